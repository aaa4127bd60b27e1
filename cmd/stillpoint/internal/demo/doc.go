// Package demo is `stillpoint demo`: the whole system on one machine, no
// outside service. It starts an embedded NATS server (or uses --nats-url),
// the bridge and a few nodes (each an agent and the sandbox owner that
// lends it sandboxes: agent a<i> and owner o<i>) as processes of the
// stillpoint binary itself, the scripted model server in process, and
// collects the bundled task set (controller-bridge/collect/tasks) through three checkpoints and
// a crash: after the second checkpoint it kills the agents and the owners
// with SIGKILL and starts them again, and the collector restores. It then
// checks the PROTOCOL §7 invariants on the run (controller-bridge/invariant) and prints them,
// ending with one line:
//
//	demo: <N> rollouts, <N> results, <C> continued in place, <R> relaunched, <K> checkpoints committed, invariants ok
//
// ChaosCommand is `stillpoint chaos` (chaos.go), on the same world: rounds
// of collection, each a run of its own on one NATS server process (or, with
// --cluster, three node processes), while faults drawn by a seed (or named
// by --plan) kill the bridge at a failpoint, an agent, an owner, the fleet,
// a sandbox daemon, a harness, the NATS server or a NATS node at a point of
// a checkpoint, take a node (an agent and its owner) down until a
// checkpoint commits without it, preempt the collector while a node is
// down, or stall an agent; after each round the invariants are
// checked, and a table at the end counts faults, checkpoints, restores,
// results and violations. docs/RELIABILITY.md says what each fault shows.
//
// It is the one package outside e2e/ that imports e2e/... (the task set):
// the cli package registers Command and ChaosCommand as its demo and chaos
// subcommands.
package demo
