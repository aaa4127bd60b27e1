package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxclient"
)

// This file is the agent's side of a provider whose snapshots keep
// processes (PROTOCOL §6, Restore of a process-keeping snapshot): the
// harness calls the model through the sandbox's relay, a checkpoint holds
// the launch (frozen, with restore_sandbox_clock), and after a restore the
// agent takes the restored launch over in place or abandons it and
// relaunches.

// Relay is what the agent calls on a sandbox's model relay.
// sandboxclient.Client implements it; a Sandbox without it has no relay.
type Relay interface {
	// RelayStatus returns the relay's status.
	RelayStatus(ctx context.Context) (sandboxapi.RelayStatus, error)
	// RepointWith points the relay at r.URL with generation
	// r.Generation, higher than its own, and labels a branch's calls
	// (r.Branch).
	RepointWith(ctx context.Context, r sandboxapi.RepointRequest) (sandboxapi.RelayStatus, error)
}

// Adopter is what the agent calls on a restored sandbox's daemon to take
// over a launch the snapshot kept. sandboxclient.Client implements it.
type Adopter interface {
	// Held tells whether the launch is still held in pause seq by the
	// supervisor identity.
	Held(ctx context.Context, id string, seq int, identity sandboxapi.Identity) (sandboxapi.HeldAnswer, error)
	// Resume continues pause seq of the launch: the take-over.
	Resume(ctx context.Context, id string, seq int, identity sandboxapi.Identity) (sandboxapi.PauseResult, error)
	// Collect returns the receipt of a launch that ended while held.
	Collect(ctx context.Context, id string, identity sandboxapi.Identity) (sandboxapi.Receipt, error)
}

var (
	_ Relay   = (*sandboxclient.Client)(nil)
	_ Adopter = (*sandboxclient.Client)(nil)
)

// relayBase turns the relay's harness URL (".../v1") into the base URL an
// adapter appends "/v1" to.
func relayBase(url string) string {
	return strings.TrimSuffix(strings.TrimRight(url, "/"), "/v1")
}

// launchPlan is how a launch reaches the model: through the relay (its
// base URL, the generation the agent set, whether it captures the calls)
// or directly.
type launchPlan struct {
	relay    bool
	capture  bool
	modelURL string
	gen      uint64
	why      string
	// admissionClosed: the daemon refused the re-point while a checkpoint
	// is open; the launch waits for the resume (errAdmissionClosed).
	admissionClosed bool
}

// planLaunch decides how a launch in a sandbox of info reaches the model.
// With a model URL to point at and a relay up (on every provider, unless
// the owner opted out), the relay is pointed at the model (one generation
// higher than both the relay's and the bookmark's) and the harness calls
// the relay, which captures its calls. Where there is no relay to use (no
// model URL, a daemon client without one, a daemon the owner runs
// without one: its choice) the harness calls the model directly: a
// restore relaunches it, and the rollout has no trajectory. A relay that
// is there but fails its status or the re-point is an infrastructure
// fault, never a reason to call around it: errRelayUnready, and the stage
// runs again.
func (a *Agent) planLaunch(r *run, bm agentapi.Bookmark, info SessionInfo, dc Sandbox) (launchPlan, error) {
	if a.cfg.ModelURL == "" {
		return launchPlan{why: "no model URL for a relay (Config.ModelURL)"}, nil
	}
	rl, ok := dc.(Relay)
	if !ok {
		return launchPlan{why: "the sandbox's daemon client has no relay"}, nil
	}
	st, err := retryNoResponders(r.ctx, 30*time.Second, func(ctx context.Context) (sandboxapi.RelayStatus, error) { return rl.RelayStatus(ctx) })
	if err == nil && !st.Up {
		err = errors.New("the relay is not up")
	}
	if err == nil {
		gen := max(st.Generation, bm.RelayGen) + 1
		st, err = retryNoResponders(r.ctx, 30*time.Second, func(ctx context.Context) (sandboxapi.RelayStatus, error) {
			return rl.RepointWith(ctx, sandboxapi.RepointRequest{URL: a.cfg.ModelURL, Generation: gen, Branch: branchLabel(bm)})
		})
		if err == nil {
			return launchPlan{relay: true, capture: st.Capture != nil, modelURL: relayBase(st.URL), gen: st.Generation}, nil
		}
		if isAdmissionClosed(err) {
			return launchPlan{admissionClosed: true, why: "the re-point waits for an open checkpoint's resume"}, nil
		}
	}
	if isCode(err, sandboxapi.CodeNoRelay) {
		why := "the sandbox's relay: " + err.Error()
		r.log.Info().Str("sandbox", info.SandboxID).Str("why", why).Msg("the harness calls the model directly: no trajectory, and a restore relaunches it")
		return launchPlan{why: why}, nil
	}
	return launchPlan{}, fmt.Errorf("%w: sandbox %s: %w", errRelayUnready, info.SandboxID, err)
}

// errRelayUnready: the sandbox's relay is there but did not answer its
// status or take the re-point. The stage runs again from its bookmark
// (stages), and a relay that stays so for relayTries makes the sandbox
// lost: an infrastructure fault, never a launch around the relay that
// would leave the rollout without its trajectory.
var errRelayUnready = errors.New("agent: the sandbox's relay is not ready")

// relayTries is how many launch stages in a row may find the relay
// unready before the sandbox counts as lost.
const relayTries = 8

// rebindResult is what rebind did with a restored launch.
type rebindResult struct {
	// adopted: the launch continues in place; wait for it.
	adopted bool
	// done: the launch had ended and was collected; bm is the next
	// stage's bookmark.
	done bool
}

// rebind runs check_restored on the last launch of bm, held by a
// checkpoint in a snapshot that kept it: take it over in place (re-point
// the relay one generation up, apply the clock decision, continue the held
// pause, adopt), collect it if it ended, or abandon it (KILL, no continue)
// so that the caller relaunches from the saved session. Every outcome is
// logged with its reason and recorded on the launch (LaunchRecord.Rebind);
// no failure here is an error of the rollout, only a relaunch.
func (a *Agent) rebind(r *run, bm agentapi.Bookmark, lc LaunchContext, dc Sandbox) (agentapi.Bookmark, rebindResult, error) {
	orig := bm.Clone()
	last := &bm.Launches[len(bm.Launches)-1]
	h := *last.Held
	to := a.takeOver(r, bm, lc, dc, last, h)
	if to.admissionClosed {
		// A checkpoint of the new epoch is open: the take-over waits for
		// its resume, the launch still held (the bookmark unchanged).
		return bm, rebindResult{}, errAdmissionClosed
	}
	outcome, why, clock := to.outcome, to.why, to.clock
	last.Rebind, last.RebindWhy, last.Clock = outcome, why, clock
	ev := r.log.Warn()
	if outcome == agentapi.RebindRelayGone {
		ev = r.log.Info() // expected where a relay cannot run
	}
	ev.Str("launch", last.ID).Str("sandbox", lc.Session.SandboxID).Str("rebind", outcome).Str("why", why).Str("clock", clock).
		Int("pause_seq", h.Seq).Str("identity", h.Identity).Msg("restored launch re-bound")
	a.cfg.Metrics.Rebind(outcome)
	switch outcome {
	case agentapi.RebindResumed:
		last.Sandbox, last.Ended, last.Detail = lc.Session.SandboxID, agentapi.LaunchRunning, ""
		bm.Resume, bm.RelayGen = true, to.gen
		return bm, rebindResult{adopted: true}, nil
	case agentapi.RebindCollected:
		// Collected once: a relaunch that follows (an interrupted or
		// failed launch) does not re-bind it again.
		last.Sandbox, last.Held = lc.Session.SandboxID, nil
		next, err := a.ended(r, bm, lc, to.receipt)
		return next, rebindResult{done: true}, err
	}
	// Abandon: KILL, never a continue (a daemon that does not know the
	// launch has nothing to kill), and never a relaunch beside a launch
	// that may still run: a kill that is not confirmed is asked again, and
	// one never confirmed leaves the bookmark as it was for a later try.
	if err := a.killHeld(r, dc, last.ID); err != nil {
		r.log.Warn().Err(err).Str("launch", last.ID).Msg("abandoning the restored launch: the kill is not confirmed; no relaunch beside it")
		return orig, rebindResult{}, fmt.Errorf("agent: %s: abandon %s (%s): %w", r.key, last.ID, outcome, err)
	}
	last.Held = nil
	if last.Ended == agentapi.LaunchRunning {
		last.Ended = agentapi.LaunchInterrupted
	}
	last.Detail = "abandoned after the restore: " + outcome
	bm.Resume = true
	return bm, rebindResult{}, nil
}

// killTries is how often an abandon asks for the kill of a held launch
// before it gives up; resumeTries how often a take-over asks a resume
// whose answer did not come in time.
const (
	killTries   = 4
	resumeTries = 3
)

// killHeld KILLs launch id until the daemon confirms it gone (or does not
// know it), at most killTries times with a growing wait between.
func (a *Agent) killHeld(r *run, dc Sandbox, id string) error {
	var err error
	try := 0
	perr := poll.Until(r.ctx, poll.Backoff(250*time.Millisecond, 2*time.Second), func() (bool, error) {
		if try > 0 && r.ctx.Err() != nil {
			return false, nil // no kill asked after the run ended
		}
		try++
		sctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), time.Minute)
		_, err = dc.Stop(sctx, id, true)
		cancel()
		if err == nil || isCode(err, sandboxapi.CodeUnknownLaunch) {
			err = nil
			return true, nil
		}
		r.log.Warn().Err(err).Str("launch", id).Int("try", try).Msg("the kill of an abandoned launch is not confirmed")
		return try == killTries, nil
	})
	if perr != nil {
		return errors.Join(err, perr)
	}
	return err
}

// isTimeout tells a request whose answer did not come in time: it may
// have been done all the same.
func isTimeout(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}

// takeOverResult is what takeOver found and did.
type takeOverResult struct {
	// outcome is an agentapi.Rebind constant, why its reason, clock the
	// clock decision applied.
	outcome, why, clock string
	// gen is the relay's generation after the re-point.
	gen uint64
	// receipt is an ended launch's receipt (agentapi.RebindCollected).
	receipt sandboxapi.Receipt
	// admissionClosed: the daemon refused a step while a checkpoint is
	// open; nothing was decided.
	admissionClosed bool
}

// takeOver is check_restored and the take-over of the held launch last.
func (a *Agent) takeOver(r *run, bm agentapi.Bookmark, lc LaunchContext, dc Sandbox, last *agentapi.LaunchRecord, h agentapi.HeldPause) takeOverResult {
	fail := func(outcome, why string) takeOverResult { return takeOverResult{outcome: outcome, why: why} }
	ad, ok := dc.(Adopter)
	rl, rok := dc.(Relay)
	if !ok || !rok {
		return fail(agentapi.RebindTakeoverFailed, "the sandbox's daemon client cannot take a launch over")
	}
	ident, err := sandboxapi.ParseIdentity(h.Identity)
	if err != nil {
		return fail(agentapi.RebindIdentityChanged, "the recorded identity: "+err.Error())
	}
	ans, err := retryNoResponders(r.ctx, 30*time.Second, func(ctx context.Context) (sandboxapi.HeldAnswer, error) {
		return ad.Held(ctx, last.ID, h.Seq, ident)
	})
	if err != nil {
		return fail(agentapi.RebindTakeoverFailed, "held: "+err.Error())
	}
	switch ans.Verdict {
	case sandboxapi.VerdictHeld:
	case sandboxapi.VerdictEnded:
		rc, err := retryNoResponders(r.ctx, 30*time.Second, func(ctx context.Context) (sandboxapi.Receipt, error) {
			return ad.Collect(ctx, last.ID, ident)
		})
		if err != nil {
			return fail(agentapi.RebindTakeoverFailed, "collect: "+err.Error())
		}
		return takeOverResult{outcome: agentapi.RebindCollected, why: "the launch had ended: " + rc.Outcome.String(), receipt: rc}
	case sandboxapi.VerdictIdentityChanged:
		return fail(agentapi.RebindIdentityChanged, fmt.Sprintf("supervisor %s, not %s: %s", ans.Identity, h.Identity, ans.Reason))
	default:
		return fail(agentapi.RebindNotHolding, ans.Verdict.String()+": "+ans.Reason)
	}
	if !ans.Relay.Up {
		return fail(agentapi.RebindRelayGone, "the sandbox's model relay is not up")
	}
	if a.cfg.ModelURL == "" {
		return fail(agentapi.RebindTakeoverFailed, "no model URL to point the relay at (Config.ModelURL)")
	}
	gen := max(ans.Relay.Generation, bm.RelayGen) + 1
	st, err := retryNoResponders(r.ctx, 30*time.Second, func(ctx context.Context) (sandboxapi.RelayStatus, error) {
		return rl.RepointWith(ctx, sandboxapi.RepointRequest{URL: a.cfg.ModelURL, Generation: gen, Branch: branchLabel(bm)})
	})
	if isAdmissionClosed(err) {
		return takeOverResult{admissionClosed: true}
	}
	if err != nil {
		return fail(agentapi.RebindTakeoverFailed, "repoint: "+err.Error())
	}
	d := decideClock(clockFacts{Policy: a.cfg.ClockPolicy, Frozen: h.Frozen, PauseWall: h.Wall, PauseUptime: h.Uptime,
		NowWall: ans.Wall, NowUptime: ans.Uptime, Continuous: lc.Session.Clock == clockContinuousName, SetsClock: lc.Session.SetsClock})
	clock := d.String()
	if d.Action == clockSetBack || d.Action == clockSetHost {
		if err := a.setClock(r.ctx, lc.Session.SessionID, d.Wall); err != nil {
			// The clock is not worth the launch: it goes on, logged.
			clock += " (failed: " + err.Error() + ")"
		}
	}
	// A resume whose answer did not come in time may have continued the
	// launch: ask again (the daemon answers the same request the same), do
	// not abandon a launch that may run.
	for try := 0; try == 0 || isTimeout(err) && try < resumeTries; try++ {
		if try > 0 {
			r.log.Warn().Err(err).Str("launch", last.ID).Int("try", try+1).Msg("resume: no answer in time; asking again")
		}
		_, err = retryNoResponders(r.ctx, 30*time.Second, func(ctx context.Context) (sandboxapi.PauseResult, error) {
			return ad.Resume(ctx, last.ID, h.Seq, ident)
		})
	}
	if err != nil {
		if isAdmissionClosed(err) {
			return takeOverResult{admissionClosed: true}
		}
		return takeOverResult{outcome: agentapi.RebindTakeoverFailed, why: "resume: " + err.Error(), clock: clock}
	}
	return takeOverResult{outcome: agentapi.RebindResumed, clock: clock, gen: st.Generation,
		why: fmt.Sprintf("supervisor %s held pause %d; relay at generation %d, upstream %s", h.Identity, h.Seq, st.Generation, st.Upstream)}
}

// clockContinuousName is the owner's name of a provider clock that runs on
// from the snapshot's instant (SessionInfo.Clock).
const clockContinuousName = "continuous"
