package member

import (
	"errors"
	"fmt"
	"slices"

	"github.com/stillpoint/stillpoint/events"
)

// State is a member's phase-machine state (PROTOCOL §5).
type State uint8

// The member states. Every transition the machine makes is listed in
// successors; anything else is refused with ErrTransition.
const (
	// StateIdle admits work; no checkpoint is open.
	StateIdle State = iota
	// StatePreparing has closed admission and waits for readiness.
	StatePreparing
	// StatePrepared is at a boundary and may commit.
	StatePrepared
	// StateCommitted has exported its records and created its manifest.
	StateCommitted
	// StateRestored has installed a checkpoint's records and waits for
	// resume.
	StateRestored
)

var stateNames = [...]string{"idle", "preparing", "prepared", "committed", "restored"}

// String returns the state's protocol name.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Wire returns the state as an ack carries it.
func (s State) Wire() events.State { return events.State(s.String()) }

// successors lists the legal transitions (PROTOCOL §5): idle -prepare->
// preparing -ready-> prepared -commit-> committed; idle -restore->
// restored; any -resume-> idle.
var successors = map[State][]State{
	StateIdle:      {StatePreparing, StateRestored},
	StatePreparing: {StatePrepared, StateIdle},
	StatePrepared:  {StateCommitted, StateIdle},
	StateCommitted: {StateIdle},
	StateRestored:  {StateIdle},
}

// ErrTransition is returned (wrapped, naming both states) for a transition
// that successors does not list. The machine never makes one; seeing it
// means a bug, and the phase that caused it is answered CodeInternal.
var ErrTransition = errors.New("member: illegal transition")

// CheckTransition returns nil if from -> to is a legal transition, else an
// error wrapping ErrTransition that names both states.
func CheckTransition(from, to State) error {
	if slices.Contains(successors[from], to) {
		return nil
	}
	return fmt.Errorf("%w from %s to %s", ErrTransition, from, to)
}

// ResumedKept is how many resumed checkpoint ids a member remembers to
// refuse as stale (PROTOCOL §5, Fencing).
const ResumedKept = 64
