package child

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// processOS is the Linux part of a Process.
type processOS struct {
	cmd     *exec.Cmd
	mu      sync.Mutex
	reaping bool // the reap began: the group id may be anyone's now
}

// Start starts the process of spec. The caller must end it with Stop or
// Wait (after Kill too), which also end the goroutine that waits for it.
func Start(spec Spec) (*Process, error) {
	if spec.Path == "" {
		return nil, fmt.Errorf("%w: no path", ErrSpec)
	}
	if spec.Name == "" {
		spec.Name = filepath.Base(spec.Path)
	}
	if spec.StopSignal == 0 {
		spec.StopSignal = syscall.SIGTERM
	}
	if spec.Grace <= 0 {
		spec.Grace = DefaultGrace
	}
	p := &Process{spec: spec, exited: make(chan struct{}), reap: make(chan bool, 1), reaped: make(chan struct{})}
	cmd := exec.Command(spec.Path, spec.Args...)
	cmd.Env = append(os.Environ(), spec.Env...) // os/exec keeps the last of duplicates
	cmd.Dir = spec.Dir
	var out io.Writer = &p.out
	var logf *os.File
	if spec.LogFile != "" {
		if err := os.MkdirAll(filepath.Dir(spec.LogFile), 0o755); err != nil {
			return nil, fmt.Errorf("child: %s: log file: %w", spec.Name, err)
		}
		f, err := os.OpenFile(spec.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("child: %s: log file: %w", spec.Name, err)
		}
		logf = f
		out = io.MultiWriter(&p.out, f)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if spec.Stderr != nil {
		cmd.Stderr = spec.Stderr
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = waitDelay
	if err := cmd.Start(); err != nil {
		if logf != nil {
			logf.Close()
		}
		return nil, fmt.Errorf("child: start %s: %w", spec.Name, err)
	}
	p.pid = cmd.Process.Pid
	p.sys.cmd = cmd
	go p.watch(logf)
	return p, nil
}

// watch waits for the exit without reaping, then for the reap to be asked
// for, and reaps.
func (p *Process) watch(logf *os.File) {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, p.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			break // exited, or not ours to wait for any more (ECHILD): cmd.Wait says which
		}
	}
	close(p.exited)
	killGroup := <-p.reap
	p.sys.mu.Lock()
	if killGroup {
		_ = syscall.Kill(-p.pid, syscall.SIGKILL) // the zombie still holds the group's id
	}
	p.sys.reaping = true
	p.sys.mu.Unlock()
	err := p.sys.cmd.Wait()
	if logf != nil {
		_ = logf.Close()
	}
	p.exit = exitOf(p.sys.cmd.ProcessState, err)
	close(p.reaped)
}

func exitOf(st *os.ProcessState, err error) Exit {
	if st == nil {
		return Exit{Code: -1}
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return Exit{Code: -1, Signal: ws.Signal()}
	}
	return Exit{Code: st.ExitCode()}
}

func (s *processOS) signal(sig syscall.Signal) error {
	return s.cmd.Process.Signal(sig)
}

func (s *processOS) signalGroup(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reaping {
		return os.ErrProcessDone
	}
	return syscall.Kill(-s.cmd.Process.Pid, sig)
}
