package e2e

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// demoLine is the demo's last line (issue 7).
var demoLine = regexp.MustCompile(`^demo: (\d+) rollouts, (\d+) results, (\d+) continued in place, (\d+) relaunched, (\d+) checkpoints committed, invariants ok$`)

// runDemo runs `stillpoint demo` with args and checks its last line: every
// rollout has its result, some continued in place and some relaunched, 3
// checkpoints committed, invariants ok.
func runDemo(t *testing.T, args ...string) {
	t.Helper()
	b := buildBins(t)
	var global []string
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--nats-url" { // a global flag: before the command
			global, args = []string{args[i], args[i+1]}, append(args[:i:i], args[i+2:]...)
			break
		}
	}
	cmd := exec.Command(b.stillpoint, append(append(global, "demo", "--dir", t.TempDir()), args...)...)
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

// TestDemoOnAClusterWithCredentials runs the demo against a 3-node cluster
// that `stillpoint server --cluster --auth-dir` runs as its own process,
// every component a separate process with its own role's nkey: the
// multi-node set-up of the README.
func TestDemoOnAClusterWithCredentials(t *testing.T) {
	b := buildBins(t)
	dir := t.TempDir()
	auth := filepath.Join(dir, "auth")
	srv := exec.Command(b.stillpoint, "server", "--cluster", "--dir", filepath.Join(dir, "nats"), "--listen", "127.0.0.1:0", "--auth-dir", auth)
	out := &jstest.Buffer{}
	srv.Stdout, srv.Stderr = out, out
	srv.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Signal(syscall.SIGTERM); _ = srv.Wait() })
	ready := regexp.MustCompile(`NATS ready at (\S+)`)
	var url string
	waitFor(t, "the cluster", func() bool {
		if m := ready.FindStringSubmatch(out.String()); m != nil {
			url = m[1]
			return true
		}
		return false
	})
	runDemo(t, "--nats-url", url, "--auth-dir", auth)
}

// TestDemoOnTheDirProvider runs the demo on the provider a machine without
// root gets: sandboxes are plain directories whose processes see the host's
// paths (the agent and sandboxd put paths under the sandbox's root).
func TestDemoOnTheDirProvider(t *testing.T) { runDemo(t, "--provider", "dir") }
