// Package invariant checks the invariants of PROTOCOL §7 on a run that
// ended, from what the run left: the stream (outcomes and acks, read as
// a timeline), the manifests KV, the records object store, the snapshot
// index, the model server's call ledger, the results file, the sandboxes
// the owner still lists and the processes still alive. The demo prints
// its results; the chaos injector (e2e/chaos) counts them after every
// round of faults; the e2e fault tests fail on any of them.
//
// It sits on the controller's floor, above everything it reads: the
// bridge's timeline, the collector's results, the members' records
// (participants/member), the scripted model server's ledger and the
// agent's trajectories. The production demo prints its verdict, so the
// checker is product code, not test support.
//
// What the checks need while the run goes on is gathered by a Manifests
// (OnCommit verifies every member manifest of a checkpoint as it commits,
// before a later release may delete it; a read a release ran across waits
// for that release to end and reads again). Check does the rest once the run
// is over and returns one Result per invariant, numbered as in §7.
package invariant
