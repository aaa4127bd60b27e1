package sandboxd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// ChildSpec is a process to start outside any launch, through the
// process's reap loop: an init's first process, or a command run and
// waited for (a microVM's exec).
type ChildSpec struct {
	// Argv is the program and its arguments; Argv[0] is looked up in the
	// PATH of Env (or the process's) when it has no slash. Required.
	Argv []string
	// Dir is the working directory (default: the process's).
	Dir string
	// Env is the environment (default: the process's).
	Env []string
	// Files are the child's stdin, stdout and stderr; nil ones are
	// /dev/null.
	Files [3]*os.File
	// Setsid starts the child in a new session (and process group), so
	// that Kill reaches what it starts too.
	Setsid bool
}

// Child is a process StartChild started: the reap loop reaps it and hands
// its exit to Wait, never to anyone else.
type Child struct {
	pid    int
	setsid bool
	exit   chan exitInfo
	done   chan struct{}
	info   exitInfo
}

// HoldReaper starts the process's reap loop (making the process a child
// subreaper) for a caller that starts children of its own with StartChild
// and runs no Supervisor, or outlives the ones it runs: a microVM's PID 1.
// The loop stays while any holder or Supervisor holds it; release (once)
// lets it go.
func HoldReaper() (release func(), err error) {
	if err := acquireReaper(); err != nil {
		return nil, err
	}
	var once bool
	return func() {
		if !once {
			once = true
			releaseReaper()
		}
	}, nil
}

// StartChild starts spec's process with its exit subscribed before the
// reap loop can reap it. The reap loop must be running (HoldReaper, or a
// Supervisor's Run).
func StartChild(spec ChildSpec) (*Child, error) {
	if len(spec.Argv) == 0 || spec.Argv[0] == "" {
		return nil, fmt.Errorf("%w: ChildSpec.Argv is empty", ErrInvalidSpec)
	}
	env := spec.Env
	if env == nil {
		env = os.Environ()
	}
	argv0, err := lookPath(spec.Argv[0], env)
	if err != nil {
		return nil, err
	}
	var files []*os.File
	var null *os.File
	for _, f := range spec.Files {
		if f == nil {
			if null == nil {
				if null, err = os.OpenFile(os.DevNull, os.O_RDWR, 0); err != nil {
					return nil, err
				}
				defer null.Close()
			}
			f = null
		}
		files = append(files, f)
	}
	reaper.mu.Lock()
	running := reaper.subs != nil && reaper.refs > 0
	reaper.mu.Unlock()
	if !running {
		return nil, errors.New("sandboxd: StartChild needs the reap loop (HoldReaper)")
	}
	pid, ch, err := startSubscribed(func() (int, error) {
		p, err := os.StartProcess(argv0, spec.Argv, &os.ProcAttr{Dir: spec.Dir, Env: env, Files: files,
			Sys: &syscall.SysProcAttr{Setsid: spec.Setsid}})
		if err != nil {
			return 0, err
		}
		pid := p.Pid
		_ = p.Release() // the reap loop waits for it, never os
		return pid, nil
	})
	if err != nil {
		return nil, fmt.Errorf("sandboxd: start %s: %w", spec.Argv[0], err)
	}
	c := &Child{pid: pid, setsid: spec.Setsid, exit: ch, done: make(chan struct{})}
	return c, nil
}

// PID returns the child's pid.
func (c *Child) PID() int { return c.pid }

// Wait waits for the child's exit and returns its code, or -1 and the name
// of the signal that killed it; ctx ending returns its error (the child
// goes on, and a later Wait still gets its exit). Safe for concurrent use.
func (c *Child) Wait(ctx context.Context) (code int, signal string, err error) {
	select {
	case <-c.done:
	case info := <-c.exit:
		c.info = info
		close(c.done)
	case <-ctx.Done():
		return 0, "", ctx.Err()
	}
	return c.info.code, c.info.signal, nil
}

// Kill sends SIGKILL to the child, and to its process group when it was
// started with Setsid.
func (c *Child) Kill() {
	select {
	case <-c.done:
		return
	default:
	}
	if c.setsid {
		_ = unix.Kill(-c.pid, unix.SIGKILL)
	}
	_ = unix.Kill(c.pid, unix.SIGKILL)
}
