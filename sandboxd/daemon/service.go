package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
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
	// NoPause keeps checkpoints from pausing the launch: its agent stops
	// it instead (an adapter that does not pause), or lets it run through
	// (a restart-only rollout).
	NoPause bool `json:"no_pause,omitempty"`
}

// LaunchRef names a launch in the other requests.
type LaunchRef struct {
	LaunchID string `json:"launch_id"`
	// Mode is the pause mode of a pause request (default: the launch's).
	Mode string `json:"mode,omitempty"`
	// Cancel makes a stop kill at once, without the SIGINT grace.
	Cancel bool `json:"cancel,omitempty"`
	// Wait makes a receipt request wait until the launch has ended; with
	// WaitMS, at most that long (then it answers 409 not_ended), so that a
	// long wait never holds the endpoint past its caller.
	Wait   bool  `json:"wait,omitempty"`
	WaitMS int64 `json:"wait_ms,omitempty"`
}

// ServiceError is the error the service answers with.
type ServiceError = jetstream.ServiceError

func classify(err error) (int, string) {
	switch {
	case errors.Is(err, sandboxd.ErrInvalidSpec), errors.Is(err, events.ErrInvalid), errors.Is(err, jetstream.ErrBadRequest):
		return 400, "bad_request"
	case errors.Is(err, sandboxd.ErrUnknownLaunch):
		return 404, "unknown_launch"
	case errors.Is(err, ErrAdmissionClosed):
		return 409, "admission_closed"
	case errors.Is(err, member.ErrStaleAttempt):
		return 409, "stale_attempt"
	case errors.Is(err, sandboxd.ErrLaunchExists):
		return 409, "launch_exists"
	case errors.Is(err, sandboxd.ErrNotEnded):
		return 409, "not_ended"
	case errors.Is(err, sandboxd.ErrUnconfirmed):
		return 409, "unconfirmed"
	case errors.Is(err, sandboxd.ErrModeUnavailable):
		return 409, "mode_unavailable"
	}
	return 500, "internal"
}

// serve adds the micro service; handlers are bound to ctx, and the
// service's Stop waits for them.
func (d *Daemon) serve(ctx context.Context) (*jetstream.Service, error) {
	s, err := jetstream.NewService(d.cfg.JS.Conn(), micro.Config{
		Name:        "stillpoint-sandboxd",
		Version:     "1.0.0",
		Description: "sandboxd of sandbox " + d.cfg.SandboxID + " in run " + d.cfg.Run,
		Metadata:    map[string]string{"run": d.cfg.Run, "sandbox": d.cfg.SandboxID},
	}, ServiceSubject(d.cfg.Run, d.cfg.SandboxID), classify)
	if err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	ref := func(body []byte) (LaunchRef, error) {
		var r LaunchRef
		if err := jetstream.DecodeRequest(body, &r); err != nil {
			return r, err
		}
		return r, sandboxd.ValidateID(r.LaunchID)
	}
	errs := []error{
		s.Handle("launch", func(body []byte) (any, error) {
			var r LaunchRequest
			if err := jetstream.DecodeRequest(body, &r); err != nil {
				return nil, err
			}
			mode, err := sandboxd.ParseMode(r.Mode)
			if err != nil {
				return nil, err
			}
			return d.launch(ctx, r.Episode, r.NoPause, sandboxd.Spec{ID: r.LaunchID, Command: r.Command, Argv: r.Argv, Dir: r.Dir,
				Env: r.Env, Timeout: time.Duration(r.TimeoutMS) * time.Millisecond, Mode: mode})
		}),
		s.Handle("status", func(body []byte) (any, error) {
			r, err := ref(body)
			if err != nil {
				return nil, err
			}
			return d.sup.Status(r.LaunchID)
		}),
		s.Handle("pause", func(body []byte) (any, error) {
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
		s.Handle("continue", func(body []byte) (any, error) {
			r, err := ref(body)
			if err != nil {
				return nil, err
			}
			if d.PausedByCheckpoint(r.LaunchID) {
				return nil, fmt.Errorf("%w: launch %s is paused by a checkpoint", ErrAdmissionClosed, r.LaunchID)
			}
			return d.sup.Continue(ctx, r.LaunchID)
		}),
		s.Handle("stop", func(body []byte) (any, error) {
			r, err := ref(body)
			if err != nil {
				return nil, err
			}
			if r.Cancel {
				return d.sup.Cancel(ctx, r.LaunchID)
			}
			return d.sup.Stop(ctx, r.LaunchID)
		}),
		s.Handle("receipt", func(body []byte) (any, error) {
			r, err := ref(body)
			if err != nil {
				return nil, err
			}
			if r.Wait && r.WaitMS > 0 {
				wctx, cancel := context.WithTimeout(ctx, time.Duration(r.WaitMS)*time.Millisecond)
				defer cancel()
				rc, err := d.sup.Wait(wctx, r.LaunchID)
				if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
					return nil, fmt.Errorf("%w: %s after %d ms", sandboxd.ErrNotEnded, r.LaunchID, r.WaitMS)
				}
				return rc, err
			}
			if r.Wait {
				return d.sup.Wait(ctx, r.LaunchID)
			}
			return d.sup.Receipt(r.LaunchID)
		}),
	}
	if err := errors.Join(errs...); err != nil {
		_ = s.Stop()
		return nil, fmt.Errorf("daemon: service endpoints: %w", err)
	}
	return s, nil
}

// Client calls one sandbox's service.
type Client struct {
	svc *jetstream.ServiceClient
}

// NewClient returns a client of sandbox sandboxID of run over nc.
func NewClient(nc *nats.Conn, run, sandboxID string) (*Client, error) {
	if err := events.ValidateRun(run); err != nil {
		return nil, err
	}
	if err := events.ValidateToken("sandbox", sandboxID); err != nil {
		return nil, err
	}
	return &Client{svc: jetstream.NewServiceClient(nc, ServiceSubject(run, sandboxID))}, nil
}

// Launch starts a launch.
func (c *Client) Launch(ctx context.Context, r LaunchRequest) (sandboxd.Record, error) {
	var out sandboxd.Record
	return out, c.svc.Call(ctx, "launch", r, &out)
}

// Status returns a launch's record.
func (c *Client) Status(ctx context.Context, id string) (sandboxd.Record, error) {
	var out sandboxd.Record
	return out, c.svc.Call(ctx, "status", LaunchRef{LaunchID: id}, &out)
}

// Pause pauses a launch (mode "" for its own).
func (c *Client) Pause(ctx context.Context, id, mode string) (sandboxd.PauseReport, error) {
	var out sandboxd.PauseReport
	return out, c.svc.Call(ctx, "pause", LaunchRef{LaunchID: id, Mode: mode}, &out)
}

// Continue continues a paused launch.
func (c *Client) Continue(ctx context.Context, id string) (sandboxd.PauseReport, error) {
	var out sandboxd.PauseReport
	return out, c.svc.Call(ctx, "continue", LaunchRef{LaunchID: id}, &out)
}

// Stop stops a launch (cancel: at once, without the SIGINT grace).
func (c *Client) Stop(ctx context.Context, id string, cancel bool) (sandboxd.Receipt, error) {
	var out sandboxd.Receipt
	return out, c.svc.Call(ctx, "stop", LaunchRef{LaunchID: id, Cancel: cancel}, &out)
}

// Receipt returns a launch's receipt; with wait, once it has ended.
func (c *Client) Receipt(ctx context.Context, id string, wait bool) (sandboxd.Receipt, error) {
	var out sandboxd.Receipt
	return out, c.svc.Call(ctx, "receipt", LaunchRef{LaunchID: id, Wait: wait}, &out)
}

// WaitReceipt waits at most d for launch id to end: its receipt, or a
// ServiceError with code not_ended.
func (c *Client) WaitReceipt(ctx context.Context, id string, d time.Duration) (sandboxd.Receipt, error) {
	var out sandboxd.Receipt
	return out, c.svc.Call(ctx, "receipt", LaunchRef{LaunchID: id, Wait: true, WaitMS: max(d.Milliseconds(), 1)}, &out)
}
