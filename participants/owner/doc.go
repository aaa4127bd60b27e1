// Package owner is the sandbox owner participant (PROTOCOL §5–§6): it owns
// one sandbox per session on a shared provider, lends it to the agent, and
// takes part in checkpoints as a member of the run (package
// participants/member).
//
// The wire side (the requests agents send, the records the owner exports,
// the client) is package ownerapi; Serve answers it on the bus.
//
// # Providers
//
// The owner declares what it asks of a sandbox provider (capabilities.go):
// Provider (Name, Start, Stop) always; Snapshotter (Caps, Snapshot, Fork,
// DeleteSnapshot) for the exported mode; Lister (Sandboxes) and Execer
// (Exec) when the provider has them. The concrete providers are in package
// provider.
//
// # Task kinds
//
// Config.TaskKind says what a task is: Spec builds a session's sandbox
// from the seed's task payload (a refusal is ErrBadTask, 400), Grade
// grades it at verify. A kind may also be a Setuper (Setup runs against
// the started sandbox) and a Forker (ForkSpec completes the spec of each
// fork a restore starts). The Execer a grade gets is a GradeSandboxes
// too: Fresh starts a sandbox of the grade's own (gr<n>-<session>, no
// session's, never snapshotted) for a grade that must not trust the
// session's sandbox. TaskFuncs makes a kind of functions. The
// scripted kind is participants/scripted's Kind, the command kind (a task
// defined in its JSON, docs/TASKS.md) participants/owner/commandkind's;
// `stillpoint owner --task-kind` chooses among the kinds the CLI knows.
//
// # Sessions
//
// A sandbox's first process is its daemon (sandboxd). The owner deletes the
// daemon's heartbeat when it stops the sandbox, and, with a provider that
// is an InitWatcher, when the init exits (inits.go): the bridge and the
// agents then take the daemon for gone at once, not after its heartbeat's
// TTL (PROTOCOL §3, Liveness).
//
// A session's sandbox is started on the provider and the task kind's setup
// runs against it; only when the setup succeeded is the session tracked.
// Setup may return a small JSON object, the session data, which is
// exported beside the snapshot and restored with it: what the grade must
// keep out of the agent's reach (the scripted kind pins its check there).
// A failing setup, or one returning anything but a JSON object (or
// nothing), stops the sandbox and tracks nothing.
//
//	s, err := o.StartSession(ctx, "sess-1", ep, provider.Spec{ID: "sess-1"})
//	s, err = o.RequireSandbox("sess-1") // ErrNoSandbox: answer 409
//	err = o.CloseSession(ctx, "sess-1") // the empty-body close; idempotent
//
// SeedSession is what a seed request calls: after a restore it returns the
// restored fork of the session (its setup does not run again) instead of
// starting a new sandbox; otherwise the task kind builds the sandbox from
// the task payload and the setup gets the payload too.
//
// # Modes
//
// New decides the mode once, at startup:
//
//  1. checkpointing off: ModeOff; Run joins no bus.
//  2. the owner lends no sandboxes: ModeRestartOnly.
//  3. the provider cannot snapshot (it is not a Snapshotter, or its Caps
//     say so): ModeRestartOnly, with one warning naming the provider.
//  4. otherwise ModeExported, which needs Config.StateDir and one worker.
//
// # Checkpoints
//
// Prepare closes admission: StartSession, SeedSession, EndSession and
// CloseSession called while a checkpoint is open wait for its resume (or
// for their ctx), but the service answers seed_session and verify 409
// admission_closed at once (an agent parking a run may be waiting on one:
// PROTOCOL §5, Readiness); requests already in flight finish, and Prepare
// reports ready once none is in flight. A grade in flight is no such
// request (PROTOCOL §6: a verify is a boundary): it goes on through the
// checkpoint, the end of its session waits for the resume, and the
// verdict is answered after it. In ModeRestartOnly Prepare reports every
// session's episode as a restart and is ready at once.
//
// Export snapshots every live session's sandbox as the snapshot
// <checkpoint>-<session> (made a token), indexes it in the sp_snapshots KV
// bucket (snapshot id -> ownerapi.IndexEntry {run, snapshot, owner,
// checkpoints}: a run's owners share the bucket, and each releases the
// entries that name it)
// and returns one record per session, keyed by its episode, with data an
// ownerapi.RecordData {session, sandbox: {provider, snapshot, sandbox_id},
// workdir, data}; and, for a session a verify ended, a record of its
// verdict ({session, verdict}, no sandbox), which a restored owner answers
// the session's verify with (graded.go).
//
// Install validates every record before it touches the provider, then
// forks every snapshot or none, stops the superseded sandboxes it still
// holds, and tracks the forks as the sessions' next attempts. Retire and
// EndSession stop sandboxes and keep their snapshots; Release deletes the
// snapshots no kept checkpoint names; Park stops the exported sandboxes
// after a commit with stop.
//
// A release reads the index whatever replica of a cluster answers: it
// writes the owner's mark key (_read.<hash of run and name>, not a token,
// so no snapshot id) through the stream's leader, reads a watch of the
// index until the mark's write shows, and deletes the mark again; other
// owners' marks that the watch shows are no entries, and are skipped.
package owner
