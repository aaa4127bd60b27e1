package member

import (
	"time"

	"github.com/stillpoint/stillpoint/events"
)

// Input is something that happens to a member: a phase event, a worker's
// result, or the passing of time. Only this package's types implement it.
type Input interface{ input() }

// PhaseReceived is a decoded phase event.
type PhaseReceived struct {
	Data events.PhaseEvent
	// BeforeStart tells that the phase was published before this process
	// of the member started, and that the process keeps no state of an
	// earlier one (no state file): a prepare so published addressed the
	// process before it, whose work died with it, and a member that has
	// served nothing refuses it (events.CodeRestarted), staying one a
	// restore can go into (PROTOCOL §5, Restarted members).
	BeforeStart bool
}

// LeaseTick asks the machine whether its lease has run out.
type LeaseTick struct{}

// ReadinessReported is a prepare wait's answer: the participant became
// ready, or the reply time came first, or Prepare failed.
type ReadinessReported struct {
	Op     uint64
	Report Report
	Err    error
}

// RecordsWritten says a commit's records are in the object store (Manifest
// describes them), or why not (Err). Export is what the commit exported,
// when it exported (nil when it reused the checkpoint's export or when the
// export itself failed): the machine keeps it for every later commit of
// the checkpoint and for Park, even when the write failed.
type RecordsWritten struct {
	Op       uint64
	Export   *Export
	Manifest events.MemberManifest
	Err      *events.AckError
}

// RestoreFinished says a restore installed its records (Restored are the
// next-attempt capture keys), or why not.
type RestoreFinished struct {
	Op       uint64
	Restored []string
	Err      *events.AckError
}

// CallFinished says a retire, forget, release or branch call on the
// participant returned; Deleted is what a release deleted, Branched the
// capture keys a branch installed.
type CallFinished struct {
	Op       uint64
	Deleted  []string
	Branched []string
	Err      *events.AckError
}

// OutcomeReceived is a checkpoint.committed outcome seen on the bus.
type OutcomeReceived struct{ Committed events.CheckpointCommitted }

// PhasesMissed says the feed missed phases it cannot read again, and that
// the next phase it delivers belongs to operation Next (a checkpoint,
// restore or operation id) of Epoch. A sandbox daemon's own user reads
// only the newest phase of each kind (PROTOCOL §3, Consumers): the end of
// an operation older than those may be gone. The bridge runs one
// operation at a time, so one open on the member that is not Next, in
// that epoch, has ended: resumed, or, when StopCommit names it (the
// newest commit, which had stop), committed with stop.
type PhasesMissed struct {
	Next       string
	Epoch      uint64
	StopCommit string
}

func (PhaseReceived) input()     {}
func (LeaseTick) input()         {}
func (ReadinessReported) input() {}
func (RecordsWritten) input()    {}
func (RestoreFinished) input()   {}
func (CallFinished) input()      {}
func (OutcomeReceived) input()   {}
func (PhasesMissed) input()      {}

// Export is what one checkpoint exported (PROTOCOL §5, commit: export once
// per checkpoint id): the scope it was exported for and the records, in
// the order the participant gave them. The machine keeps it until the
// checkpoint is reopened; nobody changes it.
type Export struct {
	Scope   []events.Episode
	Records []events.Record
}

// reasonResume is the Reopen reason of a resume phase (the one reopen that
// an ack follows).
const reasonResume = "resume"

// reasonMissed is the Reopen reason of an operation whose end the feed
// missed (PhasesMissed).
const reasonMissed = "ended while its phases were missed"

// Effect is something the driver must do. Effects come in the order they
// must be done. Only this package's types implement it.
type Effect interface{ effect() }

// Reply answers the phase event with sequence Header.Seq: publish the ack
// once, then acknowledge the JetStream message.
type Reply struct {
	// Phase is the phase answered.
	Phase events.Phase
	// Header is the ack header (TookMS left zero).
	Header events.AckHeader
	body   func(events.AckHeader) events.Data
}

// Ack builds the ack payload, with TookMS from took.
func (r Reply) Ack(took time.Duration) events.Data {
	h := r.Header
	h.TookMS = max(took.Milliseconds(), 0)
	return r.body(h)
}

// Drop acknowledges the event with sequence Seq without answering it: it
// belongs to an older epoch or is not addressed to this member.
type Drop struct {
	Seq    uint64
	Reason string
}

// Supersede says a newer epoch has started without this member: stop
// everything, touch no shared state, leave the event with sequence Seq for
// whoever serves the new epoch. The machine is done: it ignores every
// input from then on (Machine.Superseded).
type Supersede struct {
	Seq   uint64
	Epoch uint64
	Newer uint64
}

// WaitReady starts a prepare wait: call the participant's Prepare until it
// is ready or ReplyAt comes, then report ReadinessReported{Op}.
type WaitReady struct {
	Op         uint64
	Checkpoint Checkpoint
	ReplyAt    time.Time
}

// WriteCommit starts a commit: re-check readiness, refuse restarts in
// scope, export (unless Export holds what the checkpoint already
// exported: then write those records again), write the records and report
// RecordsWritten{Op}.
type WriteCommit struct {
	Op       uint64
	Commit   events.Commit
	Restarts []string
	Export   *Export
}

// InstallRestore starts a restore: read and verify the member's records,
// install them, and report RestoreFinished{Op}.
type InstallRestore struct {
	Op      uint64
	Restore events.Restore
}

// CallParticipant calls the participant's Retirer, Forgetter or Releaser
// for the phase in Data, or reads the parents' records and calls its
// Brancher for a branch, and reports CallFinished{Op}.
type CallParticipant struct {
	Op   uint64
	Data events.PhaseEvent
}

// Reopen ends the open checkpoint CheckpointID: cancel every handler of
// it and wait until each has stopped, then reopen admission through the
// participant's Continuer or Resumer. The machine has already dropped
// what the checkpoint exported.
type Reopen struct {
	CheckpointID string
	// Reason says why: "resume", "lease expired", "prepare failed",
	// "restore failed", reasonMissed.
	Reason string
}

// Park asks the participant to park what it exported for the stop commit
// CheckpointID (Records, as exported), best effort.
type Park struct {
	CheckpointID string
	Records      []events.Record
	// LeaseExpired says the outcome never came: the lease ran out first.
	LeaseExpired bool
}

func (Reply) effect()           {}
func (Drop) effect()            {}
func (Supersede) effect()       {}
func (WaitReady) effect()       {}
func (WriteCommit) effect()     {}
func (InstallRestore) effect()  {}
func (CallParticipant) effect() {}
func (Reopen) effect()          {}
func (Park) effect()            {}
