// Package chaos is the chaos injector (e2e/cmd/chaos, `make chaos`, `make
// soak`, the fault matrix of e2e/faults), a test of the whole system kept
// out of the production binary. It runs the demo's world (demo.Fleet) in
// rounds of collection, each a run of its own on one NATS server process
// (or, with --cluster, three node processes, each `chaos node`), while
// faults drawn by a seed (or named by --plan) kill the bridge at a
// failpoint, an agent, an owner, the fleet, a sandbox daemon, a harness,
// the NATS server or a NATS node at a point of a checkpoint, take a node
// (an agent and its owner) down until a checkpoint commits without it,
// preempt the collector (then `chaos collect`, a process of its own) while
// a node is down, or stall an agent. After each round the PROTOCOL §7
// invariants are checked (controller-bridge/invariant), and a table at the
// end counts faults, checkpoints, restores, results and violations.
// docs/RELIABILITY.md says what each fault shows.
package chaos
