//go:build linux

package procs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/procfs"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// Running reports whether pid still names the process that started at
// start (clock ticks since boot), and it is not a zombie.
func Running(pid int, start uint64) bool {
	st, _, err := procfs.ReadStat(pid, nil)
	return err == nil && st.Start == start && st.State != 'Z'
}

// Alive reports whether pid names a process that is not a zombie.
func Alive(pid int) bool {
	st, _, err := procfs.ReadStat(pid, nil)
	return err == nil && st.State != 'Z'
}

// ExecResult turns what cmd.Run returned into a provider.ExecResult and
// an error for a command that could not run or was cut short by ctx.
func ExecResult(ctx context.Context, cmd *exec.Cmd, runErr error, stdout, stderr *bytes.Buffer) (provider.ExecResult, error) {
	res := provider.ExecResult{Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}
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

// WhileTextBusy runs start, the exec of a program the owner just wrote
// into a sandbox (CopyIn, Binds copied), again while it fails with
// ETXTBSY: a child the owner forked meanwhile for another sandbox holds the
// write descriptor until its own exec (Go's fork and exec share no lock
// with file writes). It clears within moments: start is made at most 51
// times, 20 ms apart.
func WhileTextBusy(start func() error) error {
	var err error
	tries := 0
	_ = poll.Until(context.Background(), poll.Every(20*time.Millisecond), func() (bool, error) {
		err = start()
		tries++
		return !errors.Is(err, syscall.ETXTBSY) || tries > 50, nil
	})
	return err
}

// WaitExit blocks until the child pid has exited, without reaping it.
func WaitExit(pid int) {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			return
		}
	}
}
