package owner

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/dir"
	"github.com/stillpoint/stillpoint/participants/owner/provider/nosnapshot"
	"github.com/stillpoint/stillpoint/participants/owner/provider/overlay"
)

func TestMain(m *testing.M) {
	leak.VerifyTestMain(m, jstest.LeakOptions()...)
}

const testRun = "run1"

// fullProvider is what the tests ask of the local providers: every
// ability the owner uses, and the snapshot listing of the leak checks.
type fullProvider interface {
	Provider
	Snapshotter
	Lister
	Execer
	Snapshots() ([]string, error)
}

// The local providers have every ability the owner uses.
var (
	_ fullProvider = (*dir.Provider)(nil)
	_ fullProvider = (*overlay.Provider)(nil)
	_ fullProvider = (*nosnapshot.Provider)(nil)
)

// newDir returns a dir provider under t.TempDir(); the test fails if it
// still holds a sandbox or a snapshot when the test ends (which then stops
// and deletes them).
func newDir(t *testing.T) *dir.Provider {
	t.Helper()
	d, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatalf("NewDir: %v", err)
	}
	t.Cleanup(func() { checkEmpty(t, d) })
	return d
}

// forEachProvider runs fn as a subtest with each real local provider: the
// overlay provider (namespaces, overlayfs, cgroups: root) and the dir
// provider. Each fails the test if a sandbox or snapshot is left.
func forEachProvider(t *testing.T, fn func(t *testing.T, p fullProvider)) {
	t.Run("dir", func(t *testing.T) { fn(t, newDir(t)) })
	t.Run("overlay", func(t *testing.T) {
		o, err := overlay.New(overlay.Config{StateDir: t.TempDir()})
		if err != nil {
			t.Fatalf("overlay provider (run as root on Linux with overlayfs and cgroup v2): %v", err)
		}
		t.Cleanup(func() { checkEmpty(t, o) })
		fn(t, o)
	})
}

// checkEmpty fails the test if p holds a sandbox or snapshot, and removes
// them.
func checkEmpty(t *testing.T, p fullProvider) {
	t.Helper()
	ctx := context.Background()
	if sbs := p.Sandboxes(); len(sbs) > 0 {
		t.Errorf("sandboxes left: %v", sbs)
		for _, id := range sbs {
			_ = p.Stop(ctx, id)
		}
	}
	snaps, err := p.Snapshots()
	if err != nil {
		t.Errorf("Snapshots: %v", err)
	}
	if len(snaps) > 0 {
		t.Errorf("snapshots left: %v", snaps)
		for _, id := range snaps {
			_ = p.DeleteSnapshot(ctx, id)
		}
	}
}

// dataSetup returns a Setup that counts its calls and returns
// {"seed":"<session>"} and moves the working directory to /work for
// sessions whose id starts with "d", and returns nothing otherwise.
func dataSetup(calls *atomic.Int32) SetupFunc {
	return func(_ context.Context, _ Execer, s *Session, _ json.RawMessage) (json.RawMessage, error) {
		calls.Add(1)
		if strings.HasPrefix(s.ID, "d") {
			s.Workdir = "/work"
			return json.RawMessage(`{"seed":"` + s.ID + `"}`), nil
		}
		return nil, nil
	}
}

func testLogger(t *testing.T) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
}

func baseConfig(t *testing.T, env *jstest.Env, p fullProvider, name string) Config {
	return Config{
		Run: testRun, Name: name, JS: env.JS, Bus: env.Bus, Provider: p,
		Checkpointing: true, LendsSandboxes: true, StateDir: t.TempDir(),
		Logger: testLogger(t),
	}
}

func newOwner(t *testing.T, cfg Config) *Owner {
	t.Helper()
	o, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return o
}

func ep(rollout string, attempt int) events.Episode {
	return events.Episode{Rollout: rollout, Attempt: attempt}
}

func start(t *testing.T, o *Owner, id string, e events.Episode) *Session {
	t.Helper()
	s, err := o.StartSession(t.Context(), id, e, provider.Spec{})
	if err != nil {
		t.Fatalf("StartSession %s: %v", id, err)
	}
	return s
}

// sh runs a shell script in the session's sandbox and returns its stdout.
func sh(t *testing.T, p fullProvider, sandboxID, script string) string {
	t.Helper()
	res, err := p.Exec(t.Context(), sandboxID, []string{"sh", "-c", script}, provider.ExecOptions{})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec %q in %s: %v (exit %d, stderr %q)", script, sandboxID, err, res.ExitCode, res.Stderr)
	}
	return string(res.Stdout)
}

// checkpoint prepares (expecting ready), exports and resumes id.
func checkpoint(t *testing.T, o *Owner, id string) []events.Record {
	t.Helper()
	ctx := t.Context()
	rep, err := o.Prepare(ctx, member.Checkpoint{Run: testRun, ID: id})
	if err != nil || !rep.Ready {
		t.Fatalf("Prepare %s: %+v, %v", id, rep, err)
	}
	recs, err := membertest.Drain(o.Export(ctx, events.Commit{PhaseHeader: events.PhaseHeader{Run: testRun, CheckpointID: id}}))
	if err != nil {
		t.Fatalf("Export %s: %v", id, err)
	}
	if err := o.Resume(ctx, id); err != nil {
		t.Fatalf("Resume %s: %v", id, err)
	}
	return recs
}

func decode(t *testing.T, rec events.Record) ownerapi.RecordData {
	t.Helper()
	var d ownerapi.RecordData
	if err := json.Unmarshal(rec.Data, &d); err != nil {
		t.Fatalf("record %s: %v", rec.Key, err)
	}
	return d
}

func snapshots(t *testing.T, p fullProvider) []string {
	t.Helper()
	s, err := p.Snapshots()
	if err != nil {
		t.Fatalf("Snapshots: %v", err)
	}
	return s
}

// indexKeys returns the keys of the sp_snapshots bucket.
// indexKeys lists the snapshot index's live keys as its stream's leader
// holds them. Keys alone reads an ordered consumer that may sit on a
// replica still applying the last delete (a 3-node cluster answered a
// deleted key that way once), so the listing writes a mark through the
// leader and reads a watch until the mark is in, as the owner's readIndex
// does; the owners' own marks (_read.*) are not listed.
func indexKeys(t *testing.T, env *jstest.Env) []string {
	t.Helper()
	ctx := t.Context()
	kv := env.Bus.Snapshots
	const mark = "_test.read"
	rev, err := kv.Put(ctx, mark, nil)
	if err != nil {
		t.Fatalf("index keys: mark: %v", err)
	}
	defer func() {
		// A delete, as the owner's own marks go: the index takes no purge.
		if err := kv.Delete(context.WithoutCancel(ctx), mark); err != nil {
			t.Errorf("index keys: delete the mark: %v", err)
		}
	}()
	for try := 1; ; try++ {
		keys, ok := watchKeysTo(t, kv, mark, rev)
		if ok {
			return keys
		}
		if try == 10 {
			t.Fatalf("index keys: no watch reached the mark (revision %d) in %d tries", rev, try)
		}
	}
}

// watchKeysTo reads one watch of every key until mark's revision rev is
// in, and says whether it got there within 5 s.
func watchKeysTo(t *testing.T, kv natsjs.KeyValue, mark string, rev uint64) ([]string, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	w, err := kv.WatchAll(ctx)
	if err != nil {
		if ctx.Err() != nil && t.Context().Err() == nil {
			return nil, false
		}
		t.Fatalf("index keys: watch: %v", err)
	}
	defer func() { _ = w.Stop() }()
	live := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			return nil, false
		case ent, ok := <-w.Updates():
			if !ok {
				t.Fatal("index keys: the watch closed")
			}
			if ent == nil {
				continue
			}
			k := ent.Key()
			if k == mark {
				if ent.Revision() >= rev {
					return slices.Sorted(maps.Keys(live)), true
				}
				continue
			}
			delete(live, k)
			if ent.Operation() == natsjs.KeyValuePut && !strings.HasPrefix(k, "_read.") {
				live[k] = true
			}
		}
	}
}
