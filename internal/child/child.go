package child

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sync"
	"syscall"
	"time"

	"github.com/stillpoint/stillpoint/internal/poll"
)

// DefaultGrace is how long Stop waits after the stop signal before it
// kills the process, when the Spec gives no grace.
const DefaultGrace = 20 * time.Second

// Sentinel errors.
// waitDelay bounds how long the reap waits, once the process exited, for
// the processes it left to close its stdout and stderr: after it, os/exec
// stops copying their output.
const waitDelay = 2 * time.Second

var (
	// ErrExited is returned by WaitOutput when the process exited before
	// writing what was awaited.
	ErrExited = errors.New("child: the process exited")
	// ErrSpec is wrapped by the errors of Start for an incomplete Spec.
	ErrSpec = errors.New("child: invalid spec")
)

// Spec says what to start and how.
type Spec struct {
	// Name names the process in errors and in a test's log.
	Name string
	// Path is the program; required.
	Path string
	// Args are the arguments after the program's name.
	Args []string
	// Env is added to this process's environment; an entry overrides an
	// inherited one of the same name.
	Env []string
	// Dir is the working directory (default: this process's).
	Dir string
	// LogFile, when set, also receives the output: created with its
	// directory if need be, appended to.
	LogFile string
	// Stderr, when set, receives the process's stderr instead of the
	// buffer and log file: a terminal, say.
	Stderr io.Writer
	// StopSignal starts Stop (default SIGTERM).
	StopSignal syscall.Signal
	// Grace is how long Stop waits for the process after StopSignal
	// (default DefaultGrace).
	Grace time.Duration
}

// Exit is how a process ended.
type Exit struct {
	// Code is its exit status; -1 when a signal ended it.
	Code int
	// Signal is the signal that ended it; 0 when it exited.
	Signal syscall.Signal
}

// Success reports whether the process exited with status 0.
func (e Exit) Success() bool { return e.Code == 0 && e.Signal == 0 }

// String says how the process ended: "exit status 3", "signal: killed".
func (e Exit) String() string {
	if e.Signal != 0 {
		return "signal: " + e.Signal.String()
	}
	return fmt.Sprintf("exit status %d", e.Code)
}

// Process is a started child.
type Process struct {
	spec Spec
	out  buffer
	pid  int

	exited chan struct{} // closed when the process has exited (not reaped)
	reap   chan bool     // receives once: reap now; true: kill the group first
	reaped chan struct{} // closed once reaped and its output copied
	exit   Exit          // set before reaped is closed
	waitMu sync.Mutex    // serializes Stop and Wait
	asked  bool          // the reap was asked for (under waitMu)

	sys processOS
}

// Name is the Spec's name.
func (p *Process) Name() string { return p.spec.Name }

// Pid is the process id (also its process group's id).
func (p *Process) Pid() int { return p.pid }

// Output returns what the process wrote so far (without what went to a
// Spec.Stderr of its own).
func (p *Process) Output() string { return p.out.String() }

// Exited is closed once the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Signal sends sig to the process alone. Once the process has exited it
// returns os.ErrProcessDone.
func (p *Process) Signal(sig syscall.Signal) error { return p.sys.signal(sig) }

// SignalGroup sends sig to the process's whole group, while the process
// is not reaped (afterwards it returns os.ErrProcessDone).
func (p *Process) SignalGroup(sig syscall.Signal) error { return p.sys.signalGroup(sig) }

// Kill kills the process alone with SIGKILL, as a crash does, and waits
// until it has exited. The rest of its group is left running; Stop or Wait
// kills it. ctx bounds the wait.
func (p *Process) Kill(ctx context.Context) error {
	_ = p.sys.signal(syscall.SIGKILL)
	select {
	case <-p.exited:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("child: %s: SIGKILL: %w", p.spec.Name, context.Cause(ctx))
	}
}

// Wait waits until the process has exited, or ctx ends (an error), then
// kills what is left of its group, reaps it and returns how it ended.
func (p *Process) Wait(ctx context.Context) (Exit, error) {
	select {
	case <-p.exited:
	case <-ctx.Done():
		return Exit{}, fmt.Errorf("child: %s still running: %w", p.spec.Name, context.Cause(ctx))
	}
	return p.collect(), nil
}

// Stop ends the process: its StopSignal, up to its grace for it to exit,
// then SIGKILL to its group; once it exited, whatever is left of its group
// is killed and the process reaped. It returns how the process ended.
// Stop is idempotent and may be called after Kill or Wait.
func (p *Process) Stop() Exit {
	select {
	case <-p.exited:
	default:
		_ = p.sys.signal(p.spec.StopSignal)
		t := time.NewTimer(p.spec.Grace)
		select {
		case <-p.exited:
		case <-t.C:
			_ = p.sys.signalGroup(syscall.SIGKILL)
			<-p.exited
		}
		t.Stop()
	}
	return p.collect()
}

// collect asks for the reap (group killed first) once and waits for it.
func (p *Process) collect() Exit {
	p.waitMu.Lock()
	if !p.asked {
		p.asked = true
		p.reap <- true
	}
	p.waitMu.Unlock()
	<-p.reaped
	return p.exit
}

// WaitOutput waits until re matches the output and returns the match and
// its submatches. It returns an error wrapping ErrExited, with the output,
// if the process exits first, and context.Cause(ctx) if ctx ends first.
func (p *Process) WaitOutput(ctx context.Context, re *regexp.Regexp) ([]string, error) {
	var (
		m        []string
		exitSeen time.Time
	)
	err := poll.Until(ctx, poll.Backoff(time.Millisecond, 20*time.Millisecond), func() (bool, error) {
		if m = re.FindStringSubmatch(p.out.String()); m != nil {
			return true, nil
		}
		select {
		case <-p.exited:
			// What the process wrote before it exited may still be in its
			// pipe: the copy into the buffer runs in a goroutine of its
			// own, which a loaded machine can keep waiting. It is given as
			// long as os/exec gives it at the reap (waitDelay).
			if exitSeen.IsZero() {
				exitSeen = time.Now()
			}
			if time.Since(exitSeen) < waitDelay {
				return false, nil
			}
			return false, fmt.Errorf("%w before writing %q: %s: output:\n%s", ErrExited, re, p.spec.Name, p.out.String())
		default:
			return false, nil
		}
	})
	if err != nil && !errors.Is(err, ErrExited) {
		err = fmt.Errorf("child: %s did not write %q: %w", p.spec.Name, re, err)
	}
	return m, err
}

// buffer is a bytes.Buffer for a writer and readers in other goroutines.
// It has no ReadFrom, so os/exec copies into it through Write.
type buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
