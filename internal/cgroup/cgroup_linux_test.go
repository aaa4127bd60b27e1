package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/procfs"
)

// testParent makes a cgroup of the test's own under this process's
// cgroup and, at cleanup, kills what is left in it, removes it and checks
// that it is gone.
func testParent(t *testing.T) Dir {
	t.Helper()
	self, err := Self()
	if err != nil {
		t.Fatalf("the tests need cgroup v2 mounted and writable (run as root; mount -t cgroup2 none /sys/fs/cgroup): %v", err)
	}
	d, err := Create(filepath.Join(string(self), fmt.Sprintf("cgroup-test-%d-%08x", os.Getpid(), rand.Uint32())))
	if err != nil {
		t.Fatalf("the tests need a writable cgroup v2 (run them as root): %v", err)
	}
	t.Cleanup(func() {
		if pids, _ := d.AllProcs(); len(pids) > 0 {
			t.Errorf("processes left in %s: %v", d, pids)
			_ = d.Kill()
			_, _ = d.WaitEvents(context.Background(), time.Now().Add(10*time.Second), func(e Events) bool { return !e.Populated })
		}
		if err := d.Remove(context.Background(), time.Now().Add(10*time.Second)); err != nil {
			t.Errorf("remove %s: %v", d, err)
		}
		if _, err := os.Stat(string(d)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s still there: %v", d, err)
		}
	})
	return d
}

// startIn starts sleep born in cgroup d (clone3 with CLONE_INTO_CGROUP),
// or in the test's own cgroup when d is "", and kills and reaps it at
// cleanup.
func startIn(t *testing.T, d Dir) *exec.Cmd {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatalf("sleep not found: install coreutils (apt-get install coreutils): %v", err)
	}
	cmd := exec.Command(sleep, "1000")
	if d != "" {
		fd, err := d.OpenFD()
		if err != nil {
			t.Fatal(err)
		}
		defer syscall.Close(fd)
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

func mustEvents(t *testing.T, d Dir) Events {
	t.Helper()
	e, err := d.Events()
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestMountAndSelf(t *testing.T) {
	mnt, err := Mount()
	if err != nil {
		t.Fatalf("the tests need cgroup v2: %v", err)
	}
	self, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	if string(self) != mnt && !strings.HasPrefix(string(self), mnt+"/") {
		t.Errorf("Self %s is not under the cgroup2 mount %s", self, mnt)
	}
	pids, err := self.Procs()
	if err != nil || !slices.Contains(pids, os.Getpid()) {
		t.Fatalf("%s/cgroup.procs = %v, %v; want the test process %d", self, pids, err, os.Getpid())
	}
}

func TestCreateAndRemove(t *testing.T) {
	parent := testParent(t)
	a, err := Create(string(parent.Child("a")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Create(string(a)); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("Create of an existing cgroup: %v, want fs.ErrExist", err)
	}
	if err := a.Check(); err != nil {
		t.Fatalf("Check of a fresh cgroup: %v", err)
	}
	if err := Dir(t.TempDir()).Check(); err == nil {
		t.Error("Check accepted a plain directory")
	}
	for _, sub := range []string{"b", "b/c", "d"} {
		if _, err := Create(string(a.Child(sub))); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Remove(context.Background(), time.Now().Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(string(a)); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%s still there after Remove: %v", a, err)
	}
	if err := a.Remove(context.Background(), time.Now()); err != nil {
		t.Fatalf("Remove of a missing cgroup: %v", err)
	}
}

func TestRemoveRefusesAPopulatedCgroup(t *testing.T) {
	parent := testParent(t)
	d, err := Create(string(parent.Child("busy")))
	if err != nil {
		t.Fatal(err)
	}
	startIn(t, d)
	err = d.Remove(context.Background(), time.Now().Add(20*time.Millisecond))
	if !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("Remove of a populated cgroup: %v, want EBUSY", err)
	}
	if err := d.Kill(); err != nil {
		t.Fatal(err)
	}
	// The process is gone once reaped; then the cgroup goes.
	if ok, err := d.WaitEvents(context.Background(), time.Now().Add(10*time.Second), func(e Events) bool { return !e.Populated }); !ok || err != nil {
		t.Fatalf("not emptied by Kill: %v", err)
	}
	if err := d.Remove(context.Background(), time.Now().Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
}

func TestFreezeThawKill(t *testing.T) {
	parent := testParent(t)
	d, err := Create(string(parent.Child("box")))
	if err != nil {
		t.Fatal(err)
	}
	if e := mustEvents(t, d); e.Populated || e.Frozen {
		t.Fatalf("fresh cgroup: %+v", e)
	}
	cmd := startIn(t, d)
	pid := cmd.Process.Pid
	if pids, err := d.Procs(); err != nil || !slices.Equal(pids, []int{pid}) {
		t.Fatalf("Procs = %v, %v; want [%d]", pids, err, pid)
	}
	if pids, err := parent.AllProcs(); err != nil || !slices.Equal(pids, []int{pid}) {
		t.Fatalf("AllProcs of the parent = %v, %v; want [%d]", pids, err, pid)
	}
	if pids, err := parent.Procs(); err != nil || len(pids) != 0 {
		t.Fatalf("Procs of the parent = %v, %v; want none of its own", pids, err)
	}
	if rel, _, err := procfs.Cgroup(pid, nil); err != nil || !strings.HasSuffix(string(d), rel) {
		t.Fatalf("/proc/%d/cgroup = %q, %v; want a suffix of %s", pid, rel, err, d)
	}
	ctx := context.Background()
	if err := d.Freeze(ctx, time.Now().Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if e := mustEvents(t, d); !e.Populated || !e.Frozen {
		t.Fatalf("after Freeze: %+v", e)
	}
	if err := d.Thaw(ctx, time.Now().Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if e := mustEvents(t, d); e.Frozen {
		t.Fatalf("after Thaw: %+v", e)
	}
	// Kill works on a frozen cgroup.
	if err := d.Freeze(ctx, time.Now().Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := d.Kill(); err != nil {
		t.Fatal(err)
	}
	if ok, err := d.WaitEvents(ctx, time.Now().Add(10*time.Second), func(e Events) bool { return !e.Populated }); !ok || err != nil {
		t.Fatalf("not emptied by Kill: %v, %v", ok, err)
	}
	if err := cmd.Wait(); err == nil || cmd.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("sleep ended with %v, want SIGKILL", err)
	}
}

func TestKillEachSignalsEveryProcessBelow(t *testing.T) {
	parent := testParent(t)
	a, err := Create(string(parent.Child("a")))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Create(string(a.Child("b")))
	if err != nil {
		t.Fatal(err)
	}
	startIn(t, a)
	startIn(t, b)
	if err := a.killEach(); err != nil { // the path for kernels without cgroup.kill
		t.Fatal(err)
	}
	if ok, err := a.WaitEvents(context.Background(), time.Now().Add(10*time.Second), func(e Events) bool { return !e.Populated }); !ok || err != nil {
		t.Fatalf("not emptied: %v, %v", ok, err)
	}
	if err := Dir(filepath.Join(t.TempDir(), "missing")).killEach(); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("killEach of a missing cgroup: %v, want fs.ErrNotExist", err)
	}
}

func TestAddMovesAProcess(t *testing.T) {
	parent := testParent(t)
	d, err := Create(string(parent.Child("dest")))
	if err != nil {
		t.Fatal(err)
	}
	cmd := startIn(t, "")
	if err := d.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if pids, err := d.Procs(); err != nil || !slices.Equal(pids, []int{cmd.Process.Pid}) {
		t.Fatalf("Procs after Add = %v, %v", pids, err)
	}
	if e := mustEvents(t, d); !e.Populated {
		t.Fatalf("not populated after Add: %+v", e)
	}
}

func TestWaitEventsEnds(t *testing.T) {
	d := testParent(t)
	populated := func(e Events) bool { return e.Populated }
	start := time.Now()
	ok, err := d.WaitEvents(context.Background(), start.Add(20*time.Millisecond), populated)
	if ok || err != nil || time.Since(start) < 20*time.Millisecond {
		t.Fatalf("WaitEvents on an empty cgroup = %v, %v after %v; want false, nil after the deadline", ok, err, time.Since(start))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if ok, err := d.WaitEvents(ctx, time.Now().Add(time.Hour), populated); ok || !errors.Is(err, context.Canceled) {
		t.Fatalf("WaitEvents with a cancelled ctx = %v, %v", ok, err)
	}
	if _, err := Dir(t.TempDir()).WaitEvents(context.Background(), time.Now(), populated); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("WaitEvents on a plain directory: %v, want fs.ErrNotExist", err)
	}
}

// A freeze the kernel does not confirm in time is undone: the cgroup is
// never left half frozen.
func TestFreezeNotConfirmedIsUndone(t *testing.T) {
	parent := testParent(t)
	d, err := Create(string(parent.Child("late")))
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		startIn(t, d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = d.Freeze(ctx, time.Now())
	if err == nil {
		t.Log("the kernel confirmed the freeze on the first read")
		if err := d.Thaw(context.Background(), time.Now().Add(10*time.Second)); err != nil {
			t.Fatal(err)
		}
		return
	}
	if !errors.Is(err, ErrTimeout) && !errors.Is(err, context.Canceled) {
		t.Fatalf("Freeze: %v, want ErrTimeout or context.Canceled", err)
	}
	b, err := os.ReadFile(string(d.Child("cgroup.freeze")))
	if err != nil || strings.TrimSpace(string(b)) != "0" {
		t.Fatalf("cgroup.freeze after an unconfirmed freeze: %q, %v; want 0", b, err)
	}
}
