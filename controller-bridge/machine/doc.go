// Package machine is the controller bridge's checkpoint and restore
// machine: the bridge rules of PROTOCOL §5 as a pure core, in the manner
// of etcd's raft RawNode. It does no I/O, reads no clock, starts no
// goroutine and logs nothing: Step(now, input) returns effects, and the
// driver (package bridge) carries them out and feeds back what it
// observes. One machine holds at most one operation open (PROTOCOL §5:
// one checkpoint open per run).
//
// # Inputs
//
// What the controller asks, each with the View the driver read just
// before (the run's last phase, its members, the key the ask names):
// CheckpointAsked, CommitAsked and AbortAsked (a held checkpoint),
// RestoreAsked, RetireAsked, ForgetAsked, ReleaseAsked, and Shutdown.
//
// What the bus shows: PhasePublished (a phase on the stream, with its
// stream sequence, ce-id and time), GatherStarted, AckSeen and MemberGone
// (a member that died, left or was replaced while its phase ran),
// MemberListWritten, ManifestCreated (created, or found: committed or an
// abort marker), ManifestFound, LatestMoved, OutcomePublished and
// OutcomeSeen, CheckpointsListed, CheckpointsDeleted, ReleasedMarked;
// EffectFailed when the driver could not do what was asked (a publish
// refused as fenced, the bus).
//
// Time: Tick, when a timer the machine set runs out (a deadline, the
// renew of a held checkpoint). Every Step gets now; deadlines are now plus
// a timeout, and SetTimer says how long the driver waits.
//
// # Effects
//
// In the order they are to be done: PublishPhase (the machine builds the
// event: sequence, epoch, deadline, members, scope; the fence is the
// stream sequence of the run's last phase), StartGathering and
// StopGathering (with whether heartbeats are watched), WriteMemberList,
// CreateManifest (the checkpoint manifest or the abort marker),
// MoveLatest, PublishOutcome, ListCheckpoints, DeleteCheckpoints and
// MarkReleased (a release), ReadManifest and ReadOutcome (a replay), SetTimer, WatchResume
// (a resume is checked in the background, never waited for), Note (a log
// line), and Finish, which ends the operation with its bridgeapi result or
// an error. An effect that asks for an answer is the last of its batch.
//
// # States
//
// StateIdle, then per operation: StatePreparing → StateHeld (a checkpoint
// held for an outer save) → StateCommitting → StateVerifying →
// StateCommitted, or StateAborting from any of them; StateRestoring →
// StateRestored or StateRestoreFailing; StateOperating (retire, forget);
// StateReleasing; and StateReplaying for recovery. State.String names
// each; CheckTransition refuses a transition that successors does not
// list, naming both states.
//
// # Rules
//
// PROTOCOL §5, Bridge rules, and §7: the checkpoint manifest is the commit
// point, and an abort creates the checkpoint key as an abort marker before
// anything else (§7, invariant 2), so whoever creates the key first
// decides. A restore opens the next epoch and is all or none. Acks of
// another epoch, sequence or checkpoint are ignored; a member's second
// ack is a repeat (a daemon says its ack again when asked), noted at
// debug level; a sandbox daemon that is gone is left out rather than
// failing the phase; acks already recorded count whatever the time. A
// release deletes the bridge's side only if every member released, and
// keeps abort markers.
//
// # Recovery by replay
//
// A bridge that starts reads the open operation's phase events back from
// the stream and feeds them to a fresh machine (Recover); the machine asks
// what it needs to know of the end (ReadManifest, ReadOutcome), Open then
// names the open operation, and Replayed makes it carry on, emitting only
// what remains. docs/BRIDGE.md says what each kind of open operation
// becomes.
package machine
