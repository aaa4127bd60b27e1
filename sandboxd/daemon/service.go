package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/sandboxd"
)

// ServiceSubject returns the subject prefix of a sandbox's service,
// spsvc.<run>.sandbox.<id>; endpoints are below it.
func ServiceSubject(run, sandboxID string) string { return "spsvc." + run + ".sandbox." + sandboxID }

// LaunchRequest asks for a launch.
type LaunchRequest struct {
	// LaunchID names the launch (sandboxd.ValidateID); the agent keeps it
	// in its bookmark.
	LaunchID string `json:"launch_id"`
	// Episode is the attempt the launch works for (a capture key): a
	// retire of it stops the launch, and a retired attempt cannot launch.
	Episode string `json:"episode,omitempty"`
	// Command (run by /bin/sh -c) or Argv, as in sandboxd.Spec.
	Command string   `json:"command,omitempty"`
	Argv    []string `json:"argv,omitempty"`
	Dir     string   `json:"dir,omitempty"`
	Env     []string `json:"env,omitempty"`
	// TimeoutMS is the launch's deadline, paused time not counted.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Mode is the launch's pause mode (default: the daemon's).
	Mode string `json:"mode,omitempty"`
}

// LaunchRef names a launch in the other requests.
type LaunchRef struct {
	LaunchID string `json:"launch_id"`
	// Mode is the pause mode of a pause request (default: the launch's).
	Mode string `json:"mode,omitempty"`
	// Cancel makes a stop kill at once, without the SIGINT grace.
	Cancel bool `json:"cancel,omitempty"`
	// Wait makes a receipt request wait until the launch has ended.
	Wait bool `json:"wait,omitempty"`
}

// ServiceError is the error a service endpoint answers with.
type ServiceError struct {
	// Status is an HTTP-like status: 400, 404, 409, 500.
	Status int
	// Code names the error, e.g. admission_closed.
	Code   string
	Detail string
}

// Error implements error.
func (e *ServiceError) Error() string {
	return fmt.Sprintf("sandboxd: %s (%d): %s", e.Code, e.Status, e.Detail)
}

func classify(err error) *ServiceError {
	se := &ServiceError{Status: 500, Code: "internal", Detail: err.Error()}
	switch {
	case errors.Is(err, sandboxd.ErrInvalidSpec), errors.Is(err, events.ErrInvalid):
		se.Status, se.Code = 400, "bad_request"
	case errors.Is(err, sandboxd.ErrUnknownLaunch):
		se.Status, se.Code = 404, "unknown_launch"
	case errors.Is(err, ErrAdmissionClosed):
		se.Status, se.Code = 409, "admission_closed"
	case errors.Is(err, member.ErrStaleAttempt):
		se.Status, se.Code = 409, "stale_attempt"
	case errors.Is(err, sandboxd.ErrLaunchExists):
		se.Status, se.Code = 409, "launch_exists"
	case errors.Is(err, sandboxd.ErrNotEnded):
		se.Status, se.Code = 409, "not_ended"
	case errors.Is(err, sandboxd.ErrUnconfirmed):
		se.Status, se.Code = 409, "unconfirmed"
	case errors.Is(err, sandboxd.ErrModeUnavailable):
		se.Status, se.Code = 409, "mode_unavailable"
	}
	return se
}

// service is the daemon's micro service and its in-flight handlers.
type service struct {
	svc     micro.Service
	mu      sync.Mutex
	closing bool
	wg      sync.WaitGroup
}

// handle runs fn in a goroutine unless the service is stopping.
func (s *service) handle(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return
	}
	s.wg.Go(fn)
}

// stop lets the handlers in flight answer, then stops the service: a
// handler never responds through a stopped service.
func (s *service) stop() {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.wg.Wait()
	_ = s.svc.Stop()
}

// serve adds the micro service; handlers run in goroutines (a pause can
// take seconds) bound to ctx, and stop waits for them.
func (d *Daemon) serve(ctx context.Context) (*service, error) {
	nc := d.cfg.JS.Conn()
	svc, err := micro.AddService(nc, micro.Config{
		Name:        "stillpoint-sandboxd",
		Version:     "1.0.0",
		Description: "sandboxd of sandbox " + d.cfg.SandboxID + " in run " + d.cfg.Run,
		Metadata:    map[string]string{"run": d.cfg.Run, "sandbox": d.cfg.SandboxID},
	})
	if err != nil {
		return nil, fmt.Errorf("daemon: service: %w", err)
	}
	s := &service{svc: svc}
	g := svc.AddGroup(ServiceSubject(d.cfg.Run, d.cfg.SandboxID), micro.WithGroupQueueGroupDisabled())
	add := func(name string, fn func(ctx context.Context, body []byte) (any, error)) error {
		return g.AddEndpoint(name, micro.HandlerFunc(func(req micro.Request) {
			s.handle(func() {
				res, err := fn(ctx, req.Data())
				if err != nil {
					se := classify(err)
					_ = req.Error(strconv.Itoa(se.Status), se.Code+": "+se.Detail, nil)
					return
				}
				_ = req.RespondJSON(res)
			})
		}))
	}
	ref := func(body []byte) (LaunchRef, error) {
		var r LaunchRef
		if err := strictJSON(body, &r); err != nil {
			return r, err
		}
		return r, sandboxd.ValidateID(r.LaunchID)
	}
	errs := []error{
		add("launch", func(ctx context.Context, body []byte) (any, error) {
			var r LaunchRequest
			if err := strictJSON(body, &r); err != nil {
				return nil, err
			}
			mode, err := sandboxd.ParseMode(r.Mode)
			if err != nil {
				return nil, err
			}
			return d.launch(ctx, r.Episode, sandboxd.Spec{ID: r.LaunchID, Command: r.Command, Argv: r.Argv, Dir: r.Dir,
				Env: r.Env, Timeout: time.Duration(r.TimeoutMS) * time.Millisecond, Mode: mode})
		}),
		add("status", func(ctx context.Context, body []byte) (any, error) {
			r, err := ref(body)
			if err != nil {
				return nil, err
			}
			return d.sup.Status(r.LaunchID)
		}),
		add("pause", func(ctx context.Context, body []byte) (any, error) {
			r, err := ref(body)
			if err != nil {
				return nil, err
			}
			mode, err := sandboxd.ParseMode(r.Mode)
			if err != nil {
				return nil, err
			}
			return d.sup.Pause(ctx, r.LaunchID, mode)
		}),
		add("continue", func(ctx context.Context, body []byte) (any, error) {
			r, err := ref(body)
			if err != nil {
				return nil, err
			}
			return d.sup.Continue(ctx, r.LaunchID)
		}),
		add("stop", func(ctx context.Context, body []byte) (any, error) {
			r, err := ref(body)
			if err != nil {
				return nil, err
			}
			if r.Cancel {
				return d.sup.Cancel(ctx, r.LaunchID)
			}
			return d.sup.Stop(ctx, r.LaunchID)
		}),
		add("receipt", func(ctx context.Context, body []byte) (any, error) {
			r, err := ref(body)
			if err != nil {
				return nil, err
			}
			if r.Wait {
				return d.sup.Wait(ctx, r.LaunchID)
			}
			return d.sup.Receipt(r.LaunchID)
		}),
	}
	if err := errors.Join(errs...); err != nil {
		s.stop()
		return nil, fmt.Errorf("daemon: service endpoints: %w", err)
	}
	return s, nil
}

// strictJSON decodes a request body, refusing unknown fields and oversized
// bodies with an error that names them.
func strictJSON(body []byte, v any) error {
	if len(body) > 1<<20 {
		return fmt.Errorf("%w: request body over 1 MiB", sandboxd.ErrInvalidSpec)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: request: %v", sandboxd.ErrInvalidSpec, err)
	}
	return nil
}

// Client calls one sandbox's service.
type Client struct {
	nc      *nats.Conn
	subject string
}

// NewClient returns a client of sandbox sandboxID of run over nc.
func NewClient(nc *nats.Conn, run, sandboxID string) (*Client, error) {
	if err := events.ValidateRun(run); err != nil {
		return nil, err
	}
	if err := events.ValidateToken("sandbox", sandboxID); err != nil {
		return nil, err
	}
	return &Client{nc: nc, subject: ServiceSubject(run, sandboxID)}, nil
}

// Launch starts a launch.
func (c *Client) Launch(ctx context.Context, r LaunchRequest) (sandboxd.Record, error) {
	var out sandboxd.Record
	return out, c.call(ctx, "launch", r, &out)
}

// Status returns a launch's record.
func (c *Client) Status(ctx context.Context, id string) (sandboxd.Record, error) {
	var out sandboxd.Record
	return out, c.call(ctx, "status", LaunchRef{LaunchID: id}, &out)
}

// Pause pauses a launch (mode "" for its own).
func (c *Client) Pause(ctx context.Context, id, mode string) (sandboxd.PauseReport, error) {
	var out sandboxd.PauseReport
	return out, c.call(ctx, "pause", LaunchRef{LaunchID: id, Mode: mode}, &out)
}

// Continue continues a paused launch.
func (c *Client) Continue(ctx context.Context, id string) (sandboxd.PauseReport, error) {
	var out sandboxd.PauseReport
	return out, c.call(ctx, "continue", LaunchRef{LaunchID: id}, &out)
}

// Stop stops a launch (cancel: at once, without the SIGINT grace).
func (c *Client) Stop(ctx context.Context, id string, cancel bool) (sandboxd.Receipt, error) {
	var out sandboxd.Receipt
	return out, c.call(ctx, "stop", LaunchRef{LaunchID: id, Cancel: cancel}, &out)
}

// Receipt returns a launch's receipt; with wait, once it has ended.
func (c *Client) Receipt(ctx context.Context, id string, wait bool) (sandboxd.Receipt, error) {
	var out sandboxd.Receipt
	return out, c.call(ctx, "receipt", LaunchRef{LaunchID: id, Wait: wait}, &out)
}

func (c *Client) call(ctx context.Context, endpoint string, in, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	msg, err := c.nc.RequestWithContext(ctx, c.subject+"."+endpoint, b)
	if err != nil {
		return fmt.Errorf("sandboxd %s: %w", endpoint, err)
	}
	if code := msg.Header.Get(micro.ErrorCodeHeader); code != "" {
		status, _ := strconv.Atoi(code)
		se := &ServiceError{Status: status, Detail: msg.Header.Get(micro.ErrorHeader)}
		if k, rest, ok := strings.Cut(se.Detail, ": "); ok {
			se.Code, se.Detail = k, rest
		}
		return se
	}
	if err := json.Unmarshal(msg.Data, out); err != nil {
		return fmt.Errorf("sandboxd %s: the answer does not decode: %w", endpoint, err)
	}
	return nil
}
