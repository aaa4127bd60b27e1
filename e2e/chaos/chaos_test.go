package chaos

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
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
	// A preempt comes while the node fault before it keeps its node down;
	// its round's collector is a process.
	got, err = parsePlan("node@committed+preempt@prepare,node@prepare+bridge@after-commit+preempt@commit")
	if err != nil || len(got) != 2 || got[0][0].String() != "node@committed" || got[0][1].String() != "preempt@prepare" ||
		!isCollectorRound(got[0]) || nextKind(got[0], 0) != FaultPreempt || nextKind(got[1], 0) != FaultPreempt || nextKind(got[1], 2) != "" {
		t.Errorf("parsePlan = %+v, %v", got, err)
	}
	if got, err := parsePlan(""); got != nil || err != nil {
		t.Errorf("empty plan: %v %v", got, err)
	}
	for _, bad := range []string{"agent", "agent@nowhere", "bridge@prepare", "disk@prepare", "agent@prepare+",
		"preempt@prepare", "agent@committed+preempt@prepare", "preempt@prepare+node@committed"} {
		if _, err := parsePlan(bad); !errors.Is(err, ErrUsage) {
			t.Errorf("parsePlan(%q): %v, want ErrUsage", bad, err)
		}
	}
}

// A drawn preempt gets a node fault before it, drawn as the others are,
// unless one is there already.
func TestWithNodes(t *testing.T) {
	draw := func() plannedFault { return plannedFault{kind: FaultAgent, phase: events.PhaseCommit} }
	plan := []plannedFault{{kind: FaultPreempt, phase: events.PhasePrepare}, {kind: FaultAgent, phase: events.PhaseResume},
		{kind: FaultNode, phase: pointCommitted}, {kind: FaultPreempt, phase: events.PhasePrepare}}
	var got []string
	for _, p := range withNodes(plan, draw) {
		got = append(got, p.String())
	}
	want := []string{"node@commit", "preempt@prepare", "agent@resume", "node@committed", "preempt@prepare"}
	if !slices.Equal(got, want) {
		t.Errorf("withNodes = %v, want %v", got, want)
	}
	if err := checkPreempts(withNodes(plan, draw)); err != nil {
		t.Errorf("checkPreempts after withNodes: %v", err)
	}
}

// A node fault takes down a node that holds a rollout sent to it with no
// result yet, per the collector's dispatch log and results file.
func TestBusyNodes(t *testing.T) {
	dir := t.TempDir()
	if got := busyNodes(dir, []string{"a1", "a2"}); len(got) != 0 {
		t.Errorf("busyNodes with no files = %v", got)
	}
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("results.jsonl.dispatch", `{"rollout_id":"r1","agent":"a1"}
{"rollout_id":"r2","agent":"a2"}
{"rollout_id":"r3","agent":"a3"}
{"rollout_id":"r1","agent":"a2"}
{"rollout_id":"r4","ag`)
	write("results.jsonl", `{"rollout_id":"r2","attempt":0}
`)
	if got := busyNodes(dir, []string{"a1", "a2", "a3"}); !slices.Equal(got, []string{"a2", "a3"}) {
		t.Errorf("busyNodes = %v, want a2 (r1 sent again to it) and a3", got)
	}
}

// `chaos collect` called wrongly is a usage error.
func TestCollectorUsage(t *testing.T) {
	var out bytes.Buffer
	cmd := Command(Env{Stdout: &out, Stderr: &out})
	cmd.SetArgs([]string{"collect"})
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	if err := cmd.Execute(); !errors.Is(err, ErrUsage) {
		t.Errorf("chaos collect without its flags: %v, want ErrUsage", err)
	}
}
