//go:build linux

package overlay

import (
	"syscall"

	"github.com/stillpoint/stillpoint/internal/cgroup"
	"github.com/stillpoint/stillpoint/internal/procfs"
)

// descendants returns pid's descendants, parents before children, read
// from /proc/<pid>/task/*/children (never a scan of all of /proc).
func descendants(pid int) []int {
	var out []int
	var buf []byte
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		n := len(out)
		out, buf, _ = procfs.Children(p, 0, buf, out)
		queue = append(queue, out[n:]...)
	}
	return out
}

// killInside kills what nsenter (pid) started, but not nsenter, which
// then reaps its child and exits with the child's signal; it kills nsenter
// itself only when it has not forked yet. A process forked by nsenter and
// orphaned would be reaped by the host's init, whenever that runs, and the
// sandbox's PID namespace could not end before.
func killInside(pid int) {
	tree := descendants(pid)
	if len(tree) == 0 {
		tree = []int{pid}
	}
	for _, p := range tree {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
}

// nsInit returns the pid of the process in cg (not in its children) that
// is pid 1 of its PID namespace: a sandbox's init, found without the
// process that started it. 0 if there is none.
func nsInit(cg cgroup.Dir) int {
	pids, _ := cg.Procs()
	for _, pid := range pids {
		ids, err := procfs.NSpid(pid)
		if err == nil && len(ids) > 1 && ids[len(ids)-1] == 1 {
			return pid
		}
	}
	return 0
}
