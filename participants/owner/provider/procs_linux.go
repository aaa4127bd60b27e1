//go:build linux

package provider

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
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

// running reports whether pid still names the process that started at
// start (clock ticks since boot), and it is not a zombie.
func running(pid int, start uint64) bool {
	st, _, err := procfs.ReadStat(pid, nil)
	return err == nil && st.Start == start && st.State != 'Z'
}

// alive reports whether pid names a process that is not a zombie.
func alive(pid int) bool {
	st, _, err := procfs.ReadStat(pid, nil)
	return err == nil && st.State != 'Z'
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

// execResult turns what cmd.Run returned into an ExecResult and an error
// for a command that could not run or was cut short by ctx.
func execResult(ctx context.Context, cmd *exec.Cmd, runErr error, stdout, stderr *bytes.Buffer) (ExecResult, error) {
	res := ExecResult{Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}
	if cmd.ProcessState == nil { // it never started
		return res, runErr
	}
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	switch {
	case ws.Signaled():
		res.ExitCode = 128 + int(ws.Signal())
	default:
		res.ExitCode = ws.ExitStatus()
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("exec %s: %w", cmd.Args[0], err)
	}
	var exitErr *exec.ExitError
	if runErr == nil || errors.As(runErr, &exitErr) || errors.Is(runErr, exec.ErrWaitDelay) {
		// ErrWaitDelay: the command ended but left a process holding its
		// output open; what it wrote until then is in the result.
		return res, nil
	}
	return res, runErr
}
