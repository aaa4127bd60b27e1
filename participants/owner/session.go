package owner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// Session is one session's sandbox as the owner tracks it. The owner hands
// out copies: changing one changes nothing tracked.
type Session struct {
	// ID is the session id.
	ID string
	// Episode is the attempt the session serves.
	Episode events.Episode
	// Sandbox is the session's sandbox.
	Sandbox *provider.Sandbox
	// Workdir is the working directory inside the sandbox (absolute);
	// Spec.Workdir, or "/", unless the setup changed it.
	Workdir string
	// Data is the session data the setup returned (a JSON object), or nil.
	Data json.RawMessage

	// restored marks a fork a restore installed that no seed has reused.
	restored bool
}

func (s *Session) clone() *Session {
	c := *s
	if s.Sandbox != nil {
		sb := *s.Sandbox
		c.Sandbox = &sb
	}
	c.Data = bytes.Clone(s.Data)
	return &c
}

// enter admits one request: it waits while a checkpoint holds admission
// closed (until the resume, or ctx), then counts the request in flight.
// A service request (noHoldKey in ctx) is refused instead of held. The
// caller calls leave with the returned token.
func (o *Owner) enter(ctx context.Context, sessionID string) (uint64, error) {
	return o.admit(ctx, sessionID, ctx.Value(noHoldKey{}) == nil)
}

// admit is enter; hold says whether a request that finds admission closed
// waits for the resume (true) or is refused with ErrAdmissionClosed.
func (o *Owner) admit(ctx context.Context, sessionID string, hold bool) (uint64, error) {
	o.mu.Lock()
	if !hold && o.closed {
		o.mu.Unlock()
		return 0, ErrAdmissionClosed
	}
	for o.closed {
		ch := o.reopen
		o.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, fmt.Errorf("owner: waiting for a checkpoint to resume: %w", ctx.Err())
		}
		o.mu.Lock()
	}
	defer o.mu.Unlock()
	o.nextReq++
	o.inFlight[o.nextReq] = sessionID
	return o.nextReq, nil
}

// noHoldKey marks the context of a service request: enter refuses it
// while a checkpoint is open instead of holding it. An agent waits on the
// owner's answer at prepare; if the owner held the request until the
// resume, each would wait on the other until the deadline.
type noHoldKey struct{}

// leave ends a request enter admitted.
func (o *Owner) leave(req uint64) {
	o.mu.Lock()
	delete(o.inFlight, req)
	n := len(o.inFlight)
	o.mu.Unlock()
	if n == 0 {
		o.notify()
	}
}

// checkData accepts nothing (empty or null) or a JSON object.
func checkData(d json.RawMessage) (json.RawMessage, error) {
	t := bytes.TrimSpace(d)
	if len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return nil, nil
	}
	if t[0] != '{' || !json.Valid(t) {
		return nil, fmt.Errorf("session data must be a JSON object, got %.40q", t)
	}
	return bytes.Clone(t), nil
}

// StartSession starts a sandbox for the session on the provider
// (spec.ID defaults to the session id made a token; a spec.ImageRef is
// resolved first through Config.Images, a bad or missing image wrapping
// ErrBadTask),
// runs the task kind's setup against it (with no task payload) and, only
// when the setup succeeded and returned a JSON object or nothing, tracks
// the session. The
// setup gets a copy of the session and may change its Workdir (absolute);
// other changes are ignored. Otherwise the sandbox is stopped, nothing is
// tracked, and the error wraps ErrSetup. While a checkpoint is open it
// waits for the resume first. A retired episode is refused
// (member.ErrStaleAttempt).
func (o *Owner) StartSession(ctx context.Context, sessionID string, ep events.Episode, spec provider.Spec) (*Session, error) {
	if err := events.ValidateRollout("session", sessionID); err != nil {
		return nil, err
	}
	if err := ep.Validate(); err != nil {
		return nil, err
	}
	release, err := o.resolveImage(ctx, sessionID, &spec)
	if err != nil {
		return nil, err
	}
	defer release()
	turn, err := o.waitTurn(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	defer turn()
	req, err := o.enter(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	defer o.leave(req)
	return o.start(ctx, sessionID, ep, spec, nil)
}

func (o *Owner) start(ctx context.Context, sessionID string, ep events.Episode, spec provider.Spec, task json.RawMessage) (*Session, error) {
	if o.member != nil {
		if err := o.member.Admit(ep); err != nil {
			return nil, err
		}
	}
	o.mu.Lock()
	_, tracked := o.sessions[sessionID]
	_, starting := o.pending[sessionID]
	if tracked || starting {
		o.mu.Unlock()
		return nil, fmt.Errorf("%w: %s", ErrSessionExists, sessionID)
	}
	o.pending[sessionID] = ep
	end := make(chan struct{})
	o.startEnd[sessionID] = end
	o.mu.Unlock()
	defer func() {
		o.mu.Lock()
		delete(o.pending, sessionID)
		delete(o.startEnd, sessionID)
		o.mu.Unlock()
		close(end)
	}()

	if spec.ID == "" {
		spec.ID = token(sessionID)
	}
	if spec.Workdir == "" {
		spec.Workdir = "/"
	}
	if spec.Output == nil {
		spec.Output = o.initOutput(spec.ID)
	}
	sb, err := o.cfg.Provider.Start(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("owner: start sandbox of session %s: %w", sessionID, err)
	}
	s := &Session{ID: sessionID, Episode: ep, Sandbox: sb, Workdir: spec.Workdir}
	if su, ok := o.kind.(Setuper); ok {
		c := s.clone()
		raw, err := su.Setup(ctx, o.exec, c, task)
		if err == nil {
			raw, err = checkData(raw)
		}
		if err == nil && !path.IsAbs(c.Workdir) {
			err = fmt.Errorf("workdir %q is not absolute", c.Workdir)
		}
		if err != nil {
			serr := o.cfg.Provider.Stop(context.WithoutCancel(ctx), sb.ID)
			return nil, errors.Join(fmt.Errorf("%w: session %s: %w", ErrSetup, sessionID, err), serr)
		}
		s.Data, s.Workdir = raw, c.Workdir
	}
	o.mu.Lock()
	o.sessions[sessionID] = s
	o.mu.Unlock()
	if o.member != nil {
		// A retire that came while the sandbox started did not see the
		// session: a retired attempt leaves no sandbox.
		if err := o.member.Admit(ep); err != nil {
			o.mu.Lock()
			delete(o.sessions, sessionID)
			o.mu.Unlock()
			return nil, errors.Join(err, o.cfg.Provider.Stop(context.WithoutCancel(ctx), sb.ID))
		}
	}
	o.log.Debug().Str("session", sessionID).Str("sandbox", sb.ID).Msg("session started")
	return s.clone(), nil
}

// SeedSession is what a seed request calls: when a restore installed the
// session for ep, it returns that fork (the setup does not run again);
// otherwise it builds the sandbox's spec from the task payload with the
// task kind (a refusal wraps ErrBadTask) and starts the session as
// StartSession does, its setup getting the task payload.
func (o *Owner) SeedSession(ctx context.Context, sessionID string, ep events.Episode, task json.RawMessage) (*Session, error) {
	if err := events.ValidateRollout("session", sessionID); err != nil {
		return nil, err
	}
	if err := ep.Validate(); err != nil {
		return nil, err
	}
	spec, err := o.kind.Spec(sessionID, ep, task)
	if err != nil {
		return nil, fmt.Errorf("%w: session %s: %w", ErrBadTask, sessionID, err)
	}
	if s, ok, err := o.seedRepeated(ctx, sessionID, ep); ok || err != nil {
		return s, err
	}
	o.mu.Lock()
	s, ok := o.sessions[sessionID]
	fork := ok && s.restored && s.Episode == ep
	o.mu.Unlock()
	if !fork {
		// A restored fork starts nothing, needs no image resolved and
		// waits for no turn. The image is resolved before the turn and
		// the admission: a pull holds neither a start's place nor a
		// checkpoint.
		// The image stays held from here until the sandbox (its
		// provider) holds it, or the seed failed.
		release, err := o.resolveImage(ctx, sessionID, &spec)
		if err != nil {
			return nil, err
		}
		defer release()
		turn, err := o.waitTurn(ctx, sessionID)
		if err != nil {
			return nil, err
		}
		defer turn()
	}
	req, err := o.enter(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	defer o.leave(req)
	o.mu.Lock()
	if s, ok := o.sessions[sessionID]; ok && s.restored && s.Episode == ep {
		s.restored = false
		c := s.clone()
		o.mu.Unlock()
		return c, nil
	}
	o.mu.Unlock()
	return o.start(ctx, sessionID, ep, spec, task)
}

// seedRepeated answers a seed the owner has made, or is making, for the
// same session and episode: a request or its answer lost on the bus (a
// NATS node that went away with it) is asked again, and the repeat must
// get the session the first made, not a second sandbox or ErrSessionExists.
// A repeat that comes while the first is starting waits for it; one whose
// first failed starts afresh (ok false). A session of another episode is
// not a repeat.
func (o *Owner) seedRepeated(ctx context.Context, sessionID string, ep events.Episode) (*Session, bool, error) {
	for {
		o.mu.Lock()
		if s, ok := o.sessions[sessionID]; ok && !s.restored && s.Episode == ep {
			c := s.clone()
			o.mu.Unlock()
			return c, true, nil
		}
		end, starting := o.startEnd[sessionID]
		same := starting && o.pending[sessionID] == ep
		o.mu.Unlock()
		if !same {
			return nil, false, nil
		}
		select {
		case <-end:
		case <-ctx.Done():
			return nil, false, fmt.Errorf("owner: waiting for the seed of session %s already starting: %w", sessionID, ctx.Err())
		}
	}
}

// Session returns the tracked session, including a fork a restore
// installed.
func (o *Owner) Session(sessionID string) (*Session, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s, ok := o.sessions[sessionID]
	if !ok {
		return nil, false
	}
	return s.clone(), true
}

// RequireSandbox returns the session, or ErrNoSandbox when it has no
// sandbox: a verify of such a session is refused (409), not graded.
func (o *Owner) RequireSandbox(sessionID string) (*Session, error) {
	s, ok := o.Session(sessionID)
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNoSandbox, sessionID)
	}
	return s, nil
}

// EndSession stops the session's sandbox and forgets the session and its
// data; its snapshots stay until a release. It returns ErrNoSandbox for an
// unknown session. A stop that fails leaves the session tracked.
func (o *Owner) EndSession(ctx context.Context, sessionID string) error {
	req, err := o.enter(ctx, sessionID)
	if err != nil {
		return err
	}
	defer o.leave(req)
	return o.end(ctx, sessionID)
}

func (o *Owner) end(ctx context.Context, sessionID string) error {
	o.mu.Lock()
	s, ok := o.sessions[sessionID]
	o.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s", ErrNoSandbox, sessionID)
	}
	o.mu.Lock()
	o.stopping[s.Sandbox.ID] = true
	o.mu.Unlock()
	defer func() {
		o.mu.Lock()
		delete(o.stopping, s.Sandbox.ID)
		o.mu.Unlock()
	}()
	if err := o.cfg.Provider.Stop(ctx, s.Sandbox.ID); err != nil {
		return fmt.Errorf("owner: stop sandbox %s of session %s: %w", s.Sandbox.ID, sessionID, err)
	}
	o.daemonGone(ctx, s.Sandbox.ID)
	o.mu.Lock()
	if o.sessions[sessionID] == s {
		delete(o.sessions, sessionID)
		o.freedLocked()
	}
	o.mu.Unlock()
	return nil
}

// daemonGone deletes the heartbeat of a stopped sandbox's daemon (member
// sandbox.<id>, if it ran one): it cannot say goodbye itself, and until its
// heartbeat expired every phase would count on it.
func (o *Owner) daemonGone(ctx context.Context, sandboxID string) {
	if err := o.deleteDaemon(ctx, sandboxID); err != nil {
		o.log.Debug().Err(err).Str("sandbox", sandboxID).Msg("the stopped sandbox's daemon")
	}
}

// deleteDaemon deletes the heartbeat of sandbox sandboxID's daemon, and
// returns the error of a delete the bus refused.
func (o *Owner) deleteDaemon(ctx context.Context, sandboxID string) error {
	if o.cfg.Bus == nil {
		return nil
	}
	m, err := events.NewMember(events.KindSandbox, sandboxID)
	if err != nil {
		return nil // no daemon can have that name
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := o.cfg.Bus.Daemons.Delete(dctx, events.MemberKey(o.cfg.Run, m)); err != nil && !errors.Is(err, natsjs.ErrKeyNotFound) {
		return fmt.Errorf("owner: delete the heartbeat of sandbox %s's daemon: %w", sandboxID, err)
	}
	return nil
}

// CloseSession is the empty-body close: it ends the session, and does
// nothing for a session that is already closed (or never existed). A
// closed session is not exported.
func (o *Owner) CloseSession(ctx context.Context, sessionID string) error {
	err := o.EndSession(ctx, sessionID)
	if errors.Is(err, ErrNoSandbox) {
		return nil
	}
	return err
}
