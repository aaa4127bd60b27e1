package sandboxapi

import (
	"fmt"
	"strconv"
	"strings"
)

// Identity names one process for as long as the machine runs: its pid and
// its start time (field 22 of /proc/<pid>/stat, clock ticks since boot). A
// pid alone is reused; the pair is not. A supervisor's identity goes into
// every launch record and every pause or continue result, so a restarted
// supervisor (same state directory, new process) is told apart from the
// one that paused the launch, and a VM snapshot restored with its
// processes is recognised as the same one (PROTOCOL §6, restore of a
// process-keeping snapshot).
type Identity struct {
	// PID is the process id.
	PID int `json:"pid"`
	// Start is the process start time in clock ticks since boot.
	Start uint64 `json:"start"`
}

// String returns "<pid>:<start>".
func (i Identity) String() string {
	return strconv.Itoa(i.PID) + ":" + strconv.FormatUint(i.Start, 10)
}

// IsZero reports whether i is the zero Identity.
func (i Identity) IsZero() bool { return i.PID == 0 && i.Start == 0 }

// ParseIdentity parses the form String returns.
func ParseIdentity(s string) (Identity, error) {
	p, st, ok := strings.Cut(s, ":")
	pid, err1 := strconv.Atoi(p)
	start, err2 := strconv.ParseUint(st, 10, 64)
	if !ok || err1 != nil || err2 != nil || pid <= 0 {
		return Identity{}, fmt.Errorf("sandboxapi: malformed identity %q (want <pid>:<start>)", s)
	}
	return Identity{PID: pid, Start: start}, nil
}
