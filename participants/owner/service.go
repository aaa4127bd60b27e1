package owner

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// ServiceError is the error the service answers with.
type ServiceError = jetstream.ServiceError

func classify(err error) (int, string) {
	switch {
	case errors.Is(err, ErrNoSandbox):
		return 409, "no_sandbox"
	case errors.Is(err, member.ErrStaleAttempt):
		return 409, "stale_attempt"
	case errors.Is(err, ErrAdmissionClosed):
		return 409, "admission_closed"
	case errors.Is(err, ErrSessionExists):
		return 409, "session_exists"
	case errors.Is(err, ErrSetup):
		return 422, "setup_failed"
	case errors.Is(err, ErrBadTask), errors.Is(err, events.ErrInvalid), errors.Is(err, provider.ErrInvalid), errors.Is(err, jetstream.ErrBadRequest):
		return 400, "bad_request"
	}
	return 500, "internal"
}

// Serve runs the owner's micro service for agents (package ownerapi) until
// ctx ends: seed_session (a sandbox for a session, built by the task kind
// from the task, or a restored fork when there is one), sandbox_access (the
// current sandbox of a session), verify (the task kind's grade; 409
// without a sandbox), close_session (idempotent). While a checkpoint is
// open, seed_session and verify answer 409 admission_closed at once.
// Handlers run in their own goroutines; Serve waits for them before it
// returns.
func (o *Owner) Serve(ctx context.Context, nc *nats.Conn) error {
	s, err := jetstream.NewService(nc, micro.Config{Name: "stillpoint-owner", Version: "1.0.0",
		Description: "sandbox owner " + o.cfg.Name + " of run " + o.cfg.Run,
		Metadata:    map[string]string{"run": o.cfg.Run, "owner": o.cfg.Name}},
		ownerapi.Subject(o.cfg.Run, o.cfg.Name), classify)
	if err != nil {
		return fmt.Errorf("owner: %w", err)
	}
	// Requests over the bus are refused while a checkpoint is open, not
	// held (see noHoldKey); close_session is held, as nothing waits on it.
	rctx := context.WithValue(ctx, noHoldKey{}, true)
	ref := func(body []byte) (string, error) {
		var r ownerapi.SessionRef
		if err := jetstream.DecodeRequest(body, &r); err != nil {
			return "", err
		}
		return r.SessionID, events.ValidateRollout("session_id", r.SessionID)
	}
	errs := []error{
		s.Handle(ownerapi.EndpointSeed, func(body []byte) (any, error) {
			var r ownerapi.SeedRequest
			if err := jetstream.DecodeRequest(body, &r); err != nil {
				return nil, err
			}
			ep, err := events.ParseEpisode(r.Episode)
			if err != nil {
				return nil, err
			}
			prev, had := o.Session(r.SessionID)
			sess, err := o.SeedSession(rctx, r.SessionID, ep, r.Task)
			if err != nil {
				return nil, err
			}
			return o.info(sess, had && prev.restored && prev.Episode == ep), nil
		}),
		s.Handle(ownerapi.EndpointAccess, func(body []byte) (any, error) {
			id, err := ref(body)
			if err != nil {
				return nil, err
			}
			sess, err := o.RequireSandbox(id)
			if err != nil {
				return nil, err
			}
			return o.info(sess, false), nil
		}),
		s.Handle(ownerapi.EndpointVerify, func(body []byte) (any, error) {
			var r ownerapi.VerifyRequest
			if err := jetstream.DecodeRequest(body, &r); err != nil {
				return nil, err
			}
			if err := events.ValidateRollout("session_id", r.SessionID); err != nil {
				return nil, err
			}
			return o.verify(rctx, r)
		}),
		s.Handle(ownerapi.EndpointClose, func(body []byte) (any, error) {
			id, err := ref(body)
			if err != nil {
				return nil, err
			}
			return struct{}{}, o.CloseSession(ctx, id)
		}),
	}
	if err := errors.Join(errs...); err != nil {
		_ = s.Stop()
		return fmt.Errorf("owner: service endpoints: %w", err)
	}
	<-ctx.Done()
	return s.Stop()
}

// verify grades a session as a request admitted like any other (a
// checkpoint waits for it, and one that is open holds it back), and ends
// it when asked.
func (o *Owner) verify(ctx context.Context, r ownerapi.VerifyRequest) (ownerapi.VerifyResult, error) {
	req, err := o.enter(ctx, r.SessionID)
	if err != nil {
		return ownerapi.VerifyResult{}, err
	}
	defer o.leave(req)
	sess, err := o.RequireSandbox(r.SessionID)
	if err != nil {
		return ownerapi.VerifyResult{}, err
	}
	res, err := o.kind.Grade(ctx, o.exec, sess)
	if err != nil {
		return ownerapi.VerifyResult{}, fmt.Errorf("owner: grade %s: %w", r.SessionID, err)
	}
	if r.End {
		if err := o.end(ctx, r.SessionID); err != nil {
			return ownerapi.VerifyResult{}, err
		}
	}
	return ownerapi.VerifyResult{SessionID: r.SessionID, Result: res}, nil
}

func (o *Owner) info(s *Session, restored bool) ownerapi.SessionInfo {
	return ownerapi.SessionInfo{SessionID: s.ID, Episode: s.Episode.String(), SandboxID: s.Sandbox.ID, Workdir: s.Workdir, Root: s.Sandbox.ProcRoot,
		Restored: restored, RestartOnly: o.mode != ModeExported}
}
