package procfs

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

var (
	// ErrGone is returned by the readers when the process or thread whose
	// file they read no longer exists (or, for a held stat file, when the
	// process it was opened for has been reaped).
	ErrGone = errors.New("procfs: process gone")
	// ErrMalformed is returned (wrapped) by ParseStat, and so by the stat
	// readers, for a line that does not have the fields of proc(5).
	ErrMalformed = errors.New("procfs: malformed")
)

// Stat is what the project reads from /proc/<pid>/stat or
// /proc/<pid>/task/<tid>/stat. Field numbers are those of proc(5).
type Stat struct {
	// State is the state letter (field 3): R, S, D, T, t, Z, X, ...
	State byte
	// PPID is the parent's pid (field 4).
	PPID int
	// PGID is the process group (field 5).
	PGID int
	// Session is the session id (field 6).
	Session int
	// UTime and STime are the user and system CPU time in clock ticks
	// (fields 14 and 15).
	UTime, STime uint64
	// Threads is the number of threads of the process (field 20).
	Threads int
	// Start is the start time in clock ticks since boot (field 22): with
	// the pid, it names a process for as long as the machine runs.
	Start uint64
}

// ParseStat parses a stat line. The command name may hold spaces and
// parentheses, so the fields are counted from the last ')'. A line
// without them is ErrMalformed.
func ParseStat(b []byte) (Stat, error) {
	var st Stat
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return st, fmt.Errorf("%w: stat without a command name", ErrMalformed)
	}
	b = b[i+2:]
	st.State = b[0]
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
			st.PPID = atoi(tok)
		case 5:
			st.PGID = atoi(tok)
		case 6:
			st.Session = atoi(tok)
		case 14:
			st.UTime = atou(tok)
		case 15:
			st.STime = atou(tok)
		case 20:
			st.Threads = atoi(tok)
		case 22:
			st.Start = atou(tok)
		}
		j = k
	}
	if field < 22 {
		return st, fmt.Errorf("%w: short stat", ErrMalformed)
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

// ParsePIDs appends the pids in b, separated by spaces or newlines (a
// children file, cgroup.procs), to out and returns it.
func ParsePIDs(b []byte, out []int) []int {
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

// Path returns "/proc/<pid>" + suffix ("/stat", "/environ", ...).
func Path(pid int, suffix string) string {
	b := make([]byte, 0, 32+len(suffix))
	b = append(b, "/proc/"...)
	b = strconv.AppendInt(b, int64(pid), 10)
	b = append(b, suffix...)
	return string(b)
}

// TaskPath returns "/proc/<pid>/task/<tid>" + suffix.
func TaskPath(pid, tid int, suffix string) string {
	b := make([]byte, 0, 48+len(suffix))
	b = append(b, "/proc/"...)
	b = strconv.AppendInt(b, int64(pid), 10)
	b = append(b, "/task/"...)
	b = strconv.AppendInt(b, int64(tid), 10)
	b = append(b, suffix...)
	return string(b)
}
