// Package member is the member runtime that every participant shares: the
// agent, the sandbox owner, sandboxd and the test participants. It is the
// member side of the checkpoint protocol (PROTOCOL.md §5).
//
// # Shape
//
// Machine is the member's phase machine, a pure core in the manner of
// etcd's raft: Step(now, input) returns effects, with no I/O and no clock
// of its own. Member is the driver: one loop goroutine owns the machine,
// consumes phase events, publishes acks, creates manifests and calls the
// participant; handlers that wait (a prepare's readiness, a commit's write,
// a restore's install) run in worker goroutines that the loop starts,
// cancels and waits for.
//
// A participant implements Participant (Prepare, with the PrepareFunc
// adapter) and, for what it can do, the one-method interfaces Exporter,
// Resumer, Installer, Retirer, Forgetter, Releaser, Parker and WriteHook.
// It calls Member.Notify when its readiness may have changed and
// Member.Admit before it starts or continues the work of an episode.
//
// # The rules the runtime keeps
//
//  1. States idle, preparing, prepared, committed, restored: idle -prepare->
//     preparing -ready-> prepared -commit-> committed; idle -restore->
//     restored, only on a member that has not served; any -resume-> idle.
//  2. Fencing: a phase for a resumed checkpoint id gets stale_checkpoint (the
//     last ResumedKept ids); another id while one is open gets
//     checkpoint_conflict; the wrong phase gets invalid_phase; retire, forget
//     and release are refused while a checkpoint is open ("resume first").
//     Retire marks the highest retired attempt per rollout until a forget,
//     and Admit refuses attempts at or below it (stale_attempt).
//  3. Idempotence: every answer is published once on its own ack subject
//     (jetstream.PublishOnce); a redelivered event whose ack exists is a
//     no-op; the answer of a successful prepare, commit or restore is
//     recorded per (checkpoint id, phase) and repeated for a duplicate phase
//     until the id is resumed. Export runs once per checkpoint id.
//  4. Lease: every accepted phase extends the lease to deadline + Grace,
//     never backwards; when it runs out the member resumes by itself.
//  5. Prepare waits for readiness outside the loop, asking again on Notify
//     and every PollEvery, and answers not ready, with its blockers, at
//     ReplyAt (a little before the deadline).
//  6. Commit re-checks readiness, refuses a scope that names one of its
//     restarts, exports once, streams the records to sp_records as JSON
//     lines (WriteRecords: sha256 as it goes, the stop signal checked
//     before each record) and creates its member manifest with Create. The
//     create runs in the loop, so a resume handled first means the manifest
//     is never created (PROTOCOL §7, invariant 2). With stop, the
//     participant's Parker runs once the checkpoint.committed outcome names
//     the member.
//  7. Restore reads the member's own manifest in the source checkpoint,
//     verifies size, sha256 and count over the whole object (ReadRecords,
//     ErrCorruptRecords), keeps the records in scope and installs them all
//     or none; the ack names the next attempts.
//  8. Epochs: a member serves the epoch of the first phase it handles;
//     phases of older epochs are ignored; a phase of a newer epoch after the
//     member has served supersedes it: Run stops every handler, publishes
//     MemberLeft with reason "superseded", and returns ErrSuperseded.
//
// # On the bus
//
// Run creates one durable pull consumer per process, with memory state
// (ConsumerName; DeliverNew when it creates it, so an existing one — a
// restarted process of the same member — resumes where it was), before it
// registers in sp_members, so no phase published after the registration
// is missed. It refreshes its key every third of the bucket's TTL, and on a
// clean stop publishes MemberLeft and deletes the key.
package member
