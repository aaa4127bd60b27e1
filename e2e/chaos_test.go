package e2e

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/internal/tier"
)

// faultMatrix is the fault matrix of issue 16, one row per component: each
// entry is one round of `stillpoint chaos --plan` (a run of its own), its
// faults joined by +. A point is a phase (prepare, commit, resume, restore,
// release), commit-acked (a member manifest is written) or committed (the
// checkpoint manifest and LATEST are); the bridge's are its failpoints. A
// restore comes from a fleet killed earlier in the same round.
var faultMatrix = []struct {
	component string
	rounds    []string
	args      []string // more flags of its chaos
}{
	{"bridge", []string{"bridge@after-prepare", "bridge@after-prepare-acks", "bridge@after-commit", "bridge@after-commit-acks",
		"bridge@after-manifest", "bridge@after-latest", "bridge@after-outcome", "bridge@after-release",
		"fleet@commit+bridge@after-restore", "fleet@commit+bridge@after-restore-acks"}, nil},
	{"agent", []string{"agent@prepare", "agent@commit", "agent@commit-acked", "agent@committed", "agent@resume", "agent@release",
		"fleet@committed+agent@restore"}, nil},
	{"owner", []string{"owner@prepare", "owner@commit", "owner@commit-acked", "owner@committed", "owner@resume", "owner@release",
		"fleet@committed+owner@restore"}, nil},
	{"fleet", []string{"fleet@prepare", "fleet@commit", "fleet@committed", "fleet@resume", "fleet@release"}, nil},
	{"harness", []string{"harness@prepare", "harness@commit", "harness@resume", "harness@release"}, nil},
	// A member that never answers (SIGSTOP) until the checkpoint fails,
	// and answers after the abort (SIGCONT).
	{"stall", []string{"stall@prepare", "stall@commit"}, nil},
	// One node of a 3-node R3 cluster, each node its own process, lost
	// and back: killed at the point, started again on its store once a
	// checkpoint ended without it.
	{"node", []string{"node@prepare", "node@commit", "node@commit-acked", "node@committed", "node@resume"}, []string{"--cluster"}},
}

// chaosRoundRE is the line chaos prints after each round.
var chaosRoundRE = regexp.MustCompile(`(?m)^chaos: round (\d+): .*, (invariants .*)$`)

// chaosRowRE is a row of the table's faults: kind, injected, missed.
var chaosRowRE = regexp.MustCompile(`(?m)^  (\S+)\s+(\d+)\s+(\d+)$`)

// runChaos runs `stillpoint chaos` with args from the checkout (it builds
// sandboxd and the harness there) and checks its table: every planned
// fault injected, none missed, every round's invariants ok, exit status 0.
func runChaos(t *testing.T, rounds int, args ...string) {
	t.Helper()
	b := buildBins(t)
	p := child.StartForTest(t, child.Spec{Name: "chaos", Path: b.stillpoint, Dir: "..",
		Args: append([]string{"chaos", "--dir", t.TempDir()}, args...)})
	start := time.Now()
	exit, err := p.Wait(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	out := p.Output()
	if !exit.Success() {
		t.Fatalf("chaos: %s (its output is below)", exit)
	}
	ok := 0
	for _, m := range chaosRoundRE.FindAllStringSubmatch(out, -1) {
		if m[2] != "invariants ok" {
			t.Errorf("round %s: %s", m[1], m[2])
		}
		ok++
	}
	if rounds > 0 && ok != rounds {
		t.Errorf("%d rounds reported, want %d", ok, rounds)
	}
	for _, m := range chaosRowRE.FindAllStringSubmatch(out, -1) {
		if m[3] != "0" {
			t.Errorf("%s: %s faults injected, %s missed (the round ended before their point)", m[1], m[2], m[3])
		}
	}
	if !strings.Contains(out, fmt.Sprintf("  %-26s %8d\n", "invariant violations", 0)) {
		t.Errorf("the table does not say 0 invariant violations")
	}
	t.Logf("chaos %s: %s", strings.Join(args, " "), time.Since(start).Round(time.Second))
}

// TestFaultMatrix kills each component (SIGKILL, real processes), and a
// node of a 3-node cluster, at each point of a checkpoint, a restore and a
// release, a round each, stalls an agent (SIGSTOP) until its checkpoint
// fails, and
// checks every PROTOCOL §7 invariant on every round (internal/invariant):
// the run goes on, or is restored, and ends with every result once.
func TestFaultMatrix(t *testing.T) {
	tier.E2E(t)
	for _, row := range faultMatrix {
		t.Run(row.component, func(t *testing.T) {
			t.Parallel()
			runChaos(t, len(row.rounds), append([]string{"--rollouts", "4", "--plan", strings.Join(row.rounds, ",")}, row.args...)...)
		})
	}
}
