package agent

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
)

// This file is the agent's one view of the sandbox owner: the calls it
// makes and the owner's wire types it reads. No other file of the package
// names the owner's package.

// Owner is what the agent calls on the sandbox owner that lends its
// sandboxes (PROTOCOL §6: seed_session, sandbox_access, verify,
// close_session). The owner's service client implements it.
type Owner interface {
	// SeedSession returns the session's sandbox, made (or forked by a
	// restore) for it.
	SeedSession(ctx context.Context, r ownerapi.SeedRequest) (ownerapi.SessionInfo, error)
	// SandboxAccess returns the session's current sandbox: a fork after a
	// restore.
	SandboxAccess(ctx context.Context, sessionID string) (ownerapi.SessionInfo, error)
	// VerifyEnd grades the session; with r.End the owner then ends it.
	VerifyEnd(ctx context.Context, r ownerapi.VerifyRequest) (ownerapi.VerifyResult, error)
	// CloseSession ends a session without a grade; closing one that is gone
	// is not an error.
	CloseSession(ctx context.Context, sessionID string) error
}

var _ Owner = (*ownerapi.Client)(nil)

// The owner's service error codes the agent decides on.
const (
	// codeOwnerNoSandbox: the owner tracks no such session (one an owner
	// that restarted since the seed never knew).
	codeOwnerNoSandbox = "no_sandbox"
	// codeOwnerSandboxExited: the session's sandbox's init exited (its
	// daemon died): nothing runs there any more.
	codeOwnerSandboxExited = "sandbox_exited"
)

// SessionInfo is what the owner tells the agent of a session: its current
// sandbox, the working directory, and whether it can be captured at all.
// It is the owner's wire type.
type SessionInfo = ownerapi.SessionInfo

// dialOwner is the default of Config.OwnerService: the service client of
// owner name of run over nc.
func dialOwner(nc *nats.Conn, run, name string) (Owner, error) {
	return ownerapi.NewClient(nc, run, name)
}

// seedSession asks the owner for session's sandbox, for the attempt
// episode of a rollout with task.
func (a *Agent) seedSession(ctx context.Context, session, episode string, task json.RawMessage) (SessionInfo, error) {
	return a.owner.SeedSession(ctx, ownerapi.SeedRequest{SessionID: session, Episode: episode, Task: task})
}

// verifyEnd asks the owner for session's grade and to end the session.
func (a *Agent) verifyEnd(ctx context.Context, session string) (json.RawMessage, error) {
	vr, err := a.owner.VerifyEnd(ctx, ownerapi.VerifyRequest{SessionID: session, End: true})
	return vr.Result, err
}

// clockSetter is the optional owner ability of setting a session's
// sandbox clock (ownerapi's sandbox_clock). The owner's service client has
// it.
type clockSetter interface {
	SetClock(ctx context.Context, r ownerapi.ClockRequest) (ownerapi.ClockResult, error)
}

var _ clockSetter = (*ownerapi.Client)(nil)

// setClock asks the owner to set session's sandbox clock to wall (the
// host's time when wall is zero).
func (a *Agent) setClock(ctx context.Context, session string, wall time.Time) error {
	cs, ok := a.owner.(clockSetter)
	if !ok {
		return errors.New("the owner's client cannot set a sandbox's clock")
	}
	_, err := retryNoResponders(ctx, 30*time.Second, func(ctx context.Context) (ownerapi.ClockResult, error) {
		return cs.SetClock(ctx, ownerapi.ClockRequest{SessionID: session, Wall: wall})
	})
	return err
}
