package sandboxd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// The pause modes the host allows, from the library and from the binary.
func TestModes(t *testing.T) {
	root := testCgroupRoot(t)
	ms, err := DetectModes(Config{CgroupRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ms, []sandboxapi.Mode{sandboxapi.ModeFreeze, sandboxapi.ModeStop, sandboxapi.ModeHold}) {
		t.Fatalf("modes %v: this host has a writable cgroup v2, freeze must be first (run the tests as root)", ms)
	}
	if ms, _ := DetectModes(Config{NoCgroup: true}); !slices.Equal(ms, []sandboxapi.Mode{sandboxapi.ModeStop, sandboxapi.ModeHold}) {
		t.Fatalf("modes without cgroups: %v", ms)
	}
	if _, err := New(Config{StateDir: t.TempDir(), NoCgroup: true, Mode: sandboxapi.ModeFreeze}); !errors.Is(err, ErrModeUnavailable) {
		t.Fatalf("freeze without cgroups: %v", err)
	}
	// No supervisor runs in this test, so os/exec may wait for the binary.
	out, err := exec.Command(sandboxdBin, "modes", "--cgroup-root", root).Output()
	if err != nil || strings.TrimSpace(string(out)) != "freeze stop hold" {
		t.Fatalf("sandboxd modes: %q, %v", out, err)
	}
	out, err = exec.Command(sandboxdBin, "version").Output()
	if err != nil || !strings.HasPrefix(string(out), "sandboxd ") {
		t.Fatalf("sandboxd version: %q, %v", out, err)
	}
	for _, m := range []sandboxapi.Mode{sandboxapi.ModeDefault, sandboxapi.ModeFreeze, sandboxapi.ModeStop, sandboxapi.ModeHold} {
		if back, err := sandboxapi.ParseMode(m.String()); err != nil || back != m {
			t.Errorf("ParseMode(%q) = %v, %v", m, back, err)
		}
	}
}

// A supervisor that dies leaves launches nobody supervises. The next
// supervisor on the same state directory has another identity (another
// pid, or the same pid with another start time); it sees the records of the
// dead one, kills what is left of those launches (their cgroup, their tag,
// their session) and records them as failed. While the first one lives,
// the state directory is locked.
func TestRestartedSupervisor(t *testing.T) {
	state, dir := t.TempDir(), t.TempDir()
	root := testCgroupRoot(t)
	id := launchID(t, "inner")
	logf, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	// Started by hand, not by a supervisor, so that its orphans go to init
	// when it dies, as they do for a real daemon: they escape entirely.
	// No reap loop runs yet; this test reaps the binary itself.
	argv := []string{sandboxdBin, "run", "--state", state, "--id", id, "--cgroup-root", root, "--",
		"sh", "-c", "(setsid sh -c 'exec sleep 1000' &); exec sleep 1001"}
	pid, err := syscall.ForkExec(sandboxdBin, argv, &syscall.ProcAttr{
		Env: os.Environ(), Files: []uintptr{0, logf.Fd(), logf.Fd()}, Sys: &syscall.SysProcAttr{Setsid: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	reaped := false
	defer func() {
		if !reaped {
			_ = unix.Kill(pid, unix.SIGKILL)
			_, _ = unix.Wait4(pid, nil, 0, nil)
		}
	}()
	var rec sandboxapi.Record
	poll.Wait(t, 10*time.Second, "the daemon's launch", func() bool {
		rec, err = ReadRecord(state, id)
		if err != nil || rec.State != sandboxapi.StateRunning {
			return false
		}
		// Settled: both are their sleep by now, not a shell that is about
		// to fork or exec (a process seen mid-exec may not show its tag).
		tagged := taggedWithPrefix([]byte(EnvTag + "=" + id))
		return len(tagged) == 2 && !slices.ContainsFunc(tagged, func(pid int) bool {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			return strings.TrimSpace(string(b)) != "sleep"
		})
	})
	old := rec.Supervisor
	if old.PID != pid || !Alive(old) || rec.Cgroup == "" {
		t.Fatalf("record %+v (daemon pid %d)", rec, pid)
	}

	// The state directory is locked while the daemon lives.
	s, err := New(Config{StateDir: state, CgroupRoot: root})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Run(context.Background()); !errors.Is(err, ErrStateLocked) {
		t.Fatalf("Run on a locked state directory: %v", err)
	}

	// The daemon dies.
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Wait4(pid, nil, 0, nil); err != nil {
		t.Fatal(err)
	}
	reaped = true
	left := taggedWithPrefix([]byte(EnvTag + "=" + id))
	if len(left) != 2 || Alive(old) {
		t.Fatalf("after the daemon's death: tagged %v, alive %v", left, Alive(old))
	}

	// A new supervisor, a new identity.
	s2 := startSupervisor(t, Config{StateDir: state, CgroupRoot: root})
	if s2.Identity() == old {
		t.Fatal("same identity")
	}
	rc, err := s2.Wait(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if rc.Outcome != sandboxapi.OutcomeFailed || !strings.Contains(rc.Error, ErrSupervisorRestarted.Error()) ||
		!strings.Contains(rc.Error, old.String()) || !rc.CleanupConfirmed || !rc.Started {
		t.Fatalf("receipt %+v", rc)
	}
	for _, p := range left {
		if st := stateOf(p); st != 0 && st != 'Z' {
			t.Errorf("pid %d of the lost launch still there (%c)", p, st)
		}
	}
	if _, err := os.Stat(rec.Cgroup); !os.IsNotExist(err) {
		t.Errorf("cgroup %s of the lost launch left: %v", rec.Cgroup, err)
	}
}
