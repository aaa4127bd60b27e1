package sandboxd

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/procfs"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// stopConfigs are the two ways a supervisor finds and kills processes:
// with a cgroup per launch (cgroup.procs and cgroup.kill), and without
// cgroup v2 at all (the tree walk, the subreaper's orphans and the tag).
var stopConfigs = []struct {
	name string
	cfg  Config
}{
	{"cgroup", Config{Grace: 300 * time.Millisecond}},
	{"nocgroup", Config{Grace: 300 * time.Millisecond, NoCgroup: true}},
}

// The stop scenarios (PROTOCOL §6, Stop; docs/SANDBOXD.md, Stopping), each
// checked to leave nothing behind: every process the launch started is
// found and killed, and the receipt says interrupted.
func TestStopScenarios(t *testing.T) {
	requireTool(t, "setsid", "apt-get install util-linux")
	requireTool(t, "env", "apt-get install coreutils")
	scenarios := []struct {
		name string
		cmd  string
		// sleeps is how many sleep processes run before the stop.
		sleeps int
		// unclaimed, without cgroups, is the one sleep nothing names as
		// the launch's: the stop leaves it, and the supervisor's shutdown
		// (the cleanup, which checks that no child is left) kills it.
		unclaimed bool
	}{
		// An install step: a shell waiting on a background job.
		{"install", `sleep 1001 & wait`, 1, false},
		// A command in a session of its own.
		{"own session", `setsid sleep 1002 & wait`, 1, false},
		// A daemon: double fork and setsid; it is reparented to the
		// supervisor (the subreaper).
		{"detached daemon", `(setsid sh -c 'exec sleep 1003' &); exec sleep 1004`, 2, false},
		// A child that cleared its environment: no tag, found in the tree.
		{"cleared environment", `env -i /bin/sh -c 'sleep 1005' & wait`, 1, false},
		// A detached child that cleared its environment: no tag, own
		// session, not in the tree: found by its cgroup; without one it is
		// nobody's (see TestUnclaimedOrphanKilledAtShutdown).
		{"detached cleared environment", `(env -i setsid /bin/sleep 1006 &); exec sleep 1007`, 2, true},
	}
	for _, c := range stopConfigs {
		t.Run(c.name, func(t *testing.T) {
			for _, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) {
					s := startSupervisor(t, c.cfg)
					id := launchID(t, "a")
					mustLaunch(t, s, Spec{ID: id, Command: sc.cmd})
					var procs []int
					poll.Wait(t, 5*time.Second, "the launch's sleeps", func() bool {
						procs = launchPIDs(t, s, id)
						if strings.Contains(sc.name, "cleared") {
							// Untagged processes outside the tree: count the
							// supervisor's orphans too.
							kids, _ := selfChildren(nil)
							procs = append(procs, kids...)
							slices.Sort(procs)
							procs = slices.Compact(procs)
						}
						n := 0
						for _, p := range procs {
							if commOf(p) != "sleep" {
								continue
							}
							n++
							// The unclaimed sleep is outside the tree only
							// once its subshell has exited and it is the
							// supervisor's (the subreaper's) child; before
							// that the tree walk rightly finds it.
							if sc.unclaimed && untaggedEnv(p) && parentOf(p) != os.Getpid() {
								return false
							}
						}
						return n == sc.sleeps
					})
					before := procsOf(procs)
					// The one sleep nothing names as the launch's, told apart
					// while it is there to read.
					orphan := map[procID]bool{}
					for _, p := range before {
						orphan[p] = sc.unclaimed && c.cfg.NoCgroup && commOf(p.pid) == "sleep" && untaggedEnv(p.pid)
					}
					rc, err := s.Stop(ctxT(t), id)
					if err != nil {
						t.Fatalf("Stop: %v", err)
					}
					if rc.Outcome != sandboxapi.OutcomeInterrupted || !rc.Started || !rc.CleanupConfirmed || rc.StopReason != sandboxapi.StopRequested {
						t.Fatalf("receipt %+v", rc)
					}
					for _, p := range before {
						st := p.state()
						if orphan[p] {
							if st == 0 || st == 'Z' {
								t.Errorf("the unclaimed orphan %d was attributed: update this test and the docs", p.pid)
							}
							continue
						}
						if st != 0 && st != 'Z' {
							t.Errorf("pid %d (%s) still there in state %c", p.pid, commOf(p.pid), st)
						}
					}
				})
			}
		})
	}
}

// A harness that ignores SIGINT is killed once the grace has passed.
func TestStopIgnoresSIGINT(t *testing.T) {
	for _, c := range stopConfigs {
		t.Run(c.name, func(t *testing.T) {
			s := startSupervisor(t, c.cfg)
			id := launchID(t, "a")
			mustLaunch(t, s, Spec{ID: id, Command: `trap '' INT; sleep 1000 & sleep 1001`})
			findComm(t, s, id, "sleep")
			start := time.Now()
			rc, err := s.Stop(ctxT(t), id)
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			if took < c.cfg.Grace {
				t.Fatalf("stopped in %v, before the grace of %v", took, c.cfg.Grace)
			}
			if rc.Signal != "SIGKILL" || rc.Outcome != sandboxapi.OutcomeInterrupted || !rc.CleanupConfirmed {
				t.Fatalf("receipt %+v", rc)
			}
		})
	}
}

// A stop that beats the launch: the stop file keeps it from ever starting.
func TestStopBeforeStart(t *testing.T) {
	s := startSupervisor(t, Config{})
	id := launchID(t, "a")
	rc, err := s.Stop(ctxT(t), id)
	if err != nil || rc.Started || rc.StopReason != sandboxapi.StopFile {
		t.Fatalf("Stop of an unknown launch: %+v, %v", rc, err)
	}
	if !fileExists(filepath.Join(s.StateDir(), id, StopFileName)) {
		t.Fatal("no stop file")
	}
	marker := filepath.Join(t.TempDir(), "ran")
	rec := mustLaunch(t, s, Spec{ID: id, Argv: []string{"touch", marker}})
	if rec.State != sandboxapi.StateEnded || rec.Receipt == nil || rec.Receipt.Started || rec.Receipt.Outcome != sandboxapi.OutcomeInterrupted {
		t.Fatalf("record %+v", rec)
	}
	if fileExists(marker) {
		t.Fatal("the launch ran")
	}
	// An id is used once.
	if _, err := s.Launch(ctxT(t), Spec{ID: id, Argv: []string{"true"}}); !errors.Is(err, ErrLaunchExists) {
		t.Fatalf("relaunch: %v", err)
	}
}

// Stopping one launch leaves the others alone.
func TestStopLeavesOtherLaunches(t *testing.T) {
	for _, c := range stopConfigs {
		t.Run(c.name, func(t *testing.T) {
			s := startSupervisor(t, c.cfg)
			a, b := launchID(t, "a"), launchID(t, "b")
			mustLaunch(t, s, Spec{ID: a, Command: `(setsid sleep 1000 &); sleep 1001 & wait`})
			mustLaunch(t, s, Spec{ID: b, Command: `(setsid sleep 1002 &); sleep 1003 & wait`})
			// b's two sleeps: the subshell that starts the setsid one exits
			// at once, so only the long-lived processes are checked.
			sleeps := func(id string) []int {
				var out []int
				for _, pid := range launchPIDs(t, s, id) {
					if commOf(pid) == "sleep" {
						out = append(out, pid)
					}
				}
				return out
			}
			var bProcs []int
			poll.Wait(t, 5*time.Second, "both launches' sleeps", func() bool {
				bProcs = sleeps(b)
				return len(sleeps(a)) == 2 && len(bProcs) == 2
			})
			if _, err := s.Stop(ctxT(t), a); err != nil {
				t.Fatal(err)
			}
			for _, pid := range bProcs {
				if st := stateOf(pid); st == 0 || st == 'Z' || st == 'T' {
					t.Errorf("launch b's pid %d (%s) is in state %q", pid, commOf(pid), st)
				}
			}
			if rec, _ := s.Status(b); rec.State != sandboxapi.StateRunning {
				t.Fatalf("launch b is %s", rec.State)
			}
		})
	}
}

// Cancel kills the launch and the daemon it detached at once, without the
// grace; a paused launch too.
func TestCancel(t *testing.T) {
	for _, c := range stopConfigs {
		t.Run(c.name, func(t *testing.T) {
			cfg := c.cfg
			cfg.Grace = time.Minute // Cancel must not wait for it
			s := startSupervisor(t, cfg)
			for _, paused := range []bool{false, true} {
				id := launchID(t, "running")
				if paused {
					id = launchID(t, "paused")
				}
				mustLaunch(t, s, Spec{ID: id, Command: `trap '' INT; (setsid sh -c 'exec sleep 1000' &); exec sleep 1001`})
				var procs []int
				poll.Wait(t, 5*time.Second, "the daemon", func() bool { procs = launchPIDs(t, s, id); return len(procs) >= 2 })
				if paused {
					if _, err := s.Pause(ctxT(t), id, sandboxapi.ModeDefault); err != nil {
						t.Fatal(err)
					}
				}
				before := procsOf(procs)
				start := time.Now()
				rc, err := s.Cancel(ctxT(t), id)
				if err != nil || rc.Signal != "SIGKILL" || rc.StopReason != sandboxapi.StopCancelled || !rc.CleanupConfirmed {
					t.Fatalf("Cancel: %+v, %v", rc, err)
				}
				if took := time.Since(start); took > 10*time.Second {
					t.Fatalf("Cancel took %v", took)
				}
				for _, p := range before {
					if st := p.state(); st != 0 && st != 'Z' {
						t.Errorf("pid %d still there (%c)", p.pid, st)
					}
				}
			}
		})
	}
}

// The harness's own exit code and output come back in the receipt and the
// output file.
func TestLaunchOutputAndExitCode(t *testing.T) {
	s := startSupervisor(t, Config{})
	id := launchID(t, "a")
	rec := mustLaunch(t, s, Spec{ID: id, Command: `echo out; echo err >&2; echo "tag=$` + EnvTag + `"; exit 3`, Dir: t.TempDir()})
	rc, err := s.Wait(ctxT(t), id)
	if err != nil {
		t.Fatal(err)
	}
	if rc.ExitCode != 3 || rc.Outcome != sandboxapi.OutcomeFinished || !rc.Started || !rc.CleanupConfirmed {
		t.Fatalf("receipt %+v", rc)
	}
	out := readFile(t, rec.Output)
	if out != "out\nerr\ntag="+id+"\n" {
		t.Fatalf("output %q", out)
	}
	// The record on disk says the same, with the supervisor's identity.
	disk, err := ReadRecord(s.StateDir(), id)
	if err != nil {
		t.Fatal(err)
	}
	if disk.Supervisor != s.Identity() || disk.Receipt == nil || disk.Receipt.ExitCode != 3 || disk.PID == 0 || disk.PIDStart == 0 {
		t.Fatalf("record %+v", disk)
	}
	// A command that cannot start is a failed launch.
	bad := launchID(t, "bad")
	rec, err = s.Launch(ctxT(t), Spec{ID: bad, Argv: []string{"/nonexistent/harness"}})
	if err == nil || rec.Receipt == nil || rec.Receipt.Outcome != sandboxapi.OutcomeFailed {
		t.Fatalf("bad launch: %+v, %v", rec, err)
	}
}

// A supervisor shutting down stops its launches and waits until they are
// gone.
func TestShutdownStopsLaunches(t *testing.T) {
	cfg := Config{StateDir: t.TempDir(), CgroupRoot: testCgroupRoot(t), Grace: 200 * time.Millisecond}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	id := launchID(t, "a")
	mustLaunch(t, s, Spec{ID: id, Command: `(setsid sleep 1000 &); sleep 1001`})
	poll.Wait(t, 5*time.Second, "the launch", func() bool { return len(launchPIDs(t, s, id)) >= 2 })
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	rc, err := s.Receipt(id)
	if err != nil || rc.Outcome != sandboxapi.OutcomeInterrupted || rc.StopReason != sandboxapi.StopShutdown || !rc.CleanupConfirmed {
		t.Fatalf("receipt %+v, %v", rc, err)
	}
	if _, err := s.Launch(context.Background(), Spec{ID: launchID(t, "b"), Argv: []string{"true"}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Launch after Run: %v", err)
	}
	checkNothingLeft(t)
	_ = os.Remove(cfg.StateDir)
}

// The one process nobody can claim: without cgroups, while two launches
// run, an orphan that cleared its environment, left the session and was
// never seen by a walk carries nothing that names its launch. Stopping its
// launch leaves it; the process's last supervisor kills it when it stops.
func TestUnclaimedOrphanKilledAtShutdown(t *testing.T) {
	requireTool(t, "setsid", "apt-get install util-linux")
	cfg := Config{StateDir: t.TempDir(), NoCgroup: true, Grace: 200 * time.Millisecond}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	a, b := launchID(t, "a"), launchID(t, "b")
	mustLaunch(t, s, Spec{ID: a, Command: `(env -i setsid /bin/sleep 1000 &); exec sleep 1001`})
	mustLaunch(t, s, Spec{ID: b, Command: `exec sleep 1002`})
	var orphan int
	poll.Wait(t, 5*time.Second, "the untagged orphan", func() bool {
		kids, _ := selfChildren(nil)
		for _, k := range kids {
			if commOf(k) == "sleep" {
				if b, _ := os.ReadFile(procfs.Path(k, "/environ")); len(b) == 0 {
					orphan = k
					return true
				}
			}
		}
		return false
	})
	if _, err := s.Stop(ctxT(t), a); err != nil {
		t.Fatal(err)
	}
	if st := stateOf(orphan); st == 0 || st == 'Z' {
		t.Fatalf("the unclaimed orphan %d was attributed after all (%c): update this test and the docs", orphan, st)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if st := stateOf(orphan); st != 0 && st != 'Z' {
		t.Fatalf("orphan %d still there (%c) after the last supervisor stopped", orphan, st)
	}
	checkNothingLeft(t)
}

// parentOf returns pid's parent, or 0 when pid is gone.
func parentOf(pid int) int {
	st, _, err := procfs.ReadStat(pid, nil)
	if err != nil {
		return 0
	}
	return st.PPID
}

// untaggedEnv reports whether pid's environment is empty (it cleared it
// at exec).
func untaggedEnv(pid int) bool {
	b, err := os.ReadFile(procfs.Path(pid, "/environ"))
	return err == nil && len(b) == 0
}
