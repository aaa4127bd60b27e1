package owner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// errDiskFull is the failure failingSnapshots injects.
var errDiskFull = errors.New("no space left on device (injected)")

// failingSnapshots is a real provider whose Snapshot of the sandboxes in
// fail fails, as a full disk would, the first times[id] times: the real
// snapshot is taken first, so the failure leaves a partial one behind.
type failingSnapshots struct {
	fullProvider
	mu    sync.Mutex
	fails map[string]int // sandbox id → failures still to inject
	calls map[string]int // sandbox id → Snapshot calls
}

func (f *failingSnapshots) failNext(sandbox string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fails[sandbox] = n
}

func (f *failingSnapshots) called(sandbox string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[sandbox]
}

func (f *failingSnapshots) Snapshot(ctx context.Context, id, snapshotID string) (provider.Snapshot, error) {
	f.mu.Lock()
	f.calls[id]++
	fail := f.fails[id] > 0
	if fail {
		f.fails[id]--
	}
	f.mu.Unlock()
	s, err := f.fullProvider.Snapshot(ctx, id, snapshotID)
	if err == nil && fail {
		return provider.Snapshot{}, fmt.Errorf("snapshot %s: %w", snapshotID, errDiskFull)
	}
	return s, err
}

// A snapshot that fails is taken again once before the export fails; a
// second failure fails the commit cleanly (no snapshot and no index entry
// left of it, the other sessions' snapshots deleted too) and the commit
// ack names the sandbox (issue 16).
func TestSnapshotTakenAgainOnce(t *testing.T) {
	forEachProvider(t, func(t *testing.T, d fullProvider) {
		env := jstest.Start(t)
		f := &failingSnapshots{fullProvider: d, fails: map[string]int{}, calls: map[string]int{}}
		o := newOwner(t, baseConfig(t, env, f, "o1"))
		runOwner(t, env, o)
		m := o.Member().Name()
		br := membertest.NewBridge(t, env, testRun)
		ctx := t.Context()
		s1 := start(t, o, "s1", ep("r1", 0))
		s2 := start(t, o, "s2", ep("r2", 0))
		scope := []events.Episode{ep("r1", 0), ep("r2", 0)}
		commit := func(id string) events.CommitAck {
			t.Helper()
			pa := br.Ack(br.Publish(events.Prepare{PhaseHeader: br.Header(id, 10*time.Second, m)}), events.PhasePrepare, m).(events.PrepareAck)
			if !pa.OK || !pa.Ready {
				t.Fatalf("prepare ack %+v", pa)
			}
			ca := br.Ack(br.Publish(events.Commit{PhaseHeader: br.Header(id, 10*time.Second, m), Scope: scope}), events.PhaseCommit, m).(events.CommitAck)
			br.Ack(br.Publish(events.Resume{PhaseHeader: br.Header(id, 10*time.Second, m)}), events.PhaseResume, m)
			return ca
		}

		// One failure: taken again, the commit goes through.
		f.failNext(s1.Sandbox.ID, 1)
		if ca := commit("c1"); !ca.OK || ca.Manifest == nil || ca.Manifest.Count != 2 {
			t.Fatalf("commit after one snapshot failure: %+v", ca)
		}
		if n1, n2 := f.called(s1.Sandbox.ID), f.called(s2.Sandbox.ID); n1 != 2 || n2 != 1 {
			t.Errorf("Snapshot calls %d and %d, want 2 for %s and 1 for %s", n1, n2, s1.Sandbox.ID, s2.Sandbox.ID)
		}
		if got := snapshots(t, d); !slices.Equal(got, []string{"c1-s1", "c1-s2"}) {
			t.Errorf("snapshots after c1: %v", got)
		}

		// Two failures: the commit fails on this owner, naming the
		// sandbox, and leaves no snapshot of c2.
		f.failNext(s2.Sandbox.ID, 2)
		ca := commit("c2")
		if ca.OK || ca.Error == nil || !strings.Contains(ca.Error.Detail, s2.Sandbox.ID) || !strings.Contains(ca.Error.Detail, "snapshot failed twice") {
			t.Fatalf("commit after two snapshot failures of %s: %+v (error %+v)", s2.Sandbox.ID, ca, ca.Error)
		}
		if got := snapshots(t, d); !slices.Equal(got, []string{"c1-s1", "c1-s2"}) {
			t.Errorf("snapshots after the failed c2: %v, want c1's alone", got)
		}
		if k := indexKeys(t, env); !slices.Equal(k, []string{"c1-s1", "c1-s2"}) {
			t.Errorf("index after the failed c2: %v", k)
		}

		for _, id := range []string{"s1", "s2"} {
			if err := o.CloseSession(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		ra := br.Ack(br.Publish(events.Release{PhaseHeader: br.Header("op1", 10*time.Second, m), Final: true}), events.PhaseRelease, m).(events.ReleaseAck)
		if !ra.OK || !slices.Equal(ra.Deleted, []string{"c1-s1", "c1-s2"}) {
			t.Fatalf("release ack %+v", ra)
		}
	})
}
