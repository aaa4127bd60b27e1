package e2e

import (
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
)

// manifest reads checkpoint id's manifest (as the KV keeps it: no
// members).
func (f *fleet) manifest(id string) (events.CheckpointManifest, bool) {
	var m events.CheckpointManifest
	e, err := f.env.Bus.Manifests.Get(f.t.Context(), events.ManifestKey(f.run, id))
	if err != nil || json.Unmarshal(e.Value(), &m) != nil {
		return m, false
	}
	return m, true
}

// waitHeld waits for a checkpoint that continues the fleet's first two
// rollouts (both mid-tool) and returns them, sorted, and its id.
func (f *fleet) waitHeld() ([]string, string) {
	f.t.Helper()
	rollouts := []string{f.tasks[0].RolloutID, f.tasks[1].RolloutID}
	slices.Sort(rollouts)
	var held string
	poll.Wait(f.t, time.Minute, "a checkpoint that holds both rollouts mid-tool", func() bool {
		id := f.latest(f.t.Context())
		m, ok := f.manifest(id)
		if ok && slices.Equal(m.Continued, rollouts) {
			held = id
			return true
		}
		return false
	})
	return rollouts, held
}

// TestPreemptedWhileANodeIsDown: PROTOCOL §5, Progress only moves forward.
// Both rollouts are mid-tool when a checkpoint commits; then their node
// dies (the agent and the owner are killed with SIGKILL) and the scheduler
// preempts the job (SIGTERM to the collector). The checkpoint with stop
// fails while the dead members' leases run, then commits without them and
// carries both rollouts from the checkpoint that held them. The rerun, on
// a fresh fleet, restores it and continues both from there: none starts
// over, and every model call before that checkpoint is answered once.
func TestPreemptedWhileANodeIsDown(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.25, 110*time.Second)
	f := startFleet(t, fleetOptions{n: 2, agents: 1, concurrency: 2, toolSeconds: 30, steps: 1})
	c := f.collector(t)
	c.start("--checkpoint-every", "2s")
	f.waitCalls(2, 1)
	rollouts, held := f.waitHeld()

	f.kill9("agent-a1", "owner")
	c.signal(syscall.SIGTERM)
	if code := c.wait(3 * time.Minute); code != collect.ExitStopped {
		t.Fatalf("collect exited %d after SIGTERM, want %d (stopped after a committed checkpoint)", code, collect.ExitStopped)
	}
	last := f.latest(t.Context())
	m, ok := f.manifest(last)
	if !ok || last == held || !m.Stop {
		t.Fatalf("LATEST is %s (%+v), want the stop checkpoint after %s", last, m, held)
	}
	if got := events.CarriedEpisodes(m.Carried); !slices.Equal(got, rollouts) || len(m.Continued) != 0 {
		t.Fatalf("the stop checkpoint %s continues %v and carries %v, want both rollouts carried", last, m.Continued, got)
	}
	for _, cr := range m.Carried {
		if cr.From != held {
			t.Errorf("%s carries %v from %s, want from %s, the last checkpoint that held them", last, cr.Episodes, cr.From, held)
		}
	}

	// The job comes back on a fresh fleet; the rerun restores.
	f.startOwner()
	f.startAgent("a1", "--concurrency", "2")
	c.start()
	if code := c.wait(4 * time.Minute); code != 0 {
		t.Fatalf("the rerun exited %d", code)
	}
	for _, r := range c.results() {
		if r.Attempt == 0 || r.Result == nil || !r.Result.Restored {
			t.Errorf("%s: attempt %d, restored %v: want it continued from %s", r.RolloutID, r.Attempt, r.Result != nil && r.Result.Restored, held)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := c.p.WaitOutput(ctx, regexp.MustCompile(`restored from a checkpoint\s+2\n`)); err != nil {
		t.Errorf("the rerun's summary does not say both rollouts were restored: %v\n%s", err, c.p.Output())
	}
	f.checkLedger(time.Time{}.Add(1)) // calls after the held checkpoint began may come again
}

// TestNodeBackRejoinsItsRollouts: PROTOCOL §5, Rejoin. Two nodes, each an
// agent and its owner, a rollout each, both mid-tool when a checkpoint
// commits. Node 2's agent and owner are killed with SIGKILL, its sandboxes
// with them, and stay down while node 1's rollout checkpoints and
// finishes: the checkpoints commit without node 2 and carry its rollout.
// When node 2 comes back, the collector rejoins its rollout from the
// checkpoint that holds it: it continues from there as its next attempt,
// it does not start over, and node 1 is not disturbed.
func TestNodeBackRejoinsItsRollouts(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.25, 110*time.Second)
	f := startFleet(t, fleetOptions{n: 2, agents: 1, concurrency: 1, toolSeconds: 20, steps: 1})
	f.startNodeOwner("o2")
	f.agents = append(f.agents, "a2")
	f.startAgent("a2", "--concurrency", "1", "--owner", "o2")
	c := f.collector(t)
	c.start("--checkpoint-every", "2s")
	f.waitCalls(2, 1)
	rollouts, held := f.waitHeld()
	// Which rollout node 2 holds: the one its agent exported to held.
	onNode2 := ""
	for _, r := range rollouts {
		if _, ok := f.agentRecords(t.Context(), held, "a2")[r]; ok {
			onNode2 = r
		}
	}
	if onNode2 == "" {
		t.Fatalf("agent a2 exported neither of %v to %s", rollouts, held)
	}
	onNode1 := rollouts[0]
	if onNode1 == onNode2 {
		onNode1 = rollouts[1]
	}

	f.kill9("agent-a2", "owner-o2")
	if _, err := f.reap(f.ownerState("owner-o2")); err != nil {
		t.Fatal(err)
	}
	// Node 1 goes on: its rollout finishes, the checkpoints commit without
	// node 2 and carry its rollout from held.
	poll.Wait(t, 2*time.Minute, "node 1's result, and a checkpoint that carries node 2's rollout", func() bool {
		m, ok := f.manifest(f.latest(t.Context()))
		return ok && m.CheckpointID != held && slices.Equal(events.CarriedEpisodes(m.Carried), []string{onNode2}) &&
			slices.ContainsFunc(c.partialResults(), func(r collect.Result) bool { return r.RolloutID == onNode1 })
	})
	m, _ := f.manifest(f.latest(t.Context()))
	for _, cr := range m.Carried {
		if cr.From != held {
			t.Errorf("%s carries %v from %s, want from %s, the last checkpoint that held it", m.CheckpointID, cr.Episodes, cr.From, held)
		}
	}

	// Node 2 comes back.
	f.startNodeOwner("o2")
	f.startAgent("a2", "--concurrency", "1", "--owner", "o2")
	if code := c.wait(3 * time.Minute); code != 0 {
		t.Fatalf("collect exited %d", code)
	}
	res := c.results()
	if r := res[onNode2]; r.Attempt != 1 || r.Result == nil || !r.Result.Restored {
		t.Errorf("node 2's %s: attempt %d, restored %v: want it continued from %s as attempt 1", onNode2, r.Attempt,
			r.Result != nil && r.Result.Restored, held)
	}
	if r := res[onNode1]; r.Attempt != 0 {
		t.Errorf("node 1's %s: attempt %d, want 0: it ran undisturbed", onNode1, r.Attempt)
	}
	if !regexp.MustCompile(`rejoins: \[\S+\]`).MatchString(c.p.Output()) {
		t.Errorf("the summary names no rejoin:\n%s", c.p.Output())
	}
	f.checkLedger(time.Time{}.Add(1)) // calls after the held checkpoint began may come again
}
