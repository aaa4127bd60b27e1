package demo

import (
	"errors"
	"testing"

	"github.com/stillpoint/stillpoint/events"
)

// The points a chaos fault waits for are read off the run's subjects.
func TestChaosPoints(t *testing.T) {
	for subject, want := range map[string]events.Phase{
		"sp.r1.phase.prepare":                  events.PhasePrepare,
		"sp.r1.phase.commit":                   events.PhaseCommit,
		"sp.r1.ack.7.commit.agent.a1":          pointCommitAcked,
		"sp.r1.ack.6.prepare.agent.a1":         "",
		"sp.r1.outcome.checkpoint.committed":   pointCommitted,
		"sp.r1.outcome.checkpoint.failed":      pointFailed,
		"sp.r2.phase.prepare":                  "",
		"sp.r1.member.agent.a1":                "",
		"sp.r1.phase.release":                  events.PhaseRelease,
		"sp.r1x.phase.prepare":                 "",
		"sp.r1.ack.9.commit.sandbox.sb-task-1": pointCommitAcked,
	} {
		if got := point("r1", subject); got != want {
			t.Errorf("point(r1, %s) = %q, want %q", subject, got, want)
		}
	}
}

// --plan is rounds of faults, each kind@point or bridge@<failpoint>.
func TestParsePlan(t *testing.T) {
	got, err := parsePlan("bridge@after-commit-acks+agent@prepare, fleet@committed")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || len(got[0]) != 2 || len(got[1]) != 1 ||
		got[0][0].String() != "bridge@after-commit-acks" || got[0][1].String() != "agent@prepare" || got[1][0].String() != "fleet@committed" {
		t.Errorf("parsePlan = %+v", got)
	}
	// Two faults of a kind in one round, one after the other; the
	// collector's kind.
	got, err = parsePlan("owner@committed+owner@committed,collector@restore")
	if err != nil || len(got) != 2 || len(got[0]) != 2 || got[0][1].String() != "owner@committed" || got[1][0].String() != "collector@restore" ||
		!isCollectorRound(got[1]) || isCollectorRound(got[0]) {
		t.Errorf("parsePlan = %+v, %v", got, err)
	}
	if got, err := parsePlan(""); got != nil || err != nil {
		t.Errorf("empty plan: %v %v", got, err)
	}
	for _, bad := range []string{"agent", "agent@nowhere", "bridge@prepare", "disk@prepare", "agent@prepare+"} {
		if _, err := parsePlan(bad); !errors.Is(err, ErrUsage) {
			t.Errorf("parsePlan(%q): %v, want ErrUsage", bad, err)
		}
	}
}
