// Package bridge is the controller bridge: the one component per training
// run that turns a controller's request (checkpoint, restore, retire,
// forget, release) into phase events on the bus, gathers the members'
// acks, and writes the result where it lasts.
//
// # Shape
//
// The bridge rules of PROTOCOL §5 live in package machine, a pure core:
// Step(now, input) returns effects. This package is its driver. Each
// operation takes the run's operation slot (one at a time; a held
// checkpoint's renew is one too), finishes what a previous bridge left
// open, reads the View its ask needs (the run's last phase, the live
// members, the key it names), and then carries out the machine's effects
// in order — publish a phase fenced on the run's last, read a phase's acks
// with an ordered consumer while watching its members' heartbeats, read
// and create manifests, move LATEST, publish outcomes, delete what a
// release does not keep — feeding back what it observes, until the
// machine finishes the operation with its result. Timers wait for the
// durations the machine computes; the clock is Config.Now. The failpoints
// of the crash tests (internal/failpoint, "bridge/after-prepare", ...)
// fire right after the effect they are named after.
//
// # What it owns
//
// The bridge publishes every phase event of its run on sp.<run>.phase.<phase>
// and every outcome on sp.<run>.outcome.<noun>.<verb>. It creates checkpoint
// manifests in sp_manifests (once, never replaced) and moves <run>.LATEST by
// compare-and-set. Members answer on their once-only ack subjects; the
// bridge reads them with an ordered consumer and watches sp_members so that
// a dead member fails a phase at once.
//
// # Checkpoint
//
// prepare → every member ready → commit (the scope, stop) → every member
// manifest → checkpoint manifest created (the commit point) → LATEST moved
// → outcome checkpoint.committed → resume (not with stop: the fleet stays
// parked). Any blocker, error, dead member, missing ack or passed deadline
// aborts: the checkpoint key is created as an abort marker (so that no
// other bridge can commit it later), then outcome checkpoint.failed naming
// every blocker and member, then resume. With hold, the bridge stops after
// prepare and renews the lease until Commit or Abort.
//
// # Restore
//
// A restore goes to a fresh fleet (members that have served no phase) and
// opens the next epoch. Every member installs all of its records or none.
// If any member fails, the next attempts of every scoped episode are
// retired everywhere, the fleet is resumed and restore.failed is reported:
// those rollouts restart from their input.
//
// # No state of its own
//
// Everything the bridge knows it reads back from the stream and KV: the last
// phase event (its sequence, epoch and checkpoint), the acks, the manifests.
// A bridge killed at any point and started again finishes or aborts what was
// open (Recover): it reads the open operation's phases back from the stream
// and feeds them to a fresh machine, which carries on with only what
// remains; Status names the open operation from the same replay. Two
// bridges cannot both publish: each phase is published with the expected
// last sequence of the run's phase subjects, so a zombie's publish is
// refused by the server.
//
// The controller reaches the bridge through its Go methods, the HTTP JSON
// API (Handler; docs/API.md), the Go HTTP client in package client, or the
// stillpoint CLI. The requests, results, errors and routes they share are
// the types of package bridgeapi.
package bridge
