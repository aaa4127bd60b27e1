package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// This file is the agent's one view of the sandbox owner: the calls it
// makes, the owner's wire types it reads, and how it tells the owner's and
// the daemons' refusals from their faults. No other file of the package
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
	// codeOwnerAskedAgain: a later repeat of the verify took this one's
	// place at the owner. Repeats sent together (buffered through a cut)
	// may reach the owner in any order, so the one the agent waits on can
	// be the one replaced: never an outcome, it waits for the next ask.
	codeOwnerAskedAgain = "asked_again"
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

// seedWait bounds a seed, its task's setup included.
const seedWait = 5 * time.Minute

// seedAsk is how long one ask of a seed waits for its answer before it
// asks again (a variable: the tests shorten it).
var seedAsk = 15 * time.Second

// askSeed asks the owner for the session's sandbox until it answers, at
// most seedWait. A request or its answer can be lost on the bus (core NATS
// delivers at most once: the owner's NATS node went away with its answer),
// so an ask unanswered within seedAsk is asked again; the owner answers a
// repeat with the seed it made or is making (Owner.SeedSession), never a
// second sandbox.
func (a *Agent) askSeed(ctx context.Context, session, episode string, task json.RawMessage) (SessionInfo, error) {
	wctx, cancel := context.WithTimeout(ctx, seedWait)
	defer cancel()
	for {
		info, err := retryNoResponders(wctx, seedAsk, func(ctx context.Context) (SessionInfo, error) {
			return a.seedSession(ctx, session, episode, task)
		})
		if err == nil || !errors.Is(err, context.DeadlineExceeded) || wctx.Err() != nil {
			if err != nil && ctx.Err() == nil && wctx.Err() != nil {
				err = fmt.Errorf("%w: no answer to the seed within %s", err, seedWait)
			}
			return info, err
		}
		a.log.Info().Str("session", session).Dur("after", seedAsk).Msg("the seed is unanswered; asking again")
	}
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

// VerifyWait bounds one verify request: the grade itself, and the resume
// of a checkpoint that opened while it ran, which the owner waits for
// before it ends the session and answers.
const VerifyWait = 2 * time.Hour

// verify asks the owner for the grade; the owner ends the session. While
// the grade runs the run is at its verify bookmark: a checkpoint does not
// wait for it (PROTOCOL §6), and exports the bookmark, at which a restored
// attempt grades again.
func (a *Agent) verify(r *run, bm agentapi.Bookmark) (agentapi.Bookmark, error) {
	traj, noTraj := bm.Trajectory, bm.NoTrajectory
	if traj == nil && noTraj == "" {
		noTraj = "the harness finished under an agent that collected no trajectory"
	}
	a.mu.Lock()
	r.at = atVerifying
	a.mu.Unlock()
	a.member.Notify()
	// Asked again after a reconnect and every AskAgain, each time with its
	// own wait for the owner's service to be back (no responders) and its
	// own VerifyWait; a repeat joins the grade the first ask began.
	verdict, err := askingAgain(r.ctx, a.nc, a.cfg.AskAgain, func(ctx context.Context) (json.RawMessage, error) {
		v, err := retryNoResponders(ctx, VerifyWait, func(ctx context.Context) (json.RawMessage, error) {
			return a.verifyEnd(ctx, bm.Session)
		})
		if isCode(err, codeOwnerAskedAgain) && ctx.Err() == nil {
			<-ctx.Done() // askingAgain's next ask, or the run's end
			return v, context.Cause(ctx)
		}
		return v, err
	})
	if isAdmissionClosed(err) {
		return bm, errAdmissionClosed
	}
	if err != nil {
		a.mu.Lock()
		open := a.closed
		a.mu.Unlock()
		if open && r.ctx.Err() == nil {
			// A checkpoint that opened while the grade ran holds the run at
			// its verify bookmark (and the owner its session): it fails
			// after the checkpoint, not under it, and grades again then.
			r.log.Warn().Err(err).Msg("the grade failed while a checkpoint was open; grading again after it")
			return bm, errAdmissionClosed
		}
		if isCode(err, codeOwnerSandboxExited) || isCode(err, codeOwnerNoSandbox) {
			// Its sandbox died (or the owner restarted without the
			// session): nothing is left to grade.
			return bm, fmt.Errorf("%w: verify %s: %w", errSandboxLost, r.key, err)
		}
		return bm, fmt.Errorf("agent: verify %s: %w", r.key, err)
	}
	a.mu.Lock()
	restored := r.restored
	r.seeded = false // the owner ended the session
	a.mu.Unlock()
	if traj != nil {
		a.noteVerdict(r, bm, traj, verdict)
	}
	bm.Next = agentapi.StageReturn
	bm.Result = &agentapi.Result{RolloutID: bm.Rollout, Attempt: r.ep.Attempt, Episode: r.key, Adapter: a.cfg.Adapter.Name(),
		Answer: bm.Answer, Verdict: verdict, Restart: bm.Restart, Restored: restored, Trajectory: traj, NoTrajectory: noTraj}
	return bm, nil
}

// isInfra tells a step the owner or a sandbox daemon failed on its side
// (a 5xx answer: a provider error, a guest that never connected, a
// grade's exec that failed), as opposed to its refusal of the request
// (4xx) or the rollout's own failure (its harness's exit, its grade).
func isInfra(err error) bool {
	var se *jetstream.ServiceError
	return errors.As(err, &se) && se.Status >= 500
}

// errAdmissionClosed: a daemon or the owner refused a request because a
// checkpoint is open; the run waits at its boundary and tries again.
var errAdmissionClosed = errors.New("agent: admission closed")

// isAdmissionClosed tells a refusal for an open checkpoint, which the
// owner and the daemons answer with the same code.
func isAdmissionClosed(err error) bool { return isCode(err, sandboxapi.CodeAdmissionClosed) }

func isCode(err error, code string) bool {
	var se *jetstream.ServiceError
	return errors.As(err, &se) && se.Code == code
}
