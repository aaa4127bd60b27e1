package invariant_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/controller-bridge/invariant"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

func TestMain(m *testing.M) {
	leak.VerifyTestMain(m, jstest.LeakOptions()...)
}

const run = "run1"

// The checker passes a run that kept the invariants and catches each kind
// of violation it is given (PROTOCOL §7, by number): a manifest written for
// a failed checkpoint (2), a result written twice and one missing (3), no
// ledger to read (4), a sandbox left (6 and 7).
func TestCheck(t *testing.T) {
	env := jstest.Start(t)
	ctx := t.Context()
	hs := membertest.StartMembers(t, env, run, 2, membertest.Options{Episodes: 1})
	b, js := runBridge(t, env)

	var verified invariant.Manifests
	sum := collect.Summary{}
	res, err := b.Checkpoint(ctx, bridgeapi.CheckpointRequest{ID: "c1"})
	if err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("c1: %+v %v", res, err)
	}
	verified.OnCommit(ctx, env.Bus, run, "c1")
	hs[0].Participant.Block(events.Episode{Rollout: "t0-r0"})
	res, err = b.Checkpoint(ctx, bridgeapi.CheckpointRequest{ID: "c2", TimeoutMS: 1000})
	if err != nil || res.Status != bridgeapi.StatusFailed {
		t.Fatalf("c2: %+v %v", res, err)
	}
	hs[0].Participant.Unblock(events.Episode{Rollout: "t0-r0"})
	for _, id := range []string{"c1", "c2"} {
		sum.Checkpoints = append(sum.Checkpoints, collect.CheckpointStat{ID: id})
	}
	sum.Checkpoints[0].Status = bridgeapi.StatusCommitted
	sum.Checkpoints[1].Status = bridgeapi.StatusFailed

	results := filepath.Join(t.TempDir(), "results.jsonl")
	writeResults(t, results, "r1", "r2")
	// No trajectories: their invariant (8) has a test of its own.
	r := invariant.Run{Run: run, JS: js, Bus: env.Bus, Summary: sum, Results: results, Rollouts: []string{"r1", "r2"},
		Model: modelserver.New(nil), Manifests: &verified, NoTrajectories: true}
	want := map[int]bool{1: true, 2: true, 3: true, 4: true, 5: true, 6: true, 7: false, 8: true, 9: true, 10: true} // c1's records are not released
	check(t, invariant.Check(ctx, r), want)

	// A manifest for the failed c2, results wrong, no ledger, a sandbox left.
	m, _ := json.Marshal(events.CheckpointManifest{Run: run, CheckpointID: "c2"})
	if _, err := env.Bus.Manifests.Put(ctx, events.ManifestKey(run, "c2"), m); err != nil {
		t.Fatal(err)
	}
	writeResults(t, results, "r1", "r1")
	r.Model, r.Sandboxes = nil, []string{"sb1"}
	want = map[int]bool{1: true, 2: false, 3: false, 4: false, 5: true, 6: false, 7: false, 8: true, 9: true, 10: true}
	check(t, invariant.Check(ctx, r), want)

	// A restore was needed and none happened.
	r.NeedRestore = true
	if got := invariant.Check(ctx, r); got[0].OK {
		t.Errorf("1 without the restore it needs: %+v", got[0])
	}

	// 1: c1's member list changed after its commit: it verifies no more.
	e, err := env.Bus.Manifests.Get(ctx, events.ManifestKey(run, "c1"))
	if err != nil {
		t.Fatal(err)
	}
	var c1 events.CheckpointManifest
	if err := json.Unmarshal(e.Value(), &c1); err != nil || c1.MemberList == nil {
		t.Fatalf("c1's manifest %s: %v", e.Value(), err)
	}
	data, err := env.Bus.Checkpoints.GetBytes(ctx, c1.MemberList.Object)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Bus.Checkpoints.PutBytes(ctx, c1.MemberList.Object, append(data, ' ')); err != nil {
		t.Fatal(err)
	}
	var again invariant.Manifests
	again.OnCommit(ctx, env.Bus, run, "c1")
	r.Manifests, r.NeedRestore = &again, false
	if got := invariant.Check(ctx, r); got[0].OK || !strings.Contains(got[0].Detail, "sha256") || !strings.Contains(got[0].Detail, c1.MemberList.Object) {
		t.Errorf("1 with a changed member list: %+v, want it refused naming the list's digest", got[0])
	}
}

// runBridge runs a bridge of run on env until the test ends, and returns
// it with the JetStream context it uses.
func runBridge(t *testing.T, env *jstest.Env) (*bridge.Bridge, natsjs.JetStream) {
	t.Helper()
	return runBridgeFor(t, env, 5*time.Second)
}

// runBridgeFor is runBridge with phases of deadline timeout.
func runBridgeFor(t *testing.T, env *jstest.Env, timeout time.Duration) (*bridge.Bridge, natsjs.JetStream) {
	t.Helper()
	nc, js := env.Connect(t)
	b, err := bridge.New(bridge.Config{Run: run, Conn: nc, JS: js, Bus: env.Bus, Logger: zerolog.New(zerolog.NewTestWriter(t)), PhaseTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	bctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- b.Run(bctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return b, js
}

func check(t *testing.T, got []invariant.Result, want map[int]bool) {
	t.Helper()
	if len(got) != 10 {
		t.Fatalf("%d results, want 10: %+v", len(got), got)
	}
	for i, r := range got {
		if r.N != i+1 {
			t.Errorf("result %d is numbered %d", i, r.N)
		}
		if r.OK != want[r.N] {
			t.Errorf("%d. %s: ok %v, want %v (%s)", r.N, r.Name, r.OK, want[r.N], r.Detail)
		}
	}
}

func writeResults(t *testing.T, path string, ids ...string) {
	t.Helper()
	var b []byte
	for _, id := range ids {
		line, _ := json.Marshal(map[string]any{"rollout_id": id, "ok": true, "result": map[string]any{"verdict": map[string]any{}}})
		b = append(append(b, line...), '\n')
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Invariant 5 reads the sandbox daemons' pauses from the bridge's records
// of the prepares (their acks travel on core NATS): a pause that stood
// still passes, one that did not fails naming its checkpoint, and a
// committed checkpoint whose record is missing fails too, rather than
// counting nothing as still.
func TestPausesFromThePrepareRecords(t *testing.T) {
	env := jstest.Start(t)
	ctx := t.Context()
	sb := membertest.StartMember(t, env, run, "sandbox.s0", membertest.NewParticipant("s0"), membertest.Options{})
	b, js := runBridge(t, env)

	sum := collect.Summary{}
	results := filepath.Join(t.TempDir(), "results.jsonl")
	writeResults(t, results, "r1")
	r := invariant.Run{Run: run, JS: js, Bus: env.Bus, Results: results, Rollouts: []string{"r1"}, Model: modelserver.New(nil)}
	commit := func(id string, pause *events.PauseReport) {
		t.Helper()
		sb.Participant.ReportPause(pause)
		res, err := b.Checkpoint(ctx, bridgeapi.CheckpointRequest{ID: id})
		if err != nil || res.Status != bridgeapi.StatusCommitted {
			t.Fatalf("%s: %+v %v", id, res, err)
		}
		sum.Checkpoints = append(sum.Checkpoints, collect.CheckpointStat{ID: id, Status: bridgeapi.StatusCommitted})
		r.Summary = sum
	}
	fifth := func() invariant.Result {
		t.Helper()
		return invariant.Check(ctx, r)[4]
	}

	commit("c1", &events.PauseReport{Mode: "freeze", PIDCount: 2, TookMS: 1})
	if got := fifth(); !got.OK || !strings.Contains(got.Detail, "1 sandbox pauses") {
		t.Errorf("a frozen pause: %+v, want ok with 1 pause", got)
	}
	commit("c2", &events.PauseReport{Mode: "hold", PIDCount: 2, TookMS: 1}) // a hold that did not freeze
	if got := fifth(); got.OK || !strings.Contains(got.Detail, "c2") || !strings.Contains(got.Detail, "2 sandbox pauses") {
		t.Errorf("a hold that did not freeze: %+v, want it refused naming c2", got)
	}

	// c3's record gone from the stream: nothing says its daemon paused still.
	sum.Checkpoints = sum.Checkpoints[:1]
	commit("c3", &events.PauseReport{Mode: "freeze", PIDCount: 2, TookMS: 1})
	raw, err := env.Bus.Stream.GetLastMsgForSubject(ctx, "sp."+run+".prepared.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Bus.Stream.DeleteMsg(ctx, raw.Sequence); err != nil {
		t.Fatal(err)
	}
	if got := fifth(); got.OK || !strings.Contains(got.Detail, "c3: no record") {
		t.Errorf("a committed checkpoint without its prepare's record: %+v, want it refused naming c3", got)
	}
}

// Invariant 1 on a checkpoint a release was deleting as it was verified:
// its records gone and its manifest marked (the bridge marks before it
// deletes) is a checkpoint released before anyone heard of it, no
// violation; records gone from a manifest no release marked is one.
func TestCheckpointReleasedUnderItsVerification(t *testing.T) {
	env := jstest.Start(t)
	ctx := t.Context()
	membertest.StartMembers(t, env, run, 2, membertest.Options{Episodes: 1})
	b, js := runBridge(t, env)
	for _, id := range []string{"c1", "c2"} {
		if res, err := b.Checkpoint(ctx, bridgeapi.CheckpointRequest{ID: id}); err != nil || res.Status != bridgeapi.StatusCommitted {
			t.Fatalf("%s: %+v %v", id, res, err)
		}
	}
	sum := collect.Summary{Checkpoints: []collect.CheckpointStat{
		{ID: "c1", Status: bridgeapi.StatusCommitted}, {ID: "c2", Status: bridgeapi.StatusCommitted}}}
	results := filepath.Join(t.TempDir(), "results.jsonl")
	writeResults(t, results, "r1")

	// c1's records deleted, as a release does first.
	infos, err := env.Bus.Records.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	deleted := 0
	for _, o := range infos {
		if strings.Contains(o.Name, "/c1/") {
			if err := env.Bus.Records.Delete(ctx, o.Name); err != nil {
				t.Fatal(err)
			}
			deleted++
		}
	}
	if deleted == 0 {
		t.Fatalf("no records of c1 among %d objects", len(infos))
	}
	verify := func() invariant.Result {
		var v invariant.Manifests
		v.OnCommit(ctx, env.Bus, run, "c1")
		v.OnCommit(ctx, env.Bus, run, "c2")
		r := invariant.Run{Run: run, JS: js, Bus: env.Bus, Summary: sum, Results: results, Rollouts: []string{"r1"},
			Model: modelserver.New(nil), Manifests: &v}
		return invariant.Check(ctx, r)[0]
	}
	if got := verify(); got.OK || !strings.Contains(got.Detail, "the object is missing") {
		t.Errorf("c1's records gone, its manifest unmarked: %+v, want a violation naming the missing object", got)
	}

	// The mark a release sets before it deletes anything.
	e, err := env.Bus.Manifests.Get(ctx, events.ManifestKey(run, "c1"))
	if err != nil {
		t.Fatal(err)
	}
	var c1 events.CheckpointManifest
	if err := json.Unmarshal(e.Value(), &c1); err != nil {
		t.Fatal(err)
	}
	c1.Released = &events.ReleaseMark{Op: "release-9"}
	v, _ := json.Marshal(c1)
	if _, err := env.Bus.Manifests.Update(ctx, events.ManifestKey(run, "c1"), v, e.Revision()); err != nil {
		t.Fatal(err)
	}
	got := verify()
	if !got.OK || !strings.Contains(got.Detail, "1 released before the collector heard of them ([c1])") {
		t.Errorf("c1 marked released: %+v, want it counted released, not verified", got)
	}
	if !strings.Contains(got.Detail, "2 member manifests of 2 checkpoints verified") {
		t.Errorf("c2 should verify whole: %s", got.Detail)
	}

	// The release goes on to delete c1's member list: marked, it is still
	// a checkpoint released, not one whose list is missing.
	if c1.MemberList == nil {
		t.Fatalf("c1 has no member list: %+v", c1)
	}
	if err := env.Bus.Checkpoints.Delete(ctx, c1.MemberList.Object); err != nil {
		t.Fatal(err)
	}
	if got := verify(); !got.OK || !strings.Contains(got.Detail, "([c1])") {
		t.Errorf("c1 marked, its member list deleted: %+v, want it counted released", got)
	}
}

// gatedRelease is a test participant whose release waits until gate closes.
type gatedRelease struct {
	*membertest.Participant
	gate chan struct{}
}

func (g gatedRelease) Release(ctx context.Context, keep []string) ([]string, error) {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.Participant.Release(ctx, keep)
}

// A verification that finds a checkpoint's records missing while a release
// that does not keep it is running waits for that release to end and
// decides from what it left: here a release a member never answers, which
// fails at its deadline and marks the checkpoint (the records were deleted
// before the mark, as a replica that applied the deletions but not the mark
// would show them). Records missing with no release after the commit stay
// a violation.
func TestReleaseAcrossTheVerification(t *testing.T) {
	env := jstest.Start(t)
	ctx := t.Context()
	membertest.StartMembers(t, env, run, 1, membertest.Options{Episodes: 1})
	gate := make(chan struct{})
	membertest.StartMember(t, env, run, "owner.g", gatedRelease{membertest.NewParticipant("g"), gate}, membertest.Options{})
	b, js := runBridgeFor(t, env, 8*time.Second)
	for _, id := range []string{"c1", "c2"} {
		if res, err := b.Checkpoint(ctx, bridgeapi.CheckpointRequest{ID: id}); err != nil || res.Status != bridgeapi.StatusCommitted {
			t.Fatalf("%s: %+v %v", id, res, err)
		}
	}
	released := make(chan *bridgeapi.OpResult, 1)
	go func() {
		res, err := b.Release(context.WithoutCancel(ctx), bridgeapi.ReleaseRequest{KeepLatest: 1})
		if err != nil {
			t.Errorf("release: %v", err)
		}
		released <- res
	}()
	poll.Wait(t, 10*time.Second, "the release phase on the stream", func() bool {
		_, err := env.Bus.Stream.GetLastMsgForSubject(ctx, events.PhaseSubject(run, events.PhaseRelease))
		return err == nil
	})
	deleteRecords(t, env, "c1")
	if _, err := env.Bus.Stream.GetLastMsgForSubject(ctx, events.OutcomeSubject(run, events.TypeReleaseFailed)); err == nil {
		t.Fatal("the release ended before the verification began: its deadline is too short for this machine")
	}
	var v invariant.Manifests
	v.OnCommit(ctx, env.Bus, run, "c1") // waits for the release's end
	if res := <-released; res == nil || res.Status != bridgeapi.StatusFailed {
		t.Fatalf("the release a member never answered: %+v", res)
	}
	close(gate)

	// c3 commits after the release; its records go with no release after.
	if res, err := b.Checkpoint(ctx, bridgeapi.CheckpointRequest{ID: "c3"}); err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("c3: %+v %v", res, err)
	}
	deleteRecords(t, env, "c3")
	v.OnCommit(ctx, env.Bus, run, "c3")

	results := filepath.Join(t.TempDir(), "results.jsonl")
	writeResults(t, results, "r1")
	sum := collect.Summary{}
	for _, id := range []string{"c1", "c2", "c3"} {
		sum.Checkpoints = append(sum.Checkpoints, collect.CheckpointStat{ID: id, Status: bridgeapi.StatusCommitted})
	}
	r := invariant.Run{Run: run, JS: js, Bus: env.Bus, Summary: sum, Results: results, Rollouts: []string{"r1"},
		Model: modelserver.New(nil), Manifests: &v}
	got := invariant.Check(ctx, r)[0]
	if !strings.Contains(got.Detail, "released before the collector heard of them ([c1])") {
		t.Errorf("c1, its records deleted under a release that marked it: %s, want it counted released", got.Detail)
	}
	if got.OK || !strings.Contains(got.Detail, "c3/") || strings.Contains(got.Detail, "c1/") {
		t.Errorf("c3's records gone with no release after its commit: %+v, want a violation naming c3 alone", got)
	}
}

// deleteRecords deletes the records objects of checkpoint id.
func deleteRecords(t *testing.T, env *jstest.Env, id string) {
	t.Helper()
	infos, err := env.Bus.Records.List(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, o := range infos {
		if strings.Contains(o.Name, "/"+id+"/") && !o.Deleted {
			if err := env.Bus.Records.Delete(t.Context(), o.Name); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	if n == 0 {
		t.Fatalf("no records of %s among %d objects", id, len(infos))
	}
}
