package sandboxd

import (
	"context"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/procfs"
)

// launchMark is what identifies a launch's processes anywhere on the host:
// its mark in their environment (the supervisor's tag and the launch id:
// ids repeat across supervisors, tags do not), and the session and
// process group its harness leads (a process keeps them unless it calls
// setsid or setpgid).
type launchMark struct {
	tag       []byte // "STILLPOINT_LAUNCH_MARK=<supervisor tag>/<id>"
	rootPID   int    // 0: match the tag only
	rootStart uint64
}

func (m launchMark) matchStat(st procfs.Stat) bool {
	return m.rootPID > 0 && (st.Session == m.rootPID || st.PGID == m.rootPID) && st.Start >= m.rootStart
}

// checked returns m without its session rule if the harness's pid now
// names another process: the number was reused, so the launch's session
// and process group are gone, and a session with that id is someone
// else's. (While any process of the session lives, the number cannot be
// reused.)
func (m launchMark) checked(w *walker) launchMark {
	if m.rootPID <= 0 {
		return m
	}
	st, b, err := procfs.ReadStat(m.rootPID, w.buf)
	w.buf = b
	if err == nil && st.Start != m.rootStart {
		m.rootPID = 0
	}
	return m
}

// scanHost reads every process on the host (the last resort PROTOCOL §6
// allows: O(host), and environ takes each target's mmap lock) and returns
// those that carry the launch's mark, with their pidfds closed.
func scanHost(m launchMark, w *walker) []*proc {
	pids, err := procfs.PIDs()
	if err != nil {
		return nil
	}
	m = m.checked(w)
	self := os.Getpid()
	var out []*proc
	for _, pid := range pids {
		if pid == self {
			continue
		}
		st, b, err := procfs.ReadStat(pid, w.buf)
		w.buf = b
		if err != nil || (st.State == 'Z' || st.State == 'X') && st.Threads <= 1 {
			continue
		}
		hit := m.matchStat(st)
		if !hit {
			hit, w.buf = procfs.EnvironHas(pid, m.tag, w.buf)
		}
		if !hit {
			continue
		}
		p, _, b2, err := openProc(pid, 0, st.Start, false, w.buf)
		w.buf = b2
		if err == nil {
			out = append(out, p)
		}
	}
	return out
}

// killMarked SIGKILLs every process on the host that carries the mark,
// scan after scan, until a scan finds none or the deadline passes.
func killMarked(ctx context.Context, m launchMark, deadline time.Time) bool {
	w := newWalker()
	for round := 0; ; {
		found := scanHost(m, w)
		if len(found) == 0 {
			return true
		}
		for _, p := range found {
			_ = p.signal(unix.SIGSTOP)
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

// scanStop is the baseline the tree walk replaced (the reference's
// fallback, and BenchmarkPause's mode=scan): read the stat of every
// process on the host, build the parent links, SIGSTOP every descendant
// of the roots, rescan until no new one appears, then confirm them all.
func scanStop(ctx context.Context, roots func(*walker) []cand, o pauseOpts) (*stopSet, walkResult) {
	w := newWalker()
	s := newStopSet()
	for pass := 0; pass < maxPasses; pass++ {
		pids, err := procfs.PIDs()
		if err != nil {
			s.resume()
			return nil, walkResult{reason: "scan /proc: " + err.Error()}
		}
		kids := map[int][]int{}
		for _, pid := range pids {
			st, b, err := procfs.ReadStat(pid, w.buf)
			w.buf = b
			if err == nil {
				kids[st.PPID] = append(kids[st.PPID], pid)
			}
		}
		var todo []cand
		for level := roots(w); len(level) > 0; {
			var next []cand
			for _, c := range level {
				todo = append(todo, c)
				for _, k := range kids[c.pid] {
					next = append(next, cand{pid: k, ppid: c.pid, depth: c.depth + 1})
				}
			}
			level = next
		}
		_, fresh := s.stopLevel(todo, map[int]bool{}, unix.SIGSTOP, w)
		if pass > 0 && len(fresh) == 0 {
			break
		}
	}
	if r := s.confirm(ctx, s.order, o, w); !r.ok {
		s.resume()
		return nil, r
	}
	return s, walkResult{ok: true}
}
