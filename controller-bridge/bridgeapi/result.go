package bridgeapi

import (
	"time"

	"github.com/stillpoint/stillpoint/events"
)

// Status values of results.
const (
	StatusCommitted = "committed"
	StatusFailed    = "failed"
	StatusPrepared  = "prepared"
	StatusCompleted = "completed"
)

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
	// Carried and Retired are as in the manifest (events.CheckpointManifest).
	Carried []events.Carry `json:"carried,omitempty"`
	Retired []string       `json:"retired,omitempty"`
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

// ResultOf returns the result a checkpoint key records: committed with
// what its manifest names, or failed with the abort marker's reason.
func ResultOf(m *events.CheckpointManifest) *CheckpointResult {
	r := &CheckpointResult{Run: m.Run, CheckpointID: m.CheckpointID, Epoch: m.Epoch, Continued: m.Continued,
		Restarted: m.Restarted, Carried: m.Carried, Retired: m.Retired, PrepareMS: m.PrepareMS, CommitMS: m.CommitMS, Stop: m.Stop}
	if m.Aborted {
		r.Status = StatusFailed
		r.Failure = &Failure{Reason: m.Reason}
	} else {
		r.Status = StatusCommitted
	}
	r.Members = m.CommittedMembers()
	if len(r.Members) == 0 {
		r.Members = nil
	}
	return r
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
	// Rejoin tells a rejoin: a restore into the members that came back,
	// in the run's epoch (RestoreRequest.Rejoin).
	Rejoin bool `json:"rejoin,omitempty"`
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
	// Released is the failed release that did not keep the checkpoint: it
	// is restored no more (events.CheckpointManifest.Released).
	Released string `json:"released,omitempty"`
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
	// Open names the operation left unfinished, which the next operation
	// finishes first: "checkpoint <id> (preparing)" or "(committing)",
	// "release <id>", or "restore <id>" (a restore left retiring, or
	// resumed without its outcome, included). Empty when none is.
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
