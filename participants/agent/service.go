package agent

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/micro"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/member"
)

func classify(err error) (int, string) {
	switch {
	case errors.Is(err, events.ErrInvalid), errors.Is(err, jetstream.ErrBadRequest):
		return 400, agentapi.CodeBadRequest
	case errors.Is(err, member.ErrStaleAttempt):
		return 409, agentapi.CodeStaleAttempt
	case errors.Is(err, ErrAttemptLost):
		return 409, agentapi.CodeAttemptLost
	case errors.Is(err, ErrBusy), errors.Is(err, errAskedAgain):
		// Busy with another attempt, or with this one under a later
		// request: never the rollout's result.
		return 409, agentapi.CodeRolloutBusy
	case errors.Is(err, ErrParked):
		return 409, agentapi.CodeParked
	case errors.Is(err, ErrClosed), errors.Is(err, errShutdown):
		return 503, agentapi.CodeStopping
	case errors.Is(err, errSandboxLost):
		return 409, agentapi.CodeSandboxLost
	case errors.Is(err, ErrInfra):
		return 502, agentapi.CodeInfra
	case errors.Is(err, agentapi.ErrBadBookmark):
		return 422, agentapi.CodeBadBookmark
	case isCode(err, agentapi.CodeSessionExists):
		// The owner still holds this attempt's session for another agent
		// process (one that died): the controller retires the attempt.
		return 409, agentapi.CodeSessionExists
	}
	return 500, agentapi.CodeRolloutFailed
}

// serve adds the micro service with its run endpoint (package agentapi is
// its contract): a request is an agentapi.Request, the answer its Result
// once verified. Rollouts run side by side: each request is answered from
// its own goroutine, which the service's Stop waits for.
func (a *Agent) serve(ctx context.Context) (*jetstream.Service, error) {
	s, err := jetstream.NewService(a.nc, micro.Config{Name: events.ServiceName(events.KindAgent), Version: "1.0.0",
		Description: "agent " + a.cfg.Name + " of run " + a.cfg.Run,
		Metadata:    a.serviceMetadata()},
		events.ServiceSubject(a.cfg.Run, a.name), classify)
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	err = s.HandleAsync(ctx, agentapi.EndpointRun, func(ctx context.Context, body []byte) (any, error) {
		var req agentapi.Request
		if err := jetstream.DecodeRequest(body, &req); err != nil {
			return nil, err
		}
		r, err := a.start(ctx, req)
		if err != nil {
			return nil, err
		}
		w := a.waitFor(r)
		select {
		case <-r.done:
			return r.res, r.err
		case <-w:
			return nil, errAskedAgain
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

// serviceMetadata is the service's metadata: the run, the agent's name,
// its adapter and, once it has a member, the member's instance (a
// controller that pings the agents tells this process from one started
// since under the same name by it).
func (a *Agent) serviceMetadata() map[string]string {
	md := map[string]string{"run": a.cfg.Run, "agent": a.cfg.Name, "adapter": a.cfg.Adapter.Name()}
	if a.member != nil {
		md["instance"] = a.member.Instance()
	}
	return md
}

// MaxFinished is how many ended rollouts an agent remembers, so that a
// request asked again (by a controller that restarted) gets the same
// answer instead of a second run.
const MaxFinished = 8192

// remember keeps r's outcome; the caller holds a.mu.
func (a *Agent) remember(r *run) {
	a.finished[r.ep.Rollout] = r
	a.order = append(a.order, r)
	for len(a.order) > MaxFinished {
		old := a.order[0]
		if a.finished[old.ep.Rollout] == old {
			delete(a.finished, old.ep.Rollout)
		}
		a.order = a.order[1:]
	}
}

// errAskedAgain answers a rollout request that a repeat of it replaced:
// its caller asked again, and waits for that one's answer.
var errAskedAgain = errors.New("agent: rollout asked again; the later request gets the answer")

// waitFor registers a request waiting for r's end in place of the one
// before it, whose waiter it closes: the controller asks again while it
// waits (an answer may be lost with this agent's connection), and a run of
// hours asked every half minute then holds one waiter, not hundreds.
func (a *Agent) waitFor(r *run) <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r.waiter != nil {
		close(r.waiter)
	}
	r.waiter = make(chan struct{})
	return r.waiter
}
