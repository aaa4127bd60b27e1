// Package member is the member runtime that every participant shares: the
// agent, the sandbox owner, sandboxd and the test participants. It is the
// member side of the checkpoint protocol (docs/PROTOCOL.md §5); how it is
// built, and why, is in docs/MEMBER.md.
//
// # Using it
//
// A participant implements Participant (Prepare; PrepareFunc adapts a
// function) and, for what it can do, the one-method interfaces Exporter,
// Resumer or Continuer, Installer, Retirer, Forgetter, Releaser and
// Parker. New(Config) checks the config; Run(ctx) registers the member,
// answers phases until ctx ends, and leaves. The participant calls
// Member.Notify when its readiness may have changed, and Member.Admit
// before it starts or continues the work of an episode.
//
// # Shape
//
// Machine is the phase machine, pure in the manner of etcd's raft:
// Step(now, input) returns effects, with no I/O and no clock of its own.
// It holds everything the protocol decides: state, open checkpoint, lease
// (§5 Lease), fences and recorded replies (§5 Fencing, Idempotence), what
// each open checkpoint exported (§5 commit: export once), retire marks and
// epoch (§5 Epochs fence zombies). Member is the driver: one loop goroutine
// owns the machine, takes feed.Deliveries from its feed, publishes acks and
// creates manifests; handlers that wait (a prepare's readiness, a commit's
// write, a restore's install, a park) run in workers that the loop starts,
// cancels and waits for.
//
// # Feeds
//
// A member reads the run's phases (§3) through a feed of package feed:
// one durable consumer of its own (feed.Durable: ConsumerName,
// DurableConfig; the committed outcomes a stop commit parks on come then
// on a core subscription), or, with Config.StateFile, no consumer at all
// (feed.Core): a core-NATS subscription of the run's phases that catches
// up from the stream by direct get at start, after a reconnect and at a
// gap in the phase sequence, keeping its position in that file (§3:
// thousands of sandbox daemons, and a stream whose consumers do not grow
// with them; for a sandbox's own user, Config.NoPull, by the newest phase
// of each kind), or from a Source that a process shares among its members
// (Config.Source; membertest.Host is one).
//
// # Floor
//
// Package member is the shared floor of the participants: the agent, the
// owner and sandboxd import it, and it imports none of them, nor the
// bridge. sandboxd/daemon importing it is the one import that runs up the
// house (docs/ARCHITECTURE.md): a sandbox daemon is a member. Below it
// are only events, jetstream and internal packages, and its own feed.
//
// # Records
//
// A commit takes the participant's export one record at a time (TakeExport),
// writes it to sp_records, or to its own store (OwnRecords,
// events.RecordsBucket) when it connects with credentials of its own
// (WriteRecords), and its once-only commit ack carries their manifest, the
// manifest's one record: the machine answers in the loop, so a resume
// handled first means no ack ever carries it (§5, §7 invariant 2). A
// repeat the server refuses is compared with the ack recorded first
// (CheckRecorded). A restore finds its manifest (FindManifest: its own
// commit ack of the source's commit, the checkpoint's member list once the
// ack aged out, a schema-1 run's member key), reads and verifies the
// records (ReadRecordsAt) and installs them all or none.
package member
