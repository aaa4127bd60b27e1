package owner

import (
	"testing"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/metrics"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// An owner with a metrics Set observes each snapshot at a commit (its
// duration and the bytes it copied, also kept in the index entry) and, in
// a fresh owner, each fork at a restore with the size of the snapshot it
// started from.
func TestMetricsOfSnapshotsAndForks(t *testing.T) {
	env := jstest.Start(t)
	d := newDir(t)
	ctx := t.Context()
	cfg := baseConfig(t, env, d, "o1")
	cfg.Metrics = metrics.New()
	a := newOwner(t, cfg)
	s := start(t, a, "d1", ep("r1", 0))
	sh(t, d, s.Sandbox.ID, "head -c 5000 /dev/zero > data.bin")
	recs := checkpoint(t, a, "c1")

	f, err := cfg.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	prov := map[string]string{"provider": d.Name()}
	if n := f.Sum("stillpoint_snapshot_duration_seconds", prov); n != 1 {
		t.Fatalf("snapshots observed: %v, want 1", n)
	}
	bytes := f["stillpoint_snapshot_bytes"].GetMetric()[0].GetHistogram().GetSampleSum()
	if bytes < 5000 {
		t.Fatalf("snapshot bytes %v, want at least the 5000 written", bytes)
	}
	e, err := a.entry(ctx, "c1-d1")
	if err != nil || e == nil || float64(e.Size) != bytes {
		t.Fatalf("index entry %+v, %v: want size %v", e, err, bytes)
	}

	cfg.Metrics = metrics.New()
	b := newOwner(t, cfg)
	restore := events.Restore{PhaseHeader: events.PhaseHeader{Run: testRun, CheckpointID: "restore-1", Epoch: 1}, Source: "c1"}
	if _, err := b.Install(ctx, restore, recs); err != nil {
		t.Fatalf("Install: %v", err)
	}
	f, err = cfg.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if n := f.Sum("stillpoint_fork_duration_seconds", prov); n != 1 {
		t.Fatalf("forks observed: %v, want 1", n)
	}
	if got := f["stillpoint_fork_bytes"].GetMetric()[0].GetHistogram().GetSampleSum(); got != bytes {
		t.Fatalf("fork bytes %v, want the snapshot's %v", got, bytes)
	}
	if err := b.EndSession(ctx, "d1"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Release(ctx, nil); err != nil {
		t.Fatal(err)
	}
}
