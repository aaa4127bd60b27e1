package sandboxapi

import (
	"fmt"
	"slices"
)

// Outcome is how a launch ended (PROTOCOL §6, Bookmark v1: a launch ends
// finished, interrupted or failed).
type Outcome uint8

// The outcomes. OutcomeNone is a launch that has not ended.
const (
	// OutcomeNone: the launch has not ended.
	OutcomeNone Outcome = iota
	// OutcomeFinished: the launched process exited by itself (any exit
	// code; the receipt has it).
	OutcomeFinished
	// OutcomeInterrupted: the launch was stopped (a stop, a cancel, its
	// deadline, a stop file, or the supervisor shutting down), before or
	// after it started.
	OutcomeInterrupted
	// OutcomeFailed: the launch could not start, its process was killed by
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
	i := slices.Index(outcomeNames[:], string(b))
	if i < 0 {
		return fmt.Errorf("sandboxapi: unknown outcome %q", b)
	}
	*o = Outcome(i)
	return nil
}

// StopReason is why a launch was stopped.
type StopReason uint8

// The stop reasons.
const (
	// StopNone: not stopped.
	StopNone StopReason = iota
	// StopRequested: a stop (SIGINT, grace, SIGKILL).
	StopRequested
	// StopCancelled: a cancel (SIGKILL at once).
	StopCancelled
	// StopDeadline: the launch's deadline passed (paused time excluded).
	StopDeadline
	// StopFile: the stop file was there before the launch started.
	StopFile
	// StopShutdown: the supervisor is shutting down.
	StopShutdown
	// StopContinueFailed: a paused launch could not be continued.
	StopContinueFailed
)

var stopNames = [...]string{"", "stop", "cancel", "deadline", "stop-file", "shutdown", "continue-failed"}

// String returns the reason's record name ("" for StopNone).
func (r StopReason) String() string {
	if int(r) < len(stopNames) {
		return stopNames[r]
	}
	return fmt.Sprintf("StopReason(%d)", uint8(r))
}

// MarshalText implements encoding.TextMarshaler.
func (r StopReason) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (r *StopReason) UnmarshalText(b []byte) error {
	i := slices.Index(stopNames[:], string(b))
	if i < 0 {
		return fmt.Errorf("sandboxapi: unknown stop reason %q", b)
	}
	*r = StopReason(i)
	return nil
}
