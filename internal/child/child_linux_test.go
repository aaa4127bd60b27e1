package child_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/procfs"
)

func TestMain(m *testing.M) { leak.VerifyTestMain(m) }

func sh(name, script string) child.Spec {
	return child.Spec{Name: name, Path: "/bin/sh", Args: []string{"-c", script}}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	return c
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	st, _, err := procfs.ReadStat(pid, nil)
	return err == nil && st.State != 'Z'
}

// pidLine waits for a line "<word> <pid>" in p's output.
func pidLine(t *testing.T, p *child.Process, word string) int {
	t.Helper()
	m, err := p.WaitOutput(ctx(t), regexp.MustCompile(word+` (\d+)\n`))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(m[1])
	return pid
}

func TestWaitReturnsTheExitAndTheOutput(t *testing.T) {
	p, err := child.Start(sh("exits", "echo out; echo err >&2; exit 3"))
	if err != nil {
		t.Fatal(err)
	}
	exit, err := p.Wait(ctx(t))
	if err != nil || exit.Code != 3 || exit.Signal != 0 || exit.Success() || exit.String() != "exit status 3" {
		t.Fatalf("Wait: %+v (%s) %v, want exit status 3", exit, exit, err)
	}
	if out := p.Output(); out != "out\nerr\n" {
		t.Fatalf("output %q", out)
	}
	if again := p.Stop(); again != exit {
		t.Fatalf("Stop after Wait: %+v, want %+v", again, exit)
	}
	if err := p.Signal(syscall.SIGTERM); !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("Signal after the reap: %v, want os.ErrProcessDone", err)
	}
	if err := p.SignalGroup(syscall.SIGTERM); !errors.Is(err, os.ErrProcessDone) {
		t.Fatalf("SignalGroup after the reap: %v, want os.ErrProcessDone", err)
	}
}

func TestStopSignalsThenKills(t *testing.T) {
	p, err := child.Start(sh("polite", "trap 'echo bye; exit 0' TERM; echo ready; while :; do sleep 0.01; done"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.WaitOutput(ctx(t), regexp.MustCompile("ready")); err != nil {
		t.Fatal(err)
	}
	if exit := p.Stop(); !exit.Success() || !strings.Contains(p.Output(), "bye") {
		t.Fatalf("Stop of a process that exits on SIGTERM: %s, output %q", exit, p.Output())
	}

	spec := sh("stubborn", "trap '' TERM; echo ready; while :; do sleep 0.01; done")
	spec.Grace = 100 * time.Millisecond
	p, err = child.Start(spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.WaitOutput(ctx(t), regexp.MustCompile("ready")); err != nil {
		t.Fatal(err)
	}
	if exit := p.Stop(); exit.Signal != syscall.SIGKILL || exit.String() != "signal: killed" {
		t.Fatalf("Stop of a process that ignores SIGTERM: %s, want killed", exit)
	}
}

func TestStopSignal(t *testing.T) {
	spec := sh("int", "trap 'exit 7' INT; echo ready; while :; do sleep 0.01; done")
	spec.StopSignal = syscall.SIGINT
	p, err := child.Start(spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.WaitOutput(ctx(t), regexp.MustCompile("ready")); err != nil {
		t.Fatal(err)
	}
	if exit := p.Stop(); exit.Code != 7 {
		t.Fatalf("Stop with SIGINT: %s, want exit status 7", exit)
	}
}

// What a process leaves in its group when it exits is killed by Wait and
// Stop; Kill, a crash, leaves it running until then.
func TestTheGroupGoesWithTheProcess(t *testing.T) {
	p, err := child.Start(sh("leaves", "sleep 100 & echo left $!"))
	if err != nil {
		t.Fatal(err)
	}
	left := pidLine(t, p, "left")
	if _, err := p.Wait(ctx(t)); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 10*time.Second, fmt.Sprintf("sleep %d to be killed with its group", left), func() bool { return !alive(left) })

	p, err = child.Start(sh("crashes", "sleep 100 & echo left $!; exec sleep 100"))
	if err != nil {
		t.Fatal(err)
	}
	left = pidLine(t, p, "left")
	if err := p.Kill(ctx(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Exited():
	default:
		t.Fatal("Kill returned before the process exited")
	}
	if !alive(left) {
		t.Fatal("Kill killed the rest of the group too")
	}
	if err := p.SignalGroup(0); err != nil {
		t.Fatalf("SignalGroup before the reap: %v", err)
	}
	if exit := p.Stop(); exit.Signal != syscall.SIGKILL {
		t.Fatalf("Stop after Kill: %s, want killed", exit)
	}
	poll.Wait(t, 10*time.Second, fmt.Sprintf("sleep %d to be killed with its group", left), func() bool { return !alive(left) })
}

func TestWaitOutputOfAProcessThatExits(t *testing.T) {
	p, err := child.Start(sh("quiet", "echo something else"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	_, err = p.WaitOutput(ctx(t), regexp.MustCompile("listening"))
	if !errors.Is(err, child.ErrExited) || !strings.Contains(err.Error(), "something else") {
		t.Fatalf("WaitOutput: %v, want ErrExited with the output", err)
	}

	p2, err := child.Start(sh("slow", "sleep 100"))
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Stop()
	short, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if _, err := p2.WaitOutput(short, regexp.MustCompile("listening")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitOutput past its deadline: %v", err)
	}
	if _, err := p2.Wait(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait past its deadline: %v", err)
	}
}

func TestEnvDirLogFileAndStderr(t *testing.T) {
	dir := t.TempDir()
	logf := filepath.Join(dir, "logs", "x.log")
	var stderr strings.Builder
	spec := sh("env", `echo "$A $B $(pwd)"; echo to-stderr >&2`)
	spec.Env = []string{"A=1", "B=2", "B=3"}
	spec.Dir = dir
	spec.LogFile = logf
	spec.Stderr = &stderr
	p, err := child.Start(spec)
	if err != nil {
		t.Fatal(err)
	}
	if exit, err := p.Wait(ctx(t)); err != nil || !exit.Success() {
		t.Fatalf("Wait: %s %v", exit, err)
	}
	want := "1 3 " + dir + "\n"
	if p.Output() != want {
		t.Fatalf("output %q, want %q", p.Output(), want)
	}
	if b, err := os.ReadFile(logf); err != nil || string(b) != want {
		t.Fatalf("log file %q %v, want %q", b, err, want)
	}
	if stderr.String() != "to-stderr\n" {
		t.Fatalf("stderr %q", stderr.String())
	}
}

func TestStartErrors(t *testing.T) {
	if _, err := child.Start(child.Spec{}); !errors.Is(err, child.ErrSpec) {
		t.Fatalf("Start without a path: %v, want ErrSpec", err)
	}
	if _, err := child.Start(child.Spec{Path: filepath.Join(t.TempDir(), "nothing")}); err == nil {
		t.Fatal("Start of a missing program succeeded")
	}
}

// fakeT is a test that failed, whose log and cleanups StartForTest uses.
type fakeT struct {
	logs     []string
	cleanups []func()
}

func (f *fakeT) Helper()                 {}
func (f *fakeT) Cleanup(fn func())       { f.cleanups = append(f.cleanups, fn) }
func (f *fakeT) Failed() bool            { return true }
func (f *fakeT) Logf(s string, a ...any) { f.logs = append(f.logs, fmt.Sprintf(s, a...)) }
func (f *fakeT) Fatalf(s string, a ...any) {
	panic(fmt.Sprintf(s, a...))
}

func TestStartForTestStopsAndDumps(t *testing.T) {
	var f fakeT
	p := child.StartForTest(&f, sh("dumped", "echo started; sleep 100"))
	if _, err := p.WaitOutput(ctx(t), regexp.MustCompile("started")); err != nil {
		t.Fatal(err)
	}
	if len(f.cleanups) != 1 {
		t.Fatalf("%d cleanups, want 1", len(f.cleanups))
	}
	f.cleanups[0]()
	select {
	case <-p.Exited():
	default:
		t.Fatal("the cleanup did not stop the process")
	}
	if len(f.logs) != 1 || !strings.Contains(f.logs[0], "dumped") || !strings.Contains(f.logs[0], "started") {
		t.Fatalf("the failed test's log: %q", f.logs)
	}
}
