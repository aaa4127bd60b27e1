package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/collect/tasks"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/metrics"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/scripted"
)

// agentRecords reads the bookmarks agent name exported in checkpoint.
func (f *fleet) agentRecords(ctx context.Context, checkpoint, name string) map[string]agentapi.Bookmark {
	f.t.Helper()
	_, recs, err := member.ReadRecords(ctx, f.env.Bus, f.run, checkpoint, events.Member("agent."+name), nil)
	if err != nil {
		f.t.Fatalf("records of agent.%s in %s: %v", name, checkpoint, err)
	}
	out := map[string]agentapi.Bookmark{}
	for _, r := range recs {
		bm, err := agentapi.DecodeBookmark(r.Data)
		if err != nil {
			f.t.Fatalf("record %s: %v", r.Key, err)
		}
		out[r.Key] = bm
	}
	return out
}

func reward(t testing.TB, res agentapi.Result) float64 {
	t.Helper()
	var v scripted.Verdict
	if err := json.Unmarshal(res.Verdict, &v); err != nil {
		t.Fatalf("verdict of %s: %s: %v", res.Episode, res.Verdict, err)
	}
	if v.Reward != 1 {
		t.Errorf("%s: reward %v: %s", res.Episode, v.Reward, v.Detail)
	}
	return v.Reward
}

// TestPausedLaunchContinuesInPlace: through the real agent, owner and
// sandboxd processes, a launch caught mid-tool by two checkpoints in a row
// is exported at its harness bookmark with resume set, continues in place
// after each (one launch, two pauses), and finishes with its grade; no
// model call is repeated and no user turn injected.
func TestPausedLaunchContinuesInPlace(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.25, 10*time.Second)
	f := startFleet(t, fleetOptions{n: 1, toolSeconds: 4, steps: 1})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	out := f.dispatch(ctx, 0, 0)
	f.waitCalls(1, 3) // the computing call was answered: its tool sleeps 4 s
	for _, id := range []string{"c1", "c2"} {
		res := f.checkpoint(ctx, id)
		if len(res.Continued) != 1 {
			t.Fatalf("%s continued %v", id, res.Continued)
		}
		bm := f.agentRecords(ctx, id, "a1")[tasks.ID(0)]
		if bm.Next != agentapi.StageLaunch || !bm.Resume || len(bm.Launches) != 1 {
			t.Fatalf("%s: exported bookmark next %s resume %v launches %+v", id, bm.Next, bm.Resume, bm.Launches)
		}
	}
	o := <-out
	if o.err != nil {
		t.Fatalf("rollout: %v", o.err)
	}
	reward(t, o.res)
	f.checkTrajectory(o.res)
	if len(o.res.Launches) != 1 || o.res.Launches[0].Pauses != 2 || o.res.Launches[0].Ended != agentapi.LaunchFinished {
		t.Fatalf("launch log %+v, want one finished launch paused twice", o.res.Launches)
	}
	if r := f.ms.Repeats(); len(r) != 0 {
		t.Fatalf("repeated model calls: %v", r)
	}
	for _, e := range f.ms.Ledger() {
		if e.UserTurns != 1 {
			t.Fatalf("a request with %d user turns: a turn was injected", e.UserTurns)
		}
	}
	if rel, err := f.br.Release(ctx, bridgeapi.ReleaseRequest{}); err != nil || rel.Status != bridgeapi.StatusCompleted {
		t.Fatalf("final release: %+v %v", rel, err)
	}
}

// callsOf counts the model calls of each task whose reply was delivered.
func (f *fleet) callsOf() map[string]int {
	n := map[string]int{}
	for _, e := range f.ms.Ledger() {
		if !e.Delivered.IsZero() {
			n[e.Task]++
		}
	}
	return n
}

// waitCalls waits up to 30 s until each of the first n tasks got the
// replies of at least calls model calls.
func (f *fleet) waitCalls(n, calls int) {
	f.t.Helper()
	f.waitCallsWithin(n, calls, 30*time.Second)
}

// waitCallsWithin is waitCalls with a deadline of its own.
func (f *fleet) waitCallsWithin(n, calls int, within time.Duration) {
	f.t.Helper()
	poll.Wait(f.t, within, fmt.Sprintf("the replies of %d model calls of each of %d tasks", calls, n), func() bool {
		got := f.callsOf()
		for i := range n {
			if got[f.tasks[i].RolloutID] < calls {
				return false
			}
		}
		return true
	})
}

// checkLedger asserts PROTOCOL §7, invariant 4, on the model server's ledger: no call
// repeated after its reply was saved, none injected, and a call re-issued
// by a later attempt only if the earlier one saved its reply after the
// restored checkpoint began, or never (the crash abandoned it).
func (f *fleet) checkLedger(restoredFrom time.Time) {
	f.t.Helper()
	if r := f.ms.Repeats(); len(r) != 0 {
		f.t.Errorf("repeated model calls: %v", r)
	}
	for _, e := range f.ms.Ledger() {
		if e.UserTurns != max(f.userTurns, 1) {
			f.t.Errorf("%s: a request with %d user turns: a turn was injected", e.Task, e.UserTurns)
		}
	}
	for _, r := range f.ms.Reissued() {
		if !r.Saved.IsZero() && (restoredFrom.IsZero() || r.Saved.Before(restoredFrom)) {
			f.t.Errorf("%s: %s re-issued a call whose reply %s had saved at %s, before the restored checkpoint",
				r.Task, r.Later, r.Earlier, r.Saved.Format(time.StampMilli))
		}
	}
}

// TestCrashRestoreRelaunchesOnSavedSession: rollouts caught mid-tool by a
// checkpoint; then kill -9 of the agent and the owner (the restarted owner
// stops the sandboxes they left, daemons and harnesses with them). The
// restore forks every sandbox; asked again as the next attempt, each
// rollout relaunches in its fork on the saved session, continues it, and
// finishes with a full grade and no repeated model call.
func TestCrashRestoreRelaunchesOnSavedSession(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.25, 15*time.Second)
	const n = 4
	f := startFleet(t, fleetOptions{n: n, concurrency: n, toolSeconds: 3, steps: 1})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	lost, abandon := context.WithCancel(ctx)
	var first []<-chan outcome
	for i := range n {
		first = append(first, f.dispatch(lost, i, 0))
	}
	f.waitCalls(n, 3) // each is in its 3 s computing tool
	began := time.Now()
	res := f.checkpoint(ctx, "c1")
	if len(res.Continued) != n {
		t.Fatalf("c1 continued %v", res.Continued)
	}
	f.kill9("agent-a1", "owner")
	abandon()
	for _, ch := range first {
		if o := <-ch; o.err == nil {
			t.Fatalf("a rollout returned across the crash: %+v", o.res)
		}
	}
	f.startOwner()
	f.startAgent("a1", "--concurrency", fmt.Sprint(n))
	rr, err := f.br.Restore(ctx, bridgeapi.RestoreRequest{})
	if err != nil || rr.Status != bridgeapi.StatusCompleted {
		t.Fatalf("restore: %+v %v", rr, err)
	}
	var second []<-chan outcome
	for i := range n {
		second = append(second, f.dispatch(ctx, i, 1))
	}
	for i, ch := range second {
		o := <-ch
		if o.err != nil {
			t.Fatalf("%s after the restore: %v", tasks.ID(i), o.err)
		}
		reward(t, o.res)
		f.checkTrajectory(o.res)
		last := o.res.Launches[len(o.res.Launches)-1]
		if !o.res.Restored || len(o.res.Launches) != 2 || !last.Continued || last.Attempt != 1 || o.res.Launches[0].Attempt != 0 {
			t.Errorf("%s: restored %v, launch log %+v: want the attempt-0 launch, then one attempt-1 launch that continued the session",
				tasks.ID(i), o.res.Restored, o.res.Launches)
		}
	}
	f.checkLedger(began)
	if rel, err := f.br.Release(ctx, bridgeapi.ReleaseRequest{}); err != nil || rel.Status != bridgeapi.StatusCompleted {
		t.Fatalf("final release: %+v %v", rel, err)
	}
}

// TestQueuedRunExportedAtSeed: with one slot, a second rollout waits
// registered at its seed bookmark; a checkpoint exports it there instead of
// waiting for it, and it runs after the resume.
func TestQueuedRunExportedAtSeed(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.25, 10*time.Second)
	f := startFleet(t, fleetOptions{n: 2, concurrency: 1, toolSeconds: 3, steps: 1})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	a := f.dispatch(ctx, 0, 0)
	f.waitCalls(1, 1) // the first holds the slot
	b := f.dispatch(ctx, 1, 0)
	f.waitCalls(1, 3)
	f.checkpoint(ctx, "c1")
	recs := f.agentRecords(ctx, "c1", "a1")
	if bm := recs[tasks.ID(1)]; bm.Next != agentapi.StageSeed {
		t.Fatalf("the queued rollout was exported at %q, want seed", bm.Next)
	}
	if bm := recs[tasks.ID(0)]; bm.Next != agentapi.StageLaunch || !bm.Resume {
		t.Fatalf("the running rollout was exported at %q resume %v", bm.Next, bm.Resume)
	}
	for _, ch := range []<-chan outcome{a, b} {
		o := <-ch
		if o.err != nil {
			t.Fatal(o.err)
		}
		reward(t, o.res)
		f.checkTrajectory(o.res)
		if len(o.res.Launches) != 1 {
			t.Errorf("%s: launch log %+v", o.res.Episode, o.res.Launches)
		}
	}
	f.checkLedger(time.Time{})
}

// TestAdapterThatDoesNotPauseIsStoppedAndRelaunched: an adapter that does
// not pause gets its launch stopped at prepare (the daemon leaves it
// alone) and relaunched after the resume on its saved session. The agent's
// /metrics counts the fallback with its reason.
func TestAdapterThatDoesNotPauseIsStoppedAndRelaunched(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.25, 5*time.Second)
	f := startFleet(t, fleetOptions{n: 1, noPause: true, toolSeconds: 3, steps: 1, agentArgs: []string{"--metrics-addr", "127.0.0.1:0"}})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	out := f.dispatch(ctx, 0, 0)
	f.waitCalls(1, 3)
	f.checkpoint(ctx, "c1")
	bm := f.agentRecords(ctx, "c1", "a1")[tasks.ID(0)]
	if bm.Next != agentapi.StageLaunch || !bm.Resume || len(bm.Launches) != 1 || bm.Launches[0].Ended != agentapi.LaunchInterrupted {
		t.Fatalf("exported bookmark %s resume %v launches %+v", bm.Next, bm.Resume, bm.Launches)
	}
	f.mu.Lock()
	agent := f.procs["agent-a1"]
	f.mu.Unlock()
	m, err := agent.WaitOutput(ctx, regexp.MustCompile(`metrics on (http://\S+)`))
	if err != nil {
		t.Fatal(err)
	}
	fams, err := metrics.Scrape(ctx, m[1])
	if err != nil {
		t.Fatal(err)
	}
	if n := fams.Sum("stillpoint_relaunch_fallbacks_total", map[string]string{"reason": metrics.FallbackNoPause}); n != 1 {
		t.Errorf("fallbacks for %s: %v, want 1", metrics.FallbackNoPause, n)
	}
	if n := fams.Sum("stillpoint_pauses_total", nil); n != 0 {
		t.Errorf("pauses counted for an adapter that does not pause: %v", n)
	}
	o := <-out
	if o.err != nil {
		t.Fatal(o.err)
	}
	reward(t, o.res)
	f.checkTrajectory(o.res)
	l := o.res.Launches
	if len(l) != 2 || l[0].Ended != agentapi.LaunchInterrupted || l[0].Pauses != 0 || !l[1].Continued || l[1].Ended != agentapi.LaunchFinished {
		t.Fatalf("launch log %+v: want one interrupted launch, then one that continued the session", l)
	}
	f.checkLedger(time.Time{})
}

// TestManyRolloutsThroughCheckpointsAndACrash: 64 concurrent rollouts on
// two agents go through two checkpoints, a kill -9 of both agents and the
// owner, a restore, and a third checkpoint. Every rollout returns exactly
// one result with a full grade; a rollout that returned before the crash
// has its restored attempt retired instead of run again; no model call is
// repeated and no user turn injected.
func TestManyRolloutsThroughCheckpointsAndACrash(t *testing.T) {
	tier.E2E(t)
	parallel(t, 1, 35*time.Second)
	const n = 64
	f := startFleet(t, fleetOptions{n: n, agents: 2, concurrency: n, toolSeconds: 1.5, steps: 2})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	var (
		mu      sync.Mutex
		results = map[string][]agentapi.Result{}
	)
	awaitResult := func(i int, ch <-chan outcome, crashed <-chan struct{}) {
		o := <-ch
		if o.err != nil {
			select {
			case <-crashed: // its agent died: the restore continues it
			default:
				t.Errorf("%s: %v", tasks.ID(i), o.err)
			}
			return
		}
		mu.Lock()
		results[tasks.ID(i)] = append(results[tasks.ID(i)], o.res)
		mu.Unlock()
	}
	lost, abandon := context.WithCancel(ctx)
	crashed := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		ch := f.dispatch(lost, i, 0)
		wg.Go(func() { awaitResult(i, ch, crashed) })
	}
	f.waitCalls(n, 2)
	f.checkpoint(ctx, "c1")
	f.waitCalls(n/2, 4)
	began := time.Now()
	f.checkpoint(ctx, "c2")
	close(crashed)
	f.kill9("agent-a1", "agent-a2", "owner")
	abandon()
	wg.Wait()
	f.startOwner()
	for _, a := range f.agents {
		f.startAgent(a, "--concurrency", fmt.Sprint(n))
	}
	rr, err := f.br.Restore(ctx, bridgeapi.RestoreRequest{})
	if err != nil || rr.Status != bridgeapi.StatusCompleted {
		t.Fatalf("restore: %+v %v", rr, err)
	}
	var done []string
	mu.Lock()
	for i := range n {
		if len(results[tasks.ID(i)]) > 0 {
			done = append(done, events.Episode{Rollout: tasks.ID(i), Attempt: 1}.String())
			continue
		}
		ch := f.dispatch(ctx, i, 1)
		wg.Go(func() { awaitResult(i, ch, nil) })
	}
	mu.Unlock()
	if len(done) > 0 {
		if r, err := f.br.Retire(ctx, done); err != nil || r.Status != bridgeapi.StatusCompleted {
			t.Fatalf("retire of the restored attempts of finished rollouts: %+v %v", r, err)
		}
	}
	f.checkpoint(ctx, "c3")
	wg.Wait()
	for i := range n {
		rs := results[tasks.ID(i)]
		if len(rs) != 1 {
			t.Errorf("%s: %d results, want exactly 1", tasks.ID(i), len(rs))
			continue
		}
		reward(t, rs[0])
		f.checkTrajectory(rs[0])
	}
	t.Logf("%d rollouts returned before the crash, %d after the restore", len(done), n-len(done))
	f.checkLedger(began)
	if rel, err := f.br.Release(ctx, bridgeapi.ReleaseRequest{}); err != nil || rel.Status != bridgeapi.StatusCompleted {
		t.Fatalf("final release: %+v %v", rel, err)
	}
}
