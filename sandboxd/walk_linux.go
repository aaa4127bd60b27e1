package sandboxd

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/procfs"
)

// walker holds one goroutine's scratch buffer for /proc reads.
type walker struct{ buf []byte }

func newWalker() *walker { return &walker{buf: make([]byte, 4096)} }

// parallelMin is the width from which a level's /proc work is split
// across goroutines: a wide level (a flat tree of thousands) is I/O on
// every core, a narrow one (a deep chain) is faster inline.
const parallelMin = 64

// forEach runs fn for i in [0, n): inline for small n, else in up to
// GOMAXPROCS chunks, each on a goroutine with its own walker. It returns
// once every chunk is done.
func forEach(n int, w0 *walker, fn func(i int, w *walker)) {
	workers := min(runtime.GOMAXPROCS(0), 8, n/(parallelMin/2))
	if n < parallelMin || workers < 2 {
		for i := range n {
			fn(i, w0)
		}
		return
	}
	chunk := (n + workers - 1) / workers
	var wg sync.WaitGroup
	for k := 1; k < workers; k++ {
		lo, hi := k*chunk, min(n, (k+1)*chunk)
		if lo >= hi {
			break
		}
		wg.Go(func() {
			w := newWalker()
			for i := lo; i < hi; i++ {
				fn(i, w)
			}
		})
	}
	for i := range min(chunk, n) {
		fn(i, w0)
	}
	wg.Wait()
}

// backoff waits a little between two confirm rounds: yield the CPU for
// the first rounds (the stopped task needs it to reach its stop), then
// sleep, doubling from 20 µs to 1 ms.
func backoff(round *int) {
	*round++
	if *round <= 4 {
		_, _, _ = unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		return
	}
	d := 20 * time.Microsecond << min(*round-5, 6)
	time.Sleep(min(d, time.Millisecond))
}

// cand is a process to visit: its pid, the parent it was listed under
// (checked once a pidfd pins it), and its depth in the tree.
type cand struct{ pid, ppid, depth int }

// stopSet is what a stop-mode pause stopped: the processes with their
// pidfds held until continue, in discovery order.
type stopSet struct {
	procs map[int]*proc
	order []*proc
	// dead holds pids found dead (zombies whose stopped parent cannot
	// reap them) or unopenable, so that a later pass does not take them
	// for new.
	dead map[int]bool
}

func newStopSet() *stopSet { return &stopSet{procs: map[int]*proc{}, dead: map[int]bool{}} }

// walkResult is how a stop-mode (or scan) pause ended.
type walkResult struct {
	ok       bool
	holdouts []string // "<pid>:<state>", "PENDING <pid>:D" for D
	pendingD []string // "<pid>:D" holdouts
	reason   string
}

// stopLevel opens, checks and stops the processes of one level that the
// set does not hold yet (a process already stopped by someone else is
// noted, not signalled, and continue leaves it stopped). It returns every
// process of the level and the new ones.
func (s *stopSet) stopLevel(level []cand, seen map[int]bool, sig unix.Signal, w *walker) (all, fresh []*proc) {
	var todo []cand
	for _, c := range level {
		if seen[c.pid] {
			continue
		}
		seen[c.pid] = true
		if p := s.procs[c.pid]; p != nil {
			all = append(all, p)
			continue
		}
		todo = append(todo, c)
	}
	got := make([]*proc, len(todo))
	dead := make([]bool, len(todo))
	forEach(len(todo), w, func(i int, w *walker) {
		c := todo[i]
		p, st, b, err := openProc(c.pid, c.ppid, 0, true, w.buf)
		w.buf = b
		if err != nil {
			dead[i] = true
			return
		}
		p.depth, p.threads, p.state = c.depth, st.Threads, st.State
		switch {
		case (st.State == 'Z' || st.State == 'X') && st.Threads <= 1:
			p.close() // dead already; its children are the subreaper's now
			dead[i] = true
			return
		case st.State == 'T' || st.State == 't':
			p.wasStopped = true
		default:
			if err := p.signal(sig); err != nil {
				p.close()
				return
			}
		}
		got[i] = p
	})
	for i, p := range got {
		if dead[i] {
			s.dead[todo[i].pid] = true
		}
		if p != nil {
			s.procs[p.pid] = p
			s.order = append(s.order, p)
			all = append(all, p)
			fresh = append(fresh, p)
		}
	}
	return all, fresh
}

// classifyLive reads the state of every thread of p (one stat read for a
// single-threaded process) and classifies the process; the status and
// wchan of a thread are read only when it is in D.
func classifyLive(p *proc, w *walker) procClass {
	st, b, err := p.readStat(w.buf)
	w.buf = b
	if err != nil || st.Start != p.start {
		return procGone
	}
	p.threads, p.state = st.Threads, st.State
	if st.Threads <= 1 {
		return classifyProcess([]threadClass{classifyState(p.pid, p.pid, st.State, false, w)})
	}
	tids, err := procfs.Tasks(p.pid)
	if err != nil {
		return procGone
	}
	leaderStopped := st.State == 'T' || st.State == 't'
	classes := make([]threadClass, 0, len(tids))
	for _, tid := range tids {
		ts, b, err := procfs.ReadTaskStat(p.pid, tid, w.buf)
		w.buf = b
		if err != nil {
			classes = append(classes, threadGone)
			continue
		}
		classes = append(classes, classifyState(p.pid, tid, ts.State, leaderStopped, w))
	}
	return classifyProcess(classes)
}

func classifyState(pid, tid int, state byte, leaderStopped bool, w *walker) threadClass {
	if state != 'D' || leaderStopped {
		return classifyThread(state, leaderStopped, false, false)
	}
	pending, b := procfs.SignalPending(pid, tid, unix.SIGSTOP, w.buf)
	w.buf = b
	vfork := false
	if !pending {
		vfork, w.buf = procfs.VforkWait(pid, tid, w.buf)
	}
	return classifyThread(state, false, pending, vfork)
}

// confirm waits until every process in procs is stopped (every thread T,
// or in D under a rule that keeps it from user code) or gone, until
// o.confirmBy; past it, only while every holdout is in D, until
// o.pendingBy.
func (s *stopSet) confirm(ctx context.Context, procs []*proc, o pauseOpts, w *walker) walkResult {
	pending := procs
	classes := make([]procClass, len(procs))
	for round := 0; ; {
		classes = classes[:len(pending)]
		forEach(len(pending), w, func(i int, w *walker) { classes[i] = classifyLive(pending[i], w) })
		var rest, running []*proc
		holdD := 0
		for i, p := range pending {
			switch classes[i] {
			case procPaused:
				p.confirmed = true
				p.closeStat()
			case procPausedD:
				p.confirmed, p.inD = true, true
				p.closeStat()
			case procGone:
				p.confirmed, p.gone = true, true
				p.closeStat()
			case procHoldoutD:
				holdD++
				rest = append(rest, p)
			default:
				rest = append(rest, p)
				running = append(running, p)
			}
		}
		if len(rest) == 0 {
			return walkResult{ok: true}
		}
		now := time.Now()
		var why string
		switch {
		case ctx.Err() != nil:
			why = "cancelled: " + ctx.Err().Error()
		case now.After(o.pendingBy), now.After(o.confirmBy) && holdD < len(rest) && !stopsPending(running, w):
			why = "not stopped in time"
		}
		if why != "" {
			return holdoutResult(rest, why)
		}
		pending = rest
		backoff(&round)
	}
}

// stopsPending tells whether every thread of procs that has not stopped
// will stop before it runs user code again: it is in D (which the pending
// timeout covers), or SIGSTOP is pending for it, or its thread-group
// leader is stopped (a group stop under way). Such a thread only waits for
// a core: on a busy machine a runnable one can wait past the confirm
// timeout, and is then given until the pending timeout, as one in D is. A
// thread that SIGCONT (its workload's, say) took out of the stop has no
// SIGSTOP pending: it is no holdout of this kind. Read only once the
// confirm timeout has passed.
func stopsPending(procs []*proc, w *walker) bool {
	for _, p := range procs {
		tids := []int{p.pid}
		if p.threads > 1 {
			var err error
			if tids, err = procfs.Tasks(p.pid); err != nil {
				continue // gone: the next round sees it
			}
		}
		leaderStopped := p.state == 'T' || p.state == 't'
		for _, tid := range tids {
			ts, b, err := procfs.ReadTaskStat(p.pid, tid, w.buf)
			w.buf = b
			if err != nil {
				continue
			}
			switch ts.State {
			case 'T', 't', 'Z', 'X', 'x', 'D':
				continue
			}
			if leaderStopped {
				continue
			}
			pending, b := procfs.SignalPending(p.pid, tid, unix.SIGSTOP, w.buf)
			w.buf = b
			if pending {
				continue
			}
			// It may have taken the SIGSTOP between the two reads: it
			// then shows stopped now.
			ts, b, err = procfs.ReadTaskStat(p.pid, tid, w.buf)
			w.buf = b
			if err == nil && !strings.ContainsRune("TtZXxD", rune(ts.State)) {
				return false
			}
		}
	}
	return true
}

// holdoutResult reports the processes that did not stop.
func holdoutResult(rest []*proc, why string) walkResult {
	r := walkResult{reason: why}
	for _, p := range rest {
		if p.state == 'D' {
			r.pendingD = append(r.pendingD, strconv.Itoa(p.pid)+":D")
			r.holdouts = append(r.holdouts, "PENDING "+strconv.Itoa(p.pid)+":D")
		} else {
			r.holdouts = append(r.holdouts, strconv.Itoa(p.pid)+":"+string(p.state))
		}
	}
	if len(r.holdouts) > MaxReportPIDs {
		r.holdouts = append(r.holdouts[:MaxReportPIDs], fmt.Sprintf("and %d more", len(rest)-MaxReportPIDs))
	}
	r.reason = fmt.Sprintf("%s: %d process(es) left: %s", why, len(rest), strings.Join(r.holdouts, " "))
	return r
}

// children lists the children of every process of a level, as the next
// level's candidates.
func (s *stopSet) children(procs []*proc, w *walker) []cand {
	lists := make([][]int, len(procs))
	forEach(len(procs), w, func(i int, w *walker) {
		p := procs[i]
		if p.gone {
			return
		}
		out, b, _ := procfs.Children(p.pid, p.threads, w.buf, nil)
		w.buf = b
		lists[i] = out
	})
	var next []cand
	for i, p := range procs {
		for _, c := range lists[i] {
			next = append(next, cand{pid: c, ppid: p.pid, depth: p.depth + 1})
		}
	}
	return next
}

// resume continues what the pause stopped, children before parents
// (deepest first), so that a job-control shell never sees its command
// stopped: SIGCONT wakes a stopped task inside the kill system call, so a
// child is running again before its parent's SIGCONT is even sent. A
// process that was stopped before the pause stays stopped. Every pidfd
// is closed.
func (s *stopSet) resume() int {
	order := slices.Clone(s.order)
	slices.SortStableFunc(order, func(a, b *proc) int { return b.depth - a.depth })
	n := 0
	for _, p := range order {
		if !p.wasStopped && !p.gone && p.signal(unix.SIGCONT) == nil {
			n++
		}
		p.close()
	}
	return n
}

// release closes every pidfd without signalling.
func (s *stopSet) release() {
	for _, p := range s.order {
		p.close()
	}
}

// live returns the processes of the set that were not found gone.
func (s *stopSet) live() []*proc {
	out := make([]*proc, 0, len(s.order))
	for _, p := range s.order {
		if !p.gone {
			out = append(out, p)
		}
	}
	return out
}

// maxPasses bounds the walk's passes: a tree that keeps changing although
// every process found is stopped means a process outside the walk feeds
// it, and the pause falls back.
const maxPasses = 32

// walkStop pauses a tree in stop mode, level by level: SIGSTOP a whole
// level, confirm every process of it stopped, and only then read its
// children (a stopped process forks no more), so a parent is always
// stopped before its children (a job-control shell never sees its command
// stop). Then it checks again until nothing new appears: once everything
// found is stopped, the children of all of them are read in one sweep
// (in parallel) with the roots, and whatever is new (an orphan that a
// process exiting mid-walk left to the subreaper, or to a subreaper inside
// the tree; a child of a process that was in D) is walked level by level
// the same way. On failure everything stopped is continued.
func walkStop(ctx context.Context, roots func(*walker) []cand, o pauseOpts) (*stopSet, walkResult) {
	w := newWalker()
	s := newStopSet()
	level := roots(w)
	for pass := 0; pass < maxPasses; pass++ {
		seen := map[int]bool{}
		for len(level) > 0 {
			_, fresh := s.stopLevel(level, seen, unix.SIGSTOP, w)
			if r := s.confirm(ctx, fresh, o, w); !r.ok {
				s.resume()
				return nil, r
			}
			level = s.children(fresh, w)
		}
		level = level[:0]
		for _, c := range append(roots(w), s.children(s.live(), w)...) {
			if s.procs[c.pid] == nil && !s.dead[c.pid] {
				level = append(level, c)
			}
		}
		if len(level) == 0 {
			return s, walkResult{ok: true}
		}
	}
	s.resume()
	return nil, walkResult{reason: fmt.Sprintf("the tree kept changing after %d passes", maxPasses)}
}

// discover visits the tree from the roots, top-down, sending sig (if not
// 0) to each live process as it is found, and returns them (pidfds
// closed). Zombies are skipped.
func discover(roots func(*walker) []cand, sig unix.Signal, w *walker) []*proc {
	var found []*proc
	seen := map[int]bool{}
	level := roots(w)
	for len(level) > 0 {
		var next []cand
		for _, c := range level {
			if seen[c.pid] {
				continue
			}
			seen[c.pid] = true
			p, st, b, err := openProc(c.pid, c.ppid, 0, true, w.buf)
			w.buf = b
			if err != nil {
				continue
			}
			if (st.State == 'Z' || st.State == 'X') && st.Threads <= 1 {
				p.close()
				continue
			}
			p.depth, p.threads = c.depth, st.Threads
			if sig != 0 {
				_ = p.signal(sig)
			}
			kids, b2, _ := procfs.Children(p.pid, p.threads, w.buf, nil)
			w.buf = b2
			for _, k := range kids {
				next = append(next, cand{pid: k, ppid: p.pid, depth: c.depth + 1})
			}
			p.close()
			found = append(found, p)
		}
		level = next
	}
	return found
}

// killTree SIGKILLs the tree from the roots pass after pass (each pass
// stops what it finds on the way down, so nothing forks behind it, then
// kills it all) until a pass finds nothing alive or the deadline passes.
func killTree(ctx context.Context, roots func(*walker) []cand, deadline time.Time) bool {
	w := newWalker()
	for round := 0; ; {
		found := discover(roots, unix.SIGSTOP, w)
		if len(found) == 0 {
			return true
		}
		for _, p := range found {
			_ = p.signal(unix.SIGKILL)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		backoff(&round)
	}
}
