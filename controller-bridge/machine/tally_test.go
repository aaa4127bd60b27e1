package machine

import (
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
)

var t0 = time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC)

func header(members ...events.Member) events.PhaseHeader {
	return events.PhaseHeader{Run: "r", CheckpointID: "c1", Seq: 5, Epoch: 1, Deadline: t0.Add(10 * time.Second), Members: members}
}

func prepAck(m events.Member, ready bool, blockers ...string) events.PrepareAck {
	a := events.PrepareAck{AckHeader: events.AckHeader{Run: "r", Member: m, Seq: 5, CheckpointID: "c1", Epoch: 1, OK: true, State: events.StatePrepared}, Ready: ready}
	a.SetBlockers(blockers)
	return a
}

// TestTally checks the bridge rules of PROTOCOL §5: all ready → commit; any
// blocker, error, dead member or missing ack → abort naming every member.
func TestTally(t *testing.T) {
	a, b := events.Member("agent.a"), events.Member("owner.b")
	cases := []struct {
		name  string
		acks  []events.Ack
		dead  []events.Member
		now   time.Time
		want  Verdict
		codes map[events.Member]string
	}{
		{"§5 all ready: complete", []events.Ack{prepAck(a, true), prepAck(b, true)}, nil, t0, Complete, nil},
		{"§5 one silent before the deadline: wait", []events.Ack{prepAck(a, true)}, nil, t0, Waiting, nil},
		{"§5 one silent at the deadline: missing ack", []events.Ack{prepAck(a, true)}, nil, t0.Add(10 * time.Second), Failed,
			map[events.Member]string{b: events.CodeMissingAck}},
		{"§5 a blocker waits for the rest, then fails naming it", []events.Ack{prepAck(a, false, "r1")}, nil, t0, Waiting, nil},
		{"§5 a blocker fails once all answered", []events.Ack{prepAck(a, false, "r1"), prepAck(b, true)}, nil, t0, Failed,
			map[events.Member]string{a: "not_ready"}},
		{"§5 an error fails at once", []events.Ack{func() events.Ack {
			x := prepAck(a, false)
			x.Fail(events.CodeCheckpointConflict, "c0 is open")
			return x
		}()}, nil, t0, Failed, map[events.Member]string{a: events.CodeCheckpointConflict, b: "unanswered"}},
		{"§5 a dead member fails at once", []events.Ack{prepAck(a, true)}, []events.Member{b}, t0, Failed,
			map[events.Member]string{b: "member_dead"}},
		{"§3 a dead member that answered is not dead", []events.Ack{prepAck(a, true), prepAck(b, true)}, []events.Member{b}, t0, Complete, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tl := NewTally(events.PhasePrepare, header(a, b))
			for _, ack := range c.acks {
				if !tl.Add(ack) {
					t.Fatalf("ack of %s refused", ack.Header().Member)
				}
			}
			for _, m := range c.dead {
				tl.Dead(m)
			}
			if got := tl.Decide(c.now); got != c.want {
				t.Fatalf("verdict %s, want %s", got, c.want)
			}
			if c.want != Failed {
				return
			}
			errs, blockers, _ := tl.Failure(c.now)
			got := map[events.Member]string{}
			for _, e := range errs {
				got[e.Member] = e.Code
			}
			for m, code := range c.codes {
				if got[m] != code {
					t.Errorf("member %s: code %q, want %q (all: %v)", m, got[m], code, got)
				}
			}
			if c.codes[a] == "not_ready" && len(blockers[a]) != 1 {
				t.Errorf("blockers of %s: %v", a, blockers[a])
			}
		})
	}
}

// TestTallyRefusesForeignAcks: PROTOCOL §5, Bridge rules: acks of another
// phase, sequence, checkpoint or epoch are ignored; nor are a member's
// outside the phase's set counted.
func TestTallyRefusesForeignAcks(t *testing.T) {
	a := events.Member("agent.a")
	tl := NewTally(events.PhasePrepare, header(a))
	old := prepAck(a, true)
	old.Epoch = 0
	otherSeq := prepAck(a, true)
	otherSeq.Seq = 4
	otherCkpt := prepAck(a, true)
	otherCkpt.CheckpointID = "c0"
	stranger := prepAck("agent.z", true)
	commit := events.CommitAck{AckHeader: prepAck(a, true).AckHeader}
	for _, ack := range []events.Ack{old, otherSeq, otherCkpt, stranger, commit} {
		if tl.Add(ack) {
			t.Errorf("counted a foreign ack %+v", ack.Header())
		}
	}
	if tl.Ignored() != 5 || tl.Decide(t0) != Waiting {
		t.Errorf("ignored %d, verdict %s", tl.Ignored(), tl.Decide(t0))
	}
	if !tl.Add(prepAck(a, true)) || tl.Add(prepAck(a, true)) {
		t.Error("the first ack must count and a repeat must not")
	}
	if tl.Ignored() != 5 || tl.Repeats() != 1 || !tl.Answered(a) {
		t.Errorf("ignored %d, repeats %d, answered %v: a repeat is no foreign ack", tl.Ignored(), tl.Repeats(), tl.Answered(a))
	}
	if tl.Decide(t0) != Complete {
		t.Error("not complete")
	}
}

// TestTallyWaitAll: a restore waits for every member even after one failed
// (all or none needs every member's answer before it retires).
func TestTallyWaitAll(t *testing.T) {
	a, b := events.Member("agent.a"), events.Member("owner.b")
	tl := NewTally(events.PhaseRestore, header(a, b))
	tl.WaitAll = true
	failed := events.RestoreAck{AckHeader: prepAck(a, true).AckHeader}
	failed.Fail(events.CodeInstallFailed, "disk full")
	tl.Add(failed)
	if v := tl.Decide(t0); v != Waiting {
		t.Fatalf("verdict %s after one failure, want waiting", v)
	}
	tl.Add(events.RestoreAck{AckHeader: prepAck(b, true).AckHeader})
	if v := tl.Decide(t0); v != Failed {
		t.Fatalf("verdict %s once all answered, want failed", v)
	}
}
