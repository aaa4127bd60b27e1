package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/invariant"
	"github.com/stillpoint/stillpoint/controller-bridge/timeline"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/scripted"
)

// branchOptions shape branchWays: how many ways, and what to wait for
// before the checkpoint the branches come from (the rollouts caught
// mid-tool).
type branchOptions struct {
	ways   int
	caught func()
}

// branchWays runs the fleet's rollouts under the collector, checkpoints
// them mid-tool, branches the first one o.ways ways from that checkpoint
// while the fleet runs on, and takes a second checkpoint while the
// branches run. Every parent and every branch ends with one results line,
// graded; each branch's trajectory is its parent's calls up to the
// checkpoint, then its own (invariant 10), and its own calls reached the
// model server with its label and seed.
func branchWays(t *testing.T, f *fleet, o branchOptions) {
	ctx, cancel := context.WithTimeout(t.Context(), 12*time.Minute)
	defer cancel()
	c := f.collector(t)
	c.start()
	o.caught()
	f.checkpoint(ctx, "c1")
	parent := f.id(0)
	br, err := f.br.Branch(ctx, bridgeapi.BranchRequest{Source: "c1", Rollouts: []string{parent}, N: o.ways, Seed: 7})
	if err != nil || br.Status != bridgeapi.StatusCompleted || len(br.Branches) != o.ways {
		t.Fatalf("branch %s %d ways from c1: %+v %v", parent, o.ways, br, err)
	}
	seeds := map[string]uint64{}
	for _, b := range br.Branches {
		if b.Parent.Rollout != parent || br.Agents[b.Episode.Rollout] == "" {
			t.Fatalf("branch %+v: want one of %s, continued by a named agent (%v)", b, parent, br.Agents)
		}
		if seeds[fmt.Sprint(b.Seed)] != 0 {
			t.Errorf("two branches have seed %d", b.Seed)
		}
		seeds[b.Episode.Rollout] = b.Seed
		seeds[fmt.Sprint(b.Seed)] = 1
	}
	// The fleet's checkpoints go on while the branches run.
	c2 := f.checkpoint(ctx, "c2")
	if code := c.wait(10 * time.Minute); code != 0 {
		t.Fatalf("collect exited %d", code)
	}
	lines := c.readResults()
	for _, b := range br.Branches {
		r, ok := lines[b.Episode.Rollout]
		switch {
		case !ok:
			t.Errorf("%s: no result", b.Episode.Rollout)
			continue
		case !r.OK || r.Result == nil || len(r.Result.Verdict) == 0:
			t.Errorf("%s: not graded: %+v", b.Episode.Rollout, r)
			continue
		case r.BranchOf != parent || r.Branch != b.K:
			t.Errorf("%s: results line names branch %d of %q, want %d of %s", b.Episode.Rollout, r.Branch, r.BranchOf, b.K, parent)
		}
		var v scripted.Verdict
		if err := json.Unmarshal(r.Result.Verdict, &v); err != nil {
			t.Errorf("%s: verdict %s: %v", b.Episode.Rollout, r.Result.Verdict, err)
		}
	}
	if len(lines) != len(f.tasks)+o.ways {
		t.Errorf("%d results lines, want %d rollouts and %d branches", len(lines), len(f.tasks), o.ways)
	}
	held := 0
	for _, k := range append(append([]string{}, c2.Continued...), c2.Restarted...) {
		if ep, err := events.ParseEpisode(k); err == nil {
			if _, _, ok := events.ParseBranchRollout(ep.Rollout); ok {
				held++
			}
		}
	}
	if held == 0 {
		t.Errorf("c2, taken as the branches began, holds none of them (continued %v)", c2.Continued)
	}
	t.Logf("c2 committed while the branches ran, holding %d of them", held)
	tl, err := timeline.Read(ctx, f.env.JS, f.run, "")
	if err != nil {
		t.Fatal(err)
	}
	inv := invariant.Branches(ctx, invariant.Run{Run: f.run, JS: f.env.JS, Bus: f.env.Bus, Results: c.output, Model: f.ms}, tl)
	if !inv.OK {
		t.Errorf("invariant 10: %s", inv.Detail)
	}
	// Each branch's own calls reached the model server labelled.
	labelled := map[string]int{}
	for _, e := range f.ms.Ledger() {
		if e.Branch == "" {
			continue
		}
		want := ""
		for _, b := range br.Branches {
			if b.Label() == e.Branch && e.Seed == b.Seed {
				want = b.Episode.Rollout
			}
		}
		if want == "" {
			t.Errorf("a model call labelled %s seed %d: no branch made it", e.Branch, e.Seed)
		}
		labelled[want]++
	}
	for _, b := range br.Branches {
		if labelled[b.Episode.Rollout] == 0 {
			t.Errorf("%s: no model call of its own reached the model server with its label", b.Episode.Rollout)
		}
	}
}

// TestBranchMidToolFourWays: on overlay, a rollout caught mid-tool by a
// checkpoint is branched 4 ways from it; each branch relaunches on its
// fork's saved session, and is graded; the fleet checkpoints meanwhile.
func TestBranchMidToolFourWays(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.5, 30*time.Second)
	f := startFleet(t, fleetOptions{n: 2, concurrency: 2, toolSeconds: 4, steps: 1})
	branchWays(t, f, branchOptions{ways: 4, caught: func() { f.waitCalls(2, 3) }})
}

// TestMicroVMBranchInPlaceFourWays: on microvm, the branches of a rollout
// caught mid-tool continue in place: each fork's harness is the
// snapshot's, its relay re-pointed and labelled with the branch.
func TestMicroVMBranchInPlaceFourWays(t *testing.T) {
	tier.Heavy(t)
	parallel(t, 1, 3*time.Minute)
	requireMicroVM(t)
	f := startFleet(t, fleetOptions{n: 1, concurrency: 1, toolSeconds: 4, steps: 1, provider: "microvm"})
	branchWays(t, f, branchOptions{ways: 4, caught: func() { f.waitCalls(1, 3) }})
}

// TestOpenCodeBranchedEightWays: one OpenCode rollout, past its edit, is
// branched 8 ways from a checkpoint; each branch relaunches OpenCode on
// its fork's saved session, with no new user turn, and is graded.
func TestOpenCodeBranchedEightWays(t *testing.T) {
	tier.Heavy(t)
	parallel(t, 1, 3*time.Minute)
	f := startOpenCodeFleet(t, "oc-branch", 1, 1, "freeze", 5)
	branchWays(t, f, branchOptions{ways: 8, caught: func() {
		poll.Wait(t, 2*time.Minute, "the rollout past its edit", func() bool { return f.answered(f.id(0), turnEdit) })
	}})
	f.checkOpenCodeLedger(f.id(0), "")
}
