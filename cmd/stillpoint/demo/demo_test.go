package demo

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/internal/build"
	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/internal/testcpu"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm/qemu"
)

// TestMain checks that a demo run in-process leaves no goroutine behind:
// its server, model server, collector and director, and the goroutines
// that wait for its processes.
func TestMain(m *testing.M) { leak.VerifyTestMain(m, jstest.LeakOptions()...) }

var summaryLine = regexp.MustCompile(`(?m)^demo: 4 rollouts, 4 results, \d+ continued in place, \d+ relaunched, \d+ checkpoints committed, invariants ok$`)

// TestDemoInProcess runs the demo as `stillpoint demo` does, in this
// process, its components processes of a stillpoint binary built for the
// test, on a small set: it ends with its summary line, every invariant
// ok, and stops everything it started (TestMain checks its goroutines; the
// e2e package runs the whole demo as the README does).
func TestDemoInProcess(t *testing.T) {
	tier.E2E(t)
	testcpu.Take(t, 1)
	bin := build.StaticForTest(t, build.Stillpoint)[build.Stillpoint]
	out, errb := &jstest.Buffer{}, &jstest.Buffer{}
	env := Env{Stdout: out, Stderr: errb, Conn: &jetstream.ConnConfig{}, Program: bin}
	dir := t.TempDir()
	err := runDemo(t.Context(), env, demoFlags{rollouts: 4, agents: 1, dir: dir, provider: "dir", tool: defaultToolTime})
	if err != nil || !summaryLine.MatchString(out.String()) {
		t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s\n%s", err, out.String(), errb.String(), logsSaid(dir))
	}
	if strings.Contains(out.String(), "did not run as planned") {
		t.Logf("the crash step did not run as planned (the small set can finish first):\n%s", out.String())
	}
}

// The demo on microVMs (the microvm provider, QEMU under TCG here): three
// checkpoints, the kill -9 and a restore of VMs, invariants ok.
func TestDemoMicroVM(t *testing.T) {
	tier.E2E(t)
	if os.Geteuid() != 0 {
		t.Fatalf("the microvm provider runs QEMU as root: run as root")
	}
	if _, err := qemu.FindAssets(""); err != nil {
		t.Fatalf("the microvm demo needs QEMU and the guest kernel: %v", err)
	}
	testcpu.Take(t, 1) // the guests, under TCG
	bin := build.StaticForTest(t, build.Stillpoint)[build.Stillpoint]
	out, errb := &jstest.Buffer{}, &jstest.Buffer{}
	env := Env{Stdout: out, Stderr: errb, Conn: &jetstream.ConnConfig{}, Program: bin}
	dir := t.TempDir()
	err := runDemo(t.Context(), env, demoFlags{rollouts: 4, agents: 1, dir: dir, provider: "microvm", tool: defaultToolTime})
	if err != nil || !summaryLine.MatchString(out.String()) {
		t.Fatalf("demo: %v\nstdout:\n%s\nstderr:\n%s\n%s", err, out.String(), errb.String(), logsSaid(dir))
	}
	// The restore took the held launches over in place (the snapshot kept
	// them), and the summary counts them.
	if m := resumedLine.FindStringSubmatch(out.String()); m == nil || m[1] == "0" {
		t.Fatalf("no restored launch resumed in place:\n%s", out.String())
	}
}

// logsSaid returns what the demo's components logged at warn and above,
// and each log's last lines: what a failed demo's reader needs, from a
// directory the test then removes.
func logsSaid(dir string) string {
	files, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			fmt.Fprintf(&b, "--- %s: %v\n", filepath.Base(f), err)
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		fmt.Fprintf(&b, "--- %s (%d lines): warnings and errors, then its last 10 lines\n", filepath.Base(f), len(lines))
		for _, l := range lines {
			if strings.Contains(l, `"level":"warn"`) || strings.Contains(l, `"level":"error"`) {
				b.WriteString(l + "\n")
			}
		}
		b.WriteString("...\n")
		for _, l := range lines[max(len(lines)-10, 0):] {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

var resumedLine = regexp.MustCompile(`(?m)^restored launches re-bound\s+.*resumed_in_place (\d+)`)

// TestTasksFlag: --tasks names a set the demo has, and swe runs only with
// a real harness; each refusal is a usage error naming the flag.
func TestTasksFlag(t *testing.T) {
	env := Env{Stdout: &jstest.Buffer{}, Stderr: &jstest.Buffer{}, Conn: &jetstream.ConnConfig{}}
	for _, c := range []struct {
		harness, tasks, says string
	}{
		{"opencode", "swebench", `--tasks "swebench"`},
		{"scripted", "swe", "--tasks swe runs a real harness"},
		{"exec", "swe", "--tasks swe runs a real harness"},
	} {
		err := runDemo(t.Context(), env, demoFlags{rollouts: 1, agents: 1, harness: c.harness, tasks: c.tasks})
		if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("--harness %s --tasks %s: %v, want a usage error saying %q", c.harness, c.tasks, err, c.says)
		}
	}
}
