package procfs

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// ReadFile reads the whole of a /proc file into buf, grown as needed (a nil
// buf gets 4 KiB), and returns the bytes read. A missing file, or one whose
// process died, is ErrGone.
func ReadFile(path string, buf []byte) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if err == unix.ENOENT || err == unix.ESRCH {
			return buf[:0], ErrGone
		}
		return buf[:0], &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	buf = buf[:cap(buf)]
	if len(buf) == 0 {
		buf = make([]byte, 4096)
	}
	n := 0
	for {
		m, err := unix.Read(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			if err == unix.ESRCH || err == unix.ENOENT {
				return buf[:0], ErrGone
			}
			return buf[:0], &os.PathError{Op: "read", Path: path, Err: err}
		}
		if m == 0 {
			return buf[:n], nil
		}
		n += m
		if n == len(buf) {
			buf = append(buf, make([]byte, len(buf))...)
		}
	}
}

// ReadStat reads /proc/<pid>/stat.
func ReadStat(pid int, buf []byte) (Stat, []byte, error) {
	buf, err := ReadFile(Path(pid, "/stat"), buf)
	if err != nil {
		return Stat{}, buf, err
	}
	st, err := ParseStat(buf)
	return st, buf, err
}

// ReadTaskStat reads /proc/<pid>/task/<tid>/stat, the stat of one thread.
func ReadTaskStat(pid, tid int, buf []byte) (Stat, []byte, error) {
	buf, err := ReadFile(TaskPath(pid, tid, "/stat"), buf)
	if err != nil {
		return Stat{}, buf, err
	}
	st, err := ParseStat(buf)
	return st, buf, err
}

// OpenStat opens /proc/<pid>/stat to be read again and again with
// ReadStatFD; the caller closes the descriptor (unix.Close). The file
// stays bound to the process it was opened for: once that process has
// been reaped it reads ESRCH, never the stat of a process that reused the
// pid.
func OpenStat(pid int) (int, error) {
	fd, err := unix.Open(Path(pid, "/stat"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT || err == unix.ESRCH {
		return -1, ErrGone
	}
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: Path(pid, "/stat"), Err: err}
	}
	return fd, nil
}

// ReadStatFD reads a stat file opened by OpenStat, with one pread into buf
// (given at least 1 KiB of capacity, else replaced by 4 KiB). Any read
// error means the process is gone: ErrGone.
func ReadStatFD(fd int, buf []byte) (Stat, []byte, error) {
	buf = buf[:cap(buf)]
	if len(buf) < 1024 {
		buf = make([]byte, 4096)
	}
	n, err := unix.Pread(fd, buf, 0)
	if err != nil {
		return Stat{}, buf[:0], ErrGone
	}
	st, err := ParseStat(buf[:n])
	return st, buf[:n], err
}

// Tasks lists the thread ids of pid. Any failure, the process being gone
// the likely one, is ErrGone.
func Tasks(pid int) ([]int, error) {
	f, err := os.Open(Path(pid, "/task"))
	if err != nil {
		return nil, ErrGone
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, ErrGone
	}
	tids := make([]int, 0, len(names))
	for _, n := range names {
		if t, err := strconv.Atoi(n); err == nil {
			tids = append(tids, t)
		}
	}
	return tids, nil
}

// Children appends the children of process pid to out. A child belongs to
// the thread that forked it, so every thread's list is read; threads is the
// thread count from the process's stat when the caller has it: 1 reads
// only the leader's list (and falls back to every thread if the leader has
// exited while other threads live on), any other value (0: unknown) lists
// the threads first.
func Children(pid, threads int, buf []byte, out []int) ([]int, []byte, error) {
	if threads == 1 {
		b, err := ReadFile(TaskPath(pid, pid, "/children"), buf)
		if err == nil {
			return ParsePIDs(b, out), b, nil
		}
		if err != ErrGone {
			return out, b, err
		}
		buf = b
	}
	tids, err := Tasks(pid)
	if err != nil {
		return out, buf, err
	}
	for _, tid := range tids {
		b, err := ReadFile(TaskPath(pid, tid, "/children"), buf)
		buf = b
		if err == nil {
			out = ParsePIDs(b, out)
		}
	}
	return out, buf, nil
}

// Tree returns pid and its descendants as their children lists show them
// now, each parent before its children. A process that exits meanwhile
// is left out with what it had started; pid gone is ErrGone.
func Tree(pid int) ([]int, error) {
	if _, err := os.Stat(Path(pid, "")); err != nil {
		return nil, ErrGone
	}
	out := []int{pid}
	var buf []byte
	for i := 0; i < len(out); i++ {
		var err error
		if out, buf, err = Children(out[i], 0, buf, out); err != nil && err != ErrGone {
			return out, err
		}
	}
	return out, nil
}

// SignalPending reports whether sig is pending for thread tid of pid, in
// the thread's own pending set (SigPnd) or the process's shared one
// (ShdPnd), as /proc/<pid>/task/<tid>/status shows them.
func SignalPending(pid, tid int, sig syscall.Signal, buf []byte) (bool, []byte) {
	b, err := ReadFile(TaskPath(pid, tid, "/status"), buf)
	if err != nil {
		return false, b
	}
	if sig < 1 || sig > 64 {
		return false, b
	}
	bit := uint64(1) << (sig - 1)
	for _, key := range [...][]byte{[]byte("\nSigPnd:\t"), []byte("\nShdPnd:\t")} {
		i := bytes.Index(b, key)
		if i < 0 {
			continue
		}
		v := b[i+len(key):]
		if j := bytes.IndexByte(v, '\n'); j >= 0 {
			v = v[:j]
		}
		if m, err := strconv.ParseUint(string(v), 16, 64); err == nil && m&bit != 0 {
			return true, b
		}
	}
	return false, b
}

// VforkWait reports whether thread tid of pid sleeps in the kernel's vfork
// wait (its wchan is kernel_clone or wait_for_vfork_done): it is a vfork
// parent whose child has not exec'd or exited yet.
func VforkWait(pid, tid int, buf []byte) (bool, []byte) {
	b, err := ReadFile(TaskPath(pid, tid, "/wchan"), buf)
	if err != nil {
		return false, b
	}
	w := bytes.TrimSpace(b)
	return bytes.Equal(w, []byte("kernel_clone")) || bytes.Equal(w, []byte("wait_for_vfork_done")), b
}

// EnvironHas reports whether the environment of pid, as it was at exec,
// holds entry ("NAME=value", matched whole). A zombie has no environment.
func EnvironHas(pid int, entry []byte, buf []byte) (bool, []byte) {
	full, err := ReadFile(Path(pid, "/environ"), buf)
	if err != nil {
		return false, full
	}
	b := full
	for len(b) > 0 {
		i := bytes.IndexByte(b, 0)
		var e []byte
		if i < 0 {
			e, b = b, nil
		} else {
			e, b = b[:i], b[i+1:]
		}
		if bytes.Equal(e, entry) {
			return true, full
		}
	}
	return false, full
}

// PIDs lists every process in /proc: O(host), for the last resort only.
func PIDs() ([]int, error) {
	f, err := os.Open("/proc")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	pids := make([]int, 0, len(names))
	for _, n := range names {
		if n[0] < '0' || n[0] > '9' {
			continue
		}
		if p, err := strconv.Atoi(n); err == nil {
			pids = append(pids, p)
		}
	}
	return pids, nil
}

// Cgroup returns the cgroup v2 path of pid, the "0::" line of
// /proc/<pid>/cgroup: relative to the root of the reader's cgroup
// namespace, "" when the process is in no v2 cgroup.
func Cgroup(pid int, buf []byte) (string, []byte, error) {
	b, err := ReadFile(Path(pid, "/cgroup"), buf)
	if err != nil {
		return "", b, err
	}
	return cgroupLine(b), b, nil
}

// SelfCgroup is Cgroup of the calling process (/proc/self/cgroup).
func SelfCgroup() (string, error) {
	b, err := ReadFile("/proc/self/cgroup", nil)
	if err != nil {
		return "", err
	}
	return cgroupLine(b), nil
}

func cgroupLine(b []byte) string {
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if p, ok := bytes.CutPrefix(line, []byte("0::")); ok {
			return string(p)
		}
	}
	return ""
}

// NSpid returns the pid of process pid in each PID namespace it is in, from
// the outermost (the reader's, pid itself) to its own (the NSpid line of
// /proc/<pid>/status). A process that is pid 1 of a namespace below the
// reader's returns [pid, ..., 1].
func NSpid(pid int) ([]int, error) {
	b, err := ReadFile(Path(pid, "/status"), nil)
	if err != nil {
		return nil, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "NSpid:")
		if !ok {
			continue
		}
		var ids []int
		for _, f := range strings.Fields(rest) {
			id, err := strconv.Atoi(f)
			if err != nil {
				return nil, fmt.Errorf("%w: NSpid of %d: %q", ErrMalformed, pid, rest)
			}
			ids = append(ids, id)
		}
		return ids, nil
	}
	return nil, fmt.Errorf("%w: no NSpid in the status of %d", ErrMalformed, pid)
}

// Mounts reads the calling process's mount table, /proc/self/mountinfo,
// in its order (a mount after the ones it covers).
func Mounts() ([]Mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if m, ok := ParseMount(sc.Text()); ok {
			out = append(out, m)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("procfs: read mountinfo: %w", err)
	}
	return out, nil
}
