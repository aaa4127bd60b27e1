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
	rollouts := []string{f.tasks[0].RolloutID, f.tasks[1].RolloutID}
	slices.Sort(rollouts)
	var held string
	poll.Wait(t, time.Minute, "a checkpoint that holds both rollouts mid-tool", func() bool {
		id := f.latest(t.Context())
		m, ok := f.manifest(id)
		if ok && slices.Equal(m.Continued, rollouts) {
			held = id
			return true
		}
		return false
	})

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
