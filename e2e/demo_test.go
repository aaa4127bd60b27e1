package e2e

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/internal/tier"
)

// demoLine is the demo's last line (issue 7).
var demoLine = regexp.MustCompile(`^demo: (\d+) rollouts(?: \(\d+ of them branches\))?, (\d+) results, (\d+) continued in place, (\d+) relaunched, (\d+) checkpoints committed, invariants ok$`)

// runDemo runs `stillpoint demo` with args and checks its last line: every
// rollout has its result, some continued in place and some relaunched, 3
// checkpoints committed, invariants ok.
func runDemo(t *testing.T, args ...string) string {
	t.Helper()
	b := buildBins(t)
	var global []string
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--nats-url" { // a global flag: before the command
			global, args = []string{args[i], args[i+1]}, append(args[:i:i], args[i+2:]...)
			break
		}
	}
	// It builds sandboxd and the harness from the checkout: it runs there.
	dir := t.TempDir()
	p := child.StartForTest(t, child.Spec{Name: "demo", Path: b.stillpoint, Dir: "..",
		Args: append(append(global, "demo", "--dir", dir), args...)})
	start := time.Now()
	exit, err := p.Wait(t.Context())
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(p.Output()), "\n")
	last := lines[len(lines)-1]
	if !exit.Success() {
		t.Fatalf("demo: %s (its output is below)", exit)
	}
	m := demoLine.FindStringSubmatch(last)
	if m == nil {
		t.Fatalf("the last line %q is not the demo's summary line (its output is below)", last)
	}
	if m[1] != m[2] || m[3] == "0" || m[4] == "0" || m[5] != "3" {
		t.Fatalf("demo summary %q: want every result, some continued in place, some relaunched, 3 checkpoints", last)
	}
	// No component tried what its credentials forbid (the server's own log
	// records each refusal; a client's log says it was refused).
	logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	for _, f := range logs {
		if filepath.Base(f) == "nats.log" {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(strings.ToLower(line), "permissions violation") {
				t.Errorf("%s: %s", filepath.Base(f), line)
			}
		}
	}
	t.Logf("%s (%s, build included)", last, took.Round(time.Second))
	return p.Output()
}

// TestDemo runs the README's first command: the whole system on one
// machine, each component its own process, through 3 checkpoints and a
// kill -9 of the agents and the owner.
func TestDemo(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.75, 25*time.Second)
	runDemo(t)
}

// TestDemoWithBranches runs `stillpoint demo --branches 4`: after the
// crash restore, one rollout the restored checkpoint holds mid-run is
// branched 4 ways; each branch is graded, its result written once, and
// the invariants (branches' included) hold.
func TestDemoWithBranches(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.75, 25*time.Second)
	out := runDemo(t, "--rollouts", "8", "--branches", "4")
	rows := regexp.MustCompile(`(?m)^(\S+\.b[1-4])\s+(\S+)\s+\S+\s+\d+\s+graded\s+[01]$`).FindAllStringSubmatch(out, -1)
	if len(rows) != 4 {
		t.Fatalf("the summary lists %d graded branches, want 4 (its output is below)", len(rows))
	}
	for _, r := range rows {
		if !strings.HasPrefix(r[1], r[2]+".b") {
			t.Errorf("branch %s is listed as %s's", r[1], r[2])
		}
	}
	if !strings.Contains(out, "ok     10. branches continue their parent's calls") {
		t.Error("invariant 10 is not among those the demo checked and found ok")
	}
}

// TestDemoOnAClusterWithCredentials runs the demo against a 3-node cluster
// that `stillpoint server --cluster --auth-dir` runs as its own process,
// every component a separate process with a user of its own (every
// sandbox too, minted by the owner): the multi-node set-up of the README.
func TestDemoOnAClusterWithCredentials(t *testing.T) {
	tier.E2E(t)
	parallel(t, 1, 25*time.Second)
	b := buildBins(t)
	dir := t.TempDir()
	auth := filepath.Join(dir, "auth")
	srv := child.StartForTest(t, child.Spec{Name: "server", Path: b.stillpoint,
		Args: []string{"server", "--cluster", "--dir", filepath.Join(dir, "nats"), "--listen", "127.0.0.1:0", "--auth-dir", auth}})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	m, err := srv.WaitOutput(ctx, regexp.MustCompile(`NATS ready at (\S+)`))
	if err != nil {
		t.Fatal(err)
	}
	url := m[1]
	runDemo(t, "--nats-url", url, "--auth-dir", auth)
}

// TestDemoOnTheDirProvider runs the demo on the provider a machine without
// root gets: sandboxes are plain directories whose processes see the host's
// paths (the agent and sandboxd put paths under the sandbox's root).
func TestDemoOnTheDirProvider(t *testing.T) {
	tier.E2E(t)
	parallel(t, 1, 20*time.Second)
	runDemo(t, "--provider", "dir")
}

// TestDemoWithOpenCode runs `stillpoint demo --harness opencode` on 4 of
// the repository tasks, run by the real OpenCode all at once, through the
// demo's checkpoints and crash, every reward from the repository's tests.
// (TestOpenCodeRepoTasksThroughTwoCheckpointsAndACrash runs all 10.)
func TestDemoWithOpenCode(t *testing.T) {
	tier.E2E(t)
	parallel(t, 1, 1*time.Minute)
	runDemo(t, "--harness", "opencode", "--rollouts", "4")
}

// TestDemoWithCodex runs `stillpoint demo --harness codex` on 4 of the
// repository tasks, run by the real Codex CLI all at once, through the
// demo's checkpoints and crash, every reward from the repository's tests
// and every trajectory's tokens checked against the model server's.
func TestDemoWithCodex(t *testing.T) {
	tier.E2E(t)
	parallel(t, 1, 1*time.Minute)
	runDemo(t, "--harness", "codex", "--rollouts", "4")
}
