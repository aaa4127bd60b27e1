package timeline

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
)

// script records a run's events as a test writes them: each event one
// millisecond step (or more, with at) after the previous one, stream
// sequences in order.
type script struct {
	t0  time.Time
	now time.Time
	seq uint64
	evs []Event
}

func newScript() *script {
	t0 := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	return &script{t0: t0, now: t0}
}

const run = "r1"

var (
	a1 = events.Member("agent.a1")
	a2 = events.Member("agent.a2")
	o1 = events.Member("owner.o1")
)

func (s *script) add(after time.Duration, d events.Data) uint64 {
	s.now = s.now.Add(after)
	s.seq++
	s.evs = append(s.evs, Event{StreamSeq: s.seq, Time: s.now, Source: "/r1/x", Data: d})
	return s.seq
}

func (s *script) header(id string, seq, epoch uint64, members ...events.Member) events.PhaseHeader {
	return events.PhaseHeader{Run: run, CheckpointID: id, Seq: seq, Epoch: epoch, Deadline: s.now.Add(30 * time.Second), Members: members}
}

func ackHeader(id string, seq, epoch uint64, m events.Member) events.AckHeader {
	return events.AckHeader{Run: run, Member: m, Seq: seq, CheckpointID: id, Epoch: epoch, OK: true, State: events.StatePrepared, TookMS: 3}
}

func ready(id string, seq uint64, m events.Member) events.PrepareAck {
	return events.PrepareAck{AckHeader: ackHeader(id, seq, 0, m), Ready: true}
}

func okAck(id string, seq, epoch uint64, m events.Member) events.ResumeAck {
	h := ackHeader(id, seq, epoch, m)
	h.State = events.StateIdle
	return events.ResumeAck{AckHeader: h}
}

func commitAck(id string, seq uint64, m events.Member) events.CommitAck {
	h := ackHeader(id, seq, 0, m)
	h.State = events.StateCommitted
	return events.CommitAck{AckHeader: h}
}

func build(t *testing.T, s *script) (*Builder, []Op) {
	t.Helper()
	var b Builder
	for _, e := range s.evs {
		b.Add(e)
	}
	return &b, b.Ops(b.Last())
}

func latency(t *testing.T, a Ack) float64 {
	t.Helper()
	if a.LatencyMS == nil {
		t.Fatalf("%s has no latency: %+v", a.Member, a)
	}
	return *a.LatencyMS
}

// TestCommittedCheckpoint: a checkpoint through prepare and commit, its
// outcome and the resume after it: latencies from each publish, members
// slowest first, and Done only once the resume has every ack.
func TestCommittedCheckpoint(t *testing.T) {
	s := newScript()
	var b Builder
	add := func(after time.Duration, d events.Data) string {
		s.add(after, d)
		return b.Add(s.evs[len(s.evs)-1])
	}
	add(0, events.MemberJoined{Member: a1})
	add(time.Millisecond, events.Prepare{PhaseHeader: s.header("c1", 1, 0, a1, a2)})
	add(5*time.Millisecond, ready("c1", 1, a1))
	add(40*time.Millisecond, ready("c1", 1, a2))
	add(time.Millisecond, events.Commit{PhaseHeader: s.header("c1", 2, 0, a1, a2)})
	add(70*time.Millisecond, commitAck("c1", 2, a1))
	add(10*time.Millisecond, commitAck("c1", 2, a2))
	id := add(time.Millisecond, events.CheckpointCommitted{OutcomeHeader: events.OutcomeHeader{Run: run, CheckpointID: "c1"},
		Continued: []string{"ro1-a0"}, Members: []events.Member{a1, a2}})
	if id != "c1" {
		t.Fatalf("the outcome belongs to %q", id)
	}
	if b.Done("c1", s.now) {
		t.Fatal("Done before the resume that follows a committed checkpoint")
	}
	add(time.Millisecond, events.Resume{PhaseHeader: s.header("c1", 3, 0, a1, a2)})
	add(2*time.Millisecond, okAck("c1", 3, 0, a1))
	if b.Done("c1", s.now) {
		t.Fatal("Done while a resume ack is pending")
	}
	add(2*time.Millisecond, okAck("c1", 3, 0, a2))
	if !b.Done("c1", s.now) || b.Done("c1", s.now) {
		t.Fatal("Done must report the finished checkpoint once")
	}

	ops := b.Ops(s.now)
	if len(ops) != 1 {
		t.Fatalf("%d operations, want 1: %+v", len(ops), ops)
	}
	op := ops[0]
	if op.Kind != KindCheckpoint || op.Status != StatusCommitted || len(op.Phases) != 3 || len(op.Members) != 2 {
		t.Fatalf("op %+v", op)
	}
	prep := op.Phases[0]
	if prep.Phase != events.PhasePrepare || prep.Acks[0].Member != a2 || latency(t, prep.Acks[0]) != 45 || latency(t, prep.Acks[1]) != 5 {
		t.Errorf("prepare acks not slowest first with their latencies: %+v", prep.Acks)
	}
	if prep.Acks[0].Ready == nil || !*prep.Acks[0].Ready || prep.Acks[0].Status != AckOK {
		t.Errorf("prepare ack %+v", prep.Acks[0])
	}
	if c := op.Phases[1]; c.Acks[0].Member != a2 || latency(t, c.Acks[0]) != 80 {
		t.Errorf("commit acks %+v", c.Acks)
	}
	if op.Outcome == nil || op.Outcome.AfterMS != 127 || op.Outcome.Continued != 1 {
		t.Errorf("outcome %+v", op.Outcome)
	}
	for _, p := range op.Phases {
		for _, a := range p.Acks {
			if a.Late || a.BeforePhase || a.Unexpected {
				t.Errorf("%s %s marked %+v", p.Phase, a.Member, a)
			}
		}
	}
}

// TestAbortedByNotReadyAndMissing: a prepare that one member answers not
// ready and another never answers; the bridge aborts (resume aborted,
// then checkpoint.failed). The missing member is missing, the blockers
// are kept, and a late ack after the outcome is marked late.
func TestAbortedByNotReadyAndMissing(t *testing.T) {
	s := newScript()
	s.add(0, events.Prepare{PhaseHeader: s.header("c2", 1, 0, a1, a2, o1)})
	nr := ready("c2", 1, a1)
	nr.Ready = false
	nr.SetBlockers([]string{"ro1-a0", "ro2-a0"})
	s.add(3*time.Millisecond, nr)
	s.add(time.Millisecond, ready("c2", 1, o1))
	s.add(time.Second, events.CheckpointFailed{OutcomeHeader: events.OutcomeHeader{Run: run, CheckpointID: "c2"}, Phase: events.PhasePrepare,
		Reason: "not ready", Errors: []events.MemberError{{Member: a2, Code: events.CodeMissingAck}}})
	s.add(time.Millisecond, events.Resume{PhaseHeader: s.header("c2", 2, 0, a1, a2, o1), Aborted: true})
	s.add(time.Millisecond, ready("c2", 1, a2)) // after the outcome
	_, ops := build(t, s)
	op := ops[0]
	if op.Status != StatusFailed || op.Outcome.Reason != "not ready" || op.Outcome.Phase != events.PhasePrepare || len(op.Outcome.Errors) != 1 {
		t.Fatalf("op %+v outcome %+v", op, op.Outcome)
	}
	acks := op.Phases[0].Acks
	if acks[0].Member != a2 || !acks[0].Late || acks[0].Status != AckOK {
		t.Errorf("the ack after the outcome should lead, late: %+v", acks)
	}
	var notReady Ack
	for _, a := range acks {
		if a.Member == a1 {
			notReady = a
		}
	}
	if notReady.Status != AckNotReady || notReady.BlockerCount != 2 || len(notReady.Blockers) != 2 {
		t.Errorf("not ready ack %+v", notReady)
	}
	if r := op.Phases[1]; !r.Aborted || r.Phase != events.PhaseResume {
		t.Errorf("resume %+v", r)
	}
}

// TestMissingOnceOver: an expected member without an ack is pending while
// its phase may still be answered, missing once a later phase followed or
// the deadline passed.
func TestMissingOnceOver(t *testing.T) {
	s := newScript()
	s.add(0, events.Prepare{PhaseHeader: s.header("c3", 1, 0, a1, a2)})
	s.add(time.Millisecond, ready("c3", 1, a1))
	var b Builder
	for _, e := range s.evs {
		b.Add(e)
	}
	op, _ := b.Op("c3", s.now)
	if op.Status != StatusOpen || op.Phases[0].Acks[0].Status != AckPending || op.Phases[0].Acks[0].Member != a2 {
		t.Fatalf("before the deadline: %+v", op.Phases[0].Acks)
	}
	if b.Done("c3", s.now.Add(time.Hour)) {
		t.Error("an operation without an outcome is not done")
	}
	op, _ = b.Op("c3", s.now.Add(time.Minute))
	if op.Phases[0].Acks[0].Status != AckMissing {
		t.Errorf("after the deadline: %+v", op.Phases[0].Acks)
	}
	s.add(time.Millisecond, events.Resume{PhaseHeader: s.header("c3", 2, 0, a1, a2), Aborted: true})
	b.Add(s.evs[len(s.evs)-1])
	op, _ = b.Op("c3", s.now)
	if op.Phases[0].Acks[0].Status != AckMissing {
		t.Errorf("once a later phase followed: %+v", op.Phases[0].Acks)
	}
	if b.Open()[0] != "c3" {
		t.Errorf("open %v", b.Open())
	}
}

// TestAckBeforePhaseAndDuplicates: an ack the stream holds before its
// phase event, a phase published twice (a bridge restarted past the
// duplicate window) and an ack sent twice.
func TestAckBeforePhaseAndDuplicates(t *testing.T) {
	s := newScript()
	pre := s.header("c4", 1, 0, a1, a2)
	s.add(0, ready("c4", 1, a1)) // before the phase
	s.add(2*time.Millisecond, events.Prepare{PhaseHeader: pre})
	s.add(5*time.Millisecond, ready("c4", 1, a2))
	s.add(time.Second, events.Prepare{PhaseHeader: pre}) // republished
	s.add(time.Millisecond, ready("c4", 1, a2))          // answered again
	_, ops := build(t, s)
	op := ops[0]
	if op.Kind != KindCheckpoint || len(op.Phases) != 1 {
		t.Fatalf("op %+v", op)
	}
	p := op.Phases[0]
	if p.Republished != 1 || p.StreamSeq != 2 {
		t.Errorf("phase %+v: the first publish is kept, one republish counted", p)
	}
	byMember := map[events.Member]Ack{}
	for _, a := range p.Acks {
		byMember[a.Member] = a
	}
	if a := byMember[a1]; !a.BeforePhase || latency(t, a) != -2 {
		t.Errorf("ack before the phase %+v", a)
	}
	if a := byMember[a2]; a.Duplicates != 1 || latency(t, a) != 5 || a.BeforePhase {
		t.Errorf("duplicated ack %+v: the first is kept", a)
	}
	if op.Start != s.t0.Add(2*time.Millisecond) {
		t.Errorf("start %v: the phase's publish", op.Start)
	}
}

// TestBridgeRestartAborts: the bridge dies after the prepare's acks and
// the one started in its place aborts what was open: a later resume
// (aborted) and checkpoint.failed; an outcome written twice is counted.
func TestBridgeRestartAborts(t *testing.T) {
	s := newScript()
	s.add(0, events.Prepare{PhaseHeader: s.header("c5", 7, 0, a1, a2)})
	s.add(time.Millisecond, ready("c5", 7, a1))
	s.add(time.Millisecond, ready("c5", 7, a2))
	s.add(3*time.Second, events.Resume{PhaseHeader: s.header("c5", 8, 0, a1, a2), Aborted: true})
	fail := events.CheckpointFailed{OutcomeHeader: events.OutcomeHeader{Run: run, CheckpointID: "c5"}, Phase: events.PhasePrepare, Reason: "bridge restarted"}
	s.add(time.Millisecond, fail)
	s.add(time.Millisecond, okAck("c5", 8, 0, a1))
	s.add(time.Millisecond, okAck("c5", 8, 0, a2))
	s.add(time.Millisecond, fail)
	b, ops := build(t, s)
	op := ops[0]
	if op.Status != StatusFailed || op.Outcome.Repeated != 1 || len(op.Phases) != 2 || !op.Phases[1].Aborted {
		t.Fatalf("op %+v", op)
	}
	if !b.Done("c5", s.now) {
		t.Error("a failed checkpoint whose aborting resume was answered is done")
	}
}

// TestRestoreOpensAnEpoch: a restore in epoch 1 by fresh members, its
// outcome and resume; then a checkpoint of the new epoch.
func TestRestoreOpensAnEpoch(t *testing.T) {
	s := newScript()
	s.add(0, events.Restore{PhaseHeader: s.header("r1", 9, 1, a1, o1), Source: "c1"})
	ra := func(m events.Member) events.RestoreAck {
		h := ackHeader("r1", 9, 1, m)
		h.State = events.StateRestored
		return events.RestoreAck{AckHeader: h}
	}
	s.add(4*time.Millisecond, ra(a1))
	s.add(600*time.Millisecond, ra(o1))
	s.add(time.Millisecond, events.RestoreCompleted{OutcomeHeader: events.OutcomeHeader{Run: run, CheckpointID: "r1", Epoch: 1}, Source: "c1",
		Restored: []string{"ro1-a1", "ro2-a1"}})
	s.add(time.Millisecond, events.Resume{PhaseHeader: s.header("r1", 10, 1, a1, o1)})
	s.add(time.Millisecond, okAck("r1", 10, 1, a1))
	s.add(time.Millisecond, okAck("r1", 10, 1, o1))
	s.add(time.Second, events.Prepare{PhaseHeader: s.header("c6", 11, 1, a1, o1)})
	_, ops := build(t, s)
	if len(ops) != 2 {
		t.Fatalf("%d ops", len(ops))
	}
	r := ops[0]
	if r.Kind != KindRestore || r.Status != StatusCompleted || r.Epoch != 1 || r.Outcome.Restored != 2 || r.Outcome.Source != "c1" {
		t.Fatalf("restore %+v %+v", r, r.Outcome)
	}
	if a := r.Phases[0].Acks[0]; a.Member != o1 || a.Epoch != 1 || latency(t, a) != 604 {
		t.Errorf("restore acks %+v", r.Phases[0].Acks)
	}
	if c := ops[1]; c.Kind != KindCheckpoint || c.Epoch != 1 || c.Status != StatusOpen {
		t.Errorf("the checkpoint after %+v", c)
	}
}

// TestUnknownMembersAndOperations: an ack from a member the phase did not
// name, and acks of an operation whose phase is not on the stream.
func TestUnknownMembersAndOperations(t *testing.T) {
	s := newScript()
	s.add(0, events.Prepare{PhaseHeader: s.header("c7", 1, 0, a1)})
	s.add(time.Millisecond, ready("c7", 1, a1))
	s.add(time.Millisecond, ready("c7", 1, o1)) // not named
	s.add(time.Millisecond, commitAck("old", 3, a2))
	_, ops := build(t, s)
	if len(ops) != 2 {
		t.Fatalf("%d ops", len(ops))
	}
	c := ops[0]
	if len(c.Members) != 2 || len(c.Phases[0].Acks) != 2 {
		t.Fatalf("c7 %+v", c)
	}
	for _, a := range c.Phases[0].Acks {
		if (a.Member == o1) != a.Unexpected {
			t.Errorf("%s unexpected=%v", a.Member, a.Unexpected)
		}
	}
	old := ops[1]
	if old.Kind != KindUnknown || old.Phases[0].Phase != events.PhaseCommit || old.Phases[0].StreamSeq != 0 {
		t.Fatalf("old %+v", old)
	}
	if a := old.Phases[0].Acks[0]; a.LatencyMS != nil || !a.BeforePhase || a.Member != a2 {
		t.Errorf("an ack of an unseen phase has no latency: %+v", a)
	}
}

// TestRetireCompletesWithoutOutcome: retire publishes no outcome; it is
// completed once every member answered ok.
func TestRetireCompletesWithoutOutcome(t *testing.T) {
	s := newScript()
	s.add(0, events.Retire{PhaseHeader: s.header("retire-3", 3, 0, a1, a2), Episodes: []events.Episode{{Rollout: "ro1", Attempt: 0}}})
	s.add(time.Millisecond, okAck("retire-3", 3, 0, a1))
	var b Builder
	for _, e := range s.evs {
		b.Add(e)
	}
	if b.Done("retire-3", s.now) {
		t.Fatal("done with an ack pending")
	}
	s.add(time.Millisecond, okAck("retire-3", 3, 0, a2))
	b.Add(s.evs[len(s.evs)-1])
	op, _ := b.Op("retire-3", s.now)
	if op.Kind != KindRetire || op.Status != StatusCompleted || !b.Done("retire-3", s.now) {
		t.Fatalf("retire %+v", op)
	}
}

// TestRenderings: the text names every member and the outcome; the JSON
// is the model; the page is one file with the model inside and nothing
// it would fetch.
func TestRenderings(t *testing.T) {
	s := newScript()
	s.add(0, events.Prepare{PhaseHeader: s.header("c8", 1, 0, a1, a2)})
	s.add(time.Millisecond, ready("c8", 1, a1))
	s.add(time.Second, events.CheckpointFailed{OutcomeHeader: events.OutcomeHeader{Run: run, CheckpointID: "c8"}, Phase: events.PhasePrepare,
		Reason: "agent.a2 <did not answer>", Errors: []events.MemberError{{Member: a2, Code: events.CodeMissingAck}}})
	_, ops := build(t, s)

	var text bytes.Buffer
	if err := WriteText(&text, ops); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"checkpoint c8  FAILED", "agent.a2", "MISSING", "agent.a1", "1.000 ms ok", "outcome: FAILED", "missing_ack"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
	}

	js, err := json.Marshal(ops[0])
	if err != nil {
		t.Fatal(err)
	}
	var back Op
	if err := json.Unmarshal(js, &back); err != nil || back.ID != "c8" || back.Phases[0].Acks[0].Status != AckMissing {
		t.Errorf("JSON round trip: %v %s", err, js)
	}
	if strings.Contains(string(js), `"time":"0001`) || strings.Contains(string(js), `"latency_ms":null`) {
		t.Errorf("a missing ack's zero time or latency is in the JSON: %s", js)
	}

	var page bytes.Buffer
	if err := WriteHTML(&page, Page{Run: run, Generated: s.now, Ops: ops}); err != nil {
		t.Fatal(err)
	}
	html := page.String()
	for _, want := range []string{`"id":"c8"`, `"member":"agent.a2"`, "member-row", "createElementNS", "function drawOp"} {
		if !strings.Contains(html, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	// The reason's angle brackets must not end up as markup.
	if strings.Contains(html, "<did not answer>") {
		t.Error("the reason is in the page unescaped")
	}
	for _, bad := range []string{"<link", " src=", " href=", "@import", "url(http"} {
		if strings.Contains(html, bad) {
			t.Errorf("the page would fetch something: it has %q", bad)
		}
	}
}

// TestFirstPhaseAgedOut: when the stream no longer holds a checkpoint's
// prepare (only an ack of it), its commit names the operation and starts
// it; the outcome's time counts from there.
func TestFirstPhaseAgedOut(t *testing.T) {
	s := newScript()
	s.add(0, ready("c9", 1, a1))
	s.add(10*time.Millisecond, events.Commit{PhaseHeader: s.header("c9", 2, 0, a1)})
	s.add(20*time.Millisecond, commitAck("c9", 2, a1))
	s.add(time.Millisecond, events.CheckpointCommitted{OutcomeHeader: events.OutcomeHeader{Run: run, CheckpointID: "c9"}, Members: []events.Member{a1}})
	_, ops := build(t, s)
	op := ops[0]
	if op.Kind != KindCheckpoint || op.Start != s.t0.Add(10*time.Millisecond) || op.Outcome.AfterMS != 21 {
		t.Fatalf("op %+v outcome %+v", op, op.Outcome)
	}
	if p := op.Phases[0]; p.Phase != events.PhasePrepare || p.StreamSeq != 0 || p.Acks[0].LatencyMS != nil {
		t.Errorf("the aged-out prepare %+v", p)
	}
}

// TestPrepareRecordCoversTheDaemons: a prepare's record (its sandbox
// daemons' acks travel on core NATS) says how each daemon answered; an
// agent the prepare also named and that never answered stays missing, not
// taken for answered by the record.
func TestPrepareRecordCoversTheDaemons(t *testing.T) {
	s := newScript()
	s1, s2, s3 := events.Member("sandbox.s1"), events.Member("sandbox.s2"), events.Member("sandbox.s3")
	s.add(0, events.Prepare{PhaseHeader: s.header("c9", 1, 0, a1, a2, s1, s2, s3)})
	s.add(time.Millisecond, ready("c9", 1, a1))
	s.add(5*time.Millisecond, events.PrepareAcked{Run: run, CheckpointID: "c9", Seq: 1, Expected: 3, Answered: 2, Ready: 1,
		Missing: []events.Member{s3}, MissingCount: 1, NotReady: []events.Member{s2}, NotReadyCount: 1, Part: 1, Parts: 1})
	s.add(time.Second, events.CheckpointFailed{OutcomeHeader: events.OutcomeHeader{Run: run, CheckpointID: "c9"}, Phase: events.PhasePrepare, Reason: "not ready"})
	_, ops := build(t, s)
	got := map[events.Member]AckStatus{}
	for _, a := range ops[0].Phases[0].Acks {
		got[a.Member] = a.Status
	}
	want := map[events.Member]AckStatus{a1: AckOK, a2: AckMissing, s1: AckOK, s2: AckNotReady, s3: AckMissing}
	for m, st := range want {
		if got[m] != st {
			t.Errorf("%s: %s, want %s (all: %v)", m, got[m], st, got)
		}
	}
}
