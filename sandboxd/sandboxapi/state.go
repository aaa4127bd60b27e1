package sandboxapi

import (
	"fmt"
	"slices"
)

// State is a launch's lifecycle state. The supervisor's state machine
// (sandboxd.Machine) moves a launch through them and refuses any other
// transition; here they are what a Record says.
type State uint8

// The launch states.
const (
	// StatePending is a launch that was accepted and has not started.
	StatePending State = iota
	// StateHeld is a launch that a pause reached before it started (the
	// pause file): it starts on continue, or never if a stop comes first.
	StateHeld
	// StateRunning is a launch whose process runs.
	StateRunning
	// StatePaused is a launch paused in some mode, until continue.
	StatePaused
	// StateStopping is a launch being stopped: SIGINT sent and the grace
	// running, or SIGKILL sent.
	StateStopping
	// StateEnded is a launch whose process exited (or that never started);
	// its receipt is final.
	StateEnded
)

var stateNames = [...]string{"pending", "held", "running", "paused", "stopping", "ended"}

// String returns the state's record name.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// MarshalText implements encoding.TextMarshaler.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *State) UnmarshalText(b []byte) error {
	i := slices.Index(stateNames[:], string(b))
	if i < 0 {
		return fmt.Errorf("sandboxapi: unknown launch state %q", b)
	}
	*s = State(i)
	return nil
}
