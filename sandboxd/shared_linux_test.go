package sandboxd

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/cgroup"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/procfs"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// These tests run several supervisors on one host at once, as a host
// does that runs many sandboxes: dir sandboxes share the host's PID
// namespace, and sandboxes of every kind share a cgroup parent.

// uniqueArg is a sleep argument no other process on the host has: the
// test finds its processes by their command line.
func uniqueArg(n int) string { return fmt.Sprintf("%d.%06d", n, os.Getpid()%1000000) }

// withArg returns the live processes whose command line has arg.
func withArg(arg string) []sandboxapi.Identity {
	pids, _ := procfs.PIDs()
	var out []sandboxapi.Identity
	for _, pid := range pids {
		b, err := os.ReadFile(procfs.Path(pid, "/cmdline"))
		if err != nil || !bytes.Contains(b, []byte("\x00"+arg+"\x00")) {
			continue
		}
		if st, _, err := procfs.ReadStat(pid, nil); err == nil && st.State != 'Z' {
			out = append(out, sandboxapi.Identity{PID: pid, Start: st.Start})
		}
	}
	return out
}

// untouched fails the test unless every process of ids is alive and not
// stopped.
func untouched(t *testing.T, what string, ids []sandboxapi.Identity) {
	t.Helper()
	for _, id := range ids {
		if st := stateOf(id.PID); !Alive(id) || st == 'Z' || st == 'T' || st == 't' {
			t.Errorf("%s: pid %d (%s) alive %v, state %q", what, id.PID, commOf(id.PID), Alive(id), st)
		}
	}
}

// otherProcess is a supervisor in a process of its own: `sandboxd run`
// with one launch.
type otherProcess struct {
	pid, pidfd int
	state, log string
}

// startOtherProcess starts `sandboxd run` with flags (--no-cgroup if
// none) for launch id running cmd, before any supervisor of the test runs
// (so that the test may reap it), and waits until the launch runs.
// Cleanup kills it if it is still there.
func startOtherProcess(t *testing.T, id, cmd string, flags ...string) *otherProcess {
	t.Helper()
	dir := t.TempDir()
	o := &otherProcess{state: filepath.Join(dir, "state"), log: filepath.Join(dir, "log")}
	logf, err := os.Create(o.log)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	if len(flags) == 0 {
		flags = []string{"--no-cgroup"}
	}
	argv := append([]string{sandboxdBin, "run", "--state", o.state, "--id", id, "--grace", "200ms"}, flags...)
	argv = append(argv, "--", "sh", "-c", cmd)
	pid, err := syscall.ForkExec(sandboxdBin, argv, &syscall.ProcAttr{
		Env: os.Environ(), Files: []uintptr{0, logf.Fd(), logf.Fd()}, Sys: &syscall.SysProcAttr{Setsid: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	o.pid = pid
	if o.pidfd, err = unix.PidfdOpen(pid, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !exitedNow(o.pidfd) {
			_ = unix.PidfdSendSignal(o.pidfd, unix.SIGKILL, nil, 0)
		}
		poll.Wait(t, 10*time.Second, "sandboxd run to exit", func() bool { return exitedNow(o.pidfd) })
		// Reap it unless a reap loop did.
		_ = unix.Waitid(unix.P_PIDFD, o.pidfd, nil, unix.WEXITED|unix.WNOHANG, nil)
		unix.Close(o.pidfd)
	})
	poll.Wait(t, 10*time.Second, "the other supervisor's launch", func() bool {
		rec, err := ReadRecord(o.state, id)
		return err == nil && rec.State == sandboxapi.StateRunning
	})
	return o
}

// stop ends the other supervisor's launch and waits until the process has
// exited.
func (o *otherProcess) stop(t *testing.T) {
	t.Helper()
	if err := unix.PidfdSendSignal(o.pidfd, unix.SIGTERM, nil, 0); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 10*time.Second, "sandboxd run to exit", func() bool { return exitedNow(o.pidfd) })
	if t.Failed() {
		b, _ := os.ReadFile(o.log)
		t.Logf("sandboxd run's log:\n%s", b)
	}
}

// Launch ids repeat across sandboxes and runs. Two supervisors in one PID
// namespace (two dir sandboxes), each running a launch of the same id
// whose harness detached a daemon: stopping the launch of one leaves the
// other's harness and daemon alone, though both carry that launch id in
// their environment.
func TestSameLaunchIDUnderTwoSupervisors(t *testing.T) {
	requireTool(t, "setsid", "apt-get install util-linux")
	for _, c := range stopConfigs {
		t.Run(c.name, func(t *testing.T) {
			id := launchID(t, "same")
			otherDaemon, otherHarness := uniqueArg(3001), uniqueArg(3002)
			other := startOtherProcess(t, id, `(setsid sh -c 'exec sleep `+otherDaemon+`' &); exec sleep `+otherHarness)
			var theirs []sandboxapi.Identity
			poll.Wait(t, 5*time.Second, "the other launch's sleeps", func() bool {
				theirs = append(withArg(otherDaemon), withArg(otherHarness)...)
				return len(theirs) == 2
			})

			s := startSupervisor(t, c.cfg)
			ownDaemon, ownHarness := uniqueArg(3003), uniqueArg(3004)
			mustLaunch(t, s, Spec{ID: id, Command: `(setsid sh -c 'exec sleep ` + ownDaemon + `' &); exec sleep ` + ownHarness})
			var ours []sandboxapi.Identity
			poll.Wait(t, 5*time.Second, "this launch's sleeps", func() bool {
				ours = append(withArg(ownDaemon), withArg(ownHarness)...)
				return len(ours) == 2
			})
			rc, err := s.Stop(ctxT(t), id)
			if err != nil || !rc.CleanupConfirmed {
				t.Fatalf("Stop: %+v, %v", rc, err)
			}
			for _, p := range ours {
				if Alive(p) && stateOf(p.PID) != 'Z' {
					t.Errorf("pid %d of the stopped launch still there", p.PID)
				}
			}
			untouched(t, "the other supervisor's launch of the same id", theirs)
			if rec, err := ReadRecord(other.state, id); err != nil || rec.State != sandboxapi.StateRunning {
				t.Errorf("the other launch: %s, %v", rec.State, err)
			}
			other.stop(t)
			rec, err := ReadRecord(other.state, id)
			if err != nil || rec.Receipt == nil || rec.Receipt.StopReason != sandboxapi.StopRequested {
				t.Fatalf("the other launch's record after its own stop: %+v, %v", rec, err)
			}
		})
	}
}

// A sandbox forked from a snapshot has a copy of the state directory,
// records of launches that run on in the original among them. The copy's
// supervisor ends those launches as lost, but what it kills is only ever
// its own: the original's harness and its daemon, though they carry the
// launch id and the record names the harness and its cgroup, are left
// alone.
func TestCopiedStateDirectoryLeavesTheOriginal(t *testing.T) {
	requireTool(t, "setsid", "apt-get install util-linux")
	for _, c := range stopConfigs {
		t.Run(c.name, func(t *testing.T) {
			cfg := Config{NoCgroup: true}
			flags := []string{"--no-cgroup"}
			if !c.cfg.NoCgroup {
				cfg = Config{CgroupRoot: testCgroupRoot(t)}
				flags = []string{"--cgroup-root", cfg.CgroupRoot, "--mode", "freeze"}
			}
			id := launchID(t, "a")
			daemon, harness := uniqueArg(3031), uniqueArg(3032)
			orig := startOtherProcess(t, id, `(setsid sh -c 'exec sleep `+daemon+`' &); exec sleep `+harness, flags...)
			var theirs []sandboxapi.Identity
			poll.Wait(t, 5*time.Second, "the original launch's sleeps", func() bool {
				theirs = append(withArg(daemon), withArg(harness)...)
				return len(theirs) == 2
			})
			rec, err := ReadRecord(orig.state, id)
			if err != nil {
				t.Fatal(err)
			}
			if (rec.Cgroup == "") != c.cfg.NoCgroup {
				t.Fatalf("the original launch's cgroup: %q", rec.Cgroup)
			}
			cfg.StateDir = t.TempDir()
			if err := os.MkdirAll(LaunchDir(cfg.StateDir, id), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := writeRecord(LaunchDir(cfg.StateDir, id), &rec, false); err != nil {
				t.Fatal(err)
			}

			s := startSupervisor(t, cfg)
			rc, err := s.Wait(ctxT(t), id)
			if err != nil || rc.Outcome != sandboxapi.OutcomeFailed || !strings.Contains(rc.Error, ErrSupervisorRestarted.Error()) {
				t.Fatalf("the copied launch: %+v, %v", rc, err)
			}
			untouched(t, "the original's launch", theirs)
			if rec.Cgroup != "" {
				if ev, err := cgroup.Dir(rec.Cgroup).Events(); err != nil || !ev.Populated {
					t.Errorf("the original's cgroup %s: %+v, %v", rec.Cgroup, ev, err)
				}
			}
			orig.stop(t)
		})
	}
}

// Two supervisors in one process (as in tests, or a daemon that serves
// two state directories): the harness of one is a child of the process
// like the harness of the other, but nothing names it as the other's (not
// its tree, cgroup, session or tag). Pausing in stop mode and stopping the
// one launch of the first supervisor leaves the second's alone.
func TestStopLeavesAnotherSupervisorsLaunch(t *testing.T) {
	for _, c := range stopConfigs {
		t.Run(c.name, func(t *testing.T) {
			cfg := c.cfg
			if !cfg.NoCgroup {
				cfg.CgroupRoot = testCgroupRoot(t) // shared by both
			}
			a, b := startSupervisor(t, cfg), startSupervisor(t, cfg)
			idA, idB := launchID(t, "a"), launchID(t, "b")
			harnessA, harnessB := uniqueArg(3011), uniqueArg(3012)
			mustLaunch(t, a, Spec{ID: idA, Command: `exec sleep ` + harnessA})
			recB := mustLaunch(t, b, Spec{ID: idB, Command: `exec sleep ` + harnessB})
			var theirs []sandboxapi.Identity
			poll.Wait(t, 5*time.Second, "both harnesses", func() bool {
				theirs = withArg(harnessB)
				return len(withArg(harnessA)) == 1 && len(theirs) == 1
			})
			if theirs[0].PID != recB.PID {
				t.Fatalf("harness b is pid %d, its record says %d", theirs[0].PID, recB.PID)
			}
			res, err := a.Pause(ctxT(t), idA, sandboxapi.ModeStop)
			if err != nil || res.PIDCount != 1 {
				t.Fatalf("pause a: %+v, %v", res, err)
			}
			untouched(t, "b's harness while a is paused", theirs)
			if _, err := a.Continue(ctxT(t), idA); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Stop(ctxT(t), idA); err != nil {
				t.Fatal(err)
			}
			untouched(t, "b's harness after a's stop", theirs)
			if rec, _ := b.Status(idB); rec.State != sandboxapi.StateRunning {
				t.Fatalf("launch b is %s", rec.State)
			}
			if rc, err := b.Stop(ctxT(t), idB); err != nil || rc.Signal != "SIGINT" {
				t.Fatalf("stop b: %+v, %v", rc, err)
			}
		})
	}
}

// Supervisors come and go under one default parent (<own cgroup>/<name>),
// which each creates when it needs it and removes when it is the last to
// leave; others only probe the modes there, creating and removing it as
// fast as they can. No launch fails for a parent removed under it, every
// launch gets a cgroup, and once all have gone nothing is left.
func TestConcurrentSupervisorsShareTheCgroupParent(t *testing.T) {
	own, err := cgroup.Self()
	if err != nil {
		t.Fatalf("freeze mode needs cgroup v2: %v (run as root on a host with cgroup v2 mounted and writable)", err)
	}
	name := CgroupSubtree + "-" + testPrefix(t) + "-" + strconv.Itoa(os.Getpid())
	parent := own.Child(name)
	t.Cleanup(func() {
		if _, err := os.Stat(string(parent)); err == nil {
			t.Errorf("the shared parent %s is left behind", parent)
			_ = removeCgroup(parent)
		}
	})
	stop := make(chan struct{})
	var probes, sups sync.WaitGroup
	probes.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if ms, err := DetectModes(Config{CgroupName: name}); err != nil || ms[0] != sandboxapi.ModeFreeze {
				t.Errorf("DetectModes: %v, %v", ms, err)
				return
			}
		}
	})
	for w := range 3 {
		sups.Go(func() {
			for round := range 4 {
				if !superviseRound(t, Config{StateDir: t.TempDir(), CgroupName: name, Mode: sandboxapi.ModeFreeze}, fmt.Sprintf("w%d-r%d", w, round)) {
					return
				}
			}
		})
	}
	sups.Wait()
	close(stop)
	probes.Wait()
	checkNothingLeft(t)
}

// superviseRound runs one supervisor for a few short launches, each of
// which must get a cgroup, and stops it. It reports false (the test has
// failed) if any step failed.
func superviseRound(t *testing.T, cfg Config, tag string) bool {
	s, err := New(cfg)
	if err != nil {
		t.Errorf("New: %v", err)
		return false
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	for i := range 4 {
		id := launchID(t, fmt.Sprintf("%s-%d", tag, i))
		rec, err := s.Launch(ctx, Spec{ID: id, Argv: []string{"true"}})
		if err != nil {
			t.Errorf("Launch %s: %v", id, err)
			return false
		}
		if rec.Cgroup == "" {
			t.Errorf("launch %s runs without a cgroup", id)
			return false
		}
		if rc, err := s.Wait(ctx, id); err != nil || rc.ExitCode != 0 {
			t.Errorf("launch %s: %+v, %v", id, rc, err)
			return false
		}
	}
	return true
}

// A supervisor removes what supervisors that are gone left in the shared
// parent, when it starts and when it stops, as long as it is empty: a
// supervisor's own cgroup (with the empty launch cgroups a kill -9 left in
// it) and a probe's. It leaves a cgroup whose owner lives, one that still
// holds a process, and anything it does not know.
func TestLeftoverCgroupsOfGoneSupervisorsReaped(t *testing.T) {
	root := cgroup.Dir(testCgroupRoot(t))
	self, err := IdentityOf(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	gone := sandboxapi.Identity{PID: self.PID, Start: self.Start + 1} // that pid, another process
	mk := func(path string) cgroup.Dir {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(string(root), path), 0o755); err != nil {
			t.Fatal(err)
		}
		return root.Child(path)
	}
	deadEmpty := mk(fmt.Sprintf("sup-%d-%d-0123456789abcdef", gone.PID, gone.Start))
	mk(filepath.Join(filepath.Base(string(deadEmpty)), "launch-x"))
	frozen := mk(filepath.Join(filepath.Base(string(deadEmpty)), "launch-y"))
	if err := frozen.SetFreeze(true); err != nil {
		t.Fatal(err)
	}
	deadProbe := mk(fmt.Sprintf("probe-%d-%d-01234567", gone.PID, gone.Start))
	deadBusy := mk(fmt.Sprintf("sup-%d-%d-fedcba9876543210", gone.PID, gone.Start))
	busy := mk(filepath.Join(filepath.Base(string(deadBusy)), "launch-z"))
	alive := mk(fmt.Sprintf("sup-%d-%d-00000000000000ff", self.PID, self.Start))
	unknown := mk("someone-elses")
	t.Cleanup(func() {
		for _, d := range []cgroup.Dir{alive, unknown} {
			_ = removeCgroup(d)
		}
	})
	// A process in the busy one, started before any supervisor runs.
	fd, err := busy.OpenFD()
	if err != nil {
		t.Fatal(err)
	}
	var pidfd int
	pid, err := syscall.ForkExec("/bin/sleep", []string{"sleep", uniqueArg(3021)}, &syscall.ProcAttr{
		Sys: &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd, PidFD: &pidfd},
	})
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)

	s, err := New(Config{StateDir: t.TempDir(), CgroupRoot: string(root)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	// A launch returns once Run serves, and Run serves once it has looked.
	id := launchID(t, "a")
	mustLaunch(t, s, Spec{ID: id, Argv: []string{"true"}})
	if _, err := s.Wait(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	exists := func(d cgroup.Dir) bool { _, err := os.Stat(string(d)); return err == nil }
	for _, d := range []cgroup.Dir{deadEmpty, deadProbe} {
		if exists(d) {
			t.Errorf("%s, empty and its owner gone, is still there", d)
		}
	}
	for _, d := range []cgroup.Dir{deadBusy, busy, alive, unknown} {
		if !exists(d) {
			t.Errorf("%s was removed", d)
		}
	}
	if st := stateOf(pid); st == 0 || st == 'Z' {
		t.Fatalf("the process in %s is gone (%q)", busy, st)
	}
	// Once empty, it goes when the supervisor stops.
	if err := unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0); err != nil {
		t.Fatal(err)
	}
	if ok, err := busy.WaitEvents(ctxT(t), time.Now().Add(10*time.Second), func(e cgroup.Events) bool { return !e.Populated }); !ok || err != nil {
		t.Fatalf("%s still populated: %v", busy, err)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if exists(deadBusy) {
		t.Errorf("%s, empty now, is still there after the supervisor stopped", deadBusy)
	}
	ents, _ := os.ReadDir(string(root))
	for _, e := range ents {
		if e.IsDir() && e.Name() != filepath.Base(string(alive)) && e.Name() != filepath.Base(string(unknown)) {
			t.Errorf("%s left in the parent", e.Name())
		}
	}
	checkNothingLeft(t)
}
