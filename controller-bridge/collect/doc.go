// Package collect is a rollout collection that survives any crash: the
// controller's part that a training loop plays in production, and what
// `stillpoint collect` and `stillpoint demo` run.
//
// A Collector reads tasks (rollout id + task payload), dispatches them as
// rollouts to the run's agents over the bus with bounded concurrency, and
// writes every result exactly once to an output JSONL file. Before each
// dispatch it appends (rollout, attempt) to a dispatch log and syncs it, so
// that a collector started again knows everything that may be running.
//
// It checkpoints through the controller bridge on a timer, on request
// (CheckpointNow, SIGUSR1 in the CLI) and once with stop (Stop, SIGTERM),
// and after each commit releases all but the newest Keep checkpoints.
// It names every checkpoint it asks for: when the answer is lost (the
// bridge died or restarted under the request) it asks the bridge again for
// the same id, and the bridge, having finished what its predecessor left
// open, answers what became of it. The summary then counts that checkpoint
// once, with the timings the bridge recorded.
//
// Started again with the same run (or when it sees the agents and the
// owner restarted under it), it recovers: if the fleet is fresh it restores
// LATEST, sends every continued rollout as its restored attempt (the agent
// continues it from its bookmark), retires the restored attempts of
// rollouts already in the output, and retires every other dispatched but
// unfinished attempt and sends it again one attempt later; if the fleet is
// still the one it left (only the collector died), it asks again for the
// same attempts, and the agents answer from the run in flight or the result
// they kept; when only some agents restarted (or nothing was committed), the
// rollouts that LATEST holds by restarted members alone are rejoined
// (restored into those members, the rest of the fleet left running: a node
// that was down and came back), the other lost ones retired and sent one
// attempt later, and the rest asked again.
// Before it decides it waits, up to RecoverGrace, for the fleet to settle:
// every agent and owner up, and either all fresh (a restore), or every one
// that shows it served answering a ping of its service as the instance
// that served (alive.go): none restarted, or a partial loss known as such.
// A process killed whose heartbeat has not expired yet is waited for, and a
// member that did not restart is not. An attempt asked again names the
// agent process it went to; a successor refuses it (attempt_lost), and the
// collector recovers.
//
// It follows the run's branch operations on the stream (branch.go), from
// its start, so that a collector started again finds them again: each
// branch a BranchCompleted names becomes a task (its parent's payload,
// rollout <r>.b<k>), sent first at its attempt to the agent that installed
// it, as a restored attempt is, and written once with branch_of and branch.
// A branch that would have to start from its input (lost before a
// checkpoint held it) is written infra_failed instead. The collection does
// not end while a branch operation is open, and reads the stream's branch
// events to their end before it does.
package collect
