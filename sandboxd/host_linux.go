package sandboxd

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/cgroup"
	"github.com/stillpoint/stillpoint/internal/procfs"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// linuxHost is the Linux host: /proc, pidfds, signals, cgroup v2.
type linuxHost struct {
	log     zerolog.Logger
	self    sandboxapi.Identity
	selfPID int
	tag     string     // the state directory's tag (stateTag); "" without one
	cgRoot  cgroup.Dir // the parent shared with other supervisors; "" when freeze is unavailable
	cgMade  bool       // the parent is the default subtree (removed when empty)
	cgOwn   cgroup.Dir // this supervisor's own cgroup in it, holding the launch cgroups

	user *User // who launches run as; nil: as this process

	mu      sync.Mutex
	active  map[string]*linuxLaunch
	ownMade bool // cgOwn was made by this host (guarded by mu)
}

func newHost(cfg Config, log zerolog.Logger) (host, error) {
	self, err := IdentityOf(os.Getpid())
	if err != nil {
		return nil, fmt.Errorf("sandboxd: own identity: %w", err)
	}
	h := &linuxHost{log: log, self: self, selfPID: os.Getpid(), active: map[string]*linuxLaunch{}, user: cfg.LaunchUser}
	if cfg.StateDir != "" {
		if h.tag, err = stateTag(cfg.StateDir); err != nil {
			return nil, fmt.Errorf("%w: Config.StateDir: %w", ErrInvalidConfig, err)
		}
	}
	if !cfg.NoCgroup {
		parent, err := cgroupParent(cfg.CgroupRoot, cfg.CgroupName)
		if err == nil {
			err = prepareCgroupParent(parent, self)
		}
		if err != nil {
			log.Warn().Err(err).Msg("no writable cgroup v2: freeze unavailable, pausing in stop mode")
		} else {
			h.cgRoot, h.cgMade = parent, cfg.CgroupRoot == ""
			h.cgOwn = parent.Child(ownCgroupName(self, h.tag))
		}
	}
	return h, nil
}

func (h *linuxHost) identity() sandboxapi.Identity { return h.self }
func (h *linuxHost) uptime() float64               { return uptime() }
func (h *linuxHost) acquireReaper() error {
	return acquireReaper()
}
func (h *linuxHost) releaseReaper() { releaseReaper() }

func (h *linuxHost) modes() []sandboxapi.Mode {
	if h.cgRoot != "" {
		return []sandboxapi.Mode{sandboxapi.ModeFreeze, sandboxapi.ModeStop, sandboxapi.ModeHold}
	}
	return []sandboxapi.Mode{sandboxapi.ModeStop, sandboxapi.ModeHold}
}

// reap removes the cgroups that supervisors that are gone left in the
// shared parent (reapCgroups).
func (h *linuxHost) reap() {
	if h.cgRoot != "" {
		reapCgroups(h.cgRoot, h.log)
	}
}

// close removes the supervisor's own cgroup (unless a launch cgroup is
// left in it, still populated), reaps, and removes the default parent if
// nothing else uses it.
func (h *linuxHost) close() {
	if h.cgRoot == "" {
		return
	}
	h.mu.Lock()
	made := h.ownMade
	h.ownMade = false
	h.mu.Unlock()
	if made {
		if err := h.cgOwn.Remove(context.Background(), time.Now().Add(reapTimeout)); err != nil {
			h.log.Warn().Err(err).Msg("own cgroup left in place")
		}
	}
	h.reap()
	if h.cgMade {
		_ = unix.Rmdir(string(h.cgRoot))
	}
}

// lock takes an exclusive flock on <stateDir>/.lock (released by the
// kernel when the process dies) and writes the supervisor's identity.
func (h *linuxHost) lock(stateDir string) (func(), error) {
	path := filepath.Join(stateDir, ".lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		return nil, fmt.Errorf("%w: %s held by %s", ErrStateLocked, stateDir, strings.TrimSpace(string(holder)))
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(h.self.String()+"\n"), 0)
	return func() {
		_ = f.Truncate(0)
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}

// linuxLaunch is one started launch.
type linuxLaunch struct {
	h        *linuxHost
	id       string
	mark     launchMark
	root     *proc      // pidfd held for the launch's life
	cg       cgroup.Dir // "" without one
	cgRel    string     // the cgroup as /proc/<pid>/cgroup names it
	exitC    chan exitInfo
	isReaped atomic.Bool
	knownMu  sync.Mutex
	known    map[int]uint64 // pid -> start of processes seen in the last walk
	paused   *stopSet       // the stop-mode pause in force, its pidfds held
}

func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := os.Getenv("PATH")
	for _, e := range env {
		if p, ok := strings.CutPrefix(e, "PATH="); ok {
			path = p
		}
	}
	for dir := range strings.SplitSeq(path, ":") {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: executable not found in PATH", name)
}

// stateTag names the state directory dir among all on the host: 16 hex
// digits of a hash of its resolved path, device and inode. Only one
// supervisor at a time holds a state directory (lock), so the tag names
// that supervisor among the live ones; a supervisor restarted on the same
// directory gets the same tag and finds its predecessor's processes, and a
// copy of the directory (a forked sandbox) gets another.
func stateTag(dir string) (string, error) {
	resolved, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", err
	}
	var st unix.Stat_t
	if err := unix.Stat(resolved, &st); err != nil {
		return "", &os.PathError{Op: "stat", Path: resolved, Err: err}
	}
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%d", resolved, st.Dev, st.Ino))
	return hex.EncodeToString(sum[:8]), nil
}

// markOf is the environment entry that marks the processes of launch id
// of the supervisor whose state directory has tag.
func markOf(tag, id string) string { return EnvMark + "=" + tag + "/" + id }

// start forks the harness in a new session (so its own process group),
// as the launch user when there is one,
// directly into its cgroup with CLONE_INTO_CGROUP when it gets one, with
// its id and mark in its environment, stdin from /dev/null and stdout and
// stderr appended to the output file. Its exit is subscribed before it
// runs.
func (h *linuxHost) start(s startSpec) (hostLaunch, error) {
	argv0, err := lookPath(s.argv[0], s.env)
	if err != nil {
		return nil, err
	}
	env := s.env
	if env == nil {
		env = os.Environ()
	}
	tag := markOf(h.tag, s.id)
	env2 := make([]string, 0, len(env)+2)
	for _, e := range env {
		if !strings.HasPrefix(e, EnvTag+"=") && !strings.HasPrefix(e, EnvMark+"=") {
			env2 = append(env2, e)
		}
	}
	env2 = append(env2, EnvTag+"="+s.id, tag)
	out, err := os.OpenFile(s.output, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer null.Close()

	var cg cgroup.Dir
	cgfd := -1
	if s.cgroup && h.cgRoot != "" {
		h.mu.Lock()
		h.ownMade = true // from the first try on: close removes it if it is there
		h.mu.Unlock()
		if cg, err = createLaunchCgroup(h.cgRoot, h.cgOwn, s.id); err != nil {
			return nil, fmt.Errorf("launch cgroup: %w", err)
		}
		if cgfd, err = cg.OpenFD(); err != nil {
			_ = removeCgroup(cg)
			return nil, fmt.Errorf("launch cgroup: %w", err)
		}
		defer unix.Close(cgfd)
	}
	// The child's stat and cgroup are read before the reap loop may reap
	// it: a harness that exits at once is still a zombie then.
	var st procfs.Stat
	var cgRel string
	fork := func(withCgroup bool) (int, chan exitInfo, int, error) {
		pidfd := -1
		attr := &syscall.ProcAttr{
			Dir: s.dir, Env: env2, Files: []uintptr{null.Fd(), out.Fd(), out.Fd()},
			Sys: &syscall.SysProcAttr{Setsid: true, PidFD: &pidfd, UseCgroupFD: withCgroup, CgroupFD: cgfd},
		}
		if u := h.user; u != nil {
			attr.Sys.Credential = &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}
		}
		pid, ch, err := startSubscribed(func() (int, error) {
			pid, err := syscall.ForkExec(argv0, s.argv, attr)
			if err == nil {
				st, _, _ = procfs.ReadStat(pid, nil)
				if withCgroup {
					cgRel = cgroupOf(pid)
				}
			}
			return pid, err
		})
		return pid, ch, pidfd, err
	}
	pid, exits, pidfd, err := fork(cg != "")
	if err != nil && cg != "" && (errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP)) {
		h.log.Warn().Err(err).Str("launch", s.id).Msg("clone into cgroup failed; starting without a cgroup")
		_ = removeCgroup(cg)
		cg = ""
		pid, exits, pidfd, err = fork(false)
	}
	if err != nil {
		if cg != "" {
			_ = removeCgroup(cg)
		}
		return nil, err
	}
	l := &linuxLaunch{
		h: h, id: s.id, cg: cg,
		mark:  launchMark{tag: []byte(tag), rootPID: pid, rootStart: st.Start},
		root:  &proc{pid: pid, start: st.Start, fd: pidfd, statFD: -1},
		exitC: exits,
		known: map[int]uint64{},
	}
	if cg != "" {
		l.cgRel = cgRel
	}
	h.mu.Lock()
	h.active[s.id] = l
	h.mu.Unlock()
	return l, nil
}

// cgroupOf returns the cgroup v2 path of pid as /proc/<pid>/cgroup shows
// it ("" when it cannot be read).
func cgroupOf(pid int) string {
	p, _, _ := procfs.Cgroup(pid, nil)
	return p
}

func (l *linuxLaunch) pid() int               { return l.root.pid }
func (l *linuxLaunch) pidStart() uint64       { return l.root.start }
func (l *linuxLaunch) exits() <-chan exitInfo { return l.exitC }
func (l *linuxLaunch) reaped()                { l.isReaped.Store(true) }
func (l *linuxLaunch) exitedNow() bool        { return l.isReaped.Load() || exitedNow(l.root.fd) }
func (l *linuxLaunch) cgroupDir() string      { return string(l.cg) }

// roots returns the walk's starting points: the harness (until it is
// reaped) and the supervisor's children that belong to this launch,
// orphans reparented to the subreaper.
func (l *linuxLaunch) roots(w *walker) []cand {
	h := l.h
	var out []cand
	if !l.isReaped.Load() {
		out = append(out, cand{pid: l.root.pid, ppid: h.selfPID})
	}
	kids, b := selfChildren(w.buf)
	w.buf = b
	if len(kids) == 0 {
		return out
	}
	h.mu.Lock()
	launches := make([]*linuxLaunch, 0, len(h.active))
	rootPIDs := map[int]bool{}
	for _, o := range h.active {
		launches = append(launches, o)
		rootPIDs[o.root.pid] = true
	}
	h.mu.Unlock()
	for _, k := range kids {
		if rootPIDs[k] {
			continue
		}
		st, b, err := procfs.ReadStat(k, w.buf)
		w.buf = b
		if err != nil || (st.State == 'Z' || st.State == 'X') && st.Threads <= 1 || st.PPID != h.selfPID {
			continue
		}
		if h.attribute(k, st, launches, w) == l {
			out = append(out, cand{pid: k, ppid: h.selfPID})
		}
	}
	return out
}

// attribute says which launch a child of the process that is no launch's
// root belongs to, on positive evidence only: the launch whose cgroup
// holds it, else whose session or process group it is in, else whose tag
// it carries, else whose walk last saw it in the tree. Anything else is
// nobody's, however few launches there are: the process's children
// include the launches of every other Supervisor in it, and processes of
// no launch at all. An orphan that cleared its environment, left the
// session and was never seen, without cgroups, is nobody's; the process's
// last supervisor kills it when it stops (releaseReaper).
func (h *linuxHost) attribute(pid int, st procfs.Stat, launches []*linuxLaunch, w *walker) *linuxLaunch {
	var cgPath string
	for _, l := range launches {
		if l.cgRel == "" {
			continue
		}
		if cgPath == "" {
			if cgPath = cgroupOf(pid); cgPath == "" {
				break
			}
		}
		if cgPath == l.cgRel || strings.HasPrefix(cgPath, l.cgRel+"/") {
			return l
		}
	}
	for _, l := range launches {
		if l.mark.matchStat(st) && l.mark.checked(w).rootPID > 0 {
			return l
		}
	}
	for _, l := range launches {
		var has bool
		if has, w.buf = procfs.EnvironHas(pid, l.mark.tag, w.buf); has {
			return l
		}
	}
	for _, l := range launches {
		l.knownMu.Lock()
		s, ok := l.known[pid]
		l.knownMu.Unlock()
		if ok && s == st.Start {
			return l
		}
	}
	return nil
}

// remember notes the processes of a walk, to recognise them as orphans
// later.
func (l *linuxLaunch) remember(ps []*proc) {
	m := make(map[int]uint64, len(ps))
	for _, p := range ps {
		m[p.pid] = p.start
	}
	l.knownMu.Lock()
	l.known = m
	l.knownMu.Unlock()
}

// pause pauses the launch in mode freeze or stop (or scan, the benchmark
// baseline). An unconfirmed pause has been undone when it returns.
func (l *linuxLaunch) pause(ctx context.Context, mode sandboxapi.Mode, o pauseOpts) (pauseOutcome, error) {
	if l.exitedNow() {
		return pauseOutcome{ended: true}, nil
	}
	var out pauseOutcome
	switch mode {
	case sandboxapi.ModeFreeze:
		if l.cg == "" {
			return out, ErrModeUnavailable
		}
		out = l.freeze(ctx, o)
	case sandboxapi.ModeStop, modeScan:
		walk := walkStop
		if mode == modeScan {
			walk = scanStop
		}
		set, r := walk(ctx, l.roots, o)
		if !r.ok {
			return pauseOutcome{fallback: r.reason, pending: r.pendingD}, nil
		}
		live := set.live()
		l.remember(live)
		l.paused = set
		out = pauseOutcome{confirmed: true, count: len(live), undo: set}
		for _, p := range live {
			if len(out.pids) < MaxReportPIDs {
				out.pids = append(out.pids, p.pid)
			}
			if p.inD {
				out.pending = append(out.pending, fmt.Sprintf("%d:D", p.pid))
			}
		}
	default:
		return out, fmt.Errorf("%w: %s", ErrModeUnavailable, mode)
	}
	if out.confirmed && l.exitedNow() {
		// The harness exited just before the pause took hold: undo it; the
		// launch keeps its result.
		_, _ = l.resume(ctx, mode, &out, time.Until(o.confirmBy))
		return pauseOutcome{ended: true}, nil
	}
	return out, nil
}

// freeze writes cgroup.freeze and waits for "frozen 1"; past the confirm
// timeout it keeps waiting only while some thread is in D, up to the
// pending timeout. Unconfirmed, it thaws again: a cgroup is never left
// half frozen knowingly; a thaw that fails is in the outcome (thawErr).
func (l *linuxLaunch) freeze(ctx context.Context, o pauseOpts) pauseOutcome {
	c := l.cg
	frozen := func(e cgroup.Events) bool { return e.Frozen }
	err := c.SetFreeze(true)
	ok := false
	if err == nil {
		ok, err = c.WaitEvents(ctx, o.confirmBy, frozen)
	}
	var pendingD []string
	for !ok && err == nil && time.Now().Before(o.pendingBy) {
		if pendingD = threadsInD(c); len(pendingD) == 0 {
			break
		}
		next := time.Now().Add(100 * time.Millisecond)
		if o.pendingBy.Before(next) {
			next = o.pendingBy
		}
		ok, err = c.WaitEvents(ctx, next, frozen)
	}
	if !ok {
		why := "not frozen in time"
		if err != nil {
			why = err.Error()
		}
		if len(pendingD) > 0 {
			why += ": PENDING " + strings.Join(pendingD, " PENDING ")
		}
		terr := l.thaw()
		if terr != nil {
			why += "; thaw: " + terr.Error()
		}
		return pauseOutcome{fallback: "freeze: " + why, pending: pendingD, thawErr: terr}
	}
	pids, _ := c.AllProcs()
	out := pauseOutcome{confirmed: true, count: len(pids)}
	// The harness first, then the rest as the kernel lists them.
	if root := l.root.pid; !l.isReaped.Load() {
		out.pids = append(out.pids, root)
	}
	for _, p := range pids {
		if len(out.pids) >= MaxReportPIDs {
			break
		}
		if len(out.pids) == 0 || p != out.pids[0] {
			out.pids = append(out.pids, p)
		}
	}
	return out
}

// thaw writes 0 to cgroup.freeze and waits for "frozen 0".
func (l *linuxLaunch) thaw() error {
	return l.cg.Thaw(context.Background(), time.Now().Add(5*time.Second))
}

// threadsInD lists "<pid>:D" for the processes of the cgroup with a
// thread in D.
func threadsInD(c cgroup.Dir) []string {
	pids, _ := c.AllProcs()
	var out []string
	w := newWalker()
	for _, pid := range pids {
		tids, err := procfs.Tasks(pid)
		if err != nil {
			continue
		}
		for _, tid := range tids {
			st, b, err := procfs.ReadTaskStat(pid, tid, w.buf)
			w.buf = b
			if err == nil && st.State == 'D' {
				out = append(out, fmt.Sprintf("%d:D", pid))
				break
			}
		}
	}
	return out
}

// resume undoes a pause: thaw, or SIGCONT bottom-up to what the walk
// stopped.
func (l *linuxLaunch) resume(_ context.Context, mode sandboxapi.Mode, p *pauseOutcome, _ time.Duration) (int, error) {
	switch mode {
	case sandboxapi.ModeFreeze:
		if err := l.thaw(); err != nil {
			return 0, err
		}
		return p.count, nil
	case sandboxapi.ModeStop, modeScan:
		set, _ := p.undo.(*stopSet)
		if set == nil {
			return 0, nil
		}
		p.undo, l.paused = nil, nil
		return set.resume(), nil
	}
	return 0, nil
}

// interrupt sends SIGINT to the harness's process group, to every process
// of its tree and orphans, and to every process of its cgroup.
func (l *linuxLaunch) interrupt() {
	if !l.isReaped.Load() {
		_ = unix.Kill(-l.root.pid, unix.SIGINT)
	}
	w := newWalker()
	found := discover(l.roots, unix.SIGINT, w)
	if l.cg == "" {
		return
	}
	seen := make(map[int]bool, len(found))
	for _, p := range found {
		seen[p.pid] = true
	}
	pids, _ := l.cg.AllProcs()
	for _, pid := range pids {
		if seen[pid] {
			continue
		}
		p, _, b, err := openProc(pid, 0, 0, true, w.buf)
		w.buf = b
		if err != nil {
			continue
		}
		if rel := cgroupOf(pid); rel == l.cgRel || strings.HasPrefix(rel, l.cgRel+"/") {
			_ = p.signal(unix.SIGINT)
		}
		p.close()
	}
}

// kill SIGKILLs everything of the launch and confirms: cgroup.kill and
// "populated 0" where it has a cgroup (it works while frozen), then the
// tree and orphans, pass after pass, then every process on the host with
// the launch's tag or in its session. True when nothing was left.
func (l *linuxLaunch) kill(ctx context.Context, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	ok := true
	if l.cg != "" {
		if err := l.cg.Kill(); err != nil {
			l.h.log.Warn().Err(err).Str("launch", l.id).Msg("cgroup.kill")
			ok = false
		} else {
			got, err := l.cg.WaitEvents(ctx, deadline, func(e cgroup.Events) bool { return !e.Populated })
			ok = got && err == nil
		}
	}
	if !killTree(ctx, l.roots, deadline) {
		ok = false
	}
	if !killMarked(ctx, l.mark, deadline) {
		ok = false
	}
	return ok
}

// release forgets the launch: drops its exit subscription (if it was never
// reaped), closes the harness's pidfd, and removes the cgroup once empty.
func (l *linuxLaunch) release() error {
	l.h.mu.Lock()
	delete(l.h.active, l.id)
	l.h.mu.Unlock()
	unsubscribe(l.root.pid, l.exitC)
	l.root.close()
	if l.paused != nil {
		// Killed while paused: its pidfds go without a SIGCONT.
		l.paused.release()
		l.paused = nil
	}
	if l.cg == "" {
		return nil
	}
	if ev, err := l.cg.Events(); err == nil && ev.Populated {
		return fmt.Errorf("cgroup %s still populated; left in place", l.cg)
	}
	return removeCgroup(l.cg)
}

// recoverLaunch kills what is left of a launch of a previous supervisor
// of the state directory: its cgroup, then its harness and every process
// with its mark or in its session. True when nothing was left. A cgroup
// that is not a launch cgroup of a supervisor of this state directory
// (isOwnLaunchCgroup) is left alone: the record was copied from another.
func (h *linuxHost) recoverLaunch(ctx context.Context, rec sandboxapi.Record, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	ok := true
	if rec.Cgroup != "" && !isOwnLaunchCgroup(rec.Cgroup, h.tag) {
		h.log.Warn().Str("launch", rec.ID).Str("cgroup", rec.Cgroup).Msg("a lost launch's cgroup is not this state directory's: left alone")
	} else if rec.Cgroup != "" {
		ok = killLostCgroup(ctx, cgroup.Dir(rec.Cgroup), deadline)
		if ok {
			if err := removeCgroup(cgroup.Dir(rec.Cgroup)); err != nil {
				h.log.Warn().Err(err).Str("launch", rec.ID).Msg("remove a lost launch's cgroup")
			}
		}
	}
	// The session rule only while the harness itself is alive and carries
	// the mark: the previous supervisor may have died long ago, and once
	// the harness and its session are gone, its pid (and so a session id)
	// may name someone else's; and a record copied with its state
	// directory (a forked sandbox) names a harness that is another
	// supervisor's.
	m := launchMark{tag: []byte(markOf(h.tag, rec.ID))}
	if Alive(sandboxapi.Identity{PID: rec.PID, Start: rec.PIDStart}) {
		if has, _ := procfs.EnvironHas(rec.PID, m.tag, nil); has {
			m.rootPID, m.rootStart = rec.PID, rec.PIDStart
		}
	}
	return killMarked(ctx, m, deadline) && ok
}

// killLostCgroup kills the processes of a lost launch's cgroup and waits
// until it is empty. A cgroup that is gone (never made, or reaped by
// another supervisor once it was empty) holds nothing.
func killLostCgroup(ctx context.Context, c cgroup.Dir, deadline time.Time) bool {
	gone := func() bool {
		_, err := os.Stat(string(c))
		return errors.Is(err, fs.ErrNotExist)
	}
	if gone() {
		return true
	}
	if err := c.Kill(); err != nil {
		return gone()
	}
	got, err := c.WaitEvents(ctx, deadline, func(e cgroup.Events) bool { return !e.Populated })
	return got && err == nil || gone()
}
