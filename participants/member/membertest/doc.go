// Package membertest holds what tests of members need, against a real
// embedded NATS server (jetstream/jstest), never a mock.
//
//   - Participant: a configurable test participant. It holds a set of
//     episodes; readiness can be held back per episode (Block, Unblock,
//     Hold); it exports one record per live episode; install, prepare,
//     export and park can be told to fail; its exports can be paced per
//     record (SetWriteHook) so that a test can resume in the middle of a
//     commit's write; every call is recorded (Calls, Count).
//   - Run: the conformance suite every participant passes (rules_*.go). A
//     participant package supplies a Suite that builds its participant
//     as a Subject (Pacer paces an Exporter's records; a Subject that runs
//     its member beside other work is a Runner); the suite builds and runs
//     the Member, plays the bridge (Bridge: phases published with
//     events.Marshal and jetstream.PublishDedup, acks read from the stream)
//     and checks the rules of PROTOCOL.md §5, one subtest per rule, each
//     named after its section.
//   - RunAsker: the rules every asker of sandbox daemons passes (the
//     bridge, the agent), against a SilentDaemon: a daemon whose acks were
//     lost on the way, which says its ack only when asked with the phase
//     named (rules_asking.go).
//   - StartMember and StartMembers: members running in-process against a
//     jstest.Env, for bridge tests (agent.t0, agent.t1, ... by default),
//     returning Handles to control readiness and failures and to stop them.
//   - Intruder: a hostile client of the bus that reads every message id
//     on the stream and publishes first the ids that a scheme derived from
//     what the bus shows would give next (PROTOCOL §4), for tests that the
//     publishes to come still land.
//   - Host: one consumer for every member of a process (a feed.Source),
//     as a benchmark or a large fleet in one test runs them (StartHost,
//     Options.Host).
package membertest
