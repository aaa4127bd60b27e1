package timeline

import (
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
)

// TestBranchOperation: a branch is an operation of its own kind; its
// acks, its failure's retire and its outcome belong to it.
func TestBranchOperation(t *testing.T) {
	s := newScript()
	specs := []events.BranchSpec{events.NewBranchSpec(events.Episode{Rollout: "ro1"}, 1, 9)}
	s.add(0, events.Branch{PhaseHeader: s.header("branch-4", 4, 0, a1, a2), Source: "c1", Branches: specs})
	ack := func(m events.Member, ok bool, branched ...string) events.BranchAck {
		h := ackHeader("branch-4", 4, 0, m)
		h.State = events.StateIdle
		if !ok {
			h.Fail(events.CodeInstallFailed, "fork failed")
		}
		return events.BranchAck{AckHeader: h, Branched: branched}
	}
	s.add(time.Millisecond, ack(a1, true, "ro1.b1-a1"))
	s.add(time.Millisecond, ack(a2, false))
	s.add(time.Millisecond, events.Retire{PhaseHeader: s.header("branch-4", 5, 0, a1, a2), Episodes: []events.Episode{specs[0].Episode}})
	s.add(time.Millisecond, okAck("branch-4", 5, 0, a1))
	s.add(time.Millisecond, okAck("branch-4", 5, 0, a2))
	s.add(time.Millisecond, events.BranchFailed{OutcomeHeader: events.OutcomeHeader{Run: "run1", CheckpointID: "branch-4"}, Source: "c1",
		Branches: specs, Errors: []events.MemberError{{Member: a2, Code: events.CodeInstallFailed}}, Retired: []string{"ro1.b1-a1"}})
	b, _ := build(t, s)
	op, ok := b.Op("branch-4", s.now)
	if !ok || op.Kind != KindBranch || op.Status != StatusFailed || len(op.Phases) != 2 || op.Outcome == nil || op.Outcome.Retired != 1 {
		t.Fatalf("branch %+v", op)
	}
	if line := OutcomeLine(*op.Outcome); !strings.Contains(line, "1 branches from c1, 1 retired") {
		t.Errorf("outcome line %q", line)
	}
}
