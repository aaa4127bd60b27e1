package sandboxd

import (
	"fmt"
)

// Mode is how a launch is paused (PROTOCOL §6, Pause modes).
type Mode uint8

// The pause modes. ModeDefault is not a mode but "the launch's own", which
// is the Spec's Mode, else the Config's, else the first of Modes().
const (
	// ModeDefault selects the launch's (or the supervisor's) default mode.
	ModeDefault Mode = iota
	// ModeFreeze writes 1 to the launch's cgroup v2 cgroup.freeze and
	// waits for "frozen 1" in cgroup.events. Invisible to the processes;
	// needs a writable cgroup v2 and a launch started in its own cgroup.
	ModeFreeze
	// ModeStop sends SIGSTOP to the launch's process tree level by level,
	// confirming every thread, and SIGCONT bottom-up on continue. Works
	// everywhere; job-control shells never see their commands stop.
	ModeStop
	// ModeHold acknowledges at once and signals nothing; something else
	// (a VM snapshot, the model relay) holds the launch still.
	ModeHold
)

// modeScan is the pause strategy the tree walk replaced, a full /proc scan
// (scanStop); not a mode callers can ask for: only BenchmarkPause uses it,
// as a baseline.
const modeScan Mode = 255

var modeNames = [...]string{"default", "freeze", "stop", "hold"}

// String returns the mode's protocol name.
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// ParseMode returns the Mode named s ("freeze", "stop", "hold", or
// "default" / "" for ModeDefault).
func ParseMode(s string) (Mode, error) {
	if s == "" {
		return ModeDefault, nil
	}
	for i, n := range modeNames {
		if n == s {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown pause mode %q (want freeze, stop or hold)", ErrModeUnavailable, s)
}

// MarshalText implements encoding.TextMarshaler.
func (m Mode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (m *Mode) UnmarshalText(b []byte) error {
	v, err := ParseMode(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// Outcome is how a launch ended (PROTOCOL §6, the launch record).
type Outcome uint8

// The outcomes. OutcomeNone is a launch that has not ended.
const (
	// OutcomeNone: the launch has not ended.
	OutcomeNone Outcome = iota
	// OutcomeFinished: the harness exited by itself (any exit code; the
	// receipt has it).
	OutcomeFinished
	// OutcomeInterrupted: the launch was stopped (Stop, Cancel, its
	// deadline, a stop file, or the supervisor shutting down), before or
	// after it started.
	OutcomeInterrupted
	// OutcomeFailed: the launch could not start, its harness was killed by
	// a signal nobody here sent, or its supervisor died.
	OutcomeFailed
)

var outcomeNames = [...]string{"", "finished", "interrupted", "failed"}

// String returns the outcome's protocol name ("" for OutcomeNone).
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// MarshalText implements encoding.TextMarshaler.
func (o Outcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (o *Outcome) UnmarshalText(b []byte) error {
	for i, n := range outcomeNames {
		if n == string(b) {
			*o = Outcome(i)
			return nil
		}
	}
	return fmt.Errorf("sandboxd: unknown outcome %q", b)
}
