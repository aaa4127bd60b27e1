// Package demo is `stillpoint demo`: the whole system on one machine, no
// outside service. It starts an embedded NATS server (or uses --nats-url),
// the bridge and a few nodes (each an agent and the sandbox owner that
// lends it sandboxes: agent a<i> and owner o<i>) as processes of the
// stillpoint binary itself, the scripted model server in process, and
// collects the bundled task set (controller-bridge/collect/tasks) through
// three checkpoints and a crash: after the second checkpoint it kills the
// agents and the owners with SIGKILL and starts them again, and the
// collector restores. It then checks the PROTOCOL §7 invariants on the run
// (controller-bridge/invariant) and prints them, ending with one line:
//
//	demo: <N> rollouts, <N> results, <C> continued in place, <R> relaunched, <K> checkpoints committed, invariants ok
//
// Fleet is the world of one run (the bridge and the nodes as processes
// of the stillpoint binary, the scripted model server in process): the
// demo runs on one, and the chaos injector (e2e/chaos, not part of the
// binary) runs each of its rounds on one. The cli package registers
// Command as its demo subcommand.
package demo
