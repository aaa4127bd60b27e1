package agent

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/member"
)

// ServiceSubject returns the subject prefix of an agent's service,
// spsvc.<run>.agent.<name>; endpoints are below it.
func ServiceSubject(run, name string) string { return "spsvc." + run + ".agent." + name }

// ServiceError is the error the service answers with.
type ServiceError = jetstream.ServiceError

func classify(err error) (int, string) {
	switch {
	case errors.Is(err, events.ErrInvalid), errors.Is(err, jetstream.ErrBadRequest):
		return 400, "bad_request"
	case errors.Is(err, member.ErrStaleAttempt):
		return 409, "stale_attempt"
	case errors.Is(err, ErrBusy):
		return 409, "rollout_busy"
	case errors.Is(err, ErrParked):
		return 409, "parked"
	case errors.Is(err, ErrClosed), errors.Is(err, errShutdown):
		return 503, "stopping"
	case errors.Is(err, ErrBadBookmark):
		return 422, "bad_bookmark"
	case isCode(err, "session_exists"):
		// The owner still holds this attempt's session for another agent
		// process (one that died): the controller retires the attempt.
		return 409, "session_exists"
	}
	return 500, "rollout_failed"
}

// serve adds the micro service with its run endpoint: a request is a
// Request, the answer its Result once verified. Rollouts run side by side:
// each request is answered from its own goroutine.
func (a *Agent) serve(ctx context.Context) (*jetstream.Service, error) {
	s, err := jetstream.NewService(a.nc, micro.Config{Name: "stillpoint-agent", Version: "1.0.0",
		Description: "agent " + a.cfg.Name + " of run " + a.cfg.Run,
		Metadata:    map[string]string{"run": a.cfg.Run, "agent": a.cfg.Name, "adapter": a.cfg.Adapter.Name()}},
		ServiceSubject(a.cfg.Run, a.cfg.Name), classify)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	err = s.HandleAsync(ctx, "run", func(ctx context.Context, body []byte) (any, error) {
		var req Request
		if err := jetstream.DecodeRequest(body, &req); err != nil {
			return nil, err
		}
		r, err := a.start(req)
		if err != nil {
			return nil, err
		}
		select {
		case <-r.done:
			return r.res, r.err
		case <-ctx.Done():
			return nil, ErrClosed
		}
	})
	if err != nil {
		_ = s.Stop()
		return nil, fmt.Errorf("agent: service endpoint: %w", err)
	}
	return s, nil
}

// Client calls one agent's service.
type Client struct {
	svc *jetstream.ServiceClient
}

// NewClient returns a client of agent name of run over nc.
func NewClient(nc *nats.Conn, run, name string) (*Client, error) {
	if err := events.ValidateRun(run); err != nil {
		return nil, err
	}
	if err := events.ValidateToken("agent", name); err != nil {
		return nil, err
	}
	return &Client{svc: jetstream.NewServiceClient(nc, ServiceSubject(run, name))}, nil
}

// Rollout runs a rollout on the agent and waits for its result (ctx bounds
// the wait, not the rollout: a request asked again joins the same run).
func (c *Client) Rollout(ctx context.Context, r Request) (Result, error) {
	var out Result
	return out, c.svc.Call(ctx, "run", r, &out)
}
