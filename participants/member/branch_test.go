package member_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// checkpointAt checkpoints scope as id and returns the commit's sequence.
func (w *world) checkpointAt(t *testing.T, id string, scope []events.Episode) uint64 {
	t.Helper()
	want(t, w.prepare(t, id), "", events.StatePrepared)
	c := w.commit(t, id, scope, false)
	want(t, c, "", events.StateCommitted)
	want(t, w.resume(t, id), "", events.StateIdle)
	return c.Header().Seq
}

// branchRecords returns key -> the export that wrote it, of the records
// the last Branch call got.
func branchRecords(t *testing.T, p *membertest.Participant) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, rec := range p.BranchRecords() {
		var d membertest.RecordData
		if err := json.Unmarshal(rec.Data, &d); err != nil {
			t.Fatalf("record %s: %v", rec.Key, err)
		}
		out[rec.Key] = d.Export
	}
	return out
}

// §5 Branch: the Brancher gets exactly the member's records of the
// parents, a carried parent's from the checkpoint that carried it, and
// the ack names the branch episodes it installed.
func TestBranchGetsExactlyTheParentsRecords(t *testing.T) {
	w := start(t, membertest.Options{})
	eps := w.p.AddWork(t, 3)
	q1 := w.checkpointAt(t, "k1", eps) // export 1
	q2 := w.checkpointAt(t, "k2", eps) // export 2

	s1 := events.NewBranchSpec(eps[2], 1, 5)
	a := w.phase(t, events.Branch{PhaseHeader: w.bridge.Header("b1", 10*time.Second, w.name), Source: "k2", SourceCommitSeq: q2,
		Branches: []events.BranchSpec{s1}})
	want(t, a, "", events.StateIdle)
	if got := a.(events.BranchAck).Branched; !slices.Equal(got, []string{s1.Episode.String()}) {
		t.Fatalf("branched %v, want %s", got, s1.Episode)
	}
	if got, wantRecs := branchRecords(t, w.p), map[string]int{eps[2].String(): 2}; !mapsEqual(got, wantRecs) {
		t.Fatalf("Branch got records %v, want %v", got, wantRecs)
	}

	// eps[0] carried from k1: its record comes from k1's export, not k2's.
	specs := []events.BranchSpec{events.NewBranchSpec(eps[0], 1, 6), events.NewBranchSpec(eps[0], 2, 7), events.NewBranchSpec(eps[1], 1, 8)}
	a = w.phase(t, events.Branch{PhaseHeader: w.bridge.Header("b2", 10*time.Second, w.name), Source: "k2", SourceCommitSeq: q2,
		Carried:  []events.CarriedSource{{Source: "k1", SourceCommitSeq: q1, Episodes: eps[:1]}},
		Branches: specs})
	want(t, a, "", events.StateIdle)
	wantKeys := []string{specs[0].Episode.String(), specs[1].Episode.String(), specs[2].Episode.String()}
	slices.Sort(wantKeys)
	if got := a.(events.BranchAck).Branched; !slices.Equal(got, wantKeys) {
		t.Fatalf("branched %v, want %v", got, wantKeys)
	}
	if got, wantRecs := branchRecords(t, w.p), map[string]int{eps[0].String(): 1, eps[1].String(): 2}; !mapsEqual(got, wantRecs) {
		t.Fatalf("Branch got records %v, want %v", got, wantRecs)
	}
	for _, k := range wantKeys {
		if !slices.Contains(w.p.Live(), k) {
			t.Fatalf("live %v lacks the branch %s", w.p.Live(), k)
		}
	}
	if n := w.p.Count("branch"); n != 2 {
		t.Fatalf("%d branch calls, want 2 (a repeat answers the recorded reply)", n)
	}
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// notBrancher is a test participant without Branch.
type notBrancher struct {
	subjectNoBranch
}

type subjectNoBranch interface {
	membertest.Subject
	member.Exporter
	member.Resumer
	member.Installer
}

// §5 Branch: records of a parent and no Brancher fail the ack, saying so;
// a failed Brancher fails it too; a member with nothing of the parents
// acks ok with nothing branched.
func TestBranchFailures(t *testing.T) {
	env := jstest.Start(t)
	b := membertest.NewBridge(t, env, "run1")
	p := membertest.NewParticipant("t0")
	a := membertest.StartMember(t, env, "run1", "agent.a", notBrancher{p}, membertest.Options{}).Name
	eps := p.AddWork(t, 2)
	want(t, b.Ack(b.Publish(events.Prepare{PhaseHeader: b.Header("k1", 10*time.Second, a)}), events.PhasePrepare, a), "", events.StatePrepared)
	q := b.Publish(events.Commit{PhaseHeader: b.Header("k1", 10*time.Second, a), Scope: eps[:1]})
	want(t, b.Ack(q, events.PhaseCommit, a), "", events.StateCommitted)
	want(t, b.Ack(b.Publish(events.Resume{PhaseHeader: b.Header("k1", 10*time.Second, a)}), events.PhaseResume, a), "", events.StateIdle)

	r := b.Ack(b.Publish(events.Branch{PhaseHeader: b.Header("b1", 10*time.Second, a), Source: "k1", SourceCommitSeq: q,
		Branches: []events.BranchSpec{events.NewBranchSpec(eps[0], 1, 1)}}), events.PhaseBranch, a)
	want(t, r, events.CodeInstallFailed, events.StateIdle)
	if d := r.Header().Error.Detail; !strings.Contains(d, "no Brancher") {
		t.Fatalf("detail %q does not say the participant cannot branch", d)
	}
	// eps[1] is not in k1: nothing of it to branch.
	r = b.Ack(b.Publish(events.Branch{PhaseHeader: b.Header("b2", 10*time.Second, a), Source: "k1", SourceCommitSeq: q,
		Branches: []events.BranchSpec{events.NewBranchSpec(eps[1], 1, 1)}}), events.PhaseBranch, a)
	want(t, r, "", events.StateIdle)
	if got := r.(events.BranchAck).Branched; len(got) != 0 {
		t.Fatalf("branched %v of a parent not in the source", got)
	}
}

// §5 Branch: a Brancher's error fails the ack install_failed.
func TestBranchBrancherFails(t *testing.T) {
	w := start(t, membertest.Options{})
	eps := w.p.AddWork(t, 1)
	q := w.checkpointAt(t, "k1", eps)
	w.p.FailBranch(membertest.ErrInjected)
	r := w.phase(t, events.Branch{PhaseHeader: w.bridge.Header("b1", 10*time.Second, w.name), Source: "k1", SourceCommitSeq: q,
		Branches: []events.BranchSpec{events.NewBranchSpec(eps[0], 1, 1)}})
	want(t, r, events.CodeInstallFailed, events.StateIdle)
	if live := w.p.Live(); len(live) != 1 {
		t.Fatalf("live %v after a failed branch, want the parent only", live)
	}
}
