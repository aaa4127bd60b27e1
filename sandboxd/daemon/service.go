package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/sandboxd"
	"github.com/stillpoint/stillpoint/sandboxd/relay"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

func classify(err error) (int, string) {
	switch {
	case errors.Is(err, sandboxd.ErrInvalidSpec), errors.Is(err, events.ErrInvalid), errors.Is(err, jetstream.ErrBadRequest):
		return 400, sandboxapi.CodeBadRequest
	case errors.Is(err, sandboxd.ErrUnknownLaunch):
		return 404, sandboxapi.CodeUnknownLaunch
	case errors.Is(err, ErrAdmissionClosed):
		return 409, sandboxapi.CodeAdmissionClosed
	case errors.Is(err, member.ErrStaleAttempt):
		return 409, sandboxapi.CodeStaleAttempt
	case errors.Is(err, sandboxd.ErrLaunchExists):
		return 409, sandboxapi.CodeLaunchExists
	case errors.Is(err, sandboxd.ErrNotEnded):
		return 409, sandboxapi.CodeNotEnded
	case errors.Is(err, sandboxd.ErrUnconfirmed):
		return 409, sandboxapi.CodeUnconfirmed
	case errors.Is(err, sandboxd.ErrModeUnavailable), errors.Is(err, sandboxapi.ErrUnknownMode):
		return 409, sandboxapi.CodeModeUnavailable
	case errors.Is(err, relay.ErrStaleGeneration):
		return 409, sandboxapi.CodeStaleGeneration
	case errors.Is(err, relay.ErrBadUpstream), errors.Is(err, sandboxapi.ErrBadBranch):
		return 400, sandboxapi.CodeBadRequest
	case errors.Is(err, ErrNoRelay), errors.Is(err, ErrNoCapture):
		return 409, sandboxapi.CodeNoRelay
	case errors.Is(err, ErrIdentityChanged):
		return 409, sandboxapi.CodeIdentityChanged
	case errors.Is(err, ErrNotHolding):
		return 409, sandboxapi.CodeNotHolding
	}
	return 500, sandboxapi.CodeInternal
}

// serve adds the micro service (package sandboxapi is its contract);
// handlers are bound to ctx, and the service's Stop waits for them.
func (d *Daemon) serve(ctx context.Context) (*jetstream.Service, error) {
	s, err := jetstream.NewService(d.cfg.JS.Conn(), micro.Config{
		Name:        events.ServiceName(events.KindSandbox),
		Version:     "1.0.0",
		Description: "sandboxd of sandbox " + d.cfg.SandboxID + " in run " + d.cfg.Run,
		Metadata:    map[string]string{"run": d.cfg.Run, "sandbox": d.cfg.SandboxID},
	}, events.ServiceSubject(d.cfg.Run, d.name), classify)
	if err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	ref := func(body []byte) (sandboxapi.LaunchRef, error) {
		var r sandboxapi.LaunchRef
		if err := jetstream.DecodeRequest(body, &r); err != nil {
			return r, err
		}
		return r, sandboxd.ValidateID(r.LaunchID)
	}
	errs := []error{
		s.Handle(sandboxapi.EndpointLaunch, func(body []byte) (any, error) {
			var r sandboxapi.LaunchRequest
			if err := jetstream.DecodeRequest(body, &r); err != nil {
				return nil, err
			}
			mode, err := sandboxapi.ParseMode(r.Mode)
			if err != nil {
				return nil, err
			}
			if r.FreezeWaitMS < 0 {
				return nil, fmt.Errorf("%w: freeze_wait_ms must not be negative", sandboxd.ErrInvalidSpec)
			}
			if _, err := relay.LookupEdits(r.RelayEdits); err != nil {
				return nil, fmt.Errorf("%w: relay_edits: %w", sandboxd.ErrInvalidSpec, err)
			}
			if len(r.RelayEdits) > 0 && r.Episode == "" {
				return nil, fmt.Errorf("%w: relay_edits need an episode (the relay's label)", sandboxd.ErrInvalidSpec)
			}
			if r.Branch != nil {
				if err := r.Branch.Validate(); err != nil {
					return nil, fmt.Errorf("%w: branch: %w", sandboxd.ErrInvalidSpec, err)
				}
				if r.Episode == "" {
					return nil, fmt.Errorf("%w: branch needs an episode (the relay's label)", sandboxd.ErrInvalidSpec)
				}
				if d.cfg.Relay == nil {
					return nil, fmt.Errorf("%w: branch needs a model relay (the daemon runs none)", sandboxd.ErrInvalidSpec)
				}
			}
			if len(r.RelayEdits) > 0 && d.cfg.Relay == nil {
				d.log.Warn().Str("launch", r.LaunchID).Strs("relay_edits", r.RelayEdits).Msg("no model relay: the launch's relay edits are not applied")
			}
			return d.launch(ctx, r.Episode, r.NoPause, r.RelayEdits, r.Branch, sandboxd.Spec{ID: r.LaunchID, Command: r.Command, Argv: r.Argv, Dir: r.Dir,
				Env: r.Env, Timeout: time.Duration(r.TimeoutMS) * time.Millisecond, Mode: mode,
				Freeze: r.Freeze, FreezeWait: time.Duration(r.FreezeWaitMS) * time.Millisecond})
		}),
		s.Handle(sandboxapi.EndpointStatus, func(body []byte) (any, error) {
			r, err := ref(body)
			if err != nil {
				return nil, err
			}
			return d.launches.Status(r.LaunchID)
		}),
		s.Handle(sandboxapi.EndpointPause, func(body []byte) (any, error) {
			r, err := ref(body)
			if err != nil {
				return nil, err
			}
			mode, err := sandboxapi.ParseMode(r.Mode)
			if err != nil {
				return nil, err
			}
			return d.launches.Pause(ctx, r.LaunchID, mode)
		}),
		s.Handle(sandboxapi.EndpointContinue, func(body []byte) (any, error) {
			r, err := ref(body)
			if err != nil {
				return nil, err
			}
			if d.PausedByCheckpoint(r.LaunchID) {
				return nil, fmt.Errorf("%w: launch %s is paused by a checkpoint", ErrAdmissionClosed, r.LaunchID)
			}
			return d.launches.Continue(ctx, r.LaunchID)
		}),
		s.Handle(sandboxapi.EndpointStop, func(body []byte) (any, error) {
			r, err := ref(body)
			if err != nil {
				return nil, err
			}
			if r.Cancel {
				return d.launches.Cancel(ctx, r.LaunchID)
			}
			return d.launches.Stop(ctx, r.LaunchID)
		}),
		s.Handle(sandboxapi.EndpointReceipt, func(body []byte) (any, error) {
			r, err := ref(body)
			if err != nil {
				return nil, err
			}
			if r.Wait && r.WaitMS > 0 {
				wctx, cancel := context.WithTimeout(ctx, time.Duration(r.WaitMS)*time.Millisecond)
				defer cancel()
				rc, err := d.launches.Wait(wctx, r.LaunchID)
				if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
					return nil, fmt.Errorf("%w: %s after %d ms", sandboxd.ErrNotEnded, r.LaunchID, r.WaitMS)
				}
				return rc, err
			}
			if r.Wait {
				return d.launches.Wait(ctx, r.LaunchID)
			}
			return d.launches.Receipt(r.LaunchID)
		}),
		s.Handle(sandboxapi.EndpointHeld, func(body []byte) (any, error) {
			var r sandboxapi.HeldRequest
			if err := jetstream.DecodeRequest(body, &r); err != nil {
				return nil, err
			}
			return d.Held(r)
		}),
		s.Handle(sandboxapi.EndpointResume, func(body []byte) (any, error) {
			var r sandboxapi.ResumeRequest
			if err := jetstream.DecodeRequest(body, &r); err != nil {
				return nil, err
			}
			return d.Resume(ctx, r)
		}),
		s.Handle(sandboxapi.EndpointCollect, func(body []byte) (any, error) {
			var r sandboxapi.CollectRequest
			if err := jetstream.DecodeRequest(body, &r); err != nil {
				return nil, err
			}
			return d.Collect(r)
		}),
		s.Handle(sandboxapi.EndpointRelayStatus, func(body []byte) (any, error) {
			var r struct{}
			if err := jetstream.DecodeRequest(body, &r); err != nil {
				return nil, err
			}
			return d.RelayStatus()
		}),
		s.Handle(sandboxapi.EndpointRelayRepoint, func(body []byte) (any, error) {
			var r sandboxapi.RepointRequest
			if err := jetstream.DecodeRequest(body, &r); err != nil {
				return nil, err
			}
			return d.Repoint(r)
		}),
		s.Handle(sandboxapi.EndpointTrajectory, func(body []byte) (any, error) {
			var r sandboxapi.TrajectoryRequest
			if err := jetstream.DecodeRequest(body, &r); err != nil {
				return nil, err
			}
			return d.Trajectory(r)
		}),
	}
	if err := errors.Join(errs...); err != nil {
		_ = s.Stop()
		return nil, fmt.Errorf("daemon: service endpoints: %w", err)
	}
	return s, nil
}
