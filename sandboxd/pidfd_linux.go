package sandboxd

import (
	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/procfs"
)

// proc is one process the supervisor acts on: its pid, its start time (the
// pair is its identity) and, while the supervisor holds it, a pidfd, so a
// signal can never reach a process that reused the pid.
type proc struct {
	pid   int
	start uint64
	fd    int // -1 when no pidfd is held
	// statFD is /proc/<pid>/stat held open during a walk (-1: none): a
	// pread is half the cost of open, read, close, and a held proc file
	// fails (ESRCH) rather than read a process that reused the pid.
	statFD int
	depth  int // depth in the launch's tree (the harness and orphans: 0)

	// Last seen: the thread count (1 spares listing the threads) and the
	// state letter of the process (its leader thread).
	threads int
	state   byte

	// Pause bookkeeping.
	wasStopped bool // already stopped before the pause: continue leaves it
	inD        bool // counted as paused with a thread in D
	confirmed  bool
	gone       bool
}

// openProc opens a pidfd for pid and only then reads its stat, so what it
// checks is the process the pidfd holds: if wantPPID > 0 its parent must be
// wantPPID (a pid read from a children list, which may have been reused
// since), if wantStart > 0 its start time must match. Anything else,
// including a process that died, is procfs.ErrGone. The stat is returned
// for the caller's use (state, threads). With holdFD the pidfd and the
// stat file stay open (the walk closes the stat file once the process is
// confirmed, the pidfd at continue); without, p.fd is -1.
func openProc(pid, wantPPID int, wantStart uint64, holdFD bool, buf []byte) (*proc, procfs.Stat, []byte, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if err == unix.ESRCH {
			return nil, procfs.Stat{}, buf, procfs.ErrGone
		}
		if err != unix.EMFILE && err != unix.ENFILE {
			return nil, procfs.Stat{}, buf, err
		}
		fd = -1 // out of descriptors: fall back to verify-then-signal
	}
	p := &proc{pid: pid, fd: fd, statFD: -1}
	if holdFD {
		if sfd, err := procfs.OpenStat(pid); err == nil {
			p.statFD = sfd
		}
	}
	st, buf, err := p.readStat(buf)
	if err == nil && (wantPPID > 0 && st.PPID != wantPPID || wantStart > 0 && st.Start != wantStart) {
		err = procfs.ErrGone
	}
	if err != nil {
		p.close()
		return nil, st, buf, err
	}
	p.start = st.Start
	if !holdFD && p.fd >= 0 {
		unix.Close(p.fd)
		p.fd = -1
	}
	return p, st, buf, nil
}

// readStat reads the process's stat through the held file when there is
// one.
func (p *proc) readStat(buf []byte) (procfs.Stat, []byte, error) {
	if p.statFD < 0 {
		return procfs.ReadStat(p.pid, buf)
	}
	return procfs.ReadStatFD(p.statFD, buf)
}

// closeStat closes the held stat file.
func (p *proc) closeStat() {
	if p.statFD >= 0 {
		unix.Close(p.statFD)
		p.statFD = -1
	}
}

// signal sends sig through the pidfd; without one it opens a pidfd,
// checks the start time, signals and closes. A process that is gone is
// procfs.ErrGone.
func (p *proc) signal(sig unix.Signal) error {
	if p.fd >= 0 {
		err := unix.PidfdSendSignal(p.fd, sig, nil, 0)
		if err == unix.ESRCH {
			return procfs.ErrGone
		}
		return err
	}
	q, _, _, err := openProc(p.pid, 0, p.start, true, nil)
	if err != nil {
		return err
	}
	defer q.close()
	if q.fd < 0 {
		// No descriptor to be had: the start time was just checked.
		err = unix.Kill(p.pid, sig)
	} else {
		err = unix.PidfdSendSignal(q.fd, sig, nil, 0)
	}
	if err == unix.ESRCH {
		return procfs.ErrGone
	}
	return err
}

// close releases the pidfd and the stat file.
func (p *proc) close() {
	if p.fd >= 0 {
		unix.Close(p.fd)
		p.fd = -1
	}
	p.closeStat()
}
