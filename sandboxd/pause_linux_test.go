package sandboxd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/cgroup"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/procfs"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// frozenFor checks, for d, that no process in pids gains CPU time and that
// no file in files changes size: while a launch is paused none of its
// processes runs and none of its files changes (PROTOCOL §7, invariant 5).
func frozenFor(t *testing.T, d time.Duration, pids []int, files ...string) {
	t.Helper()
	// The kernel accounts a thread's last tick before its stop lazily:
	// take the baseline once that has settled.
	settle := time.NewTimer(50 * time.Millisecond)
	<-settle.C
	ticks := cpuTicks(pids)
	sizes := make([]int64, len(files))
	for i, f := range files {
		sizes[i] = fileSize(f)
	}
	poll.Holds(t, d, func() error {
		for pid, was := range cpuTicks(pids) {
			if now := ticks[pid]; was != now {
				return fmt.Errorf("pid %d (%s) ran while paused: cpu ticks %d -> %d", pid, commOf(pid), now, was)
			}
		}
		for i, f := range files {
			if n := fileSize(f); n != sizes[i] {
				return fmt.Errorf("%s changed while paused: %d -> %d bytes", f, sizes[i], n)
			}
		}
		return nil
	})
}

// stateLetters returns the states of every thread of every pid.
func stateLetters(pids []int) map[int]string {
	m := map[int]string{}
	for _, pid := range pids {
		tids, err := procfs.Tasks(pid)
		if err != nil {
			continue
		}
		var b strings.Builder
		for _, tid := range tids {
			if st, _, err := procfs.ReadTaskStat(pid, tid, nil); err == nil {
				b.WriteByte(st.State)
			}
		}
		m[pid] = b.String()
	}
	return m
}

// While paused, in freeze and in stop mode, no process of the launch runs
// and no file changes: a busy writer, a process in another session and a
// detached daemon (double fork, setsid) included. Continue resumes them.
func TestPauseStopsEverything(t *testing.T) {
	requireTool(t, "setsid", "apt-get install util-linux")
	for _, pm := range pauseModes {
		t.Run(pm.name, func(t *testing.T) {
			s := startSupervisor(t, pm.cfg)
			dir := t.TempDir()
			a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
			id := launchID(t, "a")
			mustLaunch(t, s, Spec{ID: id, Command: `
				( while :; do echo x >> ` + a + `; done ) &
				( setsid sh -c 'while :; do echo d >> ` + b + `; sleep 0.01; done' & )
				setsid sh -c 'while :; do :; done' &
				wait`})
			var pids []int
			poll.Wait(t, 5*time.Second, "every process of the launch", func() bool {
				pids = launchPIDs(t, s, id)
				return len(pids) >= 4 && fileSize(a) > 0 && fileSize(b) > 0
			})
			rep, err := s.Pause(ctxT(t), id, sandboxapi.ModeDefault)
			if err != nil {
				t.Fatalf("Pause: %v (%+v)", err, rep)
			}
			if rep.State != sandboxapi.StatePaused || rep.Mode != pm.mode || rep.PauseSeq != 1 || rep.Fallback != "" ||
				rep.Identity != s.Identity() || rep.Uptime <= 0 || rep.Wall.IsZero() || rep.PIDCount < 4 {
				t.Fatalf("report %+v", rep)
			}
			pids = launchPIDs(t, s, id)
			if pm.mode == sandboxapi.ModeStop {
				// Every thread stopped, but for a vfork parent (dash runs
				// sleep with vfork), whose D the report lists.
				for pid, st := range stateLetters(pids) {
					if strings.Trim(st, "T") != "" && !(strings.Trim(st, "TD") == "" && slices.Contains(rep.Pending, strconv.Itoa(pid)+":D")) {
						t.Errorf("pid %d (%s) threads in %q, want all T (pending %v)", pid, commOf(pid), st, rep.Pending)
					}
				}
			}
			frozenFor(t, 300*time.Millisecond, pids, a, b)
			// Pausing again repeats the report.
			again, err := s.Pause(ctxT(t), id, sandboxapi.ModeDefault)
			if err != nil || again.PauseSeq != rep.PauseSeq || again.PIDCount != rep.PIDCount {
				t.Fatalf("second Pause: %+v, %v", again, err)
			}
			if rec, _ := s.Status(id); rec.State != sandboxapi.StatePaused || rec.Pauses.Count != 1 || rec.Deadline != (time.Time{}) {
				t.Fatalf("record %+v", rec)
			}
			crep, err := s.Continue(ctxT(t), id)
			if err != nil || crep.State != sandboxapi.StateRunning || crep.PauseSeq != 1 || crep.Op != "continue" {
				t.Fatalf("Continue: %+v, %v", crep, err)
			}
			sa, sb, ticks := fileSize(a), fileSize(b), cpuTicks(pids)
			poll.Wait(t, 5*time.Second, "the launch to run again", func() bool {
				ran := 0
				for pid, n := range cpuTicks(pids) {
					if n > ticks[pid] {
						ran++
					}
				}
				return fileSize(a) > sa && fileSize(b) > sb && ran >= 2
			})
			rec, _ := s.Status(id)
			if rec.Pauses.Count != 1 || rec.Pauses.Total < 300*time.Millisecond || rec.State != sandboxapi.StateRunning {
				t.Fatalf("record %+v", rec)
			}
		})
	}
}

// Two pauses of the same launch: it finishes with every step done once, in
// order, by the same process (no relaunch).
func TestTwoPausesSameLaunch(t *testing.T) {
	for _, pm := range pauseModes {
		t.Run(pm.name, func(t *testing.T) {
			s := startSupervisor(t, pm.cfg)
			steps := filepath.Join(t.TempDir(), "steps")
			id := launchID(t, "a")
			rec := mustLaunch(t, s, Spec{ID: id, Command: `for i in 1 2 3 4 5 6; do echo step $i >> ` + steps + `; sleep 0.05; done; echo done >> ` + steps})
			for n, after := range []string{"step 2", "step 4"} {
				poll.Wait(t, 10*time.Second, after, func() bool { return strings.Contains(readFile(t, steps), after) })
				rep, err := s.Pause(ctxT(t), id, sandboxapi.ModeDefault)
				if err != nil || rep.PauseSeq != n+1 {
					t.Fatalf("Pause %d: %+v, %v", n+1, rep, err)
				}
				frozenFor(t, 100*time.Millisecond, launchPIDs(t, s, id), steps)
				if _, err := s.Continue(ctxT(t), id); err != nil {
					t.Fatal(err)
				}
			}
			rc, err := s.Wait(ctxT(t), id)
			if err != nil || rc.ExitCode != 0 || rc.Outcome != sandboxapi.OutcomeFinished {
				t.Fatalf("receipt %+v, %v", rc, err)
			}
			want := "step 1\nstep 2\nstep 3\nstep 4\nstep 5\nstep 6\ndone\n"
			if got := readFile(t, steps); got != want {
				t.Fatalf("steps %q, want %q", got, want)
			}
			end, _ := s.Status(id)
			if end.PID != rec.PID || end.Pauses.Count != 2 || end.Pauses.Seq != 2 || end.Pauses.Total < 200*time.Millisecond {
				t.Fatalf("record %+v (launched as pid %d)", end, rec.PID)
			}
		})
	}
}

// A pause before the launch starts holds it (the pause file) until
// continue.
func TestPauseBeforeStartHolds(t *testing.T) {
	s := startSupervisor(t, Config{HoldPoll: 20 * time.Millisecond})
	id := launchID(t, "a")
	rep, err := s.Pause(ctxT(t), id, sandboxapi.ModeDefault)
	if err != nil || rep.State != sandboxapi.StateHeld {
		t.Fatalf("Pause of an unknown launch: %+v, %v", rep, err)
	}
	marker := filepath.Join(t.TempDir(), "ran")
	rec := mustLaunch(t, s, Spec{ID: id, Argv: []string{"touch", marker}})
	if rec.State != sandboxapi.StateHeld || rec.Pauses.Count != 1 {
		t.Fatalf("record %+v", rec)
	}
	poll.Holds(t, 200*time.Millisecond, func() error {
		if fileExists(marker) {
			return errors.New("a held launch ran")
		}
		return nil
	})
	crep, err := s.Continue(ctxT(t), id)
	if err != nil || crep.State != sandboxapi.StateRunning {
		t.Fatalf("Continue: %+v, %v", crep, err)
	}
	rc, err := s.Wait(ctxT(t), id)
	if err != nil || rc.ExitCode != 0 || !fileExists(marker) {
		t.Fatalf("receipt %+v, %v", rc, err)
	}

	// The pause file also works from outside: removing it starts the
	// launch, and a stop file keeps a held launch from ever starting.
	id2, id3 := launchID(t, "b"), launchID(t, "c")
	for _, id := range []string{id2, id3} {
		if err := touch(LaunchDir(s.StateDir(), id), PauseFileName); err != nil {
			t.Fatal(err)
		}
		if rec := mustLaunch(t, s, Spec{ID: id, Argv: []string{"true"}}); rec.State != sandboxapi.StateHeld {
			t.Fatalf("record %+v", rec)
		}
	}
	if err := os.Remove(filepath.Join(LaunchDir(s.StateDir(), id2), PauseFileName)); err != nil {
		t.Fatal(err)
	}
	if err := touch(LaunchDir(s.StateDir(), id3), StopFileName); err != nil {
		t.Fatal(err)
	}
	if rc, err := s.Wait(ctxT(t), id2); err != nil || !rc.Started || rc.ExitCode != 0 {
		t.Fatalf("%s: %+v, %v", id2, rc, err)
	}
	if rc, err := s.Wait(ctxT(t), id3); err != nil || rc.Started || rc.StopReason != sandboxapi.StopFile {
		t.Fatalf("%s: %+v, %v", id3, rc, err)
	}
}

// A launch that ended just before the pause keeps its result and is not
// paused.
func TestEndedBeforePauseKeepsResult(t *testing.T) {
	for _, pm := range pauseModes {
		t.Run(pm.name, func(t *testing.T) {
			s := startSupervisor(t, pm.cfg)
			// Ended and reaped.
			id := launchID(t, "a")
			mustLaunch(t, s, Spec{ID: id, Command: `exit 3`})
			if _, err := s.Wait(ctxT(t), id); err != nil {
				t.Fatal(err)
			}
			rep, err := s.Pause(ctxT(t), id, sandboxapi.ModeDefault)
			if err != nil || rep.State != sandboxapi.StateEnded {
				t.Fatalf("Pause: %+v, %v", rep, err)
			}
			// Exited but perhaps not reaped yet: the pause races the exit.
			marker := filepath.Join(t.TempDir(), "m")
			id2 := launchID(t, "b")
			mustLaunch(t, s, Spec{ID: id2, Command: `touch ` + marker + `; exit 5`})
			poll.Wait(t, 5*time.Second, "the marker", func() bool { return fileExists(marker) })
			rep, err = s.Pause(ctxT(t), id2, sandboxapi.ModeDefault)
			if err != nil {
				t.Fatalf("Pause: %+v, %v", rep, err)
			}
			if rep.State == sandboxapi.StatePaused { // the pause won: it had not exited
				if _, err := s.Continue(ctxT(t), id2); err != nil {
					t.Fatal(err)
				}
			}
			for _, c := range []struct {
				id   string
				code int
			}{{id, 3}, {id2, 5}} {
				rc, err := s.Wait(ctxT(t), c.id)
				if err != nil || rc.ExitCode != c.code || rc.Outcome != sandboxapi.OutcomeFinished {
					t.Fatalf("%s: %+v, %v", c.id, rc, err)
				}
			}
			if rc, _ := s.Receipt(id); rc.Pauses.Count != 0 {
				t.Fatalf("an ended launch was paused: %+v", rc)
			}
		})
	}
}

// A pause that cannot be confirmed in time is undone and falls back: the
// launch runs on, no process is left stopped or frozen, and the report says
// why. The confirm timeout is 1 ns, so nothing can confirm but a tree that
// is stopped before the first look.
func TestUnconfirmedPauseFallsBack(t *testing.T) {
	for _, pm := range pauseModes {
		t.Run(pm.name, func(t *testing.T) {
			cfg := pm.cfg
			cfg.ConfirmTimeout, cfg.PendingTimeout = time.Nanosecond, time.Nanosecond
			s := startSupervisor(t, cfg)
			id := launchID(t, "a")
			mustLaunch(t, s, Spec{ID: id, Command: `for i in 1 2 3 4; do sh -c 'while :; do :; done' & done; wait`})
			var pids []int
			poll.Wait(t, 5*time.Second, "the busy loops", func() bool { pids = launchPIDs(t, s, id); return len(pids) >= 5 })
			fallbacks := 0
			for try := 0; try < 20 && fallbacks == 0; try++ {
				rep, err := s.Pause(ctxT(t), id, sandboxapi.ModeDefault)
				if err == nil {
					if _, err := s.Continue(ctxT(t), id); err != nil {
						t.Fatal(err)
					}
					continue
				}
				if !errors.Is(err, ErrUnconfirmed) || rep.Fallback == "" || rep.State != sandboxapi.StateRunning {
					t.Fatalf("Pause: %+v, %v", rep, err)
				}
				fallbacks++
				if rec, _ := s.Status(id); rec.State != sandboxapi.StateRunning || rec.Pauses.Fallbacks == 0 {
					t.Fatalf("record %+v", rec)
				}
				if pm.mode == sandboxapi.ModeFreeze {
					rec, _ := s.Status(id)
					b, _ := os.ReadFile(filepath.Join(rec.Cgroup, "cgroup.freeze"))
					ev, _ := cgroup.Dir(rec.Cgroup).Events()
					if frozen := ev.Frozen; strings.TrimSpace(string(b)) != "0" || frozen {
						t.Fatalf("cgroup left frozen: cgroup.freeze %q, frozen %v", b, frozen)
					}
				}
				for pid, st := range stateLetters(pids) {
					if strings.ContainsAny(st, "Tt") {
						t.Errorf("pid %d left stopped (%s)", pid, st)
					}
				}
				ticks := cpuTicks(pids)
				poll.Wait(t, 5*time.Second, "the loops to run on", func() bool {
					ran := 0
					for pid, n := range cpuTicks(pids) {
						if n > ticks[pid] {
							ran++
						}
					}
					return ran >= 2
				})
			}
			if fallbacks == 0 {
				t.Fatal("no pause fell back in 20 tries with a 1 ns confirm timeout")
			}
		})
	}
}

// In stop mode, a process that is runnable with SIGSTOP pending only
// waits for a core: a pause past the confirm timeout waits for it up to the
// pending timeout, as for one in D, instead of falling back (a large
// tree's pause on a busy machine would). The confirm timeout is 1 ns,
// so every pause of eight busy loops on two cores finds some still
// runnable at its first look; each must be confirmed, with every thread
// stopped.
func TestStarvedStopIsWaitedFor(t *testing.T) {
	cfg := Config{Mode: sandboxapi.ModeStop, NoCgroup: true, ConfirmTimeout: time.Nanosecond, PendingTimeout: 30 * time.Second}
	s := startSupervisor(t, cfg)
	id := launchID(t, "a")
	mustLaunch(t, s, Spec{ID: id, Command: `for i in 1 2 3 4 5 6 7 8; do sh -c 'while :; do :; done' & done; wait`})
	var pids []int
	poll.Wait(t, 5*time.Second, "the busy loops", func() bool { pids = launchPIDs(t, s, id); return len(pids) >= 9 })
	for try := range 20 {
		rep, err := s.Pause(ctxT(t), id, sandboxapi.ModeStop)
		if err != nil {
			t.Fatalf("pause %d: %v (%+v)", try, err, rep)
		}
		for pid, st := range stateLetters(pids) {
			if strings.Trim(st, "T") != "" {
				t.Fatalf("pause %d confirmed with pid %d in %q", try, pid, st)
			}
		}
		if _, err := s.Continue(ctxT(t), id); err != nil {
			t.Fatal(err)
		}
	}
}

// 50 pauses of a tree with 4 busy dash loops, which vfork /bin/true
// without end, so vfork parents in D are caught all the time: none may
// fail, in freeze and in stop mode (the reference's walk failed 19 of 35).
func TestForkStorm50Pauses(t *testing.T) {
	tier.Long(t)
	for _, pm := range pauseModes {
		t.Run(pm.name, func(t *testing.T) {
			s := startSupervisor(t, pm.cfg)
			id := launchID(t, "a")
			mustLaunch(t, s, Spec{ID: id, Command: `for i in 1 2 3 4; do sh -c 'while :; do /bin/true; done' & done; wait`})
			poll.Wait(t, 5*time.Second, "the loops", func() bool { return len(launchPIDs(t, s, id)) >= 5 })
			failed, inD := 0, 0
			var worst float64
			for i := 0; i < 50; i++ {
				rep, err := s.Pause(ctxT(t), id, sandboxapi.ModeDefault)
				if err != nil {
					failed++
					t.Logf("pause %d: %v", i, err)
					continue
				}
				inD += len(rep.Pending)
				worst = max(worst, rep.TookMS)
				if i%10 == 0 {
					frozenFor(t, 30*time.Millisecond, launchPIDs(t, s, id))
				}
				if _, err := s.Continue(ctxT(t), id); err != nil {
					t.Fatal(err)
				}
			}
			t.Logf("%s: 50 pauses, %d failed, %d processes counted paused in D, slowest %.1f ms", pm.name, failed, inD, worst)
			if failed != 0 {
				t.Fatalf("%d of 50 pauses failed", failed)
			}
		})
	}
}

// A job-control shell (set -m) whose command is paused and continued sees
// nothing: it goes on and prints rc=0. In stop mode this takes stopping the
// shell before its command and continuing the command first.
func TestJobControlShell(t *testing.T) {
	tier.Long(t)
	requireTool(t, "bash", "apt-get install bash")
	for _, pm := range pauseModes {
		t.Run(pm.name, func(t *testing.T) {
			s := startSupervisor(t, pm.cfg)
			id := launchID(t, "a")
			rec := mustLaunch(t, s, Spec{ID: id, Argv: []string{"bash", "-c", "set -m; sleep 1; echo rc=$?"}})
			sleepPID := findComm(t, s, id, "sleep")
			rep, err := s.Pause(ctxT(t), id, sandboxapi.ModeDefault)
			if err != nil {
				t.Fatalf("Pause: %v", err)
			}
			if pm.mode == sandboxapi.ModeStop && (stateOf(sleepPID) != 'T' || stateOf(rec.PID) != 'T') {
				t.Fatalf("not stopped: bash %c, sleep %c", stateOf(rec.PID), stateOf(sleepPID))
			}
			frozenFor(t, 100*time.Millisecond, []int{rec.PID, sleepPID})
			if _, err := s.Continue(ctxT(t), id); err != nil {
				t.Fatal(err)
			}
			rc, err := s.Wait(ctxT(t), id)
			if err != nil || rc.ExitCode != 0 {
				t.Fatalf("receipt %+v, %v", rc, err)
			}
			if out := readFile(t, rec.Output); !strings.Contains(out, "rc=0") || strings.Contains(out, "Stopped") {
				t.Fatalf("bash saw the pause (report %+v): %q", rep, out)
			}
		})
	}
}

// A multi-threaded process, one thread blocked in a read on a FIFO and one
// writing every 2 ms: the pause is confirmed only when every thread is
// stopped, and while paused neither the blocked thread (whose read has data
// waiting) nor the writer runs.
func TestMultiThreaded(t *testing.T) {
	for _, pm := range pauseModes {
		t.Run(pm.name, func(t *testing.T) {
			s := startSupervisor(t, pm.cfg)
			dir := t.TempDir()
			fifo, out := filepath.Join(dir, "fifo"), filepath.Join(dir, "out")
			if err := syscall.Mkfifo(fifo, 0o644); err != nil {
				t.Fatal(err)
			}
			id := launchID(t, "a")
			rec := mustLaunch(t, s, Spec{ID: id, Argv: []string{threadsBin, fifo, out}})
			poll.Wait(t, 5*time.Second, "the helper's threads", func() bool {
				st, _, err := procfs.ReadStat(rec.PID, nil)
				return err == nil && st.Threads >= 3 && strings.HasPrefix(readFile(t, out), "ready") && fileSize(out+".busy") > 0
			})
			rep, err := s.Pause(ctxT(t), id, sandboxapi.ModeDefault)
			if err != nil {
				t.Fatalf("Pause: %+v, %v", rep, err)
			}
			states := stateLetters([]int{rec.PID})[rec.PID]
			if len(states) < 3 || pm.mode == sandboxapi.ModeStop && strings.Trim(states, "T") != "" {
				t.Fatalf("threads in %q after the pause", states)
			}
			w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.WriteString("x"); err != nil {
				t.Fatal(err)
			}
			w.Close()
			frozenFor(t, 300*time.Millisecond, []int{rec.PID}, out, out+".busy")
			if _, err := s.Continue(ctxT(t), id); err != nil {
				t.Fatal(err)
			}
			poll.Wait(t, 5*time.Second, "the blocked thread's read", func() bool { return strings.Contains(readFile(t, out), "read x") })
		})
	}
}

// A vfork parent in state D (wchan kernel_clone) while its child, before
// exec, blocks opening a FIFO (glibc posix_spawn does the open in the
// child): stop mode counts it paused through the D rules (and reports it as
// <pid>:D), freeze mode freezes it. Both in a single-threaded process and
// in a thread of a multi-threaded one (the leader stopped, the thread in D).
func TestVforkParentInD(t *testing.T) {
	py := requireTool(t, "python3", "apt-get install python3")
	spawn := `import os, sys, threading, time
def spawn():
    os.posix_spawn("/bin/true", ["true"], os.environ, file_actions=[(os.POSIX_SPAWN_OPEN, 0, sys.argv[1], os.O_RDONLY, 0)])
    print("spawned", flush=True)
if sys.argv[2] == "thread":
    th = threading.Thread(target=spawn)
    th.start()
    th.join()
else:
    spawn()
`
	for _, pm := range pauseModes {
		for _, shape := range []string{"process", "thread"} {
			t.Run(pm.name+"/"+shape, func(t *testing.T) {
				s := startSupervisor(t, pm.cfg)
				fifo := filepath.Join(t.TempDir(), "fifo")
				if err := syscall.Mkfifo(fifo, 0o644); err != nil {
					t.Fatal(err)
				}
				id := launchID(t, "a")
				rec := mustLaunch(t, s, Spec{ID: id, Argv: []string{py, "-c", spawn, fifo, shape}})
				var parent int
				poll.Wait(t, 10*time.Second, "a vfork parent in D", func() bool {
					for _, pid := range launchPIDs(t, s, id) {
						tids, _ := procfs.Tasks(pid)
						for _, tid := range tids {
							st, _, err := procfs.ReadTaskStat(pid, tid, nil)
							if v, _ := procfs.VforkWait(pid, tid, nil); err == nil && st.State == 'D' && v {
								parent = pid
								return true
							}
						}
					}
					return false
				})
				rep, err := s.Pause(ctxT(t), id, sandboxapi.ModeDefault)
				if err != nil {
					t.Fatalf("Pause: %+v, %v", rep, err)
				}
				if pm.mode == sandboxapi.ModeStop && !slices.Contains(rep.Pending, strconv.Itoa(parent)+":D") {
					t.Fatalf("pending %v, want %d:D", rep.Pending, parent)
				}
				if _, err := s.Continue(ctxT(t), id); err != nil {
					t.Fatal(err)
				}
				// Let the child's open finish: it execs, the parent returns.
				poll.Wait(t, 5*time.Second, "the FIFO writer", func() bool {
					w, err := os.OpenFile(fifo, os.O_WRONLY|syscall.O_NONBLOCK, 0)
					if err != nil {
						return false
					}
					w.Close()
					return true
				})
				rc, err := s.Wait(ctxT(t), id)
				if err != nil || rc.ExitCode != 0 || !strings.Contains(readFile(t, rec.Output), "spawned") {
					t.Fatalf("receipt %+v, %v, output %q", rc, err, readFile(t, rec.Output))
				}
			})
		}
	}
}

// Hold mode acknowledges at once and signals nothing: the launch keeps
// running, and the held time still does not count against its deadline.
func TestHoldMode(t *testing.T) {
	s := startSupervisor(t, Config{})
	file := filepath.Join(t.TempDir(), "f")
	id := launchID(t, "a")
	mustLaunch(t, s, Spec{ID: id, Command: `while :; do echo x >> ` + file + `; sleep 0.01; done`, Timeout: time.Hour})
	poll.Wait(t, 5*time.Second, "the writer", func() bool { return fileSize(file) > 0 })
	rep, err := s.Pause(ctxT(t), id, sandboxapi.ModeHold)
	if err != nil || rep.Mode != sandboxapi.ModeHold || rep.State != sandboxapi.StatePaused || rep.TookMS > 100 {
		t.Fatalf("Pause: %+v, %v", rep, err)
	}
	n := fileSize(file)
	poll.Wait(t, 5*time.Second, "the held launch to go on writing", func() bool { return fileSize(file) > n })
	rec, _ := s.Status(id)
	if rec.State != sandboxapi.StatePaused || !rec.Deadline.IsZero() {
		t.Fatalf("record %+v", rec)
	}
	if _, err := s.Continue(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	rec, _ = s.Status(id)
	want := rec.Started.Add(time.Hour + rec.Pauses.Total)
	if rec.Pauses.Total <= 0 || !rec.Deadline.Equal(want) {
		t.Fatalf("deadline %v, want %v (paused %v)", rec.Deadline, want, rec.Pauses.Total)
	}
	if _, err := s.Pause(ctxT(t), id, sandboxapi.ModeFreeze); !errors.Is(err, ErrModeUnavailable) && err != nil {
		t.Fatalf("freeze: %v", err)
	}
}

// A hold with Spec.Freeze (restore_sandbox_clock) also freezes the launch:
// nothing of it runs and its files stay as they are until the continue,
// and the results and the record say the pause froze. Without a cgroup of
// its own the launch stays a plain hold, and says so.
func TestHoldFreezes(t *testing.T) {
	s := startSupervisor(t, Config{Mode: sandboxapi.ModeFreeze})
	file := filepath.Join(t.TempDir(), "f")
	id := launchID(t, "a")
	mustLaunch(t, s, Spec{ID: id, Command: `while :; do echo x >> ` + file + `; sleep 0.01; done`, Timeout: time.Hour,
		Mode: sandboxapi.ModeHold, Freeze: true, FreezeWait: time.Second})
	poll.Wait(t, 5*time.Second, "the writer", func() bool { return fileSize(file) > 0 })
	rep, err := s.Pause(ctxT(t), id, sandboxapi.ModeDefault)
	if err != nil || rep.Mode != sandboxapi.ModeHold || rep.State != sandboxapi.StatePaused || !rep.Frozen || rep.PIDCount < 1 {
		t.Fatalf("Pause: %+v, %v", rep, err)
	}
	frozenFor(t, 300*time.Millisecond, launchPIDs(t, s, id), file)
	if rec, _ := s.Status(id); !rec.Pauses.Frozen || rec.Pauses.Mode != sandboxapi.ModeHold || !rec.Deadline.IsZero() {
		t.Fatalf("record %+v", rec)
	}
	crep, err := s.Continue(ctxT(t), id)
	if err != nil || !crep.Frozen || crep.State != sandboxapi.StateRunning {
		t.Fatalf("Continue: %+v, %v", crep, err)
	}
	n := fileSize(file)
	poll.Wait(t, 5*time.Second, "the launch to write again", func() bool { return fileSize(file) > n })
	if _, err := s.Cancel(ctxT(t), id); err != nil {
		t.Fatal(err)
	}

	plain := startSupervisor(t, Config{Mode: sandboxapi.ModeStop, NoCgroup: true})
	id2 := launchID(t, "b")
	mustLaunch(t, plain, Spec{ID: id2, Command: `while :; do sleep 0.01; done`, Mode: sandboxapi.ModeHold, Freeze: true})
	rep, err = plain.Pause(ctxT(t), id2, sandboxapi.ModeDefault)
	if err != nil || rep.Mode != sandboxapi.ModeHold || rep.State != sandboxapi.StatePaused || rep.Frozen {
		t.Fatalf("Pause without a cgroup: %+v, %v", rep, err)
	}
	if _, err := plain.Cancel(ctxT(t), id2); err != nil {
		t.Fatal(err)
	}
}

// A hold whose freeze does not take hold in time (a 1 ns freeze wait, busy
// loops) is undone and stays a plain hold: confirmed, paused, not frozen,
// the cgroup thawed, the loops running on.
func TestHoldThatDoesNotFreezeStaysAPlainHold(t *testing.T) {
	s := startSupervisor(t, Config{Mode: sandboxapi.ModeFreeze})
	id := launchID(t, "a")
	mustLaunch(t, s, Spec{ID: id, Command: `for i in 1 2 3 4; do sh -c 'while :; do :; done' & done; wait`,
		Mode: sandboxapi.ModeHold, Freeze: true, FreezeWait: time.Nanosecond})
	var pids []int
	poll.Wait(t, 5*time.Second, "the busy loops", func() bool { pids = launchPIDs(t, s, id); return len(pids) >= 5 })
	plain := false
	for try := 0; try < 20 && !plain; try++ {
		rep, err := s.Pause(ctxT(t), id, sandboxapi.ModeDefault)
		if err != nil || rep.State != sandboxapi.StatePaused || rep.Mode != sandboxapi.ModeHold {
			t.Fatalf("Pause: %+v, %v", rep, err)
		}
		plain = !rep.Frozen
		if plain {
			rec, _ := s.Status(id)
			ev, _ := cgroup.Dir(rec.Cgroup).Events()
			b, _ := os.ReadFile(filepath.Join(rec.Cgroup, "cgroup.freeze"))
			if rec.Pauses.Frozen || ev.Frozen || strings.TrimSpace(string(b)) != "0" {
				t.Fatalf("a plain hold left frozen: record %+v, cgroup.freeze %q, frozen %v", rec.Pauses, b, ev.Frozen)
			}
			ticks := cpuTicks(pids)
			poll.Wait(t, 5*time.Second, "the loops to run on through the plain hold", func() bool {
				ran := 0
				for pid, n := range cpuTicks(pids) {
					if n > ticks[pid] {
						ran++
					}
				}
				return ran >= 2
			})
		}
		if _, err := s.Continue(ctxT(t), id); err != nil {
			t.Fatal(err)
		}
	}
	if !plain {
		t.Fatal("no hold stayed plain in 20 tries with a 1 ns freeze wait")
	}
	if _, err := s.Cancel(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
}

// Paused time does not count against the deadline: a 600 ms launch paused
// for 800 ms is still running 1.2 s after its start, and is stopped as
// timed out only after deadline + paused time.
func TestDeadlineExcludesPausedTime(t *testing.T) {
	tier.Long(t)
	for _, pm := range pauseModes {
		t.Run(pm.name, func(t *testing.T) {
			cfg := pm.cfg
			cfg.Grace = 200 * time.Millisecond
			s := startSupervisor(t, cfg)
			id := launchID(t, "a")
			rec := mustLaunch(t, s, Spec{ID: id, Command: `sleep 1000`, Timeout: 600 * time.Millisecond})
			poll.Wait(t, 5*time.Second, "200 ms of run", func() bool { return time.Since(rec.Started) > 200*time.Millisecond })
			if _, err := s.Pause(ctxT(t), id, sandboxapi.ModeDefault); err != nil {
				t.Fatal(err)
			}
			poll.Holds(t, 800*time.Millisecond, func() error {
				if r, _ := s.Status(id); r.State != sandboxapi.StatePaused {
					return fmt.Errorf("paused launch is %s", r.State)
				}
				return nil
			})
			if _, err := s.Continue(ctxT(t), id); err != nil {
				t.Fatal(err)
			}
			if r, _ := s.Status(id); r.State != sandboxapi.StateRunning {
				t.Fatalf("stopped %v after its start, though paused 800 ms of it: %+v", time.Since(rec.Started), r)
			}
			rc, err := s.Wait(ctxT(t), id)
			if err != nil || !rc.TimedOut || rc.Outcome != sandboxapi.OutcomeInterrupted || rc.StopReason != sandboxapi.StopDeadline {
				t.Fatalf("receipt %+v, %v", rc, err)
			}
			if ran := rc.Ended.Sub(rec.Started); ran < 600*time.Millisecond+rc.Pauses.Total {
				t.Fatalf("stopped after %v: deadline 600 ms + paused %v", ran, rc.Pauses.Total)
			}
		})
	}
}
