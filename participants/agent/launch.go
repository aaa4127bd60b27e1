package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/metrics"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/live"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/sandboxd/relay"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// launchStage runs the launch stage (agentapi.StageLaunch, "harness" on
// the wire): it launches the harness (a relaunch asks the adapter whether
// the saved session continues) and waits for it, parking at checkpoints.
func (a *Agent) launchStage(r *run, bm agentapi.Bookmark) (agentapi.Bookmark, error) {
	if len(bm.Launches) >= a.cfg.MaxLaunches {
		return bm, fmt.Errorf("agent: %s: gave up after %d launches", r.key, len(bm.Launches))
	}
	info, err := askingAgain(r.ctx, a.nc, 0, func(ctx context.Context) (SessionInfo, error) {
		return retryNoResponders(ctx, ownerAsk, func(ctx context.Context) (SessionInfo, error) {
			return a.owner.SandboxAccess(ctx, bm.Session)
		})
	})
	if isCode(err, codeOwnerNoSandbox) {
		// The owner does not know the session: it restarted since the
		// seed, and its sandbox is not one it tracks.
		return bm, fmt.Errorf("%w: sandbox_access %s: %w", errSandboxLost, r.key, err)
	}
	if err != nil && r.ctx.Err() == nil && unanswered(err) && !errors.Is(err, nats.ErrNoResponders) {
		// Taken and not answered. (An owner whose service has not been
		// there for DaemonWait is gone: that goes on as before, to lostOr.)
		return bm, fmt.Errorf("%w: sandbox_access %s: %w", errOwnerUnanswered, r.key, err)
	}
	if err != nil {
		return bm, fmt.Errorf("agent: sandbox_access %s: %w", r.key, err)
	}
	if info.SandboxID == "" {
		return bm, fmt.Errorf("agent: %s: the owner lends no sandbox", r.key)
	}
	if a.daemons.isGone(info.SandboxID) {
		return bm, fmt.Errorf("%w: %s: the daemon of sandbox %s is gone", errSandboxLost, r.key, info.SandboxID)
	}
	dc, err := a.sandbox(info.SandboxID)
	if err != nil {
		return bm, err
	}
	bm.Sandbox, bm.Workdir = info.SandboxID, info.Workdir
	n := len(bm.Launches) + 1
	lc := LaunchContext{Rollout: bm.Rollout, Attempt: r.ep.Attempt, Task: bm.Task, Session: info, State: bm.State,
		Exec: a.execer(r, dc, info.SessionID, info.SandboxID, n, branchLabel(bm))}
	if k := len(bm.Launches); k > 0 && bm.KeepsProcesses && bm.Launches[k-1].Held != nil {
		// A snapshot that kept processes kept this launch, held: take it
		// over in place, collect it, or abandon it and relaunch.
		next, res, err := a.rebind(r, bm, lc, dc)
		bm = next
		switch {
		case err != nil || res.done:
			return bm, err
		case res.adopted:
			return a.adopt(r, bm, lc, dc, info)
		}
		n = len(bm.Launches) + 1
		lc.Exec = a.execer(r, dc, info.SessionID, info.SandboxID, n, branchLabel(bm))
	}
	lr := agentapi.LaunchRecord{ID: fmt.Sprintf("%s.l%d", r.key, n), Sandbox: info.SandboxID, Attempt: r.ep.Attempt, Why: "first launch"}
	plan, err := a.planLaunch(r, bm, info, dc)
	if err != nil {
		return bm, err
	}
	if plan.admissionClosed {
		return bm, errAdmissionClosed
	}
	// In place only where the snapshots keep processes and the harness
	// pauses at checkpoints; elsewhere the relay captures, and a restore
	// relaunches.
	keeps := plan.relay && info.KeepsProcesses && !bm.Restart && a.cfg.Adapter.PausesAtCheckpoints()
	bm.KeepsProcesses, lr.Relay, lr.Captured = keeps, keeps, plan.capture
	if plan.relay {
		bm.RelayGen, lc.ModelURL, lc.Relay = plan.gen, plan.modelURL, true
	} else {
		// No relay in this sandbox (the daemon has none): its commands
		// carry no branch label, which only a relay sends.
		lc.Exec = a.execer(r, dc, info.SessionID, info.SandboxID, n, nil)
	}
	if bm.Resume || len(bm.Launches) > 0 {
		d, err := a.cfg.Adapter.ResumeDecision(r.ctx, lc)
		if errors.Is(err, errAdmissionClosed) || isAdmissionClosed(err) {
			return bm, errAdmissionClosed
		}
		if err != nil {
			return bm, fmt.Errorf("agent: %s: resume decision: %w", r.key, err)
		}
		lr.Continued, lr.Why = d.Continue, d.Reason
		if d.State != nil {
			bm.State, lc.State = d.State, d.State
		}
	}
	lc.Resume = lr.Continued
	cmd, err := a.cfg.Adapter.Command(lc)
	if err != nil {
		return bm, fmt.Errorf("agent: %s: %w", r.key, err)
	}
	if err := checkRelayEdits(cmd.RelayEdits, plan.relay); err != nil {
		return bm, fmt.Errorf("agent: %s: adapter %s: %w", r.key, a.cfg.Adapter.Name(), err)
	}
	lr.Started = time.Now().UTC()
	req := sandboxapi.LaunchRequest{LaunchID: lr.ID, Episode: r.key, Argv: cmd.Argv, Env: cmd.Env, Dir: cmd.Dir,
		TimeoutMS: cmd.Timeout.Milliseconds(), Mode: cmd.Mode, NoPause: bm.Restart || !a.cfg.Adapter.PausesAtCheckpoints(), RelayEdits: cmd.RelayEdits}
	if plan.relay {
		req.Branch = branchLabel(bm) // a branch's calls carry its label
	}
	if keeps {
		// The snapshot keeps the launch: a checkpoint holds it (frozen,
		// restore_sandbox_clock) and the relay holds its model calls.
		req.Mode, req.Freeze = sandboxapi.ModeHold.String(), !a.cfg.NoFreeze
		req.FreezeWaitMS = a.cfg.FreezeWait.Milliseconds()
	}
	_, err = a.startLaunchIn(r.ctx, dc, info.SessionID, info.SandboxID, req)
	switch {
	case errors.Is(err, errSandboxLost):
		return bm, fmt.Errorf("%w: %s: launch in sandbox %s", err, r.key, info.SandboxID)
	case isAdmissionClosed(err):
		return bm, errAdmissionClosed
	case err != nil && !isCode(err, sandboxapi.CodeLaunchExists):
		return bm, fmt.Errorf("agent: %s: launch: %w", r.key, err)
	}
	lr.Ended = agentapi.LaunchRunning
	bm.Launches = append(bm.Launches, lr)
	a.mu.Lock()
	r.bm, r.launch, r.sandbox = bm.Clone(), lr.ID, info.SandboxID
	a.mu.Unlock()
	r.log.Info().Str("launch", lr.ID).Str("sandbox", info.SandboxID).Bool("continued", lr.Continued).Str("why", lr.Why).
		Bool("relay", plan.relay).Str("model", lc.ModelURL).Msg("launched")
	bm, err = a.waitLaunch(r, bm, lc, dc, lr.ID)
	if err == nil {
		// Ended (or lost with its daemon); otherwise the cleanup rule
		// still has it to kill.
		a.mu.Lock()
		r.launch, r.sandbox = "", ""
		a.mu.Unlock()
	}
	return bm, err
}

// adopt waits for a launch re-bound in place after a restore, as for a
// launch of its own.
func (a *Agent) adopt(r *run, bm agentapi.Bookmark, lc LaunchContext, dc Sandbox, info SessionInfo) (agentapi.Bookmark, error) {
	id := bm.Launches[len(bm.Launches)-1].ID
	lc.Resume = true
	a.mu.Lock()
	r.bm, r.launch, r.sandbox = bm.Clone(), id, info.SandboxID
	a.mu.Unlock()
	bm, err := a.waitLaunch(r, bm, lc, dc, id)
	if err == nil {
		a.mu.Lock()
		r.launch, r.sandbox = "", ""
		a.mu.Unlock()
	}
	return bm, err
}

// DaemonWait is how long a launch waits for a sandbox's daemon to answer:
// a sandbox just lent (or forked) starts its daemon in the background.
const DaemonWait = 60 * time.Second

// launchAsk bounds one launch request: a daemon answers one at once, and
// one that does not within it is asked again (startLaunchIn).
const launchAsk = 10 * time.Second

// startLaunchIn asks the daemon of session's sandbox for a launch, waiting
// for a daemon that is not up yet, and gives up once it is gone
// (errSandboxLost): a daemon that died answers no more. One that the
// silence rule finds gone (live.Silence) may have died before it ever
// answered (a fork's daemon killed at the restore): the owner, asked then,
// tells whether the sandbox still runs. A request that goes unanswered
// within launchAsk while the daemon lives was lost on the way, or its
// answer was (a NATS node that went down between the two): it is asked
// again, which the launch id makes safe (a repeat is answered
// launch_exists), for up to DaemonWait; a daemon that answers none of them
// for that long is an infrastructure fault, the sandbox lost, not the
// rollout's result.
func (a *Agent) startLaunchIn(ctx context.Context, dc Sandbox, session, sandbox string, req sandboxapi.LaunchRequest) (sandboxapi.Record, error) {
	deadline := time.Now().Add(DaemonWait)
	for {
		rec, err := a.askLaunch(ctx, dc, session, sandbox, req)
		if !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
			return rec, err
		}
		if time.Now().After(deadline) {
			return rec, fmt.Errorf("%w: the daemon of sandbox %s answers alive but no launch request for %s: %w", errSandboxLost, sandbox, DaemonWait, err)
		}
	}
}

// askLaunch is one launch request of startLaunchIn, asked again while no
// one answers it.
func (a *Agent) askLaunch(ctx context.Context, dc Sandbox, session, sandbox string, req sandboxapi.LaunchRequest) (sandboxapi.Record, error) {
	var silence live.Silence
	return retryNoResponders(ctx, launchAsk, func(ctx context.Context) (sandboxapi.Record, error) {
		if a.daemons.isGone(sandbox) {
			return sandboxapi.Record{}, errSandboxLost
		}
		if silence.Gone(time.Now()) {
			if err := a.sandboxRuns(ctx, session); err != nil {
				return sandboxapi.Record{}, err
			}
			silence.Reset()
		}
		rec, err := whileDaemonLives(ctx, a, sandbox, func(ctx context.Context) (sandboxapi.Record, error) {
			return dc.Launch(ctx, req)
		})
		silence.Heard(err, time.Now())
		return rec, err
	})
}

// sandboxRuns asks the owner whether session's sandbox still runs: nil
// when it does (or the owner cannot tell now), errSandboxLost when its
// init exited or the owner no longer has the session.
func (a *Agent) sandboxRuns(ctx context.Context, session string) error {
	if session == "" {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, ownerAsk)
	defer cancel()
	_, err := a.owner.SandboxAccess(cctx, session)
	if isCode(err, codeOwnerSandboxExited) || isCode(err, codeOwnerNoSandbox) {
		return fmt.Errorf("%w: session %s: %w", errSandboxLost, session, err)
	}
	return nil
}

type receiptResult struct {
	rc  sandboxapi.Receipt
	err error
}

// watchReceipt waits for the launch's end in bounded waits, so that no
// request holds the daemon's endpoint past its caller. The wait runs on a
// goroutine of wg until ctx ends or the receipt is sent (at most one, and
// the channel holds it): the caller cancels ctx and waits for wg.
func (a *Agent) watchReceipt(ctx context.Context, wg *sync.WaitGroup, dc Sandbox, sandbox, id string) <-chan receiptResult {
	ch := make(chan receiptResult, 1)
	wg.Go(func() {
		var silence live.Silence
		for {
			rc, err := live.Retry(ctx, a.receiptRetry(), func(cctx context.Context) (sandboxapi.Receipt, error) {
				rc, err := dc.WaitReceipt(cctx, id, a.cfg.ReceiptWait)
				if err == nil || ctx.Err() != nil || isCode(err, sandboxapi.CodeNotEnded) || isCode(err, sandboxapi.CodeUnknownLaunch) {
					return rc, err
				}
				// Nothing listens for the daemon's requests: its connection
				// is gone. Its heartbeat lives minutes (PROTOCOL §3,
				// Liveness), so once the silence rule finds it gone it is
				// taken for gone, as an expired heartbeat would have it (the
				// run's launch is lost). Any other error is an answer of its
				// subscription.
				if live.NoResponders(err) {
					if silence.Heard(err, time.Now()) {
						a.daemons.set(sandbox, true)
					}
				} else {
					silence.Reset()
				}
				return rc, noAnswer{err}
			})
			var na noAnswer
			switch {
			case err == nil:
				ch <- receiptResult{rc: rc}
				return
			case ctx.Err() != nil:
				return
			case isCode(err, sandboxapi.CodeNotEnded):
				continue // a bounded wait ended: the next, at once
			case isCode(err, sandboxapi.CodeUnknownLaunch):
				ch <- receiptResult{rc: sandboxapi.Receipt{ID: id, ExitCode: -1, Outcome: sandboxapi.OutcomeFailed,
					Error: "the sandbox's daemon does not know the launch", Ended: time.Now()}}
				return
			case errors.As(err, &na):
				// The daemon did not answer for receiptGiveUp (restarting,
				// or its sandbox is gone): the launch is given up.
				ch <- receiptResult{rc: sandboxapi.Receipt{ID: id, ExitCode: -1, Outcome: sandboxapi.OutcomeFailed,
					Error: "the sandbox's daemon stopped answering: " + na.err.Error(), Ended: time.Now()}}
				return
			}
		}
	})
	return ch
}

// waitLaunch waits for the launch to end, parking it at each checkpoint.
// Its receipt watcher has stopped when it returns.
func (a *Agent) waitLaunch(r *run, bm agentapi.Bookmark, lc LaunchContext, dc Sandbox, id string) (agentapi.Bookmark, error) {
	var watcher sync.WaitGroup
	defer watcher.Wait()
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel() // before the Wait above: the watcher ends with ctx
	receipts := a.watchReceipt(ctx, &watcher, dc, lc.Session.SandboxID, id)
	gone := a.daemons.goneCh(lc.Session.SandboxID)
	for {
		select {
		case res := <-receipts:
			return a.ended(r, bm, lc, res.rc)
		case <-gone:
			return a.ended(r, bm, lc, a.lostReceipt(r, id, lc.Session.SandboxID))
		case <-r.parkCh:
			pr := a.parkRequestOf(r)
			if pr == nil || bm.Restart {
				continue // stale, or a restart: never parked
			}
			next, done, err := a.park(r, bm, lc, dc, id, pr, receipts)
			if err != nil || done {
				return next, err
			}
			bm = next
		case <-r.ctx.Done():
			return bm, context.Cause(r.ctx)
		}
	}
}

// parkRequestOf returns the run's park request while its checkpoint is
// still open.
func (a *Agent) parkRequestOf(r *run) *parkRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	pr := r.parkReq
	if pr == nil || !a.closed || a.open != pr.cp {
		return nil
	}
	return pr
}

// park brings a running launch to a boundary for checkpoint pr.cp: paused
// in place once its daemon acked the pause, else stopped for a relaunch
// after the resume. done tells that the launch ended (next is then the
// bookmark of the following stage).
func (a *Agent) park(r *run, bm agentapi.Bookmark, lc LaunchContext, dc Sandbox, id string, pr *parkRequest,
	receipts <-chan receiptResult) (next agentapi.Bookmark, done bool, err error) {
	why, reason := "the adapter does not pause", metrics.FallbackNoPause
	if a.cfg.Adapter.PausesAtCheckpoints() {
		ctx, cancel := context.WithDeadline(r.ctx, pr.dl)
		gone := a.daemons.goneCh(lc.Session.SandboxID)
		ack, err := a.acks.wait(ctx, pr.seq, lc.Session.SandboxID, pr.reopen, gone, 250*time.Millisecond)
		cancel()
		switch {
		case errors.Is(err, errReopened):
			return bm, false, nil // the checkpoint is over: the launch runs on
		case errors.Is(err, errDaemonGone):
			// Nothing to pause or stop: the launch went with its daemon.
			// Its heartbeat may live on for minutes: the book takes it
			// for gone now, so that the launch after the resume finds the
			// sandbox lost at once instead of asking a daemon that is not
			// there for DaemonWait, unready for every checkpoint meanwhile.
			a.daemons.set(lc.Session.SandboxID, true)
			// The run waits at its launch bookmark, exportable (a restore
			// relaunches it in a fork of its session); after the resume
			// it finds the sandbox lost and starts over.
			next, err := a.ended(r, bm, lc, a.lostReceipt(r, id, lc.Session.SandboxID))
			return next, true, err
		case r.ctx.Err() != nil:
			return bm, false, context.Cause(r.ctx)
		case err != nil:
			why, reason = "no pause ack from sandbox "+lc.Session.SandboxID+" by the deadline", metrics.FallbackNoAck
		case !ack.OK || !ack.Ready:
			why = fmt.Sprintf("sandbox %s did not confirm the pause (ok %v, ready %v)", lc.Session.SandboxID, ack.OK, ack.Ready)
			reason = metrics.FallbackNotConfirmed
		default:
			rec, err := retryNoResponders(r.ctx, 30*time.Second, func(ctx context.Context) (sandboxapi.Record, error) { return dc.Status(ctx, id) })
			switch {
			case err != nil:
				why, reason = "status after the pause: "+err.Error(), metrics.FallbackStatus
			case rec.State == sandboxapi.StatePaused && rec.Pauses.Mode == sandboxapi.ModeHold && bm.Launches[len(bm.Launches)-1].Relay:
				// Held, its model calls held by the relay, frozen if the
				// daemon could: the snapshot keeps it as it is.
				return a.parkPaused(r, bm, pr, receipts, rec, ack.Pause)
			case rec.State == sandboxapi.StatePaused && rec.Pauses.Mode == sandboxapi.ModeHold:
				// Held, not still: its processes run on and its files may
				// change under the snapshot. Without a model relay to hold
				// it, stop it instead.
				why, reason = "the launch is held, not frozen or stopped", metrics.FallbackNotStill
			case rec.State == sandboxapi.StatePaused:
				return a.parkPaused(r, bm, pr, receipts, rec, ack.Pause)
			case rec.State == sandboxapi.StateEnded && rec.Receipt != nil:
				// It ended before the pause (or the daemon stopped it): it
				// keeps its result, or relaunches.
				next, err := a.ended(r, bm, lc, *rec.Receipt)
				return next, true, err
			default:
				why, reason = fmt.Sprintf("the launch is %s after its sandbox acked the pause", rec.State), metrics.FallbackState
			}
		}
	}
	select {
	case <-pr.reopen:
		return bm, false, nil // the checkpoint is over: the launch runs on
	default:
	}
	r.log.Info().Str("launch", id).Str("why", why).Msg("stopping the launch for a relaunch after the checkpoint")
	a.cfg.Metrics.Fallback(reason)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), 2*time.Minute)
	rc, err := dc.Stop(sctx, id, false)
	cancel()
	if err != nil {
		select {
		case res := <-receipts:
			rc = res.rc
		case <-a.daemons.goneCh(lc.Session.SandboxID):
			rc = a.lostReceipt(r, id, lc.Session.SandboxID)
		case <-r.ctx.Done():
			return bm, true, context.Cause(r.ctx)
		case <-time.After(time.Minute):
			return bm, true, fmt.Errorf("agent: %s: stop %s at a checkpoint: %w", r.key, id, err)
		}
	}
	next, err = a.ended(r, bm, lc, rc)
	return next, true, err
}

// parkPaused parks a run whose launch its daemon paused: exported with
// resume (a crash relaunches it on the saved session); after the resume
// the same launch continues.
func (a *Agent) parkPaused(r *run, bm agentapi.Bookmark, pr *parkRequest, receipts <-chan receiptResult,
	rec sandboxapi.Record, rep *events.PauseReport) (agentapi.Bookmark, bool, error) {
	ex := bm.Clone()
	ex.Resume = true
	last := &ex.Launches[len(ex.Launches)-1]
	if last.Relay && rec.Pauses.Mode == sandboxapi.ModeHold {
		// What a restore checks the kept launch against: pause N, the
		// supervisor, the sandbox's clocks at the pause.
		h := &agentapi.HeldPause{Seq: rec.Pauses.Seq, Identity: rec.Supervisor.String(), Wall: rec.Pauses.Since, Frozen: rec.Pauses.Frozen}
		if rep != nil {
			h.Wall, h.Uptime = rep.Wall, rep.Uptime
		}
		last.Held = h
	}
	last.Pauses++
	last.Ended = agentapi.LaunchInterrupted
	last.Detail = "paused by checkpoint " + pr.cp
	last.DurationMS = time.Since(last.Started).Milliseconds()
	a.mu.Lock()
	r.bm, r.at, r.parkedFor = ex, atParked, pr.cp
	a.mu.Unlock()
	a.member.Notify()
	r.log.Debug().Str("checkpoint", pr.cp).Str("mode", rec.Pauses.Mode.String()).Msg("parked, launch paused in place")
	took := time.Duration(-1)
	if rep != nil {
		took = time.Duration(rep.TookMS * float64(time.Millisecond))
	}
	a.cfg.Metrics.Paused(rec.Pauses.Mode.String(), took)
	select {
	case <-pr.reopen:
	case <-r.ctx.Done():
		return bm, false, context.Cause(r.ctx)
	}
	bm.Resume = true
	bm.Launches[len(bm.Launches)-1].Pauses++
	a.mu.Lock()
	r.bm, r.at, r.parkedFor = bm.Clone(), atBusy, ""
	a.mu.Unlock()
	return bm, false, nil
}

// lostReceipt is the receipt of a launch whose sandbox's daemon is gone:
// failed, as the daemon can report nothing more.
func (a *Agent) lostReceipt(r *run, id, sandbox string) sandboxapi.Receipt {
	r.log.Warn().Str("launch", id).Str("sandbox", sandbox).Msg("the sandbox's daemon is gone (its heartbeat expired or was deleted): the launch is lost")
	return sandboxapi.Receipt{ID: id, ExitCode: -1, Outcome: sandboxapi.OutcomeFailed,
		Error: "the daemon of sandbox " + sandbox + " is gone", Ended: time.Now()}
}

// ended records how the launch ended: a finished harness goes on to
// verify with its answer; an interrupted or failed one relaunches.
func (a *Agent) ended(r *run, bm agentapi.Bookmark, lc LaunchContext, rc sandboxapi.Receipt) (agentapi.Bookmark, error) {
	last := &bm.Launches[len(bm.Launches)-1]
	end := rc.Ended
	if end.IsZero() || end.Before(last.Started) {
		// The sandbox's clock is not the agent's: a fork whose clock runs
		// on from its snapshot is behind by the time it lay in the
		// snapshot.
		end = time.Now()
	}
	last.DurationMS = end.Sub(last.Started).Milliseconds()
	last.ExitCode = rc.ExitCode
	switch rc.Outcome {
	case sandboxapi.OutcomeFinished:
		last.Ended, last.Detail = agentapi.LaunchFinished, ""
		ans, err := a.cfg.Adapter.Answer(lc, ExecResult{ExitCode: rc.ExitCode, Output: rc.OutputTail})
		if err != nil {
			return bm, fmt.Errorf("agent: %s: answer of %s: %w", r.key, last.ID, err)
		}
		// The trajectory is stored now, while the sandbox is there: the
		// grade ends the session, and a restored attempt at verify grades
		// with the bookmark's.
		traj, noTraj, err := a.collectTrajectory(r, bm)
		if err != nil {
			return bm, err
		}
		bm.Answer, bm.Next, bm.Resume = ans, agentapi.StageVerify, false
		bm.Trajectory, bm.NoTrajectory = traj, noTraj
	case sandboxapi.OutcomeInterrupted:
		last.Ended, last.Detail = agentapi.LaunchInterrupted, string(rc.StopReason)
		bm.Next, bm.Resume = agentapi.StageLaunch, true
	default:
		last.Ended, last.Detail = agentapi.LaunchFailed, rc.Error
		bm.Next, bm.Resume = agentapi.StageLaunch, true
	}
	r.log.Info().Str("launch", last.ID).Str("ended", last.Ended).Int("exit", rc.ExitCode).Int("pauses", last.Pauses).Msg("launch ended")
	return bm, nil
}

// execer runs short commands in the sandbox for the adapter: launches the
// checkpoints leave alone, as they end in moments. Each wait for one's end
// is bounded: a daemon that dies while it holds the request never
// answers it. One whose daemon is gone fails with errSandboxLost. Each
// labels the relay as its launch does, with branch when the agent points
// relays (Config.ModelURL): a command's launch labels the relay too.
func (a *Agent) execer(r *run, dc Sandbox, session, sandbox string, n int, branch *sandboxapi.BranchLabel) func(ctx context.Context, argv []string) (ExecResult, error) {
	if a.cfg.ModelURL == "" {
		branch = nil
	}
	k := 0
	return func(ctx context.Context, argv []string) (ExecResult, error) {
		k++
		id := fmt.Sprintf("%s.l%d.x%d", r.key, n, k)
		if _, err := a.startLaunchIn(ctx, dc, session, sandbox, sandboxapi.LaunchRequest{LaunchID: id, Episode: r.key, Argv: argv, NoPause: true,
			TimeoutMS: time.Minute.Milliseconds(), Branch: branch}); err != nil {
			if isAdmissionClosed(err) {
				return ExecResult{}, errAdmissionClosed
			}
			if !isCode(err, sandboxapi.CodeLaunchExists) {
				return ExecResult{}, err
			}
		}
		for {
			res, err := live.Retry(ctx, a.receiptRetry(), func(cctx context.Context) (ExecResult, error) {
				rc, err := dc.WaitReceipt(cctx, id, a.cfg.ReceiptWait)
				var se *jetstream.ServiceError
				switch {
				case isCode(err, sandboxapi.CodeNotEnded):
					return ExecResult{}, err
				case err == nil:
					if rc.Outcome != sandboxapi.OutcomeFinished {
						return ExecResult{}, fmt.Errorf("command %v: %s %s", argv, rc.Outcome, rc.Error)
					}
					return ExecResult{ExitCode: rc.ExitCode, Output: rc.OutputTail}, nil
				case ctx.Err() != nil:
					return ExecResult{}, context.Cause(ctx)
				case errors.As(err, &se):
					return ExecResult{}, err
				case a.daemonDied(ctx, sandbox):
					// Its heartbeat went, or it answers no alive query: a
					// daemon killed while it held the command answers
					// nothing more.
					return ExecResult{}, fmt.Errorf("%w: command %v: the daemon of sandbox %s is gone: %w", errSandboxLost, argv, sandbox, err)
				}
				// No answer (the daemon restarting, or dead with its
				// heartbeat not yet expired): again.
				return ExecResult{}, noAnswer{err}
			})
			var na noAnswer
			switch {
			case isCode(err, sandboxapi.CodeNotEnded):
				continue // a bounded wait ended: the next, at once
			case errors.As(err, &na) && ctx.Err() != nil:
				return ExecResult{}, context.Cause(ctx)
			case errors.As(err, &na):
				return ExecResult{}, fmt.Errorf("command %v: the daemon of sandbox %s stopped answering: %w", argv, sandbox, na.err)
			}
			return res, err
		}
	}
}

// checkRelayEdits refuses a launch whose relay edits are unknown, or that
// names edits with no model relay to apply them: the model would see what
// the edits are there to take out.
func checkRelayEdits(edits []string, viaRelay bool) error {
	if _, err := relay.LookupEdits(edits); err != nil {
		return err
	}
	if len(edits) > 0 && !viaRelay {
		return fmt.Errorf("relay edits %v named, but the sandbox runs no model relay to apply them", edits)
	}
	return nil
}
