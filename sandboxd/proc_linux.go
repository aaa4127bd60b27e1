package sandboxd

import (
	"os"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/procfs"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// selfChildren lists the supervisor's own children: launch roots and the
// orphans reparented to it as a child subreaper (every thread's list: the
// Go runtime forks on any thread).
func selfChildren(buf []byte) ([]int, []byte) {
	out, buf, _ := procfs.Children(os.Getpid(), 0, buf, nil)
	return out, buf
}

// IdentityOf returns the identity of process pid.
func IdentityOf(pid int) (sandboxapi.Identity, error) {
	st, _, err := procfs.ReadStat(pid, nil)
	if err != nil {
		return sandboxapi.Identity{}, err
	}
	return sandboxapi.Identity{PID: pid, Start: st.Start}, nil
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
