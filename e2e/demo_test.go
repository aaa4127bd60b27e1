package e2e

import (
	"bytes"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// demoLine is the demo's last line (issue 7).
var demoLine = regexp.MustCompile(`^demo: (\d+) rollouts, (\d+) results, (\d+) continued in place, (\d+) relaunched, (\d+) checkpoints committed, invariants ok$`)

// runDemo runs `stillpoint demo` with args and checks its last line: every
// rollout has its result, some continued in place and some relaunched, 3
// checkpoints committed, invariants ok.
func runDemo(t *testing.T, args ...string) {
	t.Helper()
	b := buildBins(t)
	cmd := exec.Command(b.stillpoint, append([]string{"demo", "--dir", t.TempDir()}, args...)...)
	cmd.Dir = ".." // it builds sandboxd and the harness from the checkout
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	last := lines[len(lines)-1]
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	m := demoLine.FindStringSubmatch(last)
	if m == nil {
		t.Fatalf("the last line %q is not the demo's summary line\n%s", last, out.String())
	}
	if m[1] != m[2] || m[3] == "0" || m[4] == "0" || m[5] != "3" {
		t.Fatalf("demo summary %q: want every result, some continued in place, some relaunched, 3 checkpoints", last)
	}
	t.Logf("%s (%s, build included)", last, took.Round(time.Second))
}

// TestDemo runs the README's first command: the whole system on one
// machine, each component its own process, through 3 checkpoints and a
// kill -9 of the agents and the owner.
func TestDemo(t *testing.T) { runDemo(t) }
