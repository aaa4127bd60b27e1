// Package demo is `stillpoint demo`: the whole system on one machine, no
// outside service. It starts an embedded NATS server (or uses --nats-url),
// the bridge, a sandbox owner and a few agents as processes of the
// stillpoint binary itself, the scripted model server in process, and
// collects the bundled task set (e2e/tasks) through three checkpoints and
// a crash: after the second checkpoint it kills the agents and the owner
// with SIGKILL and starts them again, and the collector restores. It then
// checks the PROTOCOL §7 invariants on the run (internal/invariant) and prints them,
// ending with one line:
//
//	demo: <N> rollouts, <N> results, <C> continued in place, <R> relaunched, <K> checkpoints committed, invariants ok
//
// It is the one package outside e2e/ that imports e2e/... (the task set):
// the cli package registers Command as its demo subcommand.
package demo
