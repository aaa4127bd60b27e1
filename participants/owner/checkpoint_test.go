package owner

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// A commit snapshots every session and exports {sandbox, workdir, data};
// a restore into a fresh owner forks the snapshots, the forks hold the
// checkpoint's files and not later ones, a re-seed reuses the fork without
// running setup again, and a final release leaves nothing (PROTOCOL §5
// commit and restore, §6 sandbox owner).
func TestCommitAndRestore(t *testing.T) {
	forEachProvider(t, func(t *testing.T, d fullProvider) {
		env := jstest.Start(t)
		ctx := t.Context()
		var calls atomic.Int32
		cfg := baseConfig(t, env, d, "o1")
		cfg.TaskKind = TaskFuncs{SetupFn: dataSetup(&calls)}
		a := newOwner(t, cfg)
		d1 := start(t, a, "d1", ep("r1", 0))
		s2 := start(t, a, "s2", ep("r2", 1))
		sh(t, d, d1.Sandbox.ID, "echo before > before.txt")
		sh(t, d, s2.Sandbox.ID, "echo two > two.txt")

		recs := checkpoint(t, a, "c1")
		sh(t, d, d1.Sandbox.ID, "echo after > after.txt")
		if len(recs) != 2 || recs[0].Key != "r1" || recs[1].Key != "r2-a1" {
			t.Fatalf("records %+v", recs)
		}
		r1, r2 := decode(t, recs[0]), decode(t, recs[1])
		want1 := ownerapi.RecordData{Session: "d1", Sandbox: ownerapi.SandboxRef{Provider: d.Name(), Snapshot: "c1-d1", SandboxID: d1.Sandbox.ID}, Workdir: "/work"}
		if r1.Session != want1.Session || r1.Sandbox != want1.Sandbox || r1.Workdir != want1.Workdir || string(r1.Data) != `{"seed":"d1"}` {
			t.Errorf("record d1 = %+v (data %s)", r1, r1.Data)
		}
		if r2.Sandbox.Snapshot != "c1-s2" || string(r2.Data) != `{}` {
			t.Errorf("record s2 = %+v (data %s)", r2, r2.Data)
		}
		if got := snapshots(t, d); !slices.Equal(got, []string{"c1-d1", "c1-s2"}) {
			t.Errorf("snapshots %v", got)
		}
		e, err := env.Bus.Snapshots.Get(ctx, "c1-d1")
		if err != nil {
			t.Fatalf("index: %v", err)
		}
		var ie ownerapi.IndexEntry
		if err := json.Unmarshal(e.Value(), &ie); err != nil || ie.Run != testRun || ie.Snapshot != "c1-d1" || !slices.Equal(ie.Checkpoints, []string{"c1"}) {
			t.Errorf("index entry %s: %+v, %v", e.Value(), ie, err)
		}

		// A fresh owner (the process after a crash) restores.
		b := newOwner(t, cfg)
		restore := events.Restore{PhaseHeader: events.PhaseHeader{Run: testRun, CheckpointID: "restore-1", Epoch: 1}, Source: "c1"}
		installed, err := b.Install(ctx, restore, recs)
		if err != nil {
			t.Fatalf("Install: %v", err)
		}
		if !slices.Equal(installed, []events.Episode{ep("r1", 0), ep("r2", 1)}) {
			t.Errorf("installed %v", installed)
		}
		f1, ok := b.Session("d1")
		if !ok || f1.Episode != ep("r1", 1) || f1.Sandbox.ID == d1.Sandbox.ID || string(f1.Data) != `{"seed":"d1"}` || f1.Workdir != "/work" {
			t.Fatalf("restored d1 = %+v", f1)
		}
		if got := sh(t, d, f1.Sandbox.ID, "cat ../before.txt; test -e ../after.txt || echo no-after"); got != "before\nno-after\n" {
			t.Errorf("fork holds %q", got)
		}
		// A session exported without data restores with {}.
		f2, _ := b.Session("s2")
		if f2 == nil || string(f2.Data) != `{}` || f2.Episode != ep("r2", 2) {
			t.Errorf("restored s2 = %+v", f2)
		}
		// The superseded sandboxes were stopped.
		if got, want := d.Sandboxes(), slices.Sorted(slices.Values([]string{f1.Sandbox.ID, f2.Sandbox.ID})); !slices.Equal(got, want) {
			t.Errorf("sandboxes %v, want the forks %v", got, want)
		}

		// The replacement attempt's seed reuses the fork.
		before := calls.Load()
		s, err := b.SeedSession(ctx, "d1", ep("r1", 1), nil)
		if err != nil || s.Sandbox.ID != f1.Sandbox.ID {
			t.Fatalf("SeedSession: %+v, %v", s, err)
		}
		if calls.Load() != before {
			t.Error("setup ran again for a restored session")
		}
		if _, err := b.RequireSandbox("d1"); err != nil {
			t.Errorf("RequireSandbox: %v", err)
		}

		// Retire keeps snapshots; ending a session keeps them too.
		if err := b.Retire(ctx, []events.Episode{ep("r2", 2)}); err != nil {
			t.Fatalf("Retire: %v", err)
		}
		if _, ok := b.Session("s2"); ok {
			t.Error("retired session still tracked")
		}
		if err := b.EndSession(ctx, "d1"); err != nil {
			t.Fatal(err)
		}
		if got := snapshots(t, d); len(got) != 2 {
			t.Errorf("retire or end dropped snapshots: %v", got)
		}
		deleted, err := b.Release(ctx, nil)
		if err != nil || !slices.Equal(deleted, []string{"c1-d1", "c1-s2"}) {
			t.Fatalf("final Release: %v, %v", deleted, err)
		}
		if k := indexKeys(t, env); len(k) != 0 {
			t.Errorf("index keeps %v", k)
		}
	})
}

// Install validates every record before it touches the provider, and
// forks all or none.
func TestInstallAllOrNone(t *testing.T) {
	forEachProvider(t, func(t *testing.T, d fullProvider) {
		env := jstest.Start(t)
		ctx := t.Context()
		cfg := baseConfig(t, env, d, "o1")
		var calls atomic.Int32
		cfg.TaskKind = TaskFuncs{SetupFn: dataSetup(&calls)}
		a := newOwner(t, cfg)
		for i, id := range []string{"d1", "d2", "d3"} {
			start(t, a, id, ep("r"+id, i))
		}
		recs := checkpoint(t, a, "c1")
		if len(recs) != 3 {
			t.Fatalf("records %+v", recs)
		}
		held := d.Sandboxes()
		restore := events.Restore{PhaseHeader: events.PhaseHeader{Run: testRun, CheckpointID: "restore-1", Epoch: 1}, Source: "c1"}

		mutate := func(i int, f func(d *ownerapi.RecordData)) []events.Record {
			out := slices.Clone(recs)
			rd := decode(t, out[i])
			f(&rd)
			out[i].Data, _ = json.Marshal(rd)
			return out
		}
		for name, bad := range map[string][]events.Record{
			"bad json":       append(slices.Clone(recs[:2]), events.Record{Key: recs[2].Key, Data: json.RawMessage(`{"session":`)}),
			"bad key":        append(slices.Clone(recs[:2]), events.Record{Key: "x-a01", Data: recs[2].Data}),
			"other provider": mutate(2, func(d *ownerapi.RecordData) { d.Sandbox.Provider = "remote" }),
			"array data":     mutate(2, func(d *ownerapi.RecordData) { d.Data = json.RawMessage(`[1]`) }),
			"relative dir":   mutate(2, func(d *ownerapi.RecordData) { d.Workdir = "work" }),
		} {
			t.Run(name, func(t *testing.T) {
				b := newOwner(t, cfg)
				_, err := b.Install(ctx, restore, bad)
				if !errors.Is(err, ErrRecord) {
					t.Fatalf("Install: %v, want ErrRecord", err)
				}
				if got := d.Sandboxes(); !slices.Equal(got, held) {
					t.Errorf("sandboxes %v, want only %v", got, held)
				}
				if _, ok := b.Session("d1"); ok {
					t.Error("a session was installed")
				}
			})
		}

		t.Run("fork failure", func(t *testing.T) {
			b := newOwner(t, cfg)
			// The last record names a snapshot the provider does not hold.
			_, err := b.Install(ctx, restore, mutate(2, func(d *ownerapi.RecordData) { d.Sandbox.Snapshot = "missing" }))
			if !errors.Is(err, provider.ErrNotFound) {
				t.Fatalf("Install: %v, want ErrNotFound", err)
			}
			if got := d.Sandboxes(); !slices.Equal(got, held) {
				t.Errorf("sandboxes %v, want only %v (no fork left)", got, held)
			}
			if _, ok := b.Session("d1"); ok {
				t.Error("a session was installed")
			}
		})

		for _, id := range []string{"d1", "d2", "d3"} {
			if err := a.EndSession(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := a.Release(ctx, nil); err != nil {
			t.Fatal(err)
		}
	})
}

// Release deletes the snapshots no kept checkpoint names and keeps the
// rest; the final release leaves none (PROTOCOL §5 release).
func TestRelease(t *testing.T) {
	forEachProvider(t, func(t *testing.T, d fullProvider) {
		env := jstest.Start(t)
		ctx := t.Context()
		o := newOwner(t, baseConfig(t, env, d, "o1"))
		start(t, o, "s1", ep("r1", 0))
		checkpoint(t, o, "c1")
		checkpoint(t, o, "c2")
		if err := o.EndSession(ctx, "s1"); err != nil {
			t.Fatal(err)
		}
		if got := snapshots(t, d); !slices.Equal(got, []string{"c1-s1", "c2-s1"}) {
			t.Fatalf("snapshots %v", got)
		}
		deleted, err := o.Release(ctx, []string{"c2"})
		if err != nil || !slices.Equal(deleted, []string{"c1-s1"}) {
			t.Fatalf("Release(c2): %v, %v", deleted, err)
		}
		if got := snapshots(t, d); !slices.Equal(got, []string{"c2-s1"}) {
			t.Errorf("snapshots after keeping c2: %v", got)
		}
		if deleted, err := o.Release(ctx, []string{"c2"}); err != nil || len(deleted) != 0 {
			t.Errorf("repeated Release(c2): %v, %v", deleted, err)
		}
		deleted, err = o.Release(ctx, nil)
		if err != nil || !slices.Equal(deleted, []string{"c2-s1"}) {
			t.Fatalf("final Release: %v, %v", deleted, err)
		}
		if k := indexKeys(t, env); len(k) != 0 {
			t.Errorf("index keeps %v", k)
		}
	})
}

// A run's owners (one a node) share the snapshot index: each release
// decides the entries its owner wrote alone, and reads past another
// owner's mark, a key with no value that is no entry: owners that each
// released every entry would fail on each other's marks, and the final
// release would delete nothing of the bridge's.
func TestReleaseOfOneOwnerAmongSeveral(t *testing.T) {
	env := jstest.Start(t)
	ctx := t.Context()
	d1, d2 := newDir(t), newDir(t)
	o1 := newOwner(t, baseConfig(t, env, d1, "o1"))
	o2 := newOwner(t, baseConfig(t, env, d2, "o2"))
	start(t, o1, "s1", ep("r1", 0))
	start(t, o2, "s2", ep("r2", 0))
	checkpoint(t, o1, "c1")
	checkpoint(t, o2, "c1")
	for o, s := range map[*Owner]string{o1: "s1", o2: "s2"} {
		if err := o.EndSession(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	// o2's release is reading: its mark is in the index.
	if _, err := env.Bus.Snapshots.Put(ctx, o2.markKey(), nil); err != nil {
		t.Fatal(err)
	}
	deleted, err := o1.Release(ctx, nil)
	if err != nil || !slices.Equal(deleted, []string{"c1-s1"}) {
		t.Fatalf("o1's final Release: %v, %v; want c1-s1 alone", deleted, err)
	}
	if got := snapshots(t, d2); !slices.Equal(got, []string{"c1-s2"}) {
		t.Errorf("o2's snapshots after o1's release: %v", got)
	}
	if err := env.Bus.Snapshots.Delete(ctx, o2.markKey()); err != nil {
		t.Fatal(err)
	}
	if k := indexKeys(t, env); !slices.Equal(k, []string{"c1-s2"}) {
		t.Errorf("index after o1's release: %v, want o2's entry", k)
	}
	deleted, err = o2.Release(ctx, nil)
	if err != nil || !slices.Equal(deleted, []string{"c1-s2"}) {
		t.Fatalf("o2's final Release: %v, %v", deleted, err)
	}
	if k := indexKeys(t, env); len(k) != 0 {
		t.Errorf("index keeps %v", k)
	}
}

// Snapshot ids are tokens: <checkpoint>-<session> when that is one,
// otherwise sanitized with a hash that keeps distinct sessions apart.
func TestSnapshotID(t *testing.T) {
	if got := SnapshotID("c1", "s1"); got != "c1-s1" {
		t.Errorf("SnapshotID(c1, s1) = %q", got)
	}
	a, b := SnapshotID("c1", "sess.1"), SnapshotID("c1", "sess_1")
	if a == b || provider.ValidateID("id", a) != nil {
		t.Errorf("dotted id %q vs %q", a, b)
	}
	if long := SnapshotID("c1", strings.Repeat("x", 120)); provider.ValidateID("id", long) != nil {
		t.Errorf("long id %q is not a token", long)
	}
}

// After a commit with stop, Park stops the exported sandboxes and keeps
// their snapshots.
func TestPark(t *testing.T) {
	forEachProvider(t, func(t *testing.T, d fullProvider) {
		env := jstest.Start(t)
		ctx := t.Context()
		o := newOwner(t, baseConfig(t, env, d, "o1"))
		start(t, o, "s1", ep("r1", 0))
		start(t, o, "s2", ep("r2", 0))
		recs := checkpoint(t, o, "c1")
		if err := o.Park(ctx, recs); err != nil {
			t.Fatalf("Park: %v", err)
		}
		if sbs := d.Sandboxes(); len(sbs) != 0 {
			t.Errorf("sandboxes after park: %v", sbs)
		}
		if _, ok := o.Session("s1"); ok {
			t.Error("a parked session is still tracked")
		}
		if got := snapshots(t, d); len(got) != 2 {
			t.Errorf("snapshots after park: %v", got)
		}
		if err := o.Park(ctx, recs); err != nil {
			t.Errorf("second Park: %v", err)
		}
		if _, err := o.Release(ctx, nil); err != nil {
			t.Fatal(err)
		}
	})
}

// staleGets is the snapshot index as a replica still catching up answers
// gets of it (a KV get is a direct get, which any replica may answer, and
// one whose node of a cluster just came back lacks recent keys): every key
// is missing. Watches, Updates and Deletes go to the bucket.
type staleGets struct{ natsjs.KeyValue }

func (staleGets) Get(context.Context, string) (natsjs.KeyValueEntry, error) {
	return nil, natsjs.ErrKeyNotFound
}

// TestReleaseWithStaleGets: on a 3-node cluster, a release whose gets of
// the index a stale replica answers still decides every listed snapshot on
// the value its listing read: it deletes those no kept checkpoint names,
// drops the released checkpoints from the others, and the final release
// leaves no snapshot and no key (invariant 7, the cluster-node row of the
// fault matrix).
func TestReleaseWithStaleGets(t *testing.T) {
	env := jstest.StartCluster(t)
	ctx := t.Context()
	d := newDir(t)
	o := newOwner(t, baseConfig(t, env, d, "o1"))
	start(t, o, "s1", ep("r1", 0))
	start(t, o, "s2", ep("r2", 0))
	checkpoint(t, o, "c1")
	checkpoint(t, o, "c2")
	for _, s := range []string{"s1", "s2"} {
		if err := o.EndSession(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	stale := *o.cfg.Bus
	stale.Snapshots = staleGets{stale.Snapshots}
	o.cfg.Bus = &stale
	deleted, err := o.Release(ctx, []string{"c2"})
	if want := []string{"c1-s1", "c1-s2"}; err != nil || !slices.Equal(deleted, want) {
		t.Fatalf("Release(c2): %v, %v; want %v", deleted, err, want)
	}
	if got := snapshots(t, d); !slices.Equal(got, []string{"c2-s1", "c2-s2"}) {
		t.Errorf("snapshots after keeping c2: %v", got)
	}
	if k := indexKeys(t, env); !slices.Equal(k, []string{"c2-s1", "c2-s2"}) {
		t.Errorf("index after keeping c2: %v", k)
	}
	deleted, err = o.Release(ctx, nil)
	if want := []string{"c2-s1", "c2-s2"}; err != nil || !slices.Equal(deleted, want) {
		t.Fatalf("final Release: %v, %v; want %v", deleted, err, want)
	}
	if k := indexKeys(t, env); len(k) != 0 {
		t.Errorf("index keeps %v", k)
	}
}
