package machine

import (
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
)

// Input is something the machine is told: what the controller asks, what
// the bus shows, or that time passed. Only this package's types implement
// it.
type Input interface{ input() }

// View is the run as the driver read it from the stream and KV just
// before an ask. Which fields an ask needs is said on each ask.
type View struct {
	// Seq, Epoch and Last are the run's last phase event (Seq and Epoch
	// from the run's head record once the event aged out; Last is nil
	// then, and before the first phase). StreamSeq is its stream sequence,
	// the fence of the next publish; LastID its ce-id; LastAt its time.
	Seq       uint64
	StreamSeq uint64
	Epoch     uint64
	Last      events.PhaseEvent
	LastID    string
	LastAt    time.Time
	// Members are the live members the operation addresses: the members of
	// the run's epoch (and fresh ones), or for a restore the fresh members
	// only. Sorted.
	Members []events.Member
	// Instances are the process instances of Members as their heartbeats
	// said (a checkpoint's outcome names them); may be nil.
	Instances map[events.Member]string
	// Manifest is the checkpoint key that the ask names: a checkpoint's own
	// id (nil: it does not exist yet), or a restore's source.
	Manifest *events.CheckpointManifest
	// Latest is LATEST (a restore without a source).
	Latest *events.Latest
	// Previous is LATEST's manifest, its members loaded (a new
	// checkpoint: what it carries forward); nil before the first commit.
	Previous *events.CheckpointManifest
	// Sources are the manifests a restore's source carries episodes
	// from, by id (nil: not found), members loaded.
	Sources map[string]*events.CheckpointManifest
	// Checkpoints are every checkpoint key of the run, oldest first (a
	// release).
	Checkpoints []events.CheckpointManifest
	// StreamMaxAge is how long the stream keeps a message (a restore),
	// when age is its only limit; 0 when another limit (messages, bytes)
	// may drop old messages first, or it is not known.
	StreamMaxAge time.Duration
}

// CheckpointAsked asks for a checkpoint. View: the run's last phase, the
// members of its epoch, and Manifest, the key of Request.ID (none when the
// controller left the id empty: the machine then makes a new one).
type CheckpointAsked struct {
	Request bridgeapi.CheckpointRequest
	View    View
}

// CommitAsked commits the held checkpoint ID. View: the run's last phase,
// which must still be the held checkpoint's.
type CommitAsked struct {
	ID   string
	Stop bool
	View View
}

// AbortAsked abandons the held checkpoint ID. View: the run's last phase.
type AbortAsked struct {
	ID   string
	View View
}

// Shutdown says the bridge stops: a held checkpoint is abandoned (the
// fleet must not wait for a lease to run out). View: the run's last phase.
type Shutdown struct{ View View }

// RestoreAsked asks for a restore. View: the run's last phase, the fresh
// members, LATEST and Manifest, the key of the source (Request.Source, or
// LATEST's checkpoint when it is empty).
type RestoreAsked struct {
	Request bridgeapi.RestoreRequest
	View    View
}

// RetireAsked asks every member to refuse the given attempts from now on.
// View: the run's last phase and the members of its epoch.
type RetireAsked struct {
	Episodes []events.Episode
	View     View
}

// ForgetAsked asks every member to drop the refusal marks of rollouts.
// View: the run's last phase and the members of its epoch.
type ForgetAsked struct {
	Rollouts []string
	View     View
}

// ReleaseAsked asks the fleet and the bridge to delete what no kept
// checkpoint names. View: the run's last phase, the members of its epoch
// and every checkpoint key.
type ReleaseAsked struct {
	Request bridgeapi.ReleaseRequest
	View    View
}

// BranchAsked asks to branch rollouts of a committed checkpoint
// (PROTOCOL §5, Branch). Request.Seed is the base seed (the driver draws
// one when the controller gave none). View: the run's last phase, the
// live members of its epoch (Members: who must hold the parents, and whom
// a failure retires the branches on), LATEST, Manifest (the source, its
// members loaded) and Sources (what it carries from).
type BranchAsked struct {
	Request bridgeapi.BranchRequest
	View    View
	// History is what the run's earlier branch phases named.
	History BranchHistory
}

// BranchHistory is what a run's branch phases named: each branch rollout
// with the highest attempt named (a branch made again names a later one),
// and the operations' ids.
type BranchHistory struct {
	Rollouts map[string]int
	Ops      map[string]bool
}

// Recover starts the replay of the run's open operation into an idle
// machine: History is its phase events as the stream holds them, oldest
// first, from the operation's first phase (prepare, restore, retire,
// forget or release) to the run's last phase. The machine answers with
// the reads it needs (ReadManifest, ReadOutcome); once it asks for none,
// Open describes the operation and Replayed carries on with what remains.
//
// Previous is LATEST's manifest, members loaded, when the operation is a
// checkpoint: what its commit carries forward (View.Previous).
type Recover struct {
	History  []PhasePublished
	Previous *events.CheckpointManifest
	// Members are the live members of the run's epoch when the operation
	// is a branch: whom its failure retires the branches on.
	Members []events.Member
}

// Replayed says the replay is complete: the machine carries on with what
// remains of the operation, or finds nothing open and goes idle.
type Replayed struct{}

// PhasePublished says a phase event is on the stream: the one the machine
// asked to publish (PublishPhase), or one of the history (Recover).
type PhasePublished struct {
	Event events.PhaseEvent
	// StreamSeq is its stream sequence, ID its ce-id, At its publish time.
	StreamSeq uint64
	ID        string
	At        time.Time
}

// GatherStarted answers StartGathering: the acks of phase Seq are being
// read. Backlog is the stream sequence of the last ack already recorded
// when the gathering started, 0 if there was none: until an ack at or past
// it is seen, a passed deadline does not fail the phase.
type GatherStarted struct {
	Seq     uint64
	Backlog uint64
}

// AckSeen is a message on the ack subjects of the phase gathered, with its
// stream sequence. Ack is nil for a message that did not decode as an ack
// (the driver logs it); it still counts towards the backlog.
type AckSeen struct {
	Ack       events.Ack
	StreamSeq uint64
}

// Gone says why a member is gone.
type Gone uint8

// The reasons a member is gone.
const (
	// GoneNotAlive: it had no heartbeat when the phase started.
	GoneNotAlive Gone = iota
	// GoneReplaced: another process took its name during the phase.
	GoneReplaced
	// GoneLeft: its heartbeat expired or was deleted during the phase.
	GoneLeft
	// GoneSilent: it had not answered, and nothing answered on its alive
	// subject (events.AliveSubject): its connection is gone.
	GoneSilent
)

var goneNames = [...]string{"member not alive at the phase's start",
	"member replaced by a new process during a phase", "member died or left during a phase",
	"member silent, and nothing answers for it: its connection is gone"}

// String says it in words.
func (g Gone) String() string {
	if int(g) < len(goneNames) {
		return goneNames[g]
	}
	return "member gone"
}

// MemberGone says a member of the gathered phase is gone (the driver
// watches heartbeats when StartGathering asks it to).
type MemberGone struct {
	Member events.Member
	Why    Gone
}

// MemberListWritten answers WriteMemberList: the object is stored.
type MemberListWritten struct{}

// ManifestCreated answers CreateManifest: the checkpoint key as it is
// now. Created is false when it existed already: then Manifest is what was
// there (committed, or an abort marker), not what was asked.
type ManifestCreated struct {
	Manifest events.CheckpointManifest
	Created  bool
}

// ManifestFound answers ReadManifest: the checkpoint key, nil if absent.
type ManifestFound struct{ Manifest *events.CheckpointManifest }

// LatestMoved answers MoveLatest: LATEST names the checkpoint, or a later
// one.
type LatestMoved struct{}

// OutcomePublished answers PublishOutcome: the outcome is on the stream
// (published now, or found there).
type OutcomePublished struct{ Type events.Type }

// OutcomeSeen answers ReadOutcome: the outcome of that type and operation
// on the stream, nil if there is none.
type OutcomeSeen struct {
	Type events.Type
	Data events.Data
}

// CheckpointsListed answers ListCheckpoints: every checkpoint key of the
// run, oldest first.
type CheckpointsListed struct {
	Checkpoints []events.CheckpointManifest
	// Purged are the checkpoints whose key the release asked about
	// purged already: deleted by it before its bridge died.
	Purged []string
}

// CheckpointsDeleted answers DeleteCheckpoints.
type CheckpointsDeleted struct{}

// ReleasedMarked answers MarkReleased.
type ReleasedMarked struct{}

// Tick says time passed: a timer the machine set (SetTimer) ran out.
type Tick struct{}

// EffectFailed says the driver could not carry out the last effect that
// asks for an answer (a publish refused as fenced wraps
// bridgeapi.ErrFenced; anything else is the bus). The operation ends with
// Err, except a held checkpoint's renew, which is tried again.
type EffectFailed struct{ Err error }

func (CheckpointAsked) input()    {}
func (CommitAsked) input()        {}
func (AbortAsked) input()         {}
func (Shutdown) input()           {}
func (RestoreAsked) input()       {}
func (RetireAsked) input()        {}
func (ForgetAsked) input()        {}
func (ReleaseAsked) input()       {}
func (Recover) input()            {}
func (BranchAsked) input()        {}
func (Replayed) input()           {}
func (PhasePublished) input()     {}
func (GatherStarted) input()      {}
func (AckSeen) input()            {}
func (MemberGone) input()         {}
func (MemberListWritten) input()  {}
func (ManifestCreated) input()    {}
func (ManifestFound) input()      {}
func (LatestMoved) input()        {}
func (OutcomePublished) input()   {}
func (OutcomeSeen) input()        {}
func (CheckpointsListed) input()  {}
func (CheckpointsDeleted) input() {}
func (ReleasedMarked) input()     {}
func (Tick) input()               {}
func (EffectFailed) input()       {}
