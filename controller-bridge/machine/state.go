package machine

import (
	"errors"
	"fmt"
	"slices"
)

// State is where the machine is in an operation (PROTOCOL §5, Bridge
// rules). Every transition it makes is listed in successors; anything else
// is refused with ErrTransition.
type State uint8

// The states.
const (
	// StateIdle: no operation is open; the machine takes an ask or a
	// Recover.
	StateIdle State = iota
	// StateReplaying: the history of the run's open operation has been fed
	// (Recover); the machine reads what the stream and KV say about it, and
	// Replayed makes it carry on.
	StateReplaying
	// StatePreparing: a prepare is published and its acks gathered.
	StatePreparing
	// StateHeld: every member is ready and the checkpoint is held for an
	// outer save; a Tick renews the lease until a commit or an abort.
	StateHeld
	// StateCommitting: a commit is published and its acks gathered.
	StateCommitting
	// StateVerifying: the member manifests are read and checked, and the
	// checkpoint manifest (the commit point) is created.
	StateVerifying
	// StateCommitted: the checkpoint manifest exists. LATEST, the outcome
	// and (without stop) the resume follow.
	StateCommitted
	// StateAborting: the abort marker, outcome checkpoint.failed and the
	// resume.
	StateAborting
	// StateRestoring: a restore is published and its acks gathered.
	StateRestoring
	// StateRestored: every member installed; outcome restore.completed,
	// then the resume.
	StateRestored
	// StateRestoreFailing: a member did not install; the next attempts are
	// retired everywhere, the fleet resumed, restore.failed reported.
	StateRestoreFailing
	// StateOperating: a retire or forget is published and its acks
	// gathered.
	StateOperating
	// StateReleasing: a release is published, its acks gathered, and the
	// bridge's side of what is not kept deleted.
	StateReleasing
	// StateBranching: a branch is published and its acks gathered; then
	// branch.completed.
	StateBranching
	// StateBranchFailing: a member did not branch; the branch episodes
	// are retired everywhere, branch.failed reported.
	StateBranchFailing
)

var stateNames = [...]string{"idle", "replaying", "preparing", "held", "committing", "verifying", "committed",
	"aborting", "restoring", "restored", "restore-failing", "operating", "releasing", "branching", "branch-failing"}

// String returns the state's name.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// successors lists the legal transitions. Every state may go back to idle:
// an operation finishes, is fenced, or fails on the bus.
var successors = map[State][]State{
	StateIdle: {StateReplaying, StatePreparing, StateRestoring, StateOperating, StateReleasing, StateBranching},
	// Replayed carries on in the state the history shows, or finds the
	// operation closed.
	StateReplaying: {StateIdle, StatePreparing, StateCommitting, StateCommitted, StateAborting,
		StateRestoring, StateRestored, StateRestoreFailing, StateReleasing, StateBranching, StateBranchFailing},
	StatePreparing:      {StateIdle, StateHeld, StateCommitting, StateAborting},
	StateHeld:           {StateIdle, StateCommitting, StateAborting},
	StateCommitting:     {StateIdle, StateVerifying, StateAborting},
	StateVerifying:      {StateIdle, StateCommitted, StateAborting},
	StateCommitted:      {StateIdle},
	StateAborting:       {StateIdle, StateCommitted},
	StateRestoring:      {StateIdle, StateRestored, StateRestoreFailing},
	StateRestored:       {StateIdle},
	StateRestoreFailing: {StateIdle},
	StateOperating:      {StateIdle},
	StateReleasing:      {StateIdle},
	StateBranching:      {StateIdle, StateBranchFailing},
	StateBranchFailing:  {StateIdle},
}

// Errors of Step. An input the machine refuses leaves it as it was.
var (
	// ErrTransition is returned (wrapped, naming both states) for a
	// transition that successors does not list. The machine never makes
	// one; seeing it means a bug.
	ErrTransition = errors.New("machine: illegal transition")
	// ErrUnexpected is returned (wrapped, naming the input and the state)
	// for a result the machine did not ask for: the driver answered an
	// effect twice, or one it was never given.
	ErrUnexpected = errors.New("machine: unexpected input")
)

// CheckTransition returns nil if from -> to is a legal transition, else an
// error wrapping ErrTransition that names both states.
func CheckTransition(from, to State) error {
	if slices.Contains(successors[from], to) {
		return nil
	}
	return fmt.Errorf("%w from %s to %s", ErrTransition, from, to)
}
