//go:build linux

package provider

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// descendants returns pid's descendants, parents before children, read
// from /proc/<pid>/task/*/children (never a scan of all of /proc).
func descendants(pid int) []int {
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", p))
		for _, t := range tasks {
			b, err := os.ReadFile(t)
			if err != nil {
				continue
			}
			for _, f := range strings.Fields(string(b)) {
				if c, err := strconv.Atoi(f); err == nil {
					out = append(out, c)
					queue = append(queue, c)
				}
			}
		}
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
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	want := []byte(tag)
	self := os.Getpid()
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(b, []byte{0}) {
			if bytes.Equal(kv, want) {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// alive reports whether pid names a process that is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
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
