package bridge_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// TestRandomSequences runs seeded random interleavings of checkpoints
// (committed, blocked, failing writes, held then committed or aborted,
// with short and long deadlines), retires, forgets, releases and restores
// (some with a failing install), and checks PROTOCOL §7 invariants 1, 2
// and 6 after every step. STILLPOINT_SEED=<n> replays a seed; the seed is
// printed on failure. STILLPOINT_RANDOM_STEPS sets the length.
func TestRandomSequences(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("STILLPOINT_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("STILLPOINT_SEED=%q: %v", s, err)
		}
		seed = n
	}
	steps := 30
	if s := os.Getenv("STILLPOINT_RANDOM_STEPS"); s != "" {
		steps, _ = strconv.Atoi(s)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replay with: STILLPOINT_SEED=%d go test -run TestRandomSequences ./controller-bridge/", seed)
		}
	})
	t.Logf("seed %d, %d steps", seed, steps)
	rs := &randomRun{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), env: jstest.Start(t),
		committed: map[string]bool{}, failed: map[string]bool{}, marks: map[string]int{}}
	rs.hs = membertest.StartMembers(t, rs.env, run, 2, membertest.Options{Episodes: 2, Prefix: "g0-"})
	rs.b = startBridge(t, rs.env, bridge.Config{PhaseTimeout: 3 * time.Second})
	for i := range steps {
		op := rs.step(i)
		t.Logf("step %d: %s", i, op)
		rs.check(i)
		if t.Failed() {
			return
		}
	}
	// Invariant 1 in full: LATEST restores into a fresh fleet.
	if len(rs.committed) > 0 {
		rs.restore(false)
		rs.check(steps)
	}
}

type randomRun struct {
	t         *testing.T
	rng       *rand.Rand
	env       *jstest.Env
	b         *bridge.Bridge
	hs        []*membertest.Handle
	gen       int
	n         int
	work      int
	committed map[string]bool
	failed    map[string]bool
	marks     map[string]int // rollout → highest retired attempt, this fleet
	latest    string         // the checkpoint committed last: what a restore restores
}

func (r *randomRun) live() []events.Episode {
	var out []events.Episode
	for _, h := range r.hs {
		for _, k := range h.Participant.Live() {
			e, _ := events.ParseEpisode(k)
			out = append(out, e)
		}
	}
	return out
}

func (r *randomRun) step(i int) string {
	t := r.t
	switch x := r.rng.IntN(100); {
	case x < 45:
		return r.checkpoint()
	case x < 60:
		live := r.live()
		if len(live) == 0 {
			return "retire: nothing live"
		}
		ep := live[r.rng.IntN(len(live))]
		res, err := r.b.Retire(ctx(t), []string{ep.String()})
		if err != nil || res.Status != bridgeapi.StatusCompleted {
			t.Fatalf("retire %s: %+v %v", ep, res, err)
		}
		if ep.Attempt >= r.marks[ep.Rollout] {
			r.marks[ep.Rollout] = ep.Attempt
		}
		return "retire " + ep.String()
	case x < 68:
		for ro := range r.marks {
			if res, err := r.b.Forget(ctx(t), []string{ro}); err != nil || res.Status != bridgeapi.StatusCompleted {
				t.Fatalf("forget %s: %+v %v", ro, res, err)
			}
			delete(r.marks, ro)
			return "forget " + ro
		}
		return "forget: nothing retired"
	case x < 76:
		h := r.hs[r.rng.IntN(len(r.hs))]
		r.work++
		ep := events.Episode{Rollout: "w" + strconv.Itoa(r.work)}
		h.Participant.Add(ep)
		return "new work " + ep.String() + " on " + string(h.Name)
	case x < 84:
		res, err := r.b.Release(ctx(t), bridgeapi.ReleaseRequest{KeepLatest: 1 + r.rng.IntN(2)})
		if err != nil || res.Status != bridgeapi.StatusCompleted {
			t.Fatalf("release: %+v %v", res, err)
		}
		for _, id := range res.Deleted {
			delete(r.committed, id)
		}
		return fmt.Sprintf("release, deleted %v", res.Deleted)
	default:
		if len(r.committed) == 0 {
			return r.checkpoint()
		}
		return r.restore(r.rng.IntN(3) == 0)
	}
}

// checkpoint takes a checkpoint that commits or fails on purpose.
func (r *randomRun) checkpoint() string {
	t := r.t
	r.n++
	id := "c" + strconv.Itoa(r.n)
	timeout := int64(3000)
	if r.rng.IntN(2) == 0 {
		timeout = 800
	}
	expectFail, how := false, "plain"
	var undo func()
	switch x := r.rng.IntN(100); {
	case x < 20:
		live := r.live()
		if len(live) > 0 {
			ep := live[r.rng.IntN(len(live))]
			for _, h := range r.hs {
				h.Participant.Block(ep)
				undo = func() {
					for _, h := range r.hs {
						h.Participant.Unblock(ep)
					}
				}
			}
			expectFail, how = true, "blocked "+ep.String()
		}
	case x < 32:
		h := r.hs[r.rng.IntN(len(r.hs))]
		h.Participant.FailExport(errors.New("write failed"))
		undo = func() { h.Participant.FailExport(nil) }
		expectFail, how = true, "failing export on "+string(h.Name)
	case x < 45:
		how = "held"
	}
	var res *bridgeapi.CheckpointResult
	var err error
	if how == "held" {
		res, err = r.b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: id, TimeoutMS: timeout, Hold: true})
		if err != nil || res.Status != bridgeapi.StatusPrepared {
			t.Fatalf("hold %s: %+v %v", id, res, err)
		}
		if r.rng.IntN(2) == 0 {
			res, err = r.b.Abort(ctx(t), id)
			expectFail, how = true, "held then aborted"
		} else {
			res, err = r.b.Commit(ctx(t), id, false)
			how = "held then committed"
		}
	} else {
		res, err = r.b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: id, TimeoutMS: timeout})
	}
	if undo != nil {
		undo()
	}
	if err != nil {
		t.Fatalf("checkpoint %s (%s): %v", id, how, err)
	}
	switch {
	case expectFail && res.Status != bridgeapi.StatusFailed, !expectFail && res.Status != bridgeapi.StatusCommitted:
		t.Fatalf("checkpoint %s (%s): %s, %+v", id, how, res.Status, res.Failure)
	case res.Status == bridgeapi.StatusCommitted:
		r.committed[id] = true
		r.latest = id
	default:
		r.failed[id] = true
	}
	poll.Wait(t, 10*time.Second, "the fleet to reopen", func() bool { return allOpen(r.hs) })
	return fmt.Sprintf("checkpoint %s (%s, %d ms): %s", id, how, timeout, res.Status)
}

// exportedTo tells whether the member whose rollouts are named
// <prefix>-r<j> exported any of them to checkpoint id.
func (r *randomRun) exportedTo(id, name string) bool {
	if id == "" {
		return false
	}
	// The member manifests of the checkpoint: what each member exported,
	// its own rollouts and any work added to it since (w<n>).
	m := manifestOf(r.t, r.env, id)
	if m == nil {
		r.t.Fatalf("checkpoint %s has no manifest", id)
	}
	return slices.ContainsFunc(m.Members, func(mm events.MemberManifest) bool { return mm.Member.Name() == name && mm.Count > 0 })
}

// restore replaces the fleet by a fresh one and restores LATEST into it.
func (r *randomRun) restore(failOne bool) string {
	t := r.t
	for _, h := range r.hs {
		_ = h.Stop()
	}
	r.gen++
	r.hs = membertest.StartMembers(t, r.env, run, 2, membertest.Options{Prefix: "g0-"})
	// A failing install fails the restore only where there is something
	// to install: a member that exported nothing to LATEST has no manifest
	// in it and installs nothing (PROTOCOL §5, commit).
	expectFail := failOne && r.exportedTo(r.latest, r.hs[1].Member.Name().Name())
	if failOne {
		r.hs[1].Participant.FailInstall(errors.New("fork failed"))
	}
	res, err := r.b.Restore(ctx(t), bridgeapi.RestoreRequest{})
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	r.marks = map[string]int{}
	switch {
	case expectFail && res.Status != bridgeapi.StatusFailed, !expectFail && res.Status != bridgeapi.StatusCompleted:
		t.Fatalf("restore (fail one %v): %s %+v", failOne, res.Status, res.Failure)
	case res.Status == bridgeapi.StatusFailed:
		// Invariant 6: the retired next attempts are refused everywhere
		// and nothing of them is live.
		for _, k := range res.Retired {
			e, _ := events.ParseEpisode(k)
			if e.Attempt > r.marks[e.Rollout] {
				r.marks[e.Rollout] = e.Attempt
			}
		}
		r.hs[1].Participant.FailInstall(nil)
	}
	poll.Wait(t, 10*time.Second, "the fleet to reopen", func() bool { return allOpen(r.hs) })
	return fmt.Sprintf("restore (fail one %v): %s, %d restored, %d retired", failOne, res.Status, len(res.Restored), len(res.Retired))
}

// check asserts invariants 1, 2 and 6 of PROTOCOL §7.
func (r *randomRun) check(step int) {
	t := r.t
	for id := range r.committed {
		m := manifestOf(t, r.env, id)
		if m == nil || m.Aborted {
			t.Fatalf("step %d: committed %s has manifest %+v", step, id, m)
		}
		for _, mm := range m.Members {
			got, _, err := member.ReadRecords(ctx(t), r.env.Bus, run, id, mm.Member, nil)
			if err != nil {
				t.Fatalf("step %d: invariant 1: %s of %s does not verify: %v", step, mm.Member, id, err)
			}
			if got.SHA256 != mm.SHA256 {
				t.Fatalf("step %d: invariant 1: %s of %s changed", step, mm.Member, id)
			}
		}
	}
	for id := range r.failed {
		if m := manifestOf(t, r.env, id); m == nil || !m.Aborted {
			t.Fatalf("step %d: invariant 2: failed %s has key %+v, want an abort marker forever", step, id, m)
		}
	}
	for ro, mark := range r.marks {
		for a := 0; a <= mark; a++ {
			ep := events.Episode{Rollout: ro, Attempt: a}
			for _, h := range r.hs {
				if err := h.Member.Admit(ep); err == nil {
					t.Fatalf("step %d: invariant 6: %s admits retired %s", step, h.Name, ep)
				}
				for _, k := range h.Participant.Live() {
					if k == ep.String() {
						t.Fatalf("step %d: invariant 6: %s still holds retired %s", step, h.Name, ep)
					}
				}
			}
		}
	}
}
