package invariant_test

import (
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/invariant"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// Invariant 1 verifies what a checkpoint carries too: a carry whose
// source is gone, or marked released, fails it naming the source; and
// invariant 9 passes a run whose checkpoint carried what a gone member
// held.
func TestCarriedSourcesVerify(t *testing.T) {
	env := jstest.Start(t)
	ctx := t.Context()
	hs := membertest.StartMembers(t, env, run, 2, membertest.Options{Episodes: 1})
	b, js := runBridge(t, env)
	for _, id := range []string{"c1", "c2"} {
		if id == "c2" {
			_ = hs[1].Stop() // agent.t1 leaves, holding t1-r0
		}
		if res, err := b.Checkpoint(ctx, bridgeapi.CheckpointRequest{ID: id}); err != nil || res.Status != bridgeapi.StatusCommitted {
			t.Fatalf("%s: %+v %v", id, res, err)
		}
	}
	var ok invariant.Manifests
	ok.OnCommit(ctx, env.Bus, run, "c1")
	ok.OnCommit(ctx, env.Bus, run, "c2")
	r := invariant.Run{Run: run, JS: js, Bus: env.Bus, Manifests: &ok, NoTrajectories: true}
	got := invariant.Check(ctx, r)
	if !got[0].OK {
		t.Errorf("1 with c2 carrying from c1: %+v", got[0])
	}
	if !got[8].OK || !strings.Contains(got[8].Detail, "1 episodes carried") {
		t.Errorf("9 with c2 carrying from c1: %+v", got[8])
	}

	// c1's manifest gone: c2 restores no more.
	if err := env.Bus.Manifests.Delete(ctx, events.ManifestKey(run, "c1")); err != nil {
		t.Fatal(err)
	}
	var gone invariant.Manifests
	gone.OnCommit(ctx, env.Bus, run, "c2")
	r.Manifests = &gone
	if got := invariant.Check(ctx, r); got[0].OK || !strings.Contains(got[0].Detail, "carries 1 episodes from c1") {
		t.Errorf("1 with c2's carry source gone: %+v, want it failed naming c1", got[0])
	}
}
