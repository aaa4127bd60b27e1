package bridge_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/timeline"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// TestCheckpointCommits: PROTOCOL §5 bridge rules — prepare, all ready,
// commit, manifest created once, LATEST moved, outcome, resume.
func TestCheckpointCommits(t *testing.T) {
	env := jstest.Start(t)
	hs := fleet(t, env, 3, 2)
	b := startBridge(t, env, bridge.Config{})

	res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != bridgeapi.StatusCommitted || len(res.Members) != 3 || len(res.Continued) != 6 {
		t.Fatalf("result %+v", res)
	}
	m := manifestOf(t, env, "c1")
	if m == nil || m.Aborted || len(m.Members) != 3 || len(m.Continued) != 6 {
		t.Fatalf("manifest %+v", m)
	}
	st, err := b.Status(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if st.Latest == nil || st.Latest.CheckpointID != "c1" || st.Open != "" || st.LastPhase != events.PhaseResume {
		t.Fatalf("status %+v", st)
	}
	poll.Wait(t, 5*time.Second, "every member to reopen admission", func() bool { return allOpen(hs) })

	// Asking again for c1 returns its result and publishes nothing.
	again, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1"})
	if err != nil || again.Status != bridgeapi.StatusCommitted {
		t.Fatalf("repeat: %+v %v", again, err)
	}
	st2, _ := b.Status(ctx(t))
	if st2.Seq != st.Seq {
		t.Errorf("a repeated checkpoint published phases: seq %d → %d", st.Seq, st2.Seq)
	}
	// A second checkpoint moves LATEST by compare-and-set.
	if res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c2"}); err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("c2: %+v %v", res, err)
	}
	if st, _ := b.Status(ctx(t)); st.Latest.CheckpointID != "c2" || len(st.Checkpoints) != 2 {
		t.Fatalf("after c2: %+v", st)
	}
}

// TestCheckpointAbortsOnBlocker: a member not ready by the deadline aborts
// the checkpoint; the outcome names it and its blocker; the checkpoint key
// is an abort marker, so no manifest can ever appear (PROTOCOL §7, invariant 2).
func TestCheckpointAbortsOnBlocker(t *testing.T) {
	env := jstest.Start(t)
	hs := fleet(t, env, 3, 2)
	b := startBridge(t, env, bridge.Config{})
	blocked := events.Episode{Rollout: "t1-r0"}
	hs[1].Participant.Block(blocked)

	res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1", TimeoutMS: 1500})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != bridgeapi.StatusFailed || res.Failure == nil || res.Failure.Phase != events.PhasePrepare {
		t.Fatalf("result %+v", res)
	}
	if got := res.Failure.Blockers[hs[1].Name]; !slices.Equal(got, []string{blocked.String()}) {
		t.Errorf("blockers of %s: %v (failure %+v)", hs[1].Name, got, res.Failure)
	}
	if len(res.Failure.Errors) != 1 || res.Failure.Errors[0].Member != hs[1].Name {
		t.Errorf("errors name %+v, want only %s", res.Failure.Errors, hs[1].Name)
	}
	if m := manifestOf(t, env, "c1"); m == nil || !m.Aborted {
		t.Fatalf("checkpoint key after an abort: %+v", m)
	}
	poll.Wait(t, 5*time.Second, "every member to reopen admission", func() bool { return allOpen(hs) })
	if st, _ := b.Status(ctx(t)); st.Latest != nil {
		t.Errorf("LATEST moved by an aborted checkpoint: %+v", st.Latest)
	}
	// Unblocked, the next checkpoint commits.
	hs[1].Participant.Unblock(blocked)
	if res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c2"}); err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("c2: %+v %v", res, err)
	}
}

// TestCheckpointAbortsOnDeadMember: a member that dies during a checkpoint
// fails it at once (its heartbeat key goes), well before the deadline.
func TestCheckpointAbortsOnDeadMember(t *testing.T) {
	env := jstest.Start(t)
	hs := fleet(t, env, 3, 1)
	b := startBridge(t, env, bridge.Config{})
	hs[2].Participant.Block(events.Episode{Rollout: "t2-r0"})
	go func() {
		// Stop the blocked member while the bridge waits on it.
		poll.Wait(t, 10*time.Second, "prepare to reach t2", func() bool { return hs[2].Participant.Count("prepare") > 0 })
		_ = hs[2].Stop()
	}()
	start := time.Now()
	res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1", TimeoutMS: 20000})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("a dead member took %s to fail the checkpoint", took)
	}
	if res.Status != bridgeapi.StatusFailed {
		t.Fatalf("result %+v", res)
	}
	found := false
	for _, e := range res.Failure.Errors {
		if e.Member == hs[2].Name && (e.Code == "member_dead" || e.Code == events.CodeMissingAck) {
			found = true
		}
	}
	if !found {
		t.Errorf("failure does not name the dead member: %+v", res.Failure)
	}
}

// TestRestoreAllOrNone: a committed checkpoint restores into a fresh fleet
// as the next attempts; a fleet where one member fails to install restores
// nothing, and the next attempts are retired everywhere.
func TestRestoreAllOrNone(t *testing.T) {
	env := jstest.Start(t)
	old := fleet(t, env, 2, 2)
	b := startBridge(t, env, bridge.Config{})
	if res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1", Stop: true}); err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("checkpoint: %+v %v", res, err)
	}
	for _, h := range old {
		_ = h.Stop()
	}

	t.Run("fails", func(t *testing.T) {
		fresh := membertest.StartMembers(t, env, run, 2, membertest.Options{})
		fresh[1].Participant.FailInstall(errors.New("disk full"))
		res, err := b.Restore(ctx(t), bridgeapi.RestoreRequest{ID: "restore-1"})
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != bridgeapi.StatusFailed || len(res.Retired) != 4 || res.Epoch != 1 {
			t.Fatalf("result %+v", res)
		}
		if len(res.Failure.Errors) != 1 || res.Failure.Errors[0].Member != fresh[1].Name {
			t.Errorf("failure %+v does not name %s", res.Failure, fresh[1].Name)
		}
		for _, h := range fresh {
			if live := h.Participant.Live(); len(live) != 0 {
				t.Errorf("%s holds %v after a failed restore", h.Name, live)
			}
			if err := h.Member.Admit(events.Episode{Rollout: "t0-r0", Attempt: 1}); err == nil && h.Name == fresh[0].Name {
				t.Errorf("%s admits a retired next attempt", h.Name)
			}
		}
		for _, h := range fresh {
			_ = h.Stop()
		}
	})
	t.Run("completes", func(t *testing.T) {
		fresh := membertest.StartMembers(t, env, run, 2, membertest.Options{})
		res, err := b.Restore(ctx(t), bridgeapi.RestoreRequest{ID: "restore-2", Source: "c1"})
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != bridgeapi.StatusCompleted || res.Epoch != 2 {
			t.Fatalf("result %+v", res)
		}
		want := []string{"t0-r0-a1", "t0-r1-a1", "t1-r0-a1", "t1-r1-a1"}
		if !slices.Equal(res.Restored, want) {
			t.Errorf("restored %v, want %v", res.Restored, want)
		}
		if live := fresh[0].Participant.Live(); !slices.Equal(live, want[:2]) {
			t.Errorf("t0 holds %v", live)
		}
		// The restored fleet checkpoints again in the new epoch.
		if res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c2"}); err != nil || res.Status != bridgeapi.StatusCommitted || res.Epoch != 2 {
			t.Fatalf("checkpoint after restore: %+v %v", res, err)
		}
	})
}

// TestRestoreRefusesWithoutFreshMembers: records of a member with no fresh
// member of that name would be lost; the restore is refused up front.
func TestRestoreRefusesWithoutFreshMembers(t *testing.T) {
	env := jstest.Start(t)
	fleet(t, env, 2, 1)
	b := startBridge(t, env, bridge.Config{})
	if res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1"}); err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("%+v %v", res, err)
	}
	_, err := b.Restore(ctx(t), bridgeapi.RestoreRequest{})
	if !errors.Is(err, bridgeapi.ErrNoFreshMember) || !strings.Contains(err.Error(), "agent.t0") {
		t.Fatalf("restore into a served fleet: %v", err)
	}
	if _, err := b.Restore(ctx(t), bridgeapi.RestoreRequest{Source: "nope"}); !errors.Is(err, bridgeapi.ErrNotFound) {
		t.Fatalf("restore of an unknown checkpoint: %v", err)
	}
}

// TestRetireAndForget: retired attempts are refused by every member until
// forgotten.
func TestRetireAndForget(t *testing.T) {
	env := jstest.Start(t)
	hs := fleet(t, env, 2, 2)
	b := startBridge(t, env, bridge.Config{})
	res, err := b.Retire(ctx(t), []string{"t0-r0", "t1-r1-a2"})
	if err != nil || res.Status != bridgeapi.StatusCompleted {
		t.Fatalf("retire: %+v %v", res, err)
	}
	for _, h := range hs {
		if err := h.Member.Admit(events.Episode{Rollout: "t1-r1", Attempt: 2}); err == nil {
			t.Errorf("%s admits a retired attempt", h.Name)
		}
		if err := h.Member.Admit(events.Episode{Rollout: "t1-r1", Attempt: 3}); err != nil {
			t.Errorf("%s refuses a later attempt: %v", h.Name, err)
		}
	}
	if res, err := b.Forget(ctx(t), []string{"t1-r1"}); err != nil || res.Status != bridgeapi.StatusCompleted {
		t.Fatalf("forget: %+v %v", res, err)
	}
	for _, h := range hs {
		if err := h.Member.Admit(events.Episode{Rollout: "t1-r1", Attempt: 2}); err != nil {
			t.Errorf("%s still refuses a forgotten rollout: %v", h.Name, err)
		}
	}
	if _, err := b.Retire(ctx(t), []string{"../x"}); !errors.Is(err, bridgeapi.ErrBadRequest) {
		t.Errorf("retire of a path-like id: %v", err)
	}
}

// TestRelease: a release keeps what it is told and deletes the manifests
// and records of the rest; the final release leaves nothing of the run.
func TestRelease(t *testing.T) {
	env := jstest.Start(t)
	hs := fleet(t, env, 2, 1)
	b := startBridge(t, env, bridge.Config{})
	for _, id := range []string{"c1", "c2", "c3"} {
		if res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: id}); err != nil || res.Status != bridgeapi.StatusCommitted {
			t.Fatalf("%s: %+v %v", id, res, err)
		}
	}
	if n := len(objects(t, env)); n != 6 {
		t.Fatalf("%d record objects, want 6", n)
	}
	res, err := b.Release(ctx(t), bridgeapi.ReleaseRequest{Keep: []string{"c1"}, KeepLatest: 1})
	if err != nil || res.Status != bridgeapi.StatusCompleted {
		t.Fatalf("release: %+v %v", res, err)
	}
	if !slices.Equal(res.Keep, []string{"c1", "c3"}) || !slices.Equal(res.Deleted, []string{"c2"}) {
		t.Fatalf("kept %v, deleted %v", res.Keep, res.Deleted)
	}
	if manifestOf(t, env, "c2") != nil || manifestOf(t, env, "c1") == nil {
		t.Error("c2's manifest kept or c1's deleted")
	}
	for _, o := range objects(t, env) {
		if strings.Contains(o, "/c2/") {
			t.Errorf("record %s of a released checkpoint is left", o)
		}
	}
	if l := memberLists(t, env, "c2"); len(l) != 0 || len(memberLists(t, env, "c1")) != 1 {
		t.Errorf("member lists: c2 %v (released), c1 %v (kept)", l, memberLists(t, env, "c1"))
	}
	for _, h := range hs {
		if h.Participant.Count("release") != 1 {
			t.Errorf("%s was not asked to release", h.Name)
		}
	}
	if _, err := b.Release(ctx(t), bridgeapi.ReleaseRequest{Keep: []string{"c2"}}); !errors.Is(err, bridgeapi.ErrNotFound) {
		t.Errorf("keeping a released checkpoint: %v", err)
	}
	// The final release.
	if res, err := b.Release(ctx(t), bridgeapi.ReleaseRequest{}); err != nil || res.Status != bridgeapi.StatusCompleted {
		t.Fatalf("final release: %+v %v", res, err)
	}
	if keys := kvKeys(t, env); len(keys) != 0 {
		t.Errorf("after the final release sp_manifests holds %v", keys)
	}
	if objs := objects(t, env); len(objs) != 0 {
		t.Errorf("after the final release sp_records holds %v", objs)
	}
	for _, id := range []string{"c1", "c2", "c3"} {
		if l := memberLists(t, env, id); len(l) != 0 {
			t.Errorf("after the final release sp_checkpoints holds %v", l)
		}
	}
}

// TestCheckpointWritesAMemberList: PROTOCOL §3, §5 commit: the checkpoint
// manifest (schema 2) names the member list, which holds the manifest
// each member's commit ack carried and verifies by its digest; no member
// manifest key is written. A list whose bytes are not the ones named is
// refused, by name, before a restore publishes anything.
func TestCheckpointWritesAMemberList(t *testing.T) {
	env := jstest.Start(t)
	fleet(t, env, 2, 2)
	b := startBridge(t, env, bridge.Config{})
	res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1"})
	if err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("checkpoint: %+v %v", res, err)
	}
	m := manifestOf(t, env, "c1") // verifies the list
	if m.Schema != events.CheckpointSchema || m.MemberList == nil || m.MemberList.Count != 2 || len(m.Members) != 2 || len(m.Committed) != 2 {
		t.Fatalf("manifest %+v", m)
	}
	if got, err := b.Get(ctx(t), "c1"); err != nil || !slices.Equal(got.Members, m.Committed) {
		t.Fatalf("Get c1: %+v %v, want the members %v", got, err, m.Committed)
	}
	for _, mm := range m.Members {
		raw, err := env.Bus.Stream.GetLastMsgForSubject(ctx(t), events.AckSubject(run, m.CommitSeq, events.PhaseCommit, mm.Member))
		if err != nil {
			t.Fatal(err)
		}
		_, d, err := events.Unmarshal(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
		if err != nil {
			t.Fatal(err)
		}
		if ack := d.(events.CommitAck); ack.Manifest == nil || ack.Manifest.SHA256 != mm.SHA256 || ack.Manifest.Object != mm.Object {
			t.Errorf("%s: the list holds %+v, its commit ack %+v", mm.Member, mm, ack.Manifest)
		}
	}
	if keys := kvKeys(t, env); !slices.Equal(keys, []string{events.LatestKey(run), events.ManifestKey(run, "c1")}) && !slices.Equal(keys, []string{events.ManifestKey(run, "c1"), events.LatestKey(run)}) {
		t.Errorf("sp_manifests holds %v, want the checkpoint manifest and LATEST only", keys)
	}
	data, err := env.Bus.Checkpoints.GetBytes(ctx(t), m.MemberList.Object)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Bus.Checkpoints.PutBytes(ctx(t), m.MemberList.Object, append(data, '\n')); err != nil {
		t.Fatal(err)
	}
	_, err = b.Restore(ctx(t), bridgeapi.RestoreRequest{Source: "c1"})
	if err == nil || !strings.Contains(err.Error(), m.MemberList.Object) || !strings.Contains(err.Error(), "sha256") {
		t.Fatalf("restore of a checkpoint whose member list was changed: %v, want a refusal naming the list and its digest", err)
	}
}

// TestReleaseKeepsManifestsWhenAMemberFails: a member that did not
// release may still hold state that the manifests name, so the bridge
// deletes nothing of its own, reports the member, and a retry finishes the
// release.
func TestReleaseKeepsManifestsWhenAMemberFails(t *testing.T) {
	env := jstest.Start(t)
	hs := fleet(t, env, 2, 1)
	b := startBridge(t, env, bridge.Config{})
	for _, id := range []string{"c1", "c2"} {
		if res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: id}); err != nil || res.Status != bridgeapi.StatusCommitted {
			t.Fatalf("%s: %+v %v", id, res, err)
		}
	}
	objs := objects(t, env)
	hs[1].Participant.FailRelease(errors.New("snapshot store unreachable"))
	res, err := b.Release(ctx(t), bridgeapi.ReleaseRequest{Keep: []string{"c2"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != bridgeapi.StatusFailed || len(res.Deleted) != 0 || res.Failure == nil {
		t.Fatalf("release with a failing member: %+v", res)
	}
	if len(res.Failure.Errors) != 1 || res.Failure.Errors[0].Member != hs[1].Name ||
		!strings.Contains(res.Failure.Errors[0].Detail, "snapshot store unreachable") {
		t.Errorf("failure %+v does not name %s and its error", res.Failure, hs[1].Name)
	}
	if !slices.Equal(res.MemberDeleted[hs[0].Name], []string{"c1"}) {
		t.Errorf("member deletions %v: %s released c1", res.MemberDeleted, hs[0].Name)
	}
	if manifestOf(t, env, "c1") == nil || !slices.Equal(objects(t, env), objs) {
		t.Error("the bridge deleted c1's manifest or records although a member did not release")
	}
	// The stream says it failed too: release.failed naming the member,
	// never release.completed.
	wantOutcome(t, env, res.OpID, events.TypeReleaseFailed, func(d events.Data) {
		f := d.(events.ReleaseFailed)
		if len(f.Errors) != 1 || f.Errors[0].Member != hs[1].Name || !slices.Equal(f.Deleted[hs[0].Name], []string{"c1"}) {
			t.Errorf("release.failed %+v does not name %s, or what %s deleted", f, hs[1].Name, hs[0].Name)
		}
	})
	// c1, not kept, may have lost what it names (hs[0] deleted its
	// snapshot): it is marked, and a restore of it is refused before any
	// phase, naming what is gone and who failed. c2, kept, is not marked.
	if m := manifestOf(t, env, "c1"); m == nil || m.Released == nil || m.Released.Op != res.OpID {
		t.Fatalf("c1 after the failed release: %+v", m)
	}
	if m := manifestOf(t, env, "c2"); m == nil || m.Released != nil {
		t.Fatalf("c2, kept, is marked: %+v", m)
	}
	before, err := b.Status(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Restore(ctx(t), bridgeapi.RestoreRequest{Source: "c1"})
	if !errors.Is(err, bridgeapi.ErrReleased) || !strings.Contains(err.Error(), string(hs[0].Name)+" deleted c1") ||
		!strings.Contains(err.Error(), string(hs[1].Name)) {
		t.Fatalf("restore of c1: %v, want ErrReleased naming what %s deleted and that %s failed", err, hs[0].Name, hs[1].Name)
	}
	if after, err := b.Status(ctx(t)); err != nil || after.Seq != before.Seq {
		t.Fatalf("the refused restore published a phase: seq %d then %d (%v)", before.Seq, after.Seq, err)
	}
	hs[1].Participant.FailRelease(nil)
	res, err = b.Release(ctx(t), bridgeapi.ReleaseRequest{Keep: []string{"c2"}})
	if err != nil || res.Status != bridgeapi.StatusCompleted || !slices.Equal(res.Deleted, []string{"c1"}) {
		t.Fatalf("retried release: %+v %v", res, err)
	}
	wantOutcome(t, env, res.OpID, events.TypeReleaseCompleted, nil)
	if manifestOf(t, env, "c1") != nil || manifestOf(t, env, "c2") == nil {
		t.Error("after the retry c1's manifest is left or c2's is gone")
	}
	for _, o := range objects(t, env) {
		if strings.Contains(o, "/c1/") {
			t.Errorf("record %s of a released checkpoint is left", o)
		}
	}
}

// TestHeldCheckpoint: hold parks the fleet across an outer save, renewing
// the lease; commit then finishes it. Another operation meanwhile is
// refused.
func TestHeldCheckpoint(t *testing.T) {
	env := jstest.Start(t)
	hs := fleet(t, env, 2, 1)
	// A phase's round trip must fit its timeout on a loaded machine, as in
	// the other bridge tests; the hold is then kept past two of them.
	const timeout = 2 * time.Second
	b := startBridge(t, env, bridge.Config{PhaseTimeout: timeout})
	res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1", Hold: true})
	if err != nil || res.Status != bridgeapi.StatusPrepared {
		t.Fatalf("hold: %+v %v", res, err)
	}
	held := time.Now()
	if _, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c2"}); !errors.Is(err, bridgeapi.ErrBusy) {
		t.Errorf("a second checkpoint while one is held: %v", err)
	}
	// Outlive two phase timeouts, the members' lease without a renew:
	// renewals (a third of the timeout apart) keep the fleet parked.
	poll.Wait(t, 30*time.Second, "two phase timeouts of renewals", func() bool {
		for _, h := range hs {
			if h.Participant.AdmissionOpen() {
				t.Fatalf("%s reopened while the checkpoint is held", h.Name)
			}
		}
		st, err := b.Status(ctx(t))
		return err == nil && st.Seq >= 3 && time.Since(held) > 2*timeout
	})
	res, err = b.Commit(ctx(t), "c1", false)
	if err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("commit: %+v %v", res, err)
	}
	poll.Wait(t, 5*time.Second, "every member to reopen admission", func() bool { return allOpen(hs) })
}

// TestTimeline reads a checkpoint back from the stream as the post-mortem
// does (an ordered consumer over sp.<run>.>) and finds it in protocol
// order: prepare, every prepare ack, commit, every commit ack, the outcome,
// resume, every resume ack.
func TestTimeline(t *testing.T) {
	t.Run("server", func(t *testing.T) { testTimeline(t, jstest.Start(t)) })
	t.Run("cluster", func(t *testing.T) { testTimeline(t, jstest.StartCluster(t)) })
}

func testTimeline(t *testing.T, env *jstest.Env) {
	fleet(t, env, 2, 1)
	b := startBridge(t, env, bridge.Config{})
	for _, id := range []string{"c1", "c2"} {
		if res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: id}); err != nil || res.Status != bridgeapi.StatusCommitted {
			t.Fatalf("%+v %v", res, err)
		}
	}
	want := []string{"phase.prepare", "ack.prepare", "ack.prepare", "phase.commit", "ack.commit", "ack.commit",
		"checkpoint.committed", "phase.resume", "resume.acked"}
	// The bridge does not wait for resume acks (which travel on core NATS):
	// read until the record of them is in.
	var entries []timeline.Entry
	poll.Wait(t, 10*time.Second, "the resume acks", func() bool {
		var err error
		if entries, err = timeline.Read(ctx(t), env.JS, run, "c2"); err != nil {
			t.Fatal(err)
		}
		return len(entries) >= len(want)
	})
	var got []string
	for i, e := range entries {
		if i > 0 && e.StreamSeq <= entries[i-1].StreamSeq {
			t.Fatalf("out of stream order at %d", i)
		}
		got = append(got, e.Type.Noun())
	}
	if !slices.Equal(got, want) {
		t.Fatalf("timeline of c2:\n got %v\nwant %v", got, want)
	}
	for _, e := range entries {
		if e.CheckpointID != "c2" || e.Summary == "" || strings.HasPrefix(e.Summary, "undecodable") {
			t.Errorf("entry %+v", e)
		}
	}
	all, err := timeline.Read(ctx(t), env.JS, run, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(all) < 2*len(want)+2 {
		t.Errorf("the whole run has %d events", len(all))
	}
}

// TestSecondBridgeFencesTheFirst: two bridges of one run (the first one a
// zombie presumed dead). The second takes the run over and aborts what the
// first held open; the first can then neither commit it nor renew it, and
// the checkpoint never gets a manifest (PROTOCOL §7, invariant 2).
func TestSecondBridgeFencesTheFirst(t *testing.T) {
	env := jstest.Start(t)
	hs := fleet(t, env, 2, 1)
	zombie := startBridge(t, env, bridge.Config{PhaseTimeout: 2 * time.Second})
	if res, err := zombie.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "x", Hold: true}); err != nil || res.Status != bridgeapi.StatusPrepared {
		t.Fatalf("hold: %+v %v", res, err)
	}
	second := startBridge(t, env, bridge.Config{Name: "second"})
	if res, err := second.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "y"}); err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("the second bridge's checkpoint: %+v %v", res, err)
	}
	if m := manifestOf(t, env, "x"); m == nil || !m.Aborted {
		t.Fatalf("x after the takeover: %+v, want an abort marker", m)
	}
	if _, err := zombie.Commit(ctx(t), "x", false); !errors.Is(err, bridgeapi.ErrFenced) {
		t.Fatalf("the zombie's commit: %v, want ErrFenced", err)
	}
	if m := manifestOf(t, env, "x"); m == nil || !m.Aborted {
		t.Fatalf("x after the zombie's commit: %+v", m)
	}
	poll.Wait(t, 5*time.Second, "the fleet to reopen", func() bool { return allOpen(hs) })
	if st, _ := second.Status(ctx(t)); st.Latest == nil || st.Latest.CheckpointID != "y" {
		t.Fatalf("LATEST %+v, want y", st.Latest)
	}
}

// TestRestoreNeedsNoFreshMemberForEmptyExports: a member that exported
// nothing (a sandbox daemon; its sandbox is forked under a new id) needs no
// fresh member of its name for a restore.
func TestRestoreNeedsNoFreshMemberForEmptyExports(t *testing.T) {
	env := jstest.Start(t)
	withWork := membertest.StartMembers(t, env, run, 1, membertest.Options{Episodes: 2})
	idle := membertest.StartMembers(t, env, run, 1, membertest.Options{Prefix: "idle"})
	b := startBridge(t, env, bridge.Config{})
	if res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1", Stop: true}); err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("%+v %v", res, err)
	}
	_ = withWork[0].Stop()
	_ = idle[0].Stop()
	membertest.StartMembers(t, env, run, 1, membertest.Options{})
	res, err := b.Restore(ctx(t), bridgeapi.RestoreRequest{})
	if err != nil || res.Status != bridgeapi.StatusCompleted || len(res.Restored) != 2 {
		t.Fatalf("restore without a fresh agent.idle0: %+v %v", res, err)
	}
}

// TestHeadOutlivesAgedOutPhases: when the run's phases have left the stream
// (MaxAge), a bridge goes on from the run's head record: the sequence never
// goes back, and the reserved checkpoint ids are refused.
func TestHeadOutlivesAgedOutPhases(t *testing.T) {
	env := jstest.Start(t)
	fleet(t, env, 2, 1)
	b := startBridge(t, env, bridge.Config{})
	for _, id := range []string{"c1", "c2"} {
		if res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: id}); err != nil || res.Status != bridgeapi.StatusCommitted {
			t.Fatalf("%+v %v", res, err)
		}
	}
	st, err := b.Status(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	before := st.Seq
	// What MaxAge does to an idle run: its phase events are gone.
	if err := env.Bus.Stream.Purge(ctx(t), natsjs.WithPurgeSubject(events.PhaseFilter(run))); err != nil {
		t.Fatal(err)
	}
	b2 := startBridge(t, env, bridge.Config{Name: "second"})
	if st, err := b2.Status(ctx(t)); err != nil || st.Seq != before {
		t.Fatalf("a bridge after the phases aged out reads seq %d (%v), want %d", st.Seq, err, before)
	}
	res, err := b2.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c3"})
	if err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("checkpoint after the phases aged out: %+v %v", res, err)
	}
	if st, _ := b2.Status(ctx(t)); st.Seq <= before {
		t.Fatalf("seq %d after c3, want above %d", st.Seq, before)
	}
	for _, id := range []string{"LATEST", "HEAD"} {
		if _, err := b2.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: id}); err == nil || !strings.Contains(err.Error(), "reserved") {
			t.Errorf("checkpoint id %s: %v, want it refused as reserved", id, err)
		}
	}
}

// TestHeldCheckpointOutlivesAFailedCommit: a commit of the held
// checkpoint that cannot read the run's state fails and leaves the
// checkpoint held; a commit once the state reads again commits it.
func TestHeldCheckpointOutlivesAFailedCommit(t *testing.T) {
	env := jstest.Start(t)
	hs := fleet(t, env, 2, 1)
	b := newBridge(t, env, bridge.Config{PhaseTimeout: 30 * time.Second})
	res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1", Hold: true})
	if err != nil || res.Status != bridgeapi.StatusPrepared {
		t.Fatalf("hold: %+v %v", res, err)
	}
	// The bridge writes the run's head in the background (publish.go,
	// heads): wait for the prepare's.
	var head natsjs.KeyValueEntry
	poll.Wait(t, 10*time.Second, "the run's head to be written", func() bool {
		var err error
		head, err = env.Bus.Manifests.Get(ctx(t), events.HeadKey(run))
		return err == nil
	})
	// The run's head does not decode: the state read fails.
	if _, err := env.Bus.Manifests.Put(ctx(t), events.HeadKey(run), []byte("not json")); err != nil {
		t.Fatal(err)
	}
	if res, err := b.Commit(ctx(t), "c1", false); err == nil {
		t.Fatalf("commit with a head that does not decode: %+v, want an error", res)
	}
	if _, err := env.Bus.Manifests.Put(ctx(t), events.HeadKey(run), head.Value()); err != nil {
		t.Fatal(err)
	}
	res, err = b.Commit(ctx(t), "c1", false)
	if err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("commit once the state reads again: %+v %v, want committed: the failed commit lost the hold", res, err)
	}
	poll.Wait(t, 5*time.Second, "every member to reopen admission", func() bool { return allOpen(hs) })
}

// TestCheckpointHeldAfterRunReturnedIsAbandoned: a Run that stops while a
// checkpoint with hold is still preparing cannot wait for it for ever;
// once it has returned, that checkpoint is abandoned when it prepares
// (nobody would renew its lease), not held: the fleet reopens at once.
func TestCheckpointHeldAfterRunReturnedIsAbandoned(t *testing.T) {
	tier.Long(t) // Run waits 5 s for the operation slot
	env := jstest.Start(t)
	hs := fleet(t, env, 1, 1)
	ep, err := events.ParseEpisode(hs[0].Participant.Live()[0])
	if err != nil {
		t.Fatal(err)
	}
	hs[0].Participant.Block(ep)
	b := buildBridge(t, env, bridge.Config{ResumeTimeout: 10 * time.Millisecond})
	rctx, stop := context.WithCancel(context.WithoutCancel(t.Context()))
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- b.Run(rctx) }()
	type answer struct {
		res *bridgeapi.CheckpointResult
		err error
	}
	held := make(chan answer, 1)
	go func() {
		res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1", Hold: true, TimeoutMS: 60_000})
		held <- answer{res, err}
	}()
	poll.Wait(t, 10*time.Second, "the member to prepare", func() bool { return !hs[0].Participant.AdmissionOpen() })
	stop()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return while an operation held the slot")
	}
	hs[0].Participant.Unblock(ep)
	a := <-held
	if a.err != nil || a.res.Status != bridgeapi.StatusFailed {
		t.Fatalf("the checkpoint after Run returned: %+v %v, want failed (abandoned)", a.res, a.err)
	}
	poll.Wait(t, 5*time.Second, "the member to reopen admission", func() bool { return allOpen(hs) })
}

// TestCheckpointWithoutAnIDGetsOne: a checkpoint asked without an id gets
// a new one (the machine's, c-<time>) and commits under it.
func TestCheckpointWithoutAnIDGetsOne(t *testing.T) {
	env := jstest.Start(t)
	fleet(t, env, 1, 1)
	b := startBridge(t, env, bridge.Config{})
	res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{})
	if err != nil || res.Status != bridgeapi.StatusCommitted || !strings.HasPrefix(res.CheckpointID, "c-") {
		t.Fatalf("checkpoint without an id: %+v %v, want committed as c-<time>", res, err)
	}
	if m := manifestOf(t, env, res.CheckpointID); m == nil || m.Aborted {
		t.Fatalf("manifest of %s: %+v", res.CheckpointID, m)
	}
}

// wantOutcome checks that the timeline of operation id holds exactly one
// outcome, of type want, and hands its data to check.
func wantOutcome(t *testing.T, env *jstest.Env, id string, want events.Type, check func(events.Data)) {
	t.Helper()
	entries, err := timeline.Read(ctx(t), env.JS, run, id)
	if err != nil {
		t.Fatal(err)
	}
	var outcomes []timeline.Entry
	for _, e := range entries {
		if strings.Contains(e.Subject, ".outcome.") {
			outcomes = append(outcomes, e)
		}
	}
	if len(outcomes) != 1 || outcomes[0].Type != want {
		t.Fatalf("outcomes of %s: %+v, want one %s", id, outcomes, want)
	}
	if check != nil {
		check(outcomes[0].Data)
	}
}

// PROTOCOL §4: no one can publish the bridge's ids first. An intruder
// that read every id on the stream after a checkpoint publishes, on a
// subject of another run, the ids that a scheme derived from what the bus
// shows (run, sequence, phase, checkpoint, member, the nonces in the ids
// seen) would give the next two checkpoints' phases, rosters, records and
// outcomes, and the members' acks. Both still commit, with every phase,
// ack, record and outcome on the stream: none was dropped as a duplicate
// of the intruder's, and the bridge was never fenced by a stranger's
// message taken for its phase.
func TestIDsCannotBeClaimedFirst(t *testing.T) {
	env := jstest.Start(t)
	hs := fleet(t, env, 2, 1)
	sbs := sandboxes(t, env, 2)
	b := startBridge(t, env, bridge.Config{})
	checkpoint := func(id string) {
		t.Helper()
		res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: id})
		if err != nil || res.Status != bridgeapi.StatusCommitted {
			t.Fatalf("%s: %+v %v", id, res, err)
		}
		poll.Wait(t, 10*time.Second, "every member to reopen admission", func() bool { return allOpen(hs) && allOpen(sbs) })
	}
	checkpoint("c1")
	want := timelineOf(t, env, "c1")

	in := membertest.NewIntruder(t, env)
	seen := in.Seen()
	guesses := membertest.Guesses(run, seen, 8, []string{"c1"}, "c2", "c3")
	// What derived ids would have been (c1 took sequences 1 to 3): the
	// guesses hold them.
	for _, derived := range []string{"run1.4.prepare.c2", "run1.5.commit.c2", "run1.c2.checkpoint.committed",
		"run1.7.roster", "run1.9.resume.acked", "run1.7.prepare.acked.1", "run1.8.commit.agent.t1"} {
		if !slices.ContainsFunc(slices.Collect(maps.Keys(guesses)), func(g string) bool { return strings.HasPrefix(g, derived) }) {
			t.Fatalf("the guesses from %d ids miss %s", len(seen), derived)
		}
	}
	t.Logf("%d guesses from %d ids", len(guesses), len(seen))
	if n := in.Claim(guesses); n != len(guesses) {
		t.Fatalf("the stream stored %d of %d guesses", n, len(guesses))
	}

	for _, id := range []string{"c2", "c3"} {
		checkpoint(id)
		if got := timelineOf(t, env, id); !slices.Equal(got, want) {
			t.Fatalf("timeline of %s:\n got %v\nwant %v (as c1's)", id, got, want)
		}
	}
}

// timelineOf returns the types of checkpoint id's events on the stream,
// in order, once the record of its resume's acks is there.
func timelineOf(t *testing.T, env *jstest.Env, id string) []string {
	t.Helper()
	var got []string
	poll.Wait(t, 10*time.Second, "the record of the resume's acks", func() bool {
		entries, err := timeline.Read(ctx(t), env.JS, run, id)
		if err != nil {
			t.Fatal(err)
		}
		got = got[:0]
		for _, e := range entries {
			got = append(got, e.Type.Noun())
		}
		return slices.Contains(got, "resume.acked")
	})
	return got
}
