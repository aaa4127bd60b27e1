package procfs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/poll"
)

// startSleep starts a child of the test that sleeps until it is killed,
// with tag in its environment, and kills and reaps it at cleanup.
func startSleep(t *testing.T, tag string) *exec.Cmd {
	t.Helper()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatalf("sleep not found: install coreutils (apt-get install coreutils): %v", err)
	}
	cmd := exec.Command(sleep, "1000")
	cmd.Env = []string{tag}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// waitState waits until the state of pid is one of states.
func waitState(t *testing.T, pid int, states string) Stat {
	t.Helper()
	var st Stat
	poll.Wait(t, 10*time.Second, fmt.Sprintf("process %d in state %s", pid, states), func() bool {
		var err error
		st, _, err = ReadStat(pid, nil)
		return err == nil && strings.IndexByte(states, st.State) >= 0
	})
	return st
}

func TestReadStatOfThisProcess(t *testing.T) {
	st, buf, err := ReadStat(os.Getpid(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// The process's state is its leader thread's, which need not be the
	// one running this test: any state of a live thread (sleeping, 'S',
	// on a loaded machine).
	if !strings.ContainsRune("RSD", rune(st.State)) || st.PPID != os.Getppid() || st.Threads < 1 || st.Start == 0 {
		t.Fatalf("stat of the test process: %+v", st)
	}
	// The thread that reads its own stat is running.
	runtime.LockOSThread()
	own, _, err := ReadTaskStat(os.Getpid(), syscall.Gettid(), nil)
	runtime.UnlockOSThread()
	if err != nil || own.State != 'R' {
		t.Fatalf("stat of this thread: %+v, %v; want state R", own, err)
	}
	if st.PGID != syscall.Getpgrp() {
		t.Errorf("PGID %d, want %d", st.PGID, syscall.Getpgrp())
	}
	if cap(buf) < len(buf) || !bytes.Contains(buf, []byte(")")) {
		t.Errorf("returned buffer %q is not the stat line", buf)
	}
	ts, _, err := ReadTaskStat(os.Getpid(), os.Getpid(), buf)
	if err != nil || ts.Start != st.Start || ts.PPID != st.PPID {
		t.Fatalf("ReadTaskStat of the leader = %+v, %v; want the start and parent of %+v", ts, err, st)
	}
	tids, err := Tasks(os.Getpid())
	if err != nil || !slices.Contains(tids, os.Getpid()) || len(tids) < 2 {
		t.Fatalf("Tasks = %v, %v; want the leader among the Go runtime's threads", tids, err)
	}
}

func TestReadFileGrowsTheBuffer(t *testing.T) {
	want, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadFile("/proc/self/status", make([]byte, 0, 8))
	if err != nil {
		t.Fatal(err)
	}
	// The status changes between reads (VmRSS, ...); its first line does
	// not.
	first := func(b []byte) string { l, _, _ := bytes.Cut(b, []byte("\n")); return string(l) }
	if len(got) < 100 || first(got) != first(want) {
		t.Fatalf("ReadFile read %d bytes starting %q; want about %d starting %q", len(got), first(got), len(want), first(want))
	}
}

func TestAChild(t *testing.T) {
	tag := "PROCFS_TEST=" + t.Name()
	cmd := startSleep(t, tag)
	pid := cmd.Process.Pid
	st := waitState(t, pid, "S")
	if st.PPID != os.Getpid() || st.Threads != 1 {
		t.Fatalf("stat of the child: %+v", st)
	}
	kids, _, err := Children(os.Getpid(), 0, nil, nil)
	if err != nil || !slices.Contains(kids, pid) {
		t.Fatalf("Children of the test (every thread) = %v, %v; want %d among them", kids, err, pid)
	}
	if tree, err := Tree(os.Getpid()); err != nil || tree[0] != os.Getpid() || !slices.Contains(tree, pid) {
		t.Fatalf("Tree of the test = %v, %v; want it first and %d in it", tree, err, pid)
	}
	if tree, err := Tree(pid); err != nil || !slices.Equal(tree, []int{pid}) {
		t.Fatalf("Tree of the child = %v, %v; want it alone", tree, err)
	}
	pids, err := PIDs()
	if err != nil || !slices.Contains(pids, pid) || !slices.Contains(pids, os.Getpid()) {
		t.Fatalf("PIDs misses the test or its child: %v", err)
	}
	if has, _ := EnvironHas(pid, []byte(tag), nil); !has {
		t.Errorf("EnvironHas(%q) = false", tag)
	}
	if has, _ := EnvironHas(pid, []byte(tag[:len(tag)-1]), nil); has {
		t.Errorf("EnvironHas matched a prefix of the entry")
	}
	if v, _ := VforkWait(pid, pid, nil); v {
		t.Errorf("a sleeping process reported in a vfork wait")
	}
	self, err := SelfCgroup()
	if err != nil || self == "" {
		t.Fatalf("SelfCgroup = %q, %v: the tests need a cgroup v2 hierarchy (mount -t cgroup2 none /sys/fs/cgroup)", self, err)
	}
	if cg, _, err := Cgroup(pid, nil); err != nil || cg != self {
		t.Errorf("Cgroup of the child = %q, %v; want the test's %q", cg, err, self)
	}
	ids, err := NSpid(pid)
	if err != nil || len(ids) == 0 || ids[0] != pid {
		t.Errorf("NSpid = %v, %v; want %d first", ids, err, pid)
	}

	// A stopped process keeps other signals pending until it continues.
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitState(t, pid, "T")
	if p, _ := SignalPending(pid, pid, syscall.SIGUSR1, nil); p {
		t.Fatal("SIGUSR1 pending before it was sent")
	}
	if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if p, _ := SignalPending(pid, pid, syscall.SIGUSR1, nil); !p {
		t.Error("SIGUSR1 sent to a stopped process is not pending")
	}
	if p, _ := SignalPending(pid, pid, syscall.SIGUSR2, nil); p {
		t.Error("SIGUSR2 reported pending")
	}
}

func TestChildrenOfALeaderThatReadsOnlyItsOwnList(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatalf("sh not found: install dash or bash: %v", err)
	}
	// A single-threaded shell with one child: threads 1 reads its list.
	shell := exec.Command(sh, "-c", "sleep 1000 & wait")
	shell.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // killed as a group
	if err := shell.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-shell.Process.Pid, syscall.SIGKILL)
		_ = shell.Process.Kill()
		_ = shell.Wait()
	})
	var kids []int
	poll.Wait(t, 10*time.Second, "the shell's child", func() bool {
		kids, _, err = Children(shell.Process.Pid, 1, nil, kids[:0])
		return err != nil || len(kids) > 0
	})
	if err != nil {
		t.Fatal(err)
	}
	st, _, err := ReadStat(kids[0], nil)
	if err != nil || st.PPID != shell.Process.Pid {
		t.Fatalf("child %d of the shell: %+v, %v", kids[0], st, err)
	}
}

func TestGone(t *testing.T) {
	cmd := startSleep(t, "X=1")
	pid := cmd.Process.Pid
	fd, err := OpenStat(pid)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	st, buf, err := ReadStatFD(fd, nil)
	if err != nil || st.PPID != os.Getpid() {
		t.Fatalf("ReadStatFD = %+v, %v", st, err)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if _, _, err := ReadStatFD(fd, buf); !errors.Is(err, ErrGone) {
		t.Errorf("ReadStatFD of a reaped process: %v, want ErrGone", err)
	}
	if _, _, err := ReadStat(pid, buf); !errors.Is(err, ErrGone) {
		t.Errorf("ReadStat of a reaped process: %v, want ErrGone", err)
	}
	if _, err := OpenStat(pid); !errors.Is(err, ErrGone) {
		t.Errorf("OpenStat of a reaped process: %v, want ErrGone", err)
	}
	if _, err := Tasks(pid); !errors.Is(err, ErrGone) {
		t.Errorf("Tasks of a reaped process: %v, want ErrGone", err)
	}
	if _, _, err := Children(pid, 1, buf, nil); !errors.Is(err, ErrGone) {
		t.Errorf("Children of a reaped process: %v, want ErrGone", err)
	}
	if has, _ := EnvironHas(pid, []byte("X=1"), buf); has {
		t.Error("EnvironHas of a reaped process reported true")
	}
}

func TestMounts(t *testing.T) {
	ms, err := Mounts()
	if err != nil {
		t.Fatal(err)
	}
	var root, proc bool
	for _, m := range ms {
		root = root || m.Point == "/"
		proc = proc || m.Point == "/proc" && m.FSType == "proc"
	}
	if !root || !proc {
		t.Fatalf("mount table without / or /proc: %+v", ms)
	}
}
