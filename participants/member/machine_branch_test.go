package member_test

import (
	"slices"
	"testing"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/member"
)

func (x *mt) branch(id string) []member.Effect {
	return x.phase(events.Branch{PhaseHeader: x.hdr(id), Source: "k1", Branches: []events.BranchSpec{events.NewBranchSpec(r1, 1, 7)}})
}

// TestMachineBranch checks the branch phase (PROTOCOL §5, Branch) in each
// state: an outside phase, answered in idle or restored, refused while a
// checkpoint or a restore is open, its success recorded for repeats.
func TestMachineBranch(t *testing.T) {
	b1 := events.NewBranchSpec(r1, 1, 7).Episode.String()
	rows := []struct {
		name  string
		setup func(x *mt)
		do    func(x *mt) []member.Effect
		want  []string
		state member.State
	}{
		{"idle: calls the participant", nil,
			func(x *mt) []member.Effect { return x.branch("b1") },
			[]string{"call branch"}, member.StateIdle},
		{"idle: the call's branched keys are the ack", func(x *mt) { x.branch("b1") },
			func(x *mt) []member.Effect { return x.step(member.CallFinished{Op: x.op, Branched: []string{b1}}) },
			[]string{"reply branch ok idle"}, member.StateIdle},
		{"restored: calls the participant", func(x *mt) {
			x.restore("r1", "k1", r1)
			x.step(member.RestoreFinished{Op: x.op, Restored: []string{"r1-a1"}})
		}, func(x *mt) []member.Effect { return x.branch("b1") },
			[]string{"call branch"}, member.StateRestored},
		{"restoring: refused", func(x *mt) { x.restore("r1", "k1", r1) },
			func(x *mt) []member.Effect { return x.branch("b1") },
			[]string{"reply branch invalid_phase idle"}, member.StateIdle},
		{"preparing: refused", func(x *mt) { x.prepare("c1") },
			func(x *mt) []member.Effect { return x.branch("b1") },
			[]string{"reply branch invalid_phase preparing"}, member.StatePreparing},
		{"prepared: refused", func(x *mt) { x.prepared("c1") },
			func(x *mt) []member.Effect { return x.branch("b1") },
			[]string{"reply branch invalid_phase prepared"}, member.StatePrepared},
		{"committed: refused", func(x *mt) { x.committed("c1", false) },
			func(x *mt) []member.Effect { return x.branch("b1") },
			[]string{"reply branch invalid_phase committed"}, member.StateCommitted},
		{"a failed call answers its error, and a repeat calls again", func(x *mt) {
			x.branch("b1")
			x.step(member.CallFinished{Op: x.op, Err: &events.AckError{Code: events.CodeInstallFailed, Detail: "x"}})
		}, func(x *mt) []member.Effect { return x.branch("b1") },
			[]string{"call branch"}, member.StateIdle},
		{"a repeat after success answers the recorded reply without calling", func(x *mt) {
			x.branch("b1")
			x.step(member.CallFinished{Op: x.op, Branched: []string{b1}})
		}, func(x *mt) []member.Effect { return x.branch("b1") },
			[]string{"reply branch ok idle"}, member.StateIdle},
		{"published before a fresh process started: refused, the member stays fresh", nil,
			func(x *mt) []member.Effect {
				return x.step(member.PhaseReceived{BeforeStart: true, Data: events.Branch{PhaseHeader: x.hdr("b1"), Source: "k1",
					Branches: []events.BranchSpec{events.NewBranchSpec(r1, 1, 7)}}})
			}, []string{"reply branch restarted idle"}, member.StateIdle},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			x := newMT(t)
			if row.setup != nil {
				row.setup(x)
			}
			got := describe(row.do(x))
			if !slices.Equal(got, row.want) {
				t.Fatalf("effects %q, want %q", got, row.want)
			}
			x.state(row.state)
		})
	}
}

// TestMachineBranchAck checks the ack's body: the sorted branched keys,
// the same on a repeat; a member that branched has served.
func TestMachineBranchAck(t *testing.T) {
	x := newMT(t)
	x.branch("b1")
	keys := []string{events.BranchRollout("r1", 2) + "-a1", events.BranchRollout("r1", 1) + "-a1"}
	first := x.step(member.CallFinished{Op: x.op, Branched: keys})
	again := x.branch("b1")
	for _, effs := range [][]member.Effect{first, again} {
		if len(effs) != 1 {
			t.Fatalf("effects %q, want one reply", describe(effs))
		}
		ack, ok := effs[0].(member.Reply).Ack(0).(events.BranchAck)
		if !ok {
			t.Fatalf("ack %T, want events.BranchAck", effs[0].(member.Reply).Ack(0))
		}
		if want := []string{"r1.b1-a1", "r1.b2-a1"}; !slices.Equal(ack.Branched, want) {
			t.Fatalf("branched %q, want %q", ack.Branched, want)
		}
	}
	if !x.m.Served() {
		t.Fatal("a member that branched has not served")
	}
}
