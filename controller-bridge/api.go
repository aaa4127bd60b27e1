package bridge

import (
	"errors"
	"fmt"
	"time"

	"github.com/stillpoint/stillpoint/events"
)

// Errors the bridge's operations return. The HTTP API maps each to a status
// and an error code (see docs/API.md).
var (
	// ErrBusy is returned when another operation of the run is open.
	ErrBusy = errors.New("bridge: another operation is open")
	// ErrNotFound is returned for a checkpoint that does not exist.
	ErrNotFound = errors.New("bridge: not found")
	// ErrFenced is returned when another bridge published a phase of this
	// run in between: this bridge is not the run's bridge any more.
	ErrFenced = errors.New("bridge: fenced by another bridge")
	// ErrBadRequest is returned for a request that names something invalid.
	ErrBadRequest = errors.New("bridge: bad request")
	// ErrNoFreshMember is returned by Restore when a member of the
	// checkpoint has no fresh member to restore into.
	ErrNoFreshMember = errors.New("bridge: no fresh member to restore into")
)

// Status values of results.
const (
	StatusCommitted = "committed"
	StatusFailed    = "failed"
	StatusPrepared  = "prepared"
	StatusCompleted = "completed"
)

// CheckpointRequest asks for a checkpoint.
type CheckpointRequest struct {
	// ID is the checkpoint id; empty picks one (c-<UTC time>). Asking again
	// for an id that already committed or failed returns that result.
	ID string `json:"checkpoint_id,omitempty"`
	// Episodes are the controller's episodes; those no member reports as a
	// restart continue. Empty means every episode the members hold.
	Episodes []string `json:"episodes,omitempty"`
	// Stop parks (kills) the exported work once the checkpoint is durable,
	// and does not resume the fleet.
	Stop bool `json:"stop,omitempty"`
	// TimeoutMS is each phase's deadline from its publish (0: the bridge's
	// default).
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Hold stops after prepare with the fleet parked and returns status
	// "prepared"; the bridge renews the lease until Commit or Abort. This is
	// the window for a slow outer save.
	Hold bool `json:"hold,omitempty"`
}

func (r CheckpointRequest) validate() error {
	var errs []error
	if r.ID != "" {
		if err := events.ValidateCheckpointID(r.ID); err != nil {
			errs = append(errs, err)
		}
	}
	for i, e := range r.Episodes {
		if _, err := events.ParseEpisode(e); err != nil {
			errs = append(errs, fmt.Errorf("episodes[%d]: %w", i, err))
			break
		}
	}
	if r.TimeoutMS < 0 {
		errs = append(errs, errors.New("timeout_ms: negative"))
	}
	if r.Hold && r.Stop {
		errs = append(errs, errors.New("hold and stop: a held checkpoint is committed with its own stop flag"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	return nil
}

// Failure says why an operation failed.
type Failure struct {
	// Phase is the phase that failed.
	Phase events.Phase `json:"phase"`
	// Reason sums it up.
	Reason string `json:"reason"`
	// Errors names every member that failed, was not ready, died or never
	// answered.
	Errors []events.MemberError `json:"errors,omitempty"`
	// Blockers and BlockerCount list each not-ready member's blockers.
	Blockers     map[events.Member][]string `json:"blockers,omitempty"`
	BlockerCount map[events.Member]int      `json:"blocker_count,omitempty"`
}

// CheckpointResult is the result of a checkpoint.
type CheckpointResult struct {
	Run          string `json:"run"`
	CheckpointID string `json:"checkpoint_id"`
	// Status is committed, failed, or prepared (held).
	Status string `json:"status"`
	Epoch  uint64 `json:"epoch"`
	// Continued and Restarted are the episodes the checkpoint continues and
	// those that restart from their input.
	Continued []string `json:"continued,omitempty"`
	Restarted []string `json:"restarted,omitempty"`
	// Members are the members that took part.
	Members []events.Member `json:"members"`
	// PrepareMS and CommitMS time the two phases.
	PrepareMS int64 `json:"prepare_ms"`
	CommitMS  int64 `json:"commit_ms,omitempty"`
	// Stop tells whether the fleet was parked.
	Stop bool `json:"stop,omitempty"`
	// Failure is set when Status is failed.
	Failure *Failure `json:"failure,omitempty"`
}

// RestoreRequest asks for a restore into a fresh fleet.
type RestoreRequest struct {
	// Source is the checkpoint to restore; empty means LATEST.
	Source string `json:"source_checkpoint_id,omitempty"`
	// ID is the restore operation's id; empty picks restore-e<epoch>.
	ID string `json:"restore_id,omitempty"`
	// TimeoutMS is the restore phase's deadline (0: the default).
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
}

// RestoreResult is the result of a restore.
type RestoreResult struct {
	Run       string `json:"run"`
	RestoreID string `json:"restore_id"`
	Source    string `json:"source_checkpoint_id"`
	// Status is completed or failed.
	Status string `json:"status"`
	// Epoch is the run's epoch after the restore.
	Epoch uint64 `json:"epoch"`
	// Restored are the next-attempt keys now live (on success).
	Restored []string `json:"restored,omitempty"`
	// Retired are the attempts retired after a failure; those rollouts
	// restart from their input as later attempts.
	Retired []string `json:"retired,omitempty"`
	// Members are the fresh members that took part.
	Members []events.Member `json:"members"`
	Failure *Failure        `json:"failure,omitempty"`
}

// OpResult is the result of a retire, forget or release.
type OpResult struct {
	Run   string       `json:"run"`
	OpID  string       `json:"op_id"`
	Phase events.Phase `json:"phase"`
	// Status is completed or failed.
	Status  string          `json:"status"`
	Members []events.Member `json:"members"`
	// Keep and Deleted are set by a release: the checkpoints kept and the
	// checkpoints whose manifests and records were deleted.
	Keep    []string `json:"keep,omitempty"`
	Deleted []string `json:"deleted,omitempty"`
	// MemberDeleted lists what each member deleted (snapshots, ...).
	MemberDeleted map[events.Member][]string `json:"member_deleted,omitempty"`
	Failure       *Failure                   `json:"failure,omitempty"`
}

// ReleaseRequest asks the fleet and the bridge to delete what no kept
// checkpoint names.
type ReleaseRequest struct {
	// Keep lists checkpoint ids to keep.
	Keep []string `json:"keep,omitempty"`
	// KeepLatest keeps the newest N committed checkpoints as well.
	KeepLatest int `json:"keep_latest,omitempty"`
}

// CheckpointInfo summarizes one checkpoint in Status.
type CheckpointInfo struct {
	CheckpointID string    `json:"checkpoint_id"`
	Epoch        uint64    `json:"epoch"`
	Created      time.Time `json:"created"`
	Aborted      bool      `json:"aborted,omitempty"`
	Reason       string    `json:"reason,omitempty"`
	Continued    int       `json:"continued"`
	Restarted    int       `json:"restarted"`
	Members      int       `json:"members"`
	Stop         bool      `json:"stop,omitempty"`
}

// Status is the run as the bus shows it.
type Status struct {
	Run string `json:"run"`
	// Epoch is the number of restores so far; Seq the last phase sequence.
	Epoch uint64 `json:"epoch"`
	Seq   uint64 `json:"seq"`
	// LastPhase and LastCheckpoint describe the last phase event.
	LastPhase      events.Phase `json:"last_phase,omitempty"`
	LastCheckpoint string       `json:"last_checkpoint,omitempty"`
	// Open is set while an operation is unfinished.
	Open string `json:"open,omitempty"`
	// Held is the checkpoint held prepared, if any.
	Held string `json:"held,omitempty"`
	// Latest is the newest committed checkpoint.
	Latest *events.Latest `json:"latest,omitempty"`
	// Checkpoints lists every checkpoint key, oldest first.
	Checkpoints []CheckpointInfo `json:"checkpoints"`
	// Members lists the live members.
	Members []events.MemberInfo `json:"members"`
}
