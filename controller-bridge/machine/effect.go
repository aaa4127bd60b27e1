package machine

import (
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
)

// Effect is something the driver must do. Effects come in the order they
// must be done. An effect that asks for an answer (a publish, a read, a
// write) is the last of its batch; the driver answers it with the input
// its doc names, or EffectFailed.
type Effect interface{ effect() }

// PublishPhase publishes Event, fenced: with the expected last stream
// sequence Fence on the run's phase subjects, so that the server refuses
// it if another bridge published in between. Answer: PhasePublished, or
// EffectFailed wrapping bridgeapi.ErrFenced.
type PublishPhase struct {
	Event events.PhaseEvent
	Fence uint64
}

// StartGathering starts reading the acks of phase Event (every ack on its
// ack subjects, those already recorded first). With Watch the driver also
// watches the heartbeats of its members and reports MemberGone; without,
// the machine only wants the acks already recorded. Fresh marks a phase
// this machine has just published: none of its acks is recorded from
// before, so the driver need not find out how many (GatherStarted's
// Backlog is 0). Answer: GatherStarted, then AckSeen and MemberGone until
// StopGathering.
type StartGathering struct {
	Event events.PhaseEvent
	Watch bool
	Fresh bool
}

// StopGathering stops reading the acks of phase Seq. Decided tells that
// the phase was decided live (the fleet answered, failed, or ran out of
// time), not only read back from the stream.
type StopGathering struct {
	Phase   events.Phase
	Seq     uint64
	Decided bool
}

// SetTimer asks for a Tick After from now. A later SetTimer replaces it.
type SetTimer struct{ After time.Duration }

// WriteMemberList puts the checkpoint's member list, Data (the bytes of
// events.EncodeMemberList, which name it), as Object in the bridge's
// object store. The name is the content's: writing it again writes the
// same bytes. Answer: MemberListWritten.
type WriteMemberList struct {
	CheckpointID string
	Object       string
	Data         []byte
}

// CreateManifest creates the checkpoint key once (never replacing it):
// the checkpoint manifest, the commit point, or an abort marker (Aborted),
// after which the checkpoint can never exist. Answer: ManifestCreated.
type CreateManifest struct{ Manifest events.CheckpointManifest }

// MoveLatest points LATEST at Latest by compare-and-set, unless it already
// names that checkpoint or one committed later (a higher CommitSeq).
// Answer: LatestMoved.
type MoveLatest struct{ Latest events.Latest }

// PublishOutcome publishes Outcome of operation ID once, with an id made
// of the run, ID and the outcome's noun (a repeat inside the stream's
// duplicate window is dropped); for an operation Replayed from the stream,
// only if the stream does not hold it already (its first bridge may have
// published it longer ago than the window). Answer: OutcomePublished.
type PublishOutcome struct {
	ID       string
	Outcome  events.Data
	Replayed bool
}

// ListCheckpoints lists every checkpoint key of the run, and the keys
// release Release purged already (a bridge that died in it did). Answer:
// CheckpointsListed.
type ListCheckpoints struct{ Release string }

// Deletion is one checkpoint a release deletes.
type Deletion struct {
	CheckpointID string
	// KeepMarker keeps the key itself: an abort marker stays forever
	// (PROTOCOL §7, invariant 2); only what its members wrote goes.
	KeepMarker bool
}

// DeleteCheckpoints deletes, for each of Delete, its records, its member
// manifests and then (unless KeepMarker) its key, in that order; then it
// purges LATEST unless LATEST names one of Keep. Before it deletes
// anything of a committed checkpoint it sets Mark on it: its members
// have already deleted their side, and a bridge killed half-way leaves a
// manifest that says it restores no more. Answer: CheckpointsDeleted.
type DeleteCheckpoints struct {
	Delete []Deletion
	Keep   []string
	Mark   events.ReleaseMark
}

// MarkReleased sets Mark on every committed checkpoint of the run not in
// Keep, merging what an earlier mark says: a failed release leaves them
// restorable no more. Answer: ReleasedMarked.
type MarkReleased struct {
	Keep []string
	Mark events.ReleaseMark
}

// ReadManifest reads the checkpoint key of CheckpointID. Answer:
// ManifestFound.
type ReadManifest struct{ CheckpointID string }

// ReadOutcome reads the run's last outcome of Type and tells whether it is
// operation ID's. Answer: OutcomeSeen.
type ReadOutcome struct {
	Type events.Type
	ID   string
}

// WatchResume asks the driver to check, in the background, that every
// member acks Event within its deadline, and to log those that do not: a
// resume is never waited for (a member that misses it reopens when its
// lease runs out).
type WatchResume struct{ Event events.Resume }

// Level is how much a Note matters.
type Level uint8

// The levels of a Note.
const (
	LevelDebug Level = iota
	LevelInfo
	LevelWarn
	LevelError
)

// Note is something worth a log line that no other effect shows: a member
// excused or failed, an ack ignored, a decision.
type Note struct {
	Level  Level
	Msg    string
	Member events.Member // "" when it names none
}

// Finish ends the operation the controller asked for: with one of its
// results (a failure of the fleet is a result, Status failed), or with Err
// when something kept the machine from deciding (fenced, the bus).
type Finish struct {
	Checkpoint *bridgeapi.CheckpointResult
	Restore    *bridgeapi.RestoreResult
	Op         *bridgeapi.OpResult
	Branch     *bridgeapi.BranchResult
	Err        error
}

func (PublishPhase) effect()      {}
func (StartGathering) effect()    {}
func (StopGathering) effect()     {}
func (SetTimer) effect()          {}
func (WriteMemberList) effect()   {}
func (CreateManifest) effect()    {}
func (MoveLatest) effect()        {}
func (PublishOutcome) effect()    {}
func (ListCheckpoints) effect()   {}
func (DeleteCheckpoints) effect() {}
func (MarkReleased) effect()      {}
func (ReadManifest) effect()      {}
func (ReadOutcome) effect()       {}
func (WatchResume) effect()       {}
func (Note) effect()              {}
func (Finish) effect()            {}
