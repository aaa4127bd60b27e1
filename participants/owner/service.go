package owner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// ServiceSubject returns the subject prefix of an owner's service,
// spsvc.<run>.owner.<name>; endpoints are below it. The subjects are
// outside sp.>, so requests are not kept in the audit stream.
func ServiceSubject(run, name string) string { return "spsvc." + run + ".owner." + name }

// SpecFunc builds the sandbox of a session from its task: the files the
// task puts in, the sandbox's first process (sandboxd), its environment.
type SpecFunc func(sessionID string, ep events.Episode, task json.RawMessage) (provider.Spec, error)

// GradeFunc grades a session: a task type's check of the sandbox (files
// written, commands' results) and of the session data its setup returned.
// It returns the verdict as a JSON object.
type GradeFunc func(ctx context.Context, p provider.Provider, s *Session) (json.RawMessage, error)

// SeedRequest asks for a session's sandbox.
type SeedRequest struct {
	SessionID string          `json:"session_id"`
	Episode   string          `json:"episode"`
	Task      json.RawMessage `json:"task,omitempty"`
}

// SessionInfo is what the agent learns of a session.
type SessionInfo struct {
	SessionID string `json:"session_id"`
	Episode   string `json:"episode"`
	// SandboxID is the sandbox's id: its daemon is member sandbox.<id>.
	SandboxID string `json:"sandbox_id"`
	Workdir   string `json:"workdir"`
	// Root is the sandbox's root as its processes see it ("/", or the host
	// path of a dir sandbox): paths inside it, Workdir included, are
	// path.Join(Root, p) to a command launched in the sandbox.
	Root string `json:"root,omitempty"`
	// Restored tells a fork a restore installed (its setup did not run
	// again).
	Restored bool `json:"restored,omitempty"`
	// RestartOnly tells the agent that this owner cannot capture the
	// session: its rollout restarts from its input after a crash.
	RestartOnly bool `json:"restart_only,omitempty"`
}

// InSandbox returns the path a command launched in the sandbox uses for p,
// a path inside it.
func (i SessionInfo) InSandbox(p string) string {
	if i.Root == "" || i.Root == "/" {
		return p
	}
	return path.Join(i.Root, p)
}

// SessionRef names a session.
type SessionRef struct {
	SessionID string `json:"session_id"`
}

// VerifyRequest asks for a session's grade.
type VerifyRequest struct {
	SessionID string `json:"session_id"`
	// End ends the session once it is graded: the agent that asks leaves
	// the sandbox to the owner (PROTOCOL §6, the cleanup rule).
	End bool `json:"end,omitempty"`
}

// VerifyResult is the grade of a session.
type VerifyResult struct {
	SessionID string          `json:"session_id"`
	Result    json.RawMessage `json:"result"`
}

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
	case errors.Is(err, events.ErrInvalid), errors.Is(err, provider.ErrInvalid), errors.Is(err, jetstream.ErrBadRequest):
		return 400, "bad_request"
	}
	return 500, "internal"
}

// Serve runs the owner's micro service for agents until ctx ends:
// seed_session (a sandbox for a session, a restored fork when there is
// one), sandbox_access (the current sandbox of a session), verify (409
// without a sandbox), close_session (idempotent). While a checkpoint is
// open, seed_session and verify answer 409 admission_closed at once. Handlers run in their
// own goroutines; Serve waits for them before it returns.
func (o *Owner) Serve(ctx context.Context, nc *nats.Conn, spec SpecFunc, grade GradeFunc) error {
	s, err := jetstream.NewService(nc, micro.Config{Name: "stillpoint-owner", Version: "1.0.0",
		Description: "sandbox owner " + o.cfg.Name + " of run " + o.cfg.Run,
		Metadata:    map[string]string{"run": o.cfg.Run, "owner": o.cfg.Name}},
		ServiceSubject(o.cfg.Run, o.cfg.Name), classify)
	if err != nil {
		return fmt.Errorf("owner: %w", err)
	}
	// Requests over the bus are refused while a checkpoint is open, not
	// held (see noHoldKey); close_session is held, as nothing waits on it.
	rctx := context.WithValue(ctx, noHoldKey{}, true)
	ref := func(body []byte) (string, error) {
		var r SessionRef
		if err := jetstream.DecodeRequest(body, &r); err != nil {
			return "", err
		}
		return r.SessionID, events.ValidateRollout("session_id", r.SessionID)
	}
	errs := []error{
		s.Handle("seed_session", func(body []byte) (any, error) {
			var r SeedRequest
			if err := jetstream.DecodeRequest(body, &r); err != nil {
				return nil, err
			}
			ep, err := events.ParseEpisode(r.Episode)
			if err != nil {
				return nil, err
			}
			var ps provider.Spec
			if spec != nil {
				if ps, err = spec(r.SessionID, ep, r.Task); err != nil {
					return nil, fmt.Errorf("%w: task: %w", jetstream.ErrBadRequest, err)
				}
			}
			prev, had := o.Session(r.SessionID)
			sess, err := o.SeedSession(rctx, r.SessionID, ep, ps)
			if err != nil {
				return nil, err
			}
			return o.info(sess, had && prev.restored && prev.Episode == ep), nil
		}),
		s.Handle("sandbox_access", func(body []byte) (any, error) {
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
		s.Handle("verify", func(body []byte) (any, error) {
			var r VerifyRequest
			if err := jetstream.DecodeRequest(body, &r); err != nil {
				return nil, err
			}
			if err := events.ValidateRollout("session_id", r.SessionID); err != nil {
				return nil, err
			}
			return o.verify(rctx, r, grade)
		}),
		s.Handle("close_session", func(body []byte) (any, error) {
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
func (o *Owner) verify(ctx context.Context, r VerifyRequest, grade GradeFunc) (VerifyResult, error) {
	req, err := o.enter(ctx, r.SessionID)
	if err != nil {
		return VerifyResult{}, err
	}
	defer o.leave(req)
	sess, err := o.RequireSandbox(r.SessionID)
	if err != nil {
		return VerifyResult{}, err
	}
	res := json.RawMessage(`{}`)
	if grade != nil {
		if res, err = grade(ctx, o.cfg.Provider, sess); err != nil {
			return VerifyResult{}, fmt.Errorf("owner: grade %s: %w", r.SessionID, err)
		}
	}
	if r.End {
		if err := o.end(ctx, r.SessionID); err != nil {
			return VerifyResult{}, err
		}
	}
	return VerifyResult{SessionID: r.SessionID, Result: res}, nil
}

func (o *Owner) info(s *Session, restored bool) SessionInfo {
	return SessionInfo{SessionID: s.ID, Episode: s.Episode.String(), SandboxID: s.Sandbox.ID, Workdir: s.Workdir, Root: s.Sandbox.ProcRoot,
		Restored: restored, RestartOnly: o.mode != ModeExported}
}

// Client calls one owner's service.
type Client struct {
	svc *jetstream.ServiceClient
}

// NewClient returns a client of owner name of run over nc.
func NewClient(nc *nats.Conn, run, name string) (*Client, error) {
	if err := events.ValidateRun(run); err != nil {
		return nil, err
	}
	if err := events.ValidateToken("owner", name); err != nil {
		return nil, err
	}
	return &Client{svc: jetstream.NewServiceClient(nc, ServiceSubject(run, name))}, nil
}

// SeedSession asks for the sandbox of a session.
func (c *Client) SeedSession(ctx context.Context, r SeedRequest) (SessionInfo, error) {
	var out SessionInfo
	return out, c.svc.Call(ctx, "seed_session", r, &out)
}

// SandboxAccess returns the current sandbox of a session (a fork after a
// restore).
func (c *Client) SandboxAccess(ctx context.Context, sessionID string) (SessionInfo, error) {
	var out SessionInfo
	return out, c.svc.Call(ctx, "sandbox_access", SessionRef{SessionID: sessionID}, &out)
}

// Verify grades a session.
func (c *Client) Verify(ctx context.Context, sessionID string) (VerifyResult, error) {
	return c.VerifyEnd(ctx, VerifyRequest{SessionID: sessionID})
}

// VerifyEnd grades a session and, with r.End, ends it.
func (c *Client) VerifyEnd(ctx context.Context, r VerifyRequest) (VerifyResult, error) {
	var out VerifyResult
	return out, c.svc.Call(ctx, "verify", r, &out)
}

// CloseSession ends a session without a verdict.
func (c *Client) CloseSession(ctx context.Context, sessionID string) error {
	var out struct{}
	return c.svc.Call(ctx, "close_session", SessionRef{SessionID: sessionID}, &out)
}
