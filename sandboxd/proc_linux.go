package sandboxd

import (
	"bytes"
	"errors"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// errGone means the process (or thread) no longer exists.
var errGone = errors.New("sandboxd: process gone")

// statInfo is what the supervisor reads from /proc/<pid>/stat or
// /proc/<pid>/task/<tid>/stat.
type statInfo struct {
	state   byte
	ppid    int
	pgrp    int
	session int
	utime   uint64
	stime   uint64
	threads int
	start   uint64
}

// procPath returns "/proc/<pid>" + suffix.
func procPath(pid int, suffix string) string {
	b := make([]byte, 0, 32+len(suffix))
	b = append(b, "/proc/"...)
	b = strconv.AppendInt(b, int64(pid), 10)
	b = append(b, suffix...)
	return string(b)
}

// taskPath returns "/proc/<pid>/task/<tid>" + suffix.
func taskPath(pid, tid int, suffix string) string {
	b := make([]byte, 0, 48+len(suffix))
	b = append(b, "/proc/"...)
	b = strconv.AppendInt(b, int64(pid), 10)
	b = append(b, "/task/"...)
	b = strconv.AppendInt(b, int64(tid), 10)
	b = append(b, suffix...)
	return string(b)
}

// readInto reads the whole of a /proc file into buf (grown as needed) and
// returns it. A missing file, or one whose process died, is errGone.
func readInto(path string, buf []byte) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		if err == unix.ENOENT || err == unix.ESRCH {
			return buf[:0], errGone
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
				return buf[:0], errGone
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

// parseStat parses a stat line. The command name may hold spaces and
// parentheses, so the fields are counted from the last ')'.
func parseStat(b []byte) (statInfo, error) {
	var st statInfo
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return st, errors.New("sandboxd: malformed stat")
	}
	b = b[i+2:]
	st.state = b[0]
	// Field numbers as in proc(5): state is field 3.
	field := 3
	for j := 1; j < len(b) && field < 22; {
		if b[j] != ' ' {
			j++
			continue
		}
		j++
		field++
		k := j
		for k < len(b) && b[k] != ' ' && b[k] != '\n' {
			k++
		}
		tok := b[j:k]
		switch field {
		case 4:
			st.ppid = atoi(tok)
		case 5:
			st.pgrp = atoi(tok)
		case 6:
			st.session = atoi(tok)
		case 14:
			st.utime = atou(tok)
		case 15:
			st.stime = atou(tok)
		case 20:
			st.threads = atoi(tok)
		case 22:
			st.start = atou(tok)
		}
		j = k
	}
	if field < 22 {
		return st, errors.New("sandboxd: short stat")
	}
	return st, nil
}

func atou(b []byte) uint64 {
	var n uint64
	for _, c := range b {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + uint64(c-'0')
	}
	return n
}

func atoi(b []byte) int {
	if len(b) > 0 && b[0] == '-' {
		return -int(atou(b[1:]))
	}
	return int(atou(b))
}

// readStat reads /proc/<pid>/stat.
func readStat(pid int, buf []byte) (statInfo, []byte, error) {
	buf, err := readInto(procPath(pid, "/stat"), buf)
	if err != nil {
		return statInfo{}, buf, err
	}
	st, err := parseStat(buf)
	return st, buf, err
}

// readTaskStat reads /proc/<pid>/task/<tid>/stat.
func readTaskStat(pid, tid int, buf []byte) (statInfo, []byte, error) {
	buf, err := readInto(taskPath(pid, tid, "/stat"), buf)
	if err != nil {
		return statInfo{}, buf, err
	}
	st, err := parseStat(buf)
	return st, buf, err
}

// parsePIDs appends the space-separated pids in b to out.
func parsePIDs(b []byte, out []int) []int {
	n, in := 0, false
	for _, c := range b {
		if c >= '0' && c <= '9' {
			n, in = n*10+int(c-'0'), true
			continue
		}
		if in {
			out = append(out, n)
		}
		n, in = 0, false
	}
	if in {
		out = append(out, n)
	}
	return out
}

// readTasks lists the thread ids of pid.
func readTasks(pid int) ([]int, error) {
	f, err := os.Open(procPath(pid, "/task"))
	if err != nil {
		return nil, errGone
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, errGone
	}
	tids := make([]int, 0, len(names))
	for _, n := range names {
		if t, err := strconv.Atoi(n); err == nil {
			tids = append(tids, t)
		}
	}
	return tids, nil
}

// readChildren appends the children of process pid to out: one read of
// /proc/<pid>/task/<tid>/children per thread (threads is the count from
// stat; 1 spares the directory listing). A child belongs to the thread
// that forked it, so every thread must be read.
func readChildren(pid, threads int, buf []byte, out []int) ([]int, []byte, error) {
	if threads <= 1 {
		b, err := readInto(taskPath(pid, pid, "/children"), buf)
		if err == nil {
			return parsePIDs(b, out), b, nil
		}
		if err != errGone {
			return out, b, err
		}
		// The leader may have exited while other threads live on.
	}
	tids, err := readTasks(pid)
	if err != nil {
		return out, buf, err
	}
	for _, tid := range tids {
		b, err := readInto(taskPath(pid, tid, "/children"), buf)
		buf = b
		if err == nil {
			out = parsePIDs(b, out)
		}
	}
	return out, buf, nil
}

// sigstopPending reports whether SIGSTOP is pending for thread tid of pid,
// in its own (SigPnd) or the process's shared (ShdPnd) pending set.
func sigstopPending(pid, tid int, buf []byte) (bool, []byte) {
	b, err := readInto(taskPath(pid, tid, "/status"), buf)
	if err != nil {
		return false, b
	}
	const bit = uint64(1) << (unix.SIGSTOP - 1)
	for _, key := range [][]byte{[]byte("\nSigPnd:\t"), []byte("\nShdPnd:\t")} {
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

// vforkWait reports whether thread tid of pid sleeps in the kernel's vfork
// wait (wchan kernel_clone), that is, it is a vfork parent whose child has
// not exec'd or exited yet.
func vforkWait(pid, tid int, buf []byte) (bool, []byte) {
	b, err := readInto(taskPath(pid, tid, "/wchan"), buf)
	if err != nil {
		return false, b
	}
	w := bytes.TrimSpace(b)
	return bytes.Equal(w, []byte("kernel_clone")) || bytes.Equal(w, []byte("wait_for_vfork_done")), b
}

// environHas reports whether the environment of pid holds the entry tag
// ("NAME=value", matched whole).
func environHas(pid int, tag []byte, buf []byte) (bool, []byte) {
	full, err := readInto(procPath(pid, "/environ"), buf)
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
		if bytes.Equal(e, tag) {
			return true, full
		}
	}
	return false, full
}

// listPIDs lists every process in /proc (the scan the supervisor avoids
// except as a last resort).
func listPIDs() ([]int, error) {
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

// selfChildren lists the supervisor's own children: launch roots and the
// orphans reparented to it as a child subreaper.
func selfChildren(buf []byte) ([]int, []byte) {
	self := os.Getpid()
	tids, err := readTasks(self)
	if err != nil {
		return nil, buf
	}
	var out []int
	for _, tid := range tids {
		b, err := readInto(taskPath(self, tid, "/children"), buf)
		buf = b
		if err == nil {
			out = parsePIDs(b, out)
		}
	}
	return out, buf
}

// IdentityOf returns the identity of process pid.
func IdentityOf(pid int) (sandboxapi.Identity, error) {
	st, _, err := readStat(pid, nil)
	if err != nil {
		return sandboxapi.Identity{}, err
	}
	return sandboxapi.Identity{PID: pid, Start: st.start}, nil
}

// Alive reports whether the process i names is still running (or a
// zombie): a process with i's pid exists and has i's start time.
func Alive(i sandboxapi.Identity) bool {
	if i.PID <= 0 {
		return false
	}
	cur, err := IdentityOf(i.PID)
	return err == nil && cur == i
}

// uptime returns the seconds since boot, CLOCK_BOOTTIME.
func uptime() float64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return float64(ts.Sec) + float64(ts.Nsec)/1e9
}
