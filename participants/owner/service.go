package owner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

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
	case errors.Is(err, provider.ErrExited):
		// The sandbox's init exited (its daemon died): nothing runs there.
		return 409, "sandbox_exited"
	case errors.Is(err, ErrNoClock):
		return 409, "clock_unavailable"
	case errors.Is(err, errVerifyAskedAgain):
		return 409, "asked_again"
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
// open, seed_session and verify answer 409 admission_closed at once; a
// verify that runs when a checkpoint opens goes on (see verify). Seeds and
// verifies are served side by side, each on a goroutine of its own (a
// setup or a grade may take long), sandbox_access and close_session in
// turn. Serve waits for every handler before it returns.
func (o *Owner) Serve(ctx context.Context, nc *nats.Conn) error {
	s, err := jetstream.NewService(nc, micro.Config{Name: events.ServiceName(events.KindOwner), Version: "1.0.0",
		Description: "sandbox owner " + o.cfg.Name + " of run " + o.cfg.Run,
		Metadata:    o.serviceMetadata()},
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
		// A seed runs the task kind's setup and a verify its grade, which
		// may take long: their requests are served side by side.
		s.HandleAsync(rctx, ownerapi.EndpointSeed, func(ctx context.Context, body []byte) (any, error) {
			var r ownerapi.SeedRequest
			if err := jetstream.DecodeRequest(body, &r); err != nil {
				return nil, err
			}
			ep, err := events.ParseEpisode(r.Episode)
			if err != nil {
				return nil, err
			}
			prev, had := o.Session(r.SessionID)
			sess, err := o.SeedSession(ctx, r.SessionID, ep, r.Task)
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
			if w, ok := o.cfg.Provider.(InitWatcher); ok && w.InitExited(sess.Sandbox.ID) {
				// Its daemon died (before it answered, maybe): the agent
				// takes the sandbox for lost rather than wait for it.
				return nil, fmt.Errorf("%w: session %s: sandbox %s", provider.ErrExited, id, sess.Sandbox.ID)
			}
			return o.info(sess, false), nil
		}),
		s.HandleAsync(rctx, ownerapi.EndpointVerify, func(ctx context.Context, body []byte) (any, error) {
			var r ownerapi.VerifyRequest
			if err := jetstream.DecodeRequest(body, &r); err != nil {
				return nil, err
			}
			if err := events.ValidateRollout("session_id", r.SessionID); err != nil {
				return nil, err
			}
			return o.verify(ctx, r)
		}),
		s.HandleAsync(ctx, ownerapi.EndpointClock, func(ctx context.Context, body []byte) (any, error) {
			var r ownerapi.ClockRequest
			if err := jetstream.DecodeRequest(body, &r); err != nil {
				return nil, err
			}
			if err := events.ValidateRollout("session_id", r.SessionID); err != nil {
				return nil, err
			}
			return o.SetClock(ctx, r.SessionID, r.Wall)
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

// verify grades a session, and ends it when asked. A grade is a
// boundary, not a request in flight (PROTOCOL §6, Sandbox owner): a
// prepare does not wait for it, and it goes on through the checkpoint,
// whose commit snapshots the session as it is. What follows it, the end
// and the answer, is a request like any other: while a checkpoint is open
// it waits for the resume, so that the sessions a prepare saw are the
// ones the commit exports, and no verdict is answered under a checkpoint.
// A verify asked while a checkpoint is open is refused (admission_closed),
// as a seed is.
func (o *Owner) verify(ctx context.Context, r ownerapi.VerifyRequest) (ownerapi.VerifyResult, error) {
	o.mu.Lock()
	if o.closed && ctx.Value(noHoldKey{}) != nil {
		// Refused while a checkpoint is open, a repeat too (startGrade).
		o.mu.Unlock()
		return ownerapi.VerifyResult{}, ErrAdmissionClosed
	}
	f, ok := o.verifies[r.SessionID]
	if ok && f.end == r.End && f.current(o.sessions[r.SessionID]) {
		// The agent asks again while it waits (a lost request or answer):
		// this request waits for the grade instead of the one before it,
		// which its caller no longer waits for, so that a grade asked
		// every minute for an hour holds one waiter, not sixty.
		if f.waiter != nil {
			close(f.waiter)
		}
		w := make(chan struct{})
		f.waiter = w
		o.mu.Unlock()
		ev := o.log.Debug()
		select {
		case <-f.done:
			ev = o.log.Info() // answered already: that answer was lost, or is late
		default:
		}
		ev.Str("session", r.SessionID).Msg("verify asked again; answering from the grade already asked")
		select {
		case <-f.done:
			return f.res, f.err
		case <-w:
			return ownerapi.VerifyResult{}, errVerifyAskedAgain
		case <-ctx.Done():
			return ownerapi.VerifyResult{}, ctx.Err()
		}
	}
	if v, ok := o.gradedVerdict(r.SessionID); ok && r.End {
		o.mu.Unlock()
		o.log.Info().Str("session", r.SessionID).Msg("verify of a session its grade ended; answering the verdict kept")
		return ownerapi.VerifyResult{SessionID: r.SessionID, Result: v}, nil
	}
	f = &verifyFlight{done: make(chan struct{}), end: r.End}
	if s := o.sessions[r.SessionID]; s != nil {
		f.sandbox = s.Sandbox.ID
	}
	o.verifies[r.SessionID] = f
	o.mu.Unlock()
	f.res, f.err = o.gradeSession(ctx, r)
	close(f.done)
	forget := func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.verifies[r.SessionID] == f {
			delete(o.verifies, r.SessionID)
		}
	}
	if f.err != nil || !r.End {
		// A failed grade is asked for again, and runs again; so does a
		// grade that left its session (it may have changed since).
		forget()
	} else {
		time.AfterFunc(verifyKept, forget)
	}
	return f.res, f.err
}

// verifyKept is how long the answer of a verify that ended its session is
// kept for a repeat of it: an agent whose connection reconnected while it
// waited asks again (the answer may have been lost), and a grade that
// ended its session could not run twice.
const verifyKept = 10 * time.Minute

// verifyFlight is one verify of a session: the grade running, then its
// answer, which a repeated request (the same session and End) gets instead
// of a second grade.
type verifyFlight struct {
	done    chan struct{}
	end     bool
	sandbox string        // the session's sandbox when it was asked
	waiter  chan struct{} // closed when a later repeat takes its place; guarded by Owner.mu
	res     ownerapi.VerifyResult
	err     error
}

// errVerifyAskedAgain answers a repeated verify that a later repeat
// replaced: its caller asked again, and waits for that one's answer.
var errVerifyAskedAgain = errors.New("owner: verify asked again; the later request gets the answer")

// current tells whether the flight answers for the session as it is now:
// still on the sandbox it graded, or ended (gone) by that grade. A session
// on another sandbox (a restore's fork) is graded anew.
func (f *verifyFlight) current(s *Session) bool {
	return s == nil || s.Sandbox.ID == f.sandbox
}

// gradeSession grades a session and ends it when asked (verify's work).
func (o *Owner) gradeSession(ctx context.Context, r ownerapi.VerifyRequest) (ownerapi.VerifyResult, error) {
	sess, done, err := o.startGrade(ctx, r.SessionID)
	if err != nil {
		return ownerapi.VerifyResult{}, err
	}
	res, err := o.kind.Grade(ctx, o.graderFor(sess.ID), sess)
	done()
	if err != nil {
		return ownerapi.VerifyResult{}, fmt.Errorf("owner: grade %s: %w", r.SessionID, err)
	}
	// Held, not refused: the agent waits for this answer, not for the
	// checkpoint.
	req, err := o.admit(ctx, r.SessionID, true)
	if err != nil {
		return ownerapi.VerifyResult{}, err
	}
	defer o.leave(req)
	if r.End {
		if err := o.endGraded(ctx, r.SessionID, sess.Sandbox.ID, res); err != nil {
			return ownerapi.VerifyResult{}, err
		}
	}
	return ownerapi.VerifyResult{SessionID: r.SessionID, Result: res}, nil
}

// startGrade admits a grade of the session: refused while a checkpoint is
// open (when ctx is a service request's) and for a session without a
// sandbox; counted among the grades running, which a prepare reports but
// does not wait for. The caller calls done when the grade ends.
func (o *Owner) startGrade(ctx context.Context, sessionID string) (*Session, func(), error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed && ctx.Value(noHoldKey{}) != nil {
		return nil, nil, ErrAdmissionClosed
	}
	s, ok := o.sessions[sessionID]
	if !ok {
		return nil, nil, fmt.Errorf("%w: %s", ErrNoSandbox, sessionID)
	}
	o.grading[sessionID]++
	var once sync.Once
	return s.clone(), func() {
		once.Do(func() {
			o.mu.Lock()
			defer o.mu.Unlock()
			if o.grading[sessionID]--; o.grading[sessionID] <= 0 {
				delete(o.grading, sessionID)
			}
		})
	}, nil
}

// endGraded ends the session after its grade, if it still has the sandbox
// that was graded, and keeps its verdict (graded.go); one a retire, a park
// or a restore stopped or replaced is left alone.
func (o *Owner) endGraded(ctx context.Context, sessionID, sandboxID string, verdict json.RawMessage) error {
	o.mu.Lock()
	s, ok := o.sessions[sessionID]
	o.mu.Unlock()
	if !ok || s.Sandbox.ID != sandboxID {
		return nil
	}
	err := o.end(ctx, sessionID)
	if errors.Is(err, ErrNoSandbox) {
		return nil
	}
	if err == nil {
		o.recordGraded(sessionID, s.Episode, verdict)
	}
	return err
}

func (o *Owner) info(s *Session, restored bool) ownerapi.SessionInfo {
	in := ownerapi.SessionInfo{SessionID: s.ID, Episode: s.Episode.String(), SandboxID: s.Sandbox.ID, Workdir: s.Workdir, Root: s.Sandbox.ProcRoot,
		Restored: restored, RestartOnly: o.mode != ModeExported}
	if sn, ok := o.cfg.Provider.(Snapshotter); ok && o.mode == ModeExported {
		c := sn.Caps()
		_, sets := o.cfg.Provider.(ClockSetter)
		in.KeepsProcesses, in.Clock, in.SetsClock = c.KeepsProcesses, c.Clock, c.SetsClock && sets
	}
	return in
}

// SetClock sets the wall clock of session id's sandbox to wall (the
// host's time when wall is zero), on a provider that can (ClockSetter with
// Caps.SetsClock; else ErrNoClock). It never sets the host's clock.
func (o *Owner) SetClock(ctx context.Context, id string, wall time.Time) (ownerapi.ClockResult, error) {
	cs, ok := o.cfg.Provider.(ClockSetter)
	if sn, isSn := o.cfg.Provider.(Snapshotter); !ok || !isSn || !sn.Caps().SetsClock {
		return ownerapi.ClockResult{}, fmt.Errorf("%w: provider %s", ErrNoClock, o.cfg.Provider.Name())
	}
	s, err := o.RequireSandbox(id)
	if err != nil {
		return ownerapi.ClockResult{}, err
	}
	if err := cs.SetClock(ctx, s.Sandbox.ID, wall); err != nil {
		return ownerapi.ClockResult{}, fmt.Errorf("owner: set the clock of sandbox %s: %w", s.Sandbox.ID, err)
	}
	if wall.IsZero() {
		wall = time.Now().UTC()
	}
	o.log.Info().Str("session", id).Str("sandbox", s.Sandbox.ID).Time("wall", wall).Msg("set the sandbox's clock")
	return ownerapi.ClockResult{SandboxID: s.Sandbox.ID, Wall: wall}, nil
}

// serviceMetadata is the service's metadata: the run, the owner's name
// and, with a member, its instance (a controller that pings the owners
// tells this process from one started since under the same name by it).
func (o *Owner) serviceMetadata() map[string]string {
	md := map[string]string{"run": o.cfg.Run, "owner": o.cfg.Name}
	if o.member != nil {
		md["instance"] = o.member.Instance()
	}
	return md
}
