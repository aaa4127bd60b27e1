package bridge

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// TestCheckpointsAreListedFromTheLeader lists the run's checkpoints on a
// 3-node cluster just after each write, many times: a checkpoint just
// created is listed and one just deleted is not. A release deletes what
// this listing holds; read through a consumer the server may place on a
// replica that has not applied the last writes (or, after its node came
// back, is still catching up), it listed a checkpoint already deleted and
// not the one after it, and the final release left that one's records.
func TestCheckpointsAreListedFromTheLeader(t *testing.T) {
	env := jstest.StartCluster(t)
	b := newTestBridge(t, env, Config{})
	ctx := t.Context()
	kv := b.cfg.Bus.Manifests
	const rounds = 500
	stale := 0
	for i := range rounds {
		id := fmt.Sprintf("c%03d", i)
		m := events.CheckpointManifest{Schema: events.CheckpointSchema, Run: "run1", CheckpointID: id,
			Created: time.Now().UTC(), Aborted: true}
		raw, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Create(ctx, events.ManifestKey("run1", id), raw); err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			if err := kv.Delete(ctx, events.ManifestKey("run1", fmt.Sprintf("c%03d", i-1))); err != nil {
				t.Fatal(err)
			}
		}
		all, err := b.checkpoints(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != 1 || all[0].CheckpointID != id {
			ids := make([]string, len(all))
			for j, c := range all {
				ids[j] = c.CheckpointID
			}
			t.Errorf("round %d: listed %v, want [%s]", i, ids, id)
			if stale++; stale == 5 {
				t.FailNow()
			}
		}
	}
}
