// Package jetstream is the bus of the Stillpoint checkpoint protocol: the layout of streams and
// buckets on NATS JetStream (PROTOCOL.md §3), the code that creates and opens it, the two ways a
// member publishes, and the connection every process makes.
//
// It imports nats.go only, never nats-server, so that sandboxd, a small static binary, can use
// it. The embedded server for tests and single-node deployments is in jetstream/embedded; the
// test helper is jetstream/jstest; how participants talk on core NATS (inboxes by sequence, asking
// whether a member is there, asking again while nobody answers) is jetstream/live.
//
// # Layout
//
// One stream holds the whole conversation and is the audit log:
//
//	stream  STILLPOINT     subjects sp.>, Limits retention, file storage, MaxAge (7 days),
//	                       duplicate window (2 min), replicas (1 embedded, 3 on a cluster)
//	  sp.<run>.phase.<phase>                   phase events, published by the bridge only
//	  sp.<run>.ack.<seq>.<phase>.<member>      one ack per (phase event, member), once only
//	  sp.<run>.outcome.<noun>.<verb>           checkpoint.committed, restore.failed, ...
//	  sp.<run>.member.<member>                 joined / left
//	kv      sp_members     <run>.<member> heartbeats of agents and owners; a key lives the
//	                       bucket's max age (30 s) after its last write
//	kv      sp_daemons     <run>.sandbox.<name> heartbeats of sandbox daemons; likewise (2 min)
//	kv      sp_manifests   <run>.<checkpoint>[.<member>] created once; <run>.LATEST moved by
//	                       compare-and-set; <run>.HEAD; 16 revisions of history
//	kv      sp_snapshots   the owners' snapshot index: snapshot id -> checkpoints naming it
//	object  sp_records     <run>/<checkpoint>/<member>.<sha256 prefix>.jsonl, exported records
//	object  sp_records_<run>_<kind>_<name>   the same, of one member with credentials of its own
//	                       (made by the run's bridge when it asks, ServeStores; RecordStores
//	                       lists a run's)
//	object  sp_trajectories  <run>/<rollout>.jsonl, rollouts' trajectories; no release deletes them
//	object  sp_trajectories_<run>_agent_<name>   the same, of one agent with credentials of its
//	                       own (made likewise; TrajectoryStores lists a run's)
//
// The two heartbeats' buckets and the snapshot index are written by the members themselves, each
// with credentials that may write its own key (or, an owner, any key of the index): they are made
// as plain streams rather than by nats.go's KV create, which always allows roll-ups, so that one
// message a key is all they hold, no put may roll up (a "Nats-Rollup: all" on any key purged every
// key) and no one may purge them (plainKVStreamConfig). nats-server allows subject delete markers
// only with roll-ups: an expired heartbeat leaves none, and a reader judges a heartbeat's expiry
// by the time the server stored it plus its bucket's TTL (HeartbeatTTL, HeartbeatExpired,
// KVEntries), not by its absence. A delete (a KV-Operation DEL put) reads as gone at once.
//
// Topology holds what varies between deployments (replicas, ages, history). Provision creates
// whatever of the layout is missing and returns a Bus, a handle on all of it; it is idempotent and
// safe to run from every process at start. It never changes an object that exists, but to upgrade
// a store an earlier build made in place, keeping what it holds (sp_members and sp_snapshots made
// by the KV create get the plain stream's shape; the server will not take back sp_members'
// per-message TTLs, which it keeps): if one exists with a different configuration, it returns
// ErrConfigConflict naming each differing field with both values, for example
//
//	jetstream: config conflict: stream STILLPOINT: replicas 1, want 3; max_age 1h0m0s, want 168h0m0s
//
// and the operator decides (`nats stream edit`, or delete and provision again). Open only looks
// the layout up, for processes that must not create it; it returns ErrNotProvisioned naming
// what is missing.
//
// # Publishing
//
// Publishes that matter are synchronous and idempotent by construction. There are two kinds:
//
//   - PublishDedup is for events with an id of their own, such as phase events: the message
//     carries Nats-Msg-Id (the CloudEvent id), and the server stores a repeat inside the duplicate
//     window only once, answering with an ack whose Duplicate is set. After the window a repeat
//     is stored again, so dedup alone bounds repeats in time only. The window spans the whole
//     stream: an id another client can tell beforehand it can publish first, anywhere in the
//     stream, and the real publish is answered as a duplicate of that. Ids of publishes that may
//     be repeated come from events.MsgIDs (PROTOCOL §4).
//   - PublishOnce is the once-only ack. It publishes with the expected last subject sequence 0:
//     the subject must be empty. Each ack has a subject of its own, so a member can ack a phase
//     once, forever: a repeat (a redelivered phase, a member restarted mid-reply) is refused,
//     inside the window as a duplicate and after it with error 10071 (wrong last sequence). Both
//     come back as ErrAlreadyDone, which the member treats as success: its ack is already on the
//     bus. IsWrongLastSequence tells the second case apart.
//
// # Reading
//
// LeaderLastMsg reads the last message of a subject from the stream's leader (STREAM.MSG.GET):
// what a decision rests on, such as the bridge's fence of its next phase, since a direct get may
// be answered by a replica that has not applied the last writes. DirectGet (and Direct, its
// natsjs.Stream-like form) is the subject form of a direct get, for a member whose user may read
// only its own subjects.
//
// # Connecting
//
// ConnConfig names the servers (comma-separated for a cluster) and one way to authenticate: a
// .creds file, an nkey seed file or a token. Connect reconnects forever, since a member must
// outlive a server restart or a cluster failover; pass nats.Options to add handlers.
package jetstream
