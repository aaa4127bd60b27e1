package agent

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// branchSandbox is an endless sandbox with a relay that notes what the
// agent asks of it: every launch request and every re-point.
type branchSandbox struct {
	*endlessSandbox
	mu       sync.Mutex
	launches []sandboxapi.LaunchRequest
	repoints []sandboxapi.RepointRequest
}

func (s *branchSandbox) Launch(ctx context.Context, r sandboxapi.LaunchRequest) (sandboxapi.Record, error) {
	s.mu.Lock()
	s.launches = append(s.launches, r)
	s.mu.Unlock()
	return s.endlessSandbox.Launch(ctx, r)
}

func (s *branchSandbox) RelayStatus(context.Context) (sandboxapi.RelayStatus, error) {
	return sandboxapi.RelayStatus{Up: true, URL: "http://127.0.0.1:18480/v1"}, nil
}

func (s *branchSandbox) RepointWith(_ context.Context, rq sandboxapi.RepointRequest) (sandboxapi.RelayStatus, error) {
	s.mu.Lock()
	s.repoints = append(s.repoints, rq)
	s.mu.Unlock()
	return sandboxapi.RelayStatus{Up: true, URL: "http://127.0.0.1:18480/v1", Upstream: rq.URL, Generation: rq.Generation,
		Capture: &sandboxapi.CaptureStatus{Path: "/capture.jsonl"}}, nil
}

// Branch installs, per branch of a parent's bookmark, the bookmark
// rewritten as the branch's; the controller's request for <r>.b<k> at the
// branch's attempt continues from it, in the session the owner's branch
// forked, and its launch and re-point carry the branch's label and seed.
// A branch whose rollout is installed, running or finished here is
// refused; a record of no parent is left alone; a parent whose harness
// finished is refused.
func TestBranchContinuesFromTheParentsBookmark(t *testing.T) {
	w := newWorld(t)
	sb := &branchSandbox{endlessSandbox: newEndlessSandbox()}
	a, _ := startAgent(t, w, newStallingOwner(t, w, ""), func(string) (Sandbox, error) { return sb, nil },
		func(c *Config) { c.ModelURL = "http://model.invalid:1" })
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	// The parent r1 is checkpointed at its launch bookmark in c1, beside
	// r2; the owner holds their sessions' snapshots.
	for _, r := range []string{"r1", "r2"} {
		if _, err := w.owner.StartSession(ctx, r, events.Episode{Rollout: r}, provider.Spec{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.owner.Prepare(ctx, member.Checkpoint{Run: testRun, ID: "c1"}); err != nil {
		t.Fatal(err)
	}
	orecs, err := membertest.Drain(w.owner.Export(ctx, events.Commit{PhaseHeader: events.PhaseHeader{Run: testRun, CheckpointID: "c1"}}))
	if err != nil || len(orecs) != 2 {
		t.Fatalf("owner export: %v %v", orecs, err)
	}
	if err := w.owner.Resume(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	parent := agentapi.Bookmark{V: 1, Next: agentapi.StageLaunch, Rollout: "r1", Task: task, Session: "r1", Owner: "o1",
		Sandbox: "sb-old", State: json.RawMessage(`{"data_dir":"/d"}`), Resume: true}
	other := parent
	other.Rollout, other.Session = "r2", "r2"
	arecs := []events.Record{record(t, "r1", parent), record(t, "r2", other)}

	b := events.Branch{PhaseHeader: events.PhaseHeader{Run: testRun, CheckpointID: "branch-1"}, Source: "c1"}
	for k := 1; k <= 3; k++ {
		b.Branches = append(b.Branches, events.NewBranchSpec(events.Episode{Rollout: "r1"}, k, uint64(40+k)))
	}
	if _, err := w.owner.Branch(ctx, b, orecs); err != nil {
		t.Fatalf("owner Branch: %v", err)
	}
	eps, err := a.Branch(ctx, b, arecs)
	if err != nil {
		t.Fatalf("agent Branch: %v", err)
	}
	if len(eps) != 3 || eps[1] != (events.Episode{Rollout: "r1.b2", Attempt: 1}) {
		t.Fatalf("branched %v", eps)
	}
	a.mu.Lock()
	bm, ok := a.installed["r1.b2"]
	_, r2 := a.installed["r2.b1"]
	n := len(a.installed)
	a.mu.Unlock()
	want := agentapi.BranchRef{Parent: "r1", K: 2, Seed: 42, Source: "c1", Label: "b2"}
	if !ok || bm.Rollout != "r1.b2" || bm.Attempt != 1 || bm.Session != "r1.b2" || bm.Sandbox != "" || bm.Branch == nil || *bm.Branch != want ||
		string(bm.State) != `{"data_dir":"/d"}` || bm.Next != agentapi.StageLaunch {
		t.Fatalf("installed %+v (branch %+v)", bm, bm.Branch)
	}
	if r2 || n != 3 {
		t.Fatalf("%d bookmarks installed (r2's branch: %v), want r1's 3 alone", n, r2)
	}

	// The collector asks for r1.b2 as for a restored attempt.
	done := make(chan error, 1)
	go func() {
		_, err := a.Rollout(ctx, agentapi.Request{RolloutID: "r1.b2", Attempt: 1, Task: task})
		done <- err
	}()
	select {
	case <-sb.waited:
	case err := <-done:
		t.Fatalf("the branch ended before its launch was waited for: %v", err)
	case <-ctx.Done():
		t.Fatal("the branch was never launched")
	}
	label := sandboxapi.BranchLabel{Label: "b2", Seed: 42, Episode: "r1.b2-a1"}
	sb.mu.Lock()
	launches, repoints := sb.launches, sb.repoints
	sb.mu.Unlock()
	if len(launches) == 0 || len(repoints) == 0 {
		t.Fatalf("%d launches and %d re-points, want some of each", len(launches), len(repoints))
	}
	for _, l := range launches {
		if l.Branch == nil || *l.Branch != label || l.Episode != "r1.b2-a1" || !strings.HasPrefix(l.LaunchID, "r1.b2-a1.") {
			t.Errorf("launch %s of episode %s: branch %+v, want %+v", l.LaunchID, l.Episode, l.Branch, label)
		}
	}
	for _, rp := range repoints {
		if rp.Branch == nil || *rp.Branch != label {
			t.Errorf("re-point %+v: branch %+v, want %+v", rp, rp.Branch, label)
		}
	}
	if info, err := w.owner.RequireSandbox("r1.b2"); err != nil || info.Episode != eps[1] {
		t.Errorf("the owner's branch session: %+v %v", info, err)
	}

	// The same branches again: r1.b2 runs, r1.b1 and r1.b3 are installed.
	_, err = a.Branch(ctx, b, arecs)
	for _, s := range []string{"r1.b1: attempt 1 is installed", "r1.b2: attempt 1 runs", "r1.b3: attempt 1 is installed"} {
		if !errors.Is(err, ErrBranchExists) || !strings.Contains(err.Error(), s) {
			t.Errorf("Branch again: %v, want ErrBranchExists naming %q", err, s)
		}
	}

	// A parent whose harness finished has nothing to continue.
	graded := parent
	graded.Next = agentapi.StageVerify
	if _, err := a.Branch(ctx, b, []events.Record{record(t, "r1", graded)}); err == nil || !strings.Contains(err.Error(), "harness has finished") {
		t.Errorf("Branch of a parent at verify: %v", err)
	}

	cancel()
	if err := <-done; err == nil {
		t.Fatal("the cancelled branch returned a result")
	}
	if err := a.Retire(t.Context(), eps); err != nil {
		t.Fatal(err)
	}
	if err := w.owner.Retire(t.Context(), append(eps, events.Episode{Rollout: "r1"}, events.Episode{Rollout: "r2"})); err != nil {
		t.Fatal(err)
	}
	if _, err := w.owner.Release(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
}

// A branch's finished rollout is refused a second branch of the same
// rollout id: its answer stands.
func TestBranchOfAFinishedRolloutIsRefused(t *testing.T) {
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stored := &agentapi.Result{RolloutID: "r1.b1", Attempt: 1, Episode: "r1.b1-a1", Adapter: "test", Verdict: json.RawMessage(`{"reward":1}`)}
	done := agentapi.Bookmark{V: 1, Next: agentapi.StageReturn, Rollout: "r1.b1", Attempt: 0, Task: task, Result: stored}
	if _, err := w.agent.Install(ctx, events.Restore{}, []events.Record{record(t, "r1.b1", done)}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.agent.Rollout(ctx, agentapi.Request{RolloutID: "r1.b1", Attempt: 1, Task: task}); err != nil {
		t.Fatal(err)
	}
	parent := agentapi.Bookmark{V: 1, Next: agentapi.StageSeed, Rollout: "r1", Task: task}
	b := events.Branch{Source: "c1", Branches: []events.BranchSpec{events.NewBranchSpec(events.Episode{Rollout: "r1"}, 1, 7)}}
	if _, err := w.agent.Branch(ctx, b, []events.Record{record(t, "r1", parent)}); !errors.Is(err, ErrBranchExists) || !strings.Contains(err.Error(), "r1.b1: attempt 1 ran") {
		t.Fatalf("Branch of a finished rollout: %v, want ErrBranchExists naming it", err)
	}
}

// A branch's trajectory header counts the calls the fork's capture
// inherited: those at the head of the file that are not the branch's own
// (any attempt of the branch's rollout); a rollout that is no branch has
// none.
func TestTrajectoryBranchHeader(t *testing.T) {
	calls := func(eps ...string) []trajectory.Whole {
		var out []trajectory.Whole
		for _, e := range eps {
			out = append(out, trajectory.Whole{Call: &trajectory.Call{Episode: e}})
		}
		return out
	}
	bm := agentapi.Bookmark{Rollout: "r1.b2", Attempt: 2,
		Branch: &agentapi.BranchRef{Parent: "r1-a1", K: 2, Seed: 9, Source: "c3", Label: "b2"}}
	got := trajectoryBranch(bm, calls("r1", "r1-a1", "r1-a1", "r1.b2-a2", "r1.b2-a3"))
	want := agentapi.TrajectoryBranch{Parent: "r1", ParentEpisode: "r1-a1", K: 2, Seed: 9, Source: "c3", At: 3}
	if got == nil || *got != want {
		t.Fatalf("header %+v, want %+v", got, want)
	}
	if got := trajectoryBranch(bm, calls("r1", "r1")); got.At != 2 {
		t.Errorf("a branch that made no call yet: at %d, want 2", got.At)
	}
	// In place, the fork's harness keeps the parent's episode: its own
	// calls are those the relay sent with the branch's label and seed (a
	// sibling's label, with another seed, is not its own).
	inPlace := calls("r1-a1", "r1-a1", "r1-a1", "r1-a1")
	inPlace[1].Branch, inPlace[1].Seed = "b2", 5
	inPlace[2].Branch, inPlace[2].Seed = "b2", 9
	inPlace[3].Branch, inPlace[3].Seed = "b2", 9
	if got := trajectoryBranch(bm, inPlace); got.At != 2 {
		t.Errorf("a branch that continued in place: at %d, want 2", got.At)
	}
	if got := trajectoryBranch(agentapi.Bookmark{Rollout: "r1"}, calls("r1")); got != nil {
		t.Errorf("a rollout that is no branch has header %+v", got)
	}
}
