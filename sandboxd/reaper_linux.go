package sandboxd

import (
	"context"
	"os"
	"os/signal"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/poll"
)

// exitOf returns the exit code, or the name of the killing signal (code
// -1), of a wait status.
func exitOf(ws unix.WaitStatus) exitInfo {
	if ws.Signaled() {
		return exitInfo{code: -1, signal: signalName(ws.Signal())}
	}
	return exitInfo{code: ws.ExitStatus()}
}

func signalName(s unix.Signal) string {
	if n := unix.SignalName(s); n != "" {
		return n
	}
	return s.String()
}

// reaper is the process's one reap loop. Waiting for any child (wait4(-1))
// and SIGCHLD are process-wide, so there is exactly one, shared by every
// Supervisor in the process and alive while at least one runs (the one
// piece of package state; containerd's pkg/sys/reaper does the same). The
// process is a child subreaper while it runs, so the orphans of every
// launch come back to it, and it reaps them.
//
// mu is held across each wait4 and across each start-and-subscribe, so an
// exit is either reaped before the subscription exists (impossible: the
// child did not exist) or delivered to it: no exit status is lost.
var reaper struct {
	life sync.Mutex // serialises acquire and release
	mu   sync.Mutex
	refs int
	subs map[int]chan exitInfo
	stop chan struct{}
	done chan struct{}
}

// acquireReaper makes the process a child subreaper and starts the reap
// loop if it is the first user.
func acquireReaper() error {
	reaper.life.Lock()
	defer reaper.life.Unlock()
	if reaper.refs > 0 {
		reaper.refs++
		return nil
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return os.NewSyscallError("prctl(PR_SET_CHILD_SUBREAPER)", err)
	}
	reaper.mu.Lock()
	if reaper.subs == nil {
		reaper.subs = map[int]chan exitInfo{}
	}
	reaper.mu.Unlock()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGCHLD)
	reaper.stop, reaper.done = make(chan struct{}), make(chan struct{})
	reaper.refs = 1
	go reapLoop(sigs, reaper.stop, reaper.done)
	return nil
}

// releaseReaper stops the reap loop (after a last reap) and waits for it
// if this was the last user. The last user first kills whatever is still a
// child of the process: every launch has ended and been cleaned up by then,
// so these are orphans that no launch could claim (see attribute).
func releaseReaper() {
	reaper.life.Lock()
	defer reaper.life.Unlock()
	if reaper.refs--; reaper.refs > 0 {
		return
	}
	killOrphans(5 * time.Second)
	close(reaper.stop)
	<-reaper.done
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
}

func reapLoop(sigs chan os.Signal, stop, done chan struct{}) {
	defer close(done)
	// SIGCHLD is the trigger; the ticker is a safety net for a signal
	// coalesced while a previous reap ran.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-sigs:
		case <-tick.C:
		case <-stop:
			signal.Stop(sigs)
			reapAll()
			return
		}
		reapAll()
	}
}

// reapAll reaps every child that has exited, delivering the exits that
// have a subscriber; orphans of launches are reaped and forgotten.
func reapAll() {
	for {
		var ws unix.WaitStatus
		reaper.mu.Lock()
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if pid > 0 {
			if ch := reaper.subs[pid]; ch != nil {
				ch <- exitOf(ws)
				delete(reaper.subs, pid)
			}
		}
		reaper.mu.Unlock()
		if err == unix.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}

// startSubscribed runs start (which forks the child and returns its pid)
// with the reap loop held off, and subscribes to the child's exit before
// the loop can reap it.
func startSubscribed(start func() (int, error)) (int, chan exitInfo, error) {
	reaper.mu.Lock()
	defer reaper.mu.Unlock()
	pid, err := start()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan exitInfo, 1)
	reaper.subs[pid] = ch
	return pid, ch, nil
}

// unsubscribe drops the subscription ch for pid if it is still there (a
// child given up on before it was reaped).
func unsubscribe(pid int, ch chan exitInfo) {
	reaper.mu.Lock()
	defer reaper.mu.Unlock()
	if reaper.subs[pid] == ch {
		delete(reaper.subs, pid)
	}
}

// exitedNow reports whether the child behind pidfd has exited (a zombie
// not reaped yet, or already reaped), without reaping it.
func exitedNow(pidfd int) bool {
	if pidfd < 0 {
		return false
	}
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PIDFD, pidfd, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	if err == unix.ECHILD {
		return true
	}
	return err == nil && info.Signo != 0
}

// killOrphans kills the process's remaining children and their trees, and
// waits (the reap loop still running) until none is left or the timeout
// passes.
func killOrphans(timeout time.Duration) {
	self := os.Getpid()
	roots := func(w *walker) []cand {
		kids, b := selfChildren(w.buf)
		w.buf = b
		out := make([]cand, 0, len(kids))
		for _, k := range kids {
			out = append(out, cand{pid: k, ppid: self})
		}
		return out
	}
	deadline := time.Now().Add(timeout)
	killTree(context.Background(), roots, deadline)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	_ = poll.Until(ctx, poll.Every(time.Millisecond), func() (bool, error) {
		kids, _ := selfChildren(nil)
		return len(kids) == 0, nil
	})
}
