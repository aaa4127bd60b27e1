package collect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/client"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/metrics"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/live"
	agent "github.com/stillpoint/stillpoint/participants/agent/agentapi"
)

// Run collects every task's result, then releases what Keep does not
// keep. It returns ErrStopped after Stop, and ctx's error when ctx ends
// (the collection can then be run again).
func (c *Collector) Run(ctx context.Context) (Summary, error) {
	c.start = time.Now()
	prior, err := c.openFiles()
	if err != nil {
		return c.Summary(), fmt.Errorf("collect: %w", err)
	}
	defer c.out.Close()
	defer c.dlog.Close()
	ctx, cancel := context.WithCancel(ctx)
	// The goroutines Run starts (the requests in flight, the fleet
	// watcher) end with ctx; they are waited for before the files close,
	// so no late answer is written to a closed output.
	defer c.work.Wait()
	defer cancel()
	defer c.cancelInflight()
	if err := c.watchFleet(ctx); err != nil {
		return c.Summary(), err
	}
	// The branches first: the dispatches and results of those adopted
	// before are theirs.
	if err := c.followBranches(ctx, prior); err != nil {
		return c.Summary(), err
	}
	c.mu.Lock()
	for id, e := range prior {
		if _, ok := c.byID[id]; ok {
			c.attempt[id] = e.Attempt
			c.sentTo[id] = e
		}
	}
	c.log.Info().Int("tasks", len(c.cfg.Tasks)).Int("branches", len(c.branches)).Int("done", len(c.done)).Int("dispatched_before", len(prior)).Msg("collection starting")
	c.mu.Unlock()
	if len(prior) > 0 {
		if err := c.recover(ctx, "started again"); err != nil {
			return c.Summary(), err
		}
	} else {
		c.enqueueRest()
	}
	var tick <-chan time.Time
	if c.cfg.CheckpointEvery > 0 {
		t := time.NewTicker(c.cfg.CheckpointEvery)
		defer t.Stop()
		tick = t.C
	}
	stopProgress := c.progress(ctx)
	defer stopProgress()
	for {
		c.flushRetire(ctx)
		c.dispatch(ctx)
		c.mu.Lock()
		fatal := c.fatal
		c.mu.Unlock()
		if fatal != nil {
			return c.Summary(), fatal
		}
		var settle <-chan time.Time
		if c.finished() {
			if c.settled(ctx) {
				break
			}
			settle = time.After(settleEvery)
		}
		var retry <-chan time.Time
		if d, ok := c.nextRetry(time.Now()); ok {
			retry = time.After(d)
		}
		select {
		case <-ctx.Done():
			return c.Summary(), ctx.Err()
		case <-settle:
		case <-retry:
			c.requeueDue(time.Now())
		case <-c.changed:
		case <-tick:
			if err := c.checkpointOrRecover(ctx); err != nil {
				return c.Summary(), err
			}
		case <-c.ckptNow:
			if err := c.checkpointOrRecover(ctx); err != nil {
				return c.Summary(), err
			}
		case <-c.stopNow:
			return c.Summary(), c.stop(ctx)
		case why := <-c.fleet:
			if err := c.recover(ctx, why); err != nil {
				return c.Summary(), err
			}
		}
	}
	stopProgress()
	c.finalRelease(ctx)
	s := c.Summary()
	c.log.Info().Int("results", s.Results).Int("failed", s.Failed).Int("checkpoints", len(s.Committed())).
		Dur("elapsed", s.Elapsed).Msg("collection finished")
	return s, nil
}

// checkpointOrRecover asks for a checkpoint, once the collection has
// recovered from every restart of a fleet member it has seen and not
// recovered from yet. A checkpoint asked first would be prepared by the
// restarted members, which could then no longer be restored into (a
// restore goes only into members that have served nothing): the rollouts
// their predecessors ran would start over rather than continue from the
// last checkpoint. A recovery that fails ends it without the checkpoint;
// one that succeeds does not drop it, even when it answers a late notice
// of a restart already recovered from.
func (c *Collector) checkpointOrRecover(ctx context.Context) error {
	for {
		select {
		case why := <-c.fleet:
			if err := c.recover(ctx, why); err != nil {
				return err
			}
			continue
		default:
		}
		break
	}
	c.checkpoint(ctx, false)
	return nil
}

// enqueueRest queues every task without a result and not in flight.
func (c *Collector) enqueueRest() {
	c.mu.Lock()
	defer c.mu.Unlock()
	queued := map[string]bool{}
	for _, id := range c.queue {
		queued[id] = true
	}
	for _, t := range c.cfg.Tasks {
		id := t.RolloutID
		if _, done := c.done[id]; done || queued[id] || c.inflight[id] != nil {
			continue
		}
		c.queue = append(c.queue, id)
	}
}

// finished tells whether every task has a result.
func (c *Collector) finished() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.inflight) > 0 {
		return false
	}
	for id := range c.byID {
		if _, done := c.done[id]; !done {
			return false
		}
	}
	return true
}

func (c *Collector) signal() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// dispatch sends queued rollouts up to the concurrency bound, after the
// retires queued before them: an attempt that ended since Run's loop
// flushed them (a lost sandbox's, queued again one attempt later) is
// retired before its next attempt is sent.
func (c *Collector) dispatch(ctx context.Context) {
	for {
		c.mu.Lock()
		if c.stopping || c.recovering || len(c.queue) == 0 || len(c.inflight) >= c.cfg.Concurrency {
			c.mu.Unlock()
			return
		}
		if len(c.pendingRetire) > 0 {
			c.mu.Unlock()
			c.flushRetire(ctx)
			continue
		}
		id := c.queue[0]
		c.queue = c.queue[1:]
		if _, done := c.done[id]; done || c.inflight[id] != nil {
			c.mu.Unlock()
			continue
		}
		attempt := c.attempt[id]
		if c.branchStartsOver(id, attempt) {
			// Made again from its source, then queued (rebranch.go).
			fl := &flight{cancel: func() {}, gen: c.gen + 1}
			c.gen++
			c.inflight[id] = fl
			c.mu.Unlock()
			c.work.Go(func() { c.rebranch(ctx, id, attempt, fl.gen) })
			continue
		}
		name := c.agentOf(id)
		// The dispatch log first, synced: a collector started again knows
		// every attempt that may be running.
		e := dispatchEntry{RolloutID: id, Attempt: attempt, Agent: name, Instance: c.instances["agent."+name], Owners: c.ownersFor(name, c.instances),
			Time: time.Now().UTC()}
		sentTo := ""
		if ra, ok := c.restoredQ[id]; ok && ra == attempt {
			delete(c.restoredQ, id)
			if bi, ok := c.branches[id]; ok && bi.attempt == attempt && bi.instance != "" && bi.agent == name {
				// A branch's first send: only the process that installed
				// it may run it; a successor answers attempt_lost, and the
				// branch is made again from its source (rebranch).
				sentTo = bi.instance
			}
		} else if prev, ok := c.sentTo[id]; ok && prev.Attempt == attempt && prev.Instance != "" {
			// Asked again: only the process it went to may answer; a
			// successor refuses it (agent.CodeAttemptLost).
			e, name, sentTo = prev, prev.Agent, prev.Instance
			e.Time = time.Now().UTC()
		}
		if err := appendLine(c.dlog, e); err != nil {
			c.mu.Unlock()
			c.log.Error().Err(err).Msg("write the dispatch log; not dispatching")
			return
		}
		c.sentTo[id], c.attempt[id] = e, attempt
		rctx, cancel := context.WithCancel(ctx)
		c.gen++
		fl := &flight{cancel: cancel, gen: c.gen}
		c.inflight[id] = fl
		task := c.byID[id].Task
		c.mu.Unlock()
		c.work.Go(func() { c.send(rctx, id, task, attempt, name, sentTo, fl.gen) })
	}
}

// send runs one rollout request and records how it ended.
func (c *Collector) send(ctx context.Context, id string, task json.RawMessage, attempt int, name, sentTo string, gen uint64) {
	cl, err := agent.NewClient(c.cfg.Conn, c.cfg.Run, name)
	var res agent.Result
	if err == nil {
		// An agent not up yet is waited for (live.Retry). One that came
		// back as another process has lost this attempt: the recovery its
		// restart triggers takes the rollout from here.
		again := func(err error) bool {
			if !live.NoResponders(err) {
				return false
			}
			c.mu.Lock()
			sent, now := c.sentTo[id].Instance, c.instances["agent."+name]
			c.mu.Unlock()
			return sent == "" || now == sent
		}
		req := agent.Request{RolloutID: id, Attempt: attempt, Task: task, SentTo: sentTo}
		res, err = c.askAgain(ctx, &req, func(ctx context.Context, req agent.Request) (agent.Result, error) {
			return live.Retry(ctx, live.Policy{Interval: poll.Backoff(100*time.Millisecond, 2*time.Second), Again: again},
				func(ctx context.Context) (agent.Result, error) { return cl.Rollout(ctx, req) })
		})
	}
	if err == nil && res.Trajectory != nil && c.cfg.Trajectories != "" {
		if terr := c.saveTrajectory(ctx, id, res.Trajectory); terr != nil {
			c.log.Error().Err(terr).Str("rollout", id).Str("object", res.Trajectory.Object).
				Msg("the trajectory is not beside the results; it stays in the store (stillpoint trajectory)")
		}
	}
	c.finish(id, attempt, name, gen, res, err)
}

// finish records a rollout's end: a result (or a failure) exactly once;
// anything that leaves it unfinished leaves it to a checkpoint's restore,
// or queues it again.
func (c *Collector) finish(id string, attempt int, name string, gen uint64, res agent.Result, err error) {
	c.mu.Lock()
	defer c.signal()
	defer c.mu.Unlock()
	fl := c.inflight[id]
	if fl == nil || fl.gen != gen {
		return // a request a recovery dropped; a newer one is in flight or queued
	}
	fl.cancel()
	delete(c.inflight, id)
	if _, dup := c.done[id]; dup {
		c.log.Warn().Str("rollout", id).Int("attempt", attempt).Msg("a second answer for a rollout already written; dropped")
		return
	}
	ep := events.Episode{Rollout: id, Attempt: attempt}.String()
	var se *jetstream.ServiceError
	isSE := errors.As(err, &se)
	switch {
	case err == nil:
		c.write(Result{RolloutID: id, Attempt: attempt, Episode: ep, Agent: name, OK: true, Outcome: OutcomeGraded, Result: &res, Time: time.Now().UTC()})
		c.lastEvent = id + " done"
	case isSE && (se.Code == "rollout_failed" || se.Code == "bad_request" || se.Code == "bad_bookmark"):
		c.write(Result{RolloutID: id, Attempt: attempt, Episode: ep, Agent: name, Outcome: OutcomeFailed, Error: se.Error(), Time: time.Now().UTC()})
		c.lastEvent = id + " failed"
	case isSE && se.Code == agent.CodeInfra:
		// No result of the rollout: its attempt is retired and the
		// rollout sent again, as a new attempt, up to InfraAttempts.
		c.infra[id]++
		if c.infra[id] >= c.cfg.InfraAttempts {
			c.log.Error().Str("episode", ep).Int("attempts", c.infra[id]).Str("cause", se.Error()).Msg("the infrastructure failed every attempt; written infra_failed")
			c.write(Result{RolloutID: id, Attempt: attempt, Episode: ep, Agent: name, Outcome: OutcomeInfraFailed, Error: se.Error(), Time: time.Now().UTC()})
			c.lastEvent = id + " infra_failed"
			return
		}
		c.sum.InfraRetried++
		c.log.Warn().Str("episode", ep).Int("attempt", c.infra[id]).Str("cause", se.Error()).Msg("an infrastructure fault ended the attempt; sending the rollout again one attempt later")
		c.lastEvent = id + " infra; again"
		c.pendingRetire = append(c.pendingRetire, ep)
		c.attempt[id] = attempt + 1
		delete(c.route, id) // any agent
		c.queue = append(c.queue, id)
	case c.stopping || c.recovering || errors.Is(err, context.Canceled):
		// A stop checkpoint parked it, or a recovery dropped it: the
		// restore (or the recovery) takes it from here.
	case isSE && se.Code == agent.CodeAttemptLost:
		// Asked again of a process of the agent that is not the one it
		// went to: that one is gone, and the attempt with it. A recovery
		// decides (a restore, a rejoin, or one attempt later); the fleet
		// watcher may not have seen the new process yet.
		c.lastEvent = id + " lost with its agent process"
		c.log.Warn().Str("episode", ep).Str("agent", name).Msg("the attempt was lost with its agent process; recovering")
		select {
		case c.fleet <- "agent." + name + " lost " + ep:
		default:
		}
	case isSE && (se.Code == "parked" || se.Code == "stale_attempt" || se.Code == "session_exists" || se.Code == agent.CodeSandboxLost):
		// Parked by an earlier stop checkpoint that no restore continued,
		// retired under it, its session held for an agent process that is
		// gone, or its sandbox lost (its daemon died, or the owner
		// restarted without its session): start it over one attempt later.
		c.lastEvent = id + " " + se.Code + "; starting over"
		c.startOvers[id]++
		wait := startOverWait(c.startOvers[id])
		c.log.Info().Str("episode", ep).Str("code", se.Code).Dur("after", wait).Msg("retiring the attempt and starting it over one attempt later")
		c.pendingRetire = append(c.pendingRetire, ep)
		c.attempt[id] = attempt + 1
		if wait == 0 {
			c.queue = append(c.queue, id)
		} else {
			c.retries = append(c.retries, retry{id: id, at: time.Now().Add(wait)})
		}
	default:
		// The agent is stopping or went away, or is busy with another
		// attempt: ask again in a while (a recovery may come first). Run's
		// loop queues it when the time comes.
		c.log.Debug().Err(err).Str("episode", ep).Msg("rollout unfinished; asking again")
		c.retries = append(c.retries, retry{id: id, at: time.Now().Add(retryAfter)})
	}
}

// write appends a result, a branch's with its parent and number; the
// caller holds c.mu.
func (c *Collector) write(r Result) {
	if t, ok := c.byID[r.RolloutID]; ok {
		r.BranchOf, r.Branch = t.BranchOf, t.Branch
	}
	if err := appendLine(c.out, r); err != nil {
		// The output cannot take it: stop here; a run started again asks
		// the agent again and gets the same answer.
		c.log.Error().Err(err).Str("rollout", r.RolloutID).Msg("write the result")
		if c.fatal == nil {
			c.fatal = fmt.Errorf("collect: write the result of %s: %w", r.RolloutID, err)
		}
		return
	}
	c.done[r.RolloutID] = r
	c.count(r)
	ev := c.log.Info()
	if !r.OK {
		ev = c.log.Warn().Str("error", r.Error)
	}
	ev.Str("episode", r.Episode).Str("agent", r.Agent).Int("done", len(c.done)).Int("of", len(c.byID)).Msg("result")
}

// count adds a result written to the metrics.
func (c *Collector) count(r Result) {
	m := c.cfg.Metrics
	if r.Outcome == OutcomeInfraFailed {
		m.Result(metrics.ResultInfraFailed)
		return
	}
	if !r.OK {
		m.Result(metrics.ResultFailed)
		return
	}
	m.Result(metrics.ResultOK)
	inPlace, relaunched := continuedHow(r.Result)
	if inPlace {
		m.Continued(metrics.ContinuedInPlace)
	}
	if relaunched {
		m.Continued(metrics.Relaunched)
	}
}

func (c *Collector) cancelInflight() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, fl := range c.inflight {
		fl.cancel()
	}
}

// checkpoint takes one checkpoint and releases what Keep does not keep.
func (c *Collector) checkpoint(ctx context.Context, stop bool) *bridgeapi.CheckpointResult {
	c.mu.Lock()
	c.ckptOpen = true
	c.mu.Unlock()
	c.redraw()
	began := time.Now()
	id := c.nextCheckpointID(began)
	res, lost, err := c.askCheckpoint(ctx, bridgeapi.CheckpointRequest{ID: id, Stop: stop, Unfinished: c.unfinished()})
	st := CheckpointStat{ID: id, Stop: stop, Began: began}
	switch {
	case err != nil:
		st.Status, st.Reason = bridgeapi.StatusFailed, err.Error()
	default:
		st.ID, st.Status, st.PrepareMS, st.CommitMS, st.Continued = res.CheckpointID, res.Status, res.PrepareMS, res.CommitMS, len(res.Continued)
		st.Carried, st.Retired = len(events.CarriedEpisodes(res.Carried)), len(res.Retired)
		if res.Failure != nil {
			st.Reason = res.Failure.Reason
		}
		if lost {
			note := "the first answer was lost; the bridge was asked again"
			if st.Reason != "" {
				note += ": " + st.Reason
			}
			st.Reason = note
		}
	}
	c.mu.Lock()
	c.ckptOpen = false
	c.sum.Checkpoints = append(c.sum.Checkpoints, st)
	c.lastEvent = fmt.Sprintf("checkpoint %s %s", st.ID, st.Status)
	c.mu.Unlock()
	c.redraw()
	ev := c.log.Info()
	if st.Status != bridgeapi.StatusCommitted {
		ev = c.log.Warn().Str("reason", st.Reason)
	}
	ev.Str("checkpoint", st.ID).Str("status", st.Status).Bool("stop", stop).Int64("prepare_ms", st.PrepareMS).
		Int64("commit_ms", st.CommitMS).Int("continued", st.Continued).Int("carried", st.Carried).Int("retired", st.Retired).Msg("checkpoint")
	if err != nil || res.Status != bridgeapi.StatusCommitted {
		return res
	}
	if c.cfg.OnCommit != nil {
		c.cfg.OnCommit(ctx, res)
	}
	if !stop {
		if rel, err := c.cfg.Controller.Release(ctx, bridgeapi.ReleaseRequest{KeepLatest: max(c.cfg.Keep, 1)}); err != nil || rel.Status != bridgeapi.StatusCompleted {
			c.log.Warn().Err(err).Msg("release of older checkpoints failed; it is tried again after the next one")
		}
	}
	return res
}

// unfinished returns every attempt dispatched and not written, sorted: a
// checkpoint carries forward those of them whose members are gone, and
// names the rest of such episodes retired (bridgeapi.CheckpointRequest).
func (c *Collector) unfinished() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := []string{}
	for id := range c.sentTo {
		if _, done := c.done[id]; !done {
			out = append(out, events.Episode{Rollout: id, Attempt: c.attempt[id]}.String())
		}
	}
	slices.Sort(out)
	return out
}

// stop takes a checkpoint with stop and, once it committed, returns
// ErrStopped; the agents park what it exported.
func (c *Collector) stop(ctx context.Context) error {
	c.mu.Lock()
	c.stopping = true
	c.mu.Unlock()
	c.log.Info().Msg("stopping: checkpoint with stop")
	for try := 1; try <= 3; try++ {
		res := c.checkpoint(ctx, true)
		if res != nil && res.Status == bridgeapi.StatusCommitted {
			c.waitInflight(ctx, 30*time.Second)
			return ErrStopped
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return errors.New("collect: stop: the checkpoint with stop did not commit in 3 tries; nothing was parked, run again to continue")
}

// waitInflight waits up to d for the requests in flight to return (after a
// stop they come back parked), then cancels the rest.
func (c *Collector) waitInflight(ctx context.Context, d time.Duration) {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	changed := func() <-chan struct{} { return c.changed }
	_ = poll.UntilWoken(wctx, poll.Every(100*time.Millisecond), changed, func() (bool, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.inflight) == 0, nil
	})
	c.cancelInflight()
}

// watchFleet watches the heartbeats of the run's agents and owners: a
// member whose process was replaced (a new instance) means the fleet
// restarted under the collector, and a recovery is due. It returns once
// the current heartbeats are read; the watch goes on in a goroutine of
// c.work until ctx ends.
//
// A watch that closes before ctx ends (nats.go closes its channel when its
// subscription closes, which past a Stop or ctx means its connection
// closed) fails the collection: a watch again on that connection cannot
// mend it, and running on blind would miss a fleet restart. The
// collection can be run again, and goes on where it was.
func (c *Collector) watchFleet(ctx context.Context) error {
	w, err := c.cfg.Bus.Members.Watch(ctx, events.MemberKeyFilter(c.cfg.Run))
	if err != nil {
		return fmt.Errorf("collect: watch members: %w", err)
	}
	loaded := make(chan error, 1)
	c.work.Go(func() {
		defer func() { _ = w.Stop() }()
		initial := true
		for {
			var (
				e  natsjs.KeyValueEntry
				ok bool
			)
			select {
			case <-ctx.Done():
				return
			case e, ok = <-w.Updates():
			}
			if !ok {
				if ctx.Err() != nil {
					return
				}
				err := errors.New("collect: the members' heartbeat watch closed: fleet restarts would go unseen")
				if initial {
					loaded <- err
					return
				}
				c.log.Error().Err(err).Msg("stopping the collection")
				c.mu.Lock()
				if c.fatal == nil {
					c.fatal = err
				}
				c.mu.Unlock()
				c.signal()
				return
			}
			if e == nil {
				if initial {
					initial = false
					loaded <- nil
				}
				continue
			}
			if e.Operation() != natsjs.KeyValuePut {
				continue
			}
			var info events.MemberInfo
			if json.Unmarshal(e.Value(), &info) != nil {
				continue
			}
			k := info.Member.Kind()
			if k != events.KindAgent && k != events.KindOwner {
				continue
			}
			c.mu.Lock()
			was, seen := c.instances[string(info.Member)]
			c.instances[string(info.Member)] = info.Instance
			if o, ok := events.OwnerOf(info.Capabilities); ok && k == events.KindAgent {
				c.agentOwner[info.Member.Name()] = o
			}
			c.mu.Unlock()
			if seen && was != info.Instance && !initial {
				select {
				case c.fleet <- string(info.Member) + " restarted":
				default:
				}
			}
		}
	})
	select {
	case err := <-loaded:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// isNoFreshMember tells the restore's refusal for want of a fresh fleet.
func isNoFreshMember(err error) bool {
	var ce *client.Error
	return errors.Is(err, bridgeapi.ErrNoFreshMember) || (errors.As(err, &ce) && ce.Code == "no_fresh_member")
}

// flushRetire retires the attempts finish queued for it.
func (c *Collector) flushRetire(ctx context.Context) {
	c.mu.Lock()
	eps := c.pendingRetire
	c.pendingRetire = nil
	c.mu.Unlock()
	if len(eps) == 0 {
		return
	}
	if err := c.retire(ctx, eps); err != nil {
		c.log.Warn().Err(err).Strs("episodes", eps).Msg("retire failed")
	}
}

// retireTries is how many times retire asks, a second apart: a retire
// during a recovery fails when a member is replaced by its new process
// while it runs, and a bridge that restarts refuses it for a moment.
const retireTries = 5

// retireAgain is how retire asks again while it fails (retireTries).
var retireAgain = live.Policy{
	Interval: poll.Every(time.Second),
	Tries:    retireTries,
	Again:    func(err error) bool { return err != nil },
}

// retire retires episodes on every member, asking again (retireAgain)
// while it fails: retiring is idempotent.
func (c *Collector) retire(ctx context.Context, eps []string) error {
	try := 0
	var err error
	_, err = live.Retry(ctx, retireAgain, func(ctx context.Context) (struct{}, error) {
		if try++; try > 1 {
			c.log.Warn().Err(err).Int("try", try).Msg("retire failed; asking again")
		}
		err = c.retireOnce(ctx, eps)
		return struct{}{}, err
	})
	return err
}

// retireOnce asks the bridge once to retire episodes.
func (c *Collector) retireOnce(ctx context.Context, eps []string) error {
	res, err := c.cfg.Controller.Retire(ctx, eps)
	if err != nil {
		return err
	}
	if res.Status != bridgeapi.StatusCompleted {
		reason := "failed"
		if res.Failure != nil {
			reason = res.Failure.Reason
		}
		return fmt.Errorf("retire of %d attempts: %s", len(eps), reason)
	}
	c.mu.Lock()
	c.sum.Retired += len(eps)
	c.mu.Unlock()
	return nil
}
