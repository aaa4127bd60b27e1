package faults

import (
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/build"
	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/internal/tier"
)

// faultMatrix is the fault matrix of issue 16: each row is one `stillpoint
// chaos --plan`, each entry of its rounds one round (a run of its own), its
// faults joined by +. A point is a phase (prepare, commit, resume, restore,
// release), commit-acked (a member manifest is written) or committed (the
// checkpoint manifest and LATEST are); the bridge's are its failpoints. A
// restore comes from the fleet killed once a checkpoint committed, earlier
// in the same round.
var faultMatrix = []struct {
	name   string
	rounds []string
	args   []string // more flags of its chaos
}{
	{"bridge", []string{"bridge@after-prepare", "bridge@after-prepare-acks", "bridge@after-commit", "bridge@after-commit-acks",
		"bridge@after-manifest", "bridge@after-latest", "bridge@after-outcome", "bridge@after-release",
		"bridge@after-release-mark", "bridge@after-release-records", "bridge@after-release-member-list", "bridge@mid-release",
		"bridge@after-release-manifest", "bridge@after-release-latest", "bridge@after-release-outcome",
		"fleet@committed+bridge@after-restore", "fleet@committed+bridge@after-restore-acks"},
		// A restore needs the whole fleet back within the recovery grace,
		// and a loaded machine may take longer than chaos's 15 s to start
		// it.
		[]string{"--recover-grace", "45s"}},
	// An agent killed, and one that never answers (SIGSTOP) until the
	// checkpoint fails and answers after the abort (SIGCONT).
	{"agent", []string{"agent@prepare", "agent@commit", "agent@commit-acked", "agent@committed", "agent@resume", "agent@release",
		"fleet@committed+agent@restore", "stall@prepare", "stall@commit"}, nil},
	// The owner killed at each point, and killed twice in a row: its
	// successor killed at the next commit, when the attempts the
	// collector started over after the first wait at their launch (the
	// second successor does not know their sessions).
	{"owner", []string{"owner@prepare", "owner@commit", "owner@commit-acked", "owner@committed", "owner@resume", "owner@release",
		"fleet@committed+owner@restore", "owner@committed+owner@committed"}, nil},
	// A sandbox daemon killed (and with it its sandbox's init and launch):
	// the agent takes its heartbeat's end for a lost launch, the
	// checkpoint goes on without it, the rollout starts over one attempt
	// later.
	{"sandboxd", sandboxdRounds, nil},
	// The collector, a process of its own in these rounds, killed at each
	// point and started again on its results and dispatch log.
	{"collector", []string{"collector@prepare", "collector@commit", "collector@commit-acked", "collector@committed",
		"collector@resume", "collector@release", "fleet@committed+collector@restore"}, nil},
	// A node (an agent and its owner) lost for a while, its sandboxes with
	// it: killed at the point, kept down while the other node's rollouts go
	// on and a checkpoint commits without it (the checkpoints carry its
	// rollouts: PROTOCOL §5, Progress only moves forward), then started
	// again. Each round waits out the dead members' heartbeats (30 s).
	{"node", []string{"node@prepare", "node@committed", "node@resume"}, nil},
	// The job preempted while a node is down: its rollouts mid-tool when a
	// checkpoint commits, the node killed, the collector sent SIGTERM; its
	// checkpoint with stop commits without the dead members, carrying their
	// rollouts, and the rerun on the fleet that came back restores them.
	{"preempt", []string{"node@committed+preempt@prepare"}, nil},
	// The whole fleet (before anything committed, then with LATEST to
	// restore), and a harness.
	{"fleet-harness", []string{"fleet@prepare", "fleet@commit", "fleet@committed", "fleet@resume", "fleet@release",
		"harness@prepare", "harness@commit", "harness@resume", "harness@release"}, nil},
	// The NATS server (one node) killed at the point and started again on
	// its store: the members' durable consumers, in memory, are gone with
	// it and made again.
	{"nats", []string{"nats@prepare", "nats@commit", "nats@commit-acked", "nats@committed", "nats@resume", "nats@release"}, nil},
	// One node of a 3-node R3 cluster, each node its own process, lost
	// and back: killed at the point, started again on its store once a
	// checkpoint ended without it.
	{"cluster-node", []string{"nats-node@prepare", "nats-node@commit", "nats-node@commit-acked", "nats-node@committed", "nats-node@resume"}, []string{"--cluster"}},
	// A node of an agent and its owner cut off from the bus and the model
	// (its NATS servers, the bridge, the other node) past its lease, both
	// ways and one way, each node in a network namespace of its own
	// (--netns): the checkpoints commit without it and carry its rollouts;
	// healed, it acts on no stale phase, and nothing is lost or twice.
	{"partition", []string{"partition@prepare", "partition@committed", "partition-oneway@prepare", "partition-oneway@commit"}, []string{"--netns"}},
	// The NATS cluster split into a minority and a majority; latency,
	// jitter and a bandwidth bound; random loss.
	{"network", []string{"split@prepare", "split@commit", "slow@prepare", "lossy@commit"}, []string{"--netns"}},
}

// sandboxdRounds is the sandboxd row: a daemon killed at each point, and
// at a restore (one of the old sandboxes' daemons, the fleet killed).
var sandboxdRounds = []string{"sandboxd@prepare", "sandboxd@commit", "sandboxd@commit-acked", "sandboxd@committed",
	"sandboxd@resume", "sandboxd@release", "fleet@committed+sandboxd@restore"}

// chaosRoundRE is the line chaos prints after each round.
var chaosRoundRE = regexp.MustCompile(`(?m)^chaos: round (\d+): .*, (invariants .*)$`)

// neverLandedRE is a planned fault that missed its point on every try.
var neverLandedRE = regexp.MustCompile(`(?m)^    never landed: (.*)$`)

// chaosRowRE is a row of the table's faults: kind, injected, missed.
var chaosRowRE = regexp.MustCompile(`(?m)^  (\S+)\s+(\d+)\s+(\d+)$`)

// chaosCmd is the chaos injector's command.
const chaosCmd = "./e2e/cmd/chaos"

// startChaos starts the chaos injector (e2e/cmd/chaos) with args from the
// checkout (it builds stillpoint, sandboxd and the harness there).
func startChaos(t *testing.T, args ...string) *child.Process {
	t.Helper()
	bin := build.StaticForTest(t, chaosCmd)[chaosCmd]
	// The work directory holds every round's logs and results: kept when
	// the test fails, so that a failure in CI can be read afterwards.
	dir, err := os.MkdirTemp("", "stillpoint-faults-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kept the chaos work directory %s (a directory per round: logs/, results.jsonl)", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	return child.StartForTest(t, child.Spec{Name: "chaos " + strings.Join(args, " "), Path: bin, Dir: "../..",
		Args: append([]string{"--dir", dir}, args...)})
}

// checkChaos waits for a chaos process and checks its table: exit status
// 0, rounds planned rounds (0: any), each try of each with its invariants
// ok, every planned fault landed (a round whose fault missed its point is
// run again, up to its tries: only one that never landed fails), 0
// invariant violations.
func checkChaos(t *testing.T, p *child.Process, rounds int) {
	t.Helper()
	exit, err := p.Wait(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	out := p.Output()
	if !exit.Success() {
		t.Fatalf("%s: %s\n%s", p.Name(), exit, out)
	}
	reported := map[string]bool{}
	for _, m := range chaosRoundRE.FindAllStringSubmatch(out, -1) {
		if m[2] != "invariants ok" {
			t.Errorf("round %s: %s", m[1], m[2])
		}
		reported[m[1]] = true
	}
	if rounds > 0 && len(reported) != rounds {
		t.Errorf("%d rounds reported, want %d", len(reported), rounds)
	}
	for _, m := range chaosRowRE.FindAllStringSubmatch(out, -1) {
		if m[3] != "0" {
			t.Errorf("%s: %s faults injected, %s missed their point on every try", m[1], m[2], m[3])
		}
	}
	for _, m := range neverLandedRE.FindAllStringSubmatch(out, -1) {
		t.Errorf("never landed: %s", m[1])
	}
	if !strings.Contains(out, fmt.Sprintf("  %-26s %8d\n", "invariant violations", 0)) {
		t.Errorf("the table does not say 0 invariant violations")
	}
	if t.Failed() {
		t.Logf("%s:\n%s", p.Name(), out)
	}
}

// TestFaultMatrix kills each component (SIGKILL, real processes) and a
// node of a 3-node cluster at each point of a checkpoint, a restore and a
// release, a round each, and stalls an agent (SIGSTOP) until its
// checkpoint fails; every PROTOCOL §7 invariant is checked on every round
// (controller-bridge/invariant): the run goes on, or is restored, and ends with
// every result once. The rows run side by side (their rounds mostly wait
// on tool calls), each checked in its subtest.
func TestFaultMatrix(t *testing.T) {
	tier.E2E(t)
	start := time.Now()
	procs := make([]*child.Process, len(faultMatrix))
	selected := rowFilter(t)
	rows, n := 0, 0
	for i, row := range faultMatrix {
		if !selected(row.name) {
			continue // -run leaves its subtest out: start nothing for it
		}
		procs[i] = startChaos(t, append([]string{"--rollouts", "4", "--tool-time", "5s", "--every", "1500ms",
			"--plan", strings.Join(row.rounds, ",")}, row.args...)...)
		rows, n = rows+1, n+len(row.rounds)
	}
	for i, row := range faultMatrix {
		t.Run(row.name, func(t *testing.T) {
			if procs[i] == nil {
				t.Fatalf("row %s was not started, yet -run selects it", row.name)
			}
			checkChaos(t, procs[i], len(row.rounds))
		})
	}
	t.Logf("%d rows, %d rounds: %s", rows, n, time.Since(start).Round(time.Second))
}

// rowFilter reads the subtest part of -run (TestFaultMatrix/<rows>), so
// that `-run 'TestFaultMatrix/(nats|cluster-node)'` starts those rows'
// chaos processes alone rather than every row's. Without one, every row
// is selected.
func rowFilter(t *testing.T) func(string) bool {
	f := flag.Lookup("test.run")
	if f == nil {
		return func(string) bool { return true }
	}
	parts := splitRun(f.Value.String())
	if len(parts) < 2 || parts[1] == "" {
		return func(string) bool { return true }
	}
	re, err := regexp.Compile(parts[1])
	if err != nil {
		t.Fatalf("-run %q: %v", f.Value.String(), err)
	}
	return re.MatchString
}

// splitRun splits a -run pattern at the slashes outside brackets and
// parentheses, as the testing package does.
func splitRun(s string) []string {
	var parts []string
	depth, from := 0, 0
	for i, c := range s {
		switch c {
		case '(', '[':
			depth++
		case ')', ']':
			depth--
		case '/':
			if depth == 0 {
				parts = append(parts, s[from:i])
				from = i + 1
			}
		}
	}
	return append(parts, s[from:])
}
