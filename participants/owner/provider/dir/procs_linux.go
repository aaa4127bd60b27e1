//go:build linux

package dir

import (
	"os"

	"github.com/stillpoint/stillpoint/internal/procfs"
)

// tagged returns the pids whose environment holds the entry tag: the
// processes of a dir sandbox, including those that left its process group.
// Zombies have no environment and are not returned.
func tagged(tag string) []int {
	pids, err := procfs.PIDs()
	if err != nil {
		return nil
	}
	want := []byte(tag)
	self := os.Getpid()
	var out []int
	var buf []byte
	for _, pid := range pids {
		if pid == self {
			continue
		}
		var has bool
		if has, buf = procfs.EnvironHas(pid, want, buf); has {
			out = append(out, pid)
		}
	}
	return out
}

// inGroup lists the processes of process group pgid that are not
// zombies.
func inGroup(pgid int) []int {
	pids, err := procfs.PIDs()
	if err != nil {
		return nil
	}
	var out []int
	var buf []byte
	for _, pid := range pids {
		var st procfs.Stat
		if st, buf, err = procfs.ReadStat(pid, buf); err == nil && st.PGID == pgid && st.State != 'Z' {
			out = append(out, pid)
		}
	}
	return out
}
