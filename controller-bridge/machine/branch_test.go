package machine

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
)

// branchView is a run whose LATEST c1 continues r1 (held by agent.a and
// owner.o), carries r2 from c0 (held by agent.b) and restarted r3.
func branchView() View {
	c0 := &events.CheckpointManifest{Run: "run1", CheckpointID: "c0", CommitSeq: 3}
	c1 := &events.CheckpointManifest{Run: "run1", CheckpointID: "c1", CommitSeq: 9, Continued: []string{"r1-a1"}, Restarted: []string{"r3"},
		Members: []events.MemberManifest{{Member: "agent.a", Episodes: []string{"r1-a1"}}, {Member: "owner.o", Episodes: []string{"r1-a1"}}},
		Carried: []events.Carry{{From: "c0", FromCommitSeq: 3, Episodes: []string{"r2"}, Members: []events.Member{"agent.b"}}}}
	return View{Seq: 11, Epoch: 2, Latest: &events.Latest{CheckpointID: "c1"}, Manifest: c1, Sources: map[string]*events.CheckpointManifest{"c0": c0},
		Members: []events.Member{"agent.a", "agent.b", "owner.o", "sandbox.s1"}}
}

// PROTOCOL §5, Branch: the branch goes to the parents' holders by name,
// in the run's epoch, with a carried parent read from its checkpoint and
// a seed per branch.
func TestAskBranch(t *testing.T) {
	m := New(Config{Run: "run1", PhaseTimeout: 10 * time.Second, ResumeTimeout: time.Second})
	effs, err := m.Step(time.Now(), BranchAsked{Request: bridgeapi.BranchRequest{Rollouts: []string{"r1", "r2"}, N: 2, Seed: 5}, View: branchView()})
	if err != nil {
		t.Fatal(err)
	}
	b := effs[0].(PublishPhase).Event.(events.Branch)
	if b.CheckpointID != "branch-12" || b.Seq != 12 || b.Epoch != 2 || b.Source != "c1" || b.SourceCommitSeq != 9 {
		t.Fatalf("branch %+v", b.PhaseHeader)
	}
	if want := []events.Member{"agent.a", "agent.b", "owner.o"}; !slices.Equal(b.Members, want) || b.Sandboxes != nil {
		t.Fatalf("addressed %v (sandboxes %v), want %v and no daemon", b.Members, b.Sandboxes, want)
	}
	if len(b.Carried) != 1 || b.Carried[0].Source != "c0" || b.Carried[0].SourceCommitSeq != 3 ||
		!slices.Equal(b.Carried[0].Episodes, []events.Episode{{Rollout: "r2"}}) {
		t.Fatalf("carried %+v", b.Carried)
	}
	var got []string
	for _, s := range b.Branches {
		got = append(got, s.Episode.String())
		if s.Seed != bridgeapi.BranchSeed(5, s.Parent.Rollout, s.K) {
			t.Errorf("%s: seed %d", s.Episode, s.Seed)
		}
	}
	if want := []string{"r1.b1-a2", "r1.b2-a2", "r2.b1-a1", "r2.b2-a1"}; !slices.Equal(got, want) {
		t.Fatalf("branches %v, want %v", got, want)
	}
	if m.State() != StateBranching || m.Open() != "branch branch-12" {
		t.Fatalf("state %s, open %q", m.State(), m.Open())
	}
}

// Refused before any phase, naming the rollout or the member.
func TestAskBranchRefuses(t *testing.T) {
	for _, c := range []struct {
		name string
		req  bridgeapi.BranchRequest
		view func(v *View)
		err  error
		says string
	}{
		{"restarted", bridgeapi.BranchRequest{Rollouts: []string{"r3"}, N: 1}, nil, bridgeapi.ErrBadRequest, "r3: checkpoint c1 holds it as restarted"},
		{"not held", bridgeapi.BranchRequest{Rollouts: []string{"r9"}, N: 1}, nil, bridgeapi.ErrBadRequest, "r9: checkpoint c1 does not hold it"},
		{"holder gone", bridgeapi.BranchRequest{Rollouts: []string{"r2"}, N: 1}, func(v *View) { v.Members = v.Members[:1] },
			bridgeapi.ErrBadRequest, "[agent.b]"},
		{"no LATEST", bridgeapi.BranchRequest{Rollouts: []string{"r1"}, N: 1}, func(v *View) { v.Latest, v.Manifest = nil, nil },
			bridgeapi.ErrNotFound, "no LATEST"},
		{"aborted", bridgeapi.BranchRequest{Source: "c1", Rollouts: []string{"r1"}, N: 1}, func(v *View) { v.Manifest.Aborted = true },
			bridgeapi.ErrNotFound, "c1"},
		{"carried from a released one", bridgeapi.BranchRequest{Rollouts: []string{"r2"}, N: 1},
			func(v *View) { v.Sources["c0"].Released = &events.ReleaseMark{Op: "release-4"} }, bridgeapi.ErrReleased, "c0"},
		{"branch exists", bridgeapi.BranchRequest{Rollouts: []string{"r1"}, N: 1}, func(v *View) {
			v.Manifest.Continued = append(v.Manifest.Continued, "r1.b1-a2")
			v.Manifest.Members[0].Episodes = append(v.Manifest.Members[0].Episodes, "r1.b1-a2")
		}, bridgeapi.ErrBadRequest, "holds r1.b1 already"},
	} {
		v := branchView()
		if c.view != nil {
			c.view(&v)
		}
		m := New(Config{Run: "run1", PhaseTimeout: 10 * time.Second, ResumeTimeout: time.Second})
		_, err := m.Step(time.Now(), BranchAsked{Request: c.req, View: v})
		if !errors.Is(err, c.err) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want %v saying %q", c.name, err, c.err, c.says)
		}
		if m.State() != StateIdle {
			t.Errorf("%s: state %s after a refusal", c.name, m.State())
		}
	}
}
