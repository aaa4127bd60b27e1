// Package bridge is the controller bridge: the one component per training
// run that turns a controller's request (checkpoint, restore, retire,
// forget, release) into phase events on the bus, gathers the members'
// acks, and writes the result where it lasts (PROTOCOL §5, Bridge rules).
//
// # Shape
//
// The bridge's rules live in package machine, a pure core: Step(now,
// input) returns effects. This package is its driver. Each operation
// (Checkpoint, Commit and Abort of a held checkpoint, Restore, Retire,
// Forget, Release) takes the run's operation slot, finishes what a
// previous bridge left open (Recover), reads the View its ask needs, and
// carries out the machine's effects in order, feeding back what it
// observes, until the machine finishes the operation with its result.
// The clock is Config.Now. docs/BRIDGE.md says how the driver carries out
// each effect, how acks are gathered and decided, and how recovery works.
//
// # What it owns
//
// The bridge publishes every phase event of its run on
// sp.<run>.phase.<phase>, fenced on the run's last (a zombie bridge's
// publish is refused), and every outcome on sp.<run>.outcome.<noun>.<verb>.
// It creates checkpoint manifests in sp_manifests (once, never replaced;
// an aborted checkpoint's key is an abort marker) and moves <run>.LATEST
// by compare-and-set (PROTOCOL §3). It reads acks with an ordered consumer
// and watches the heartbeats (sp_members, and sp_daemons for the sandbox
// daemons), so that a dead member fails a phase as soon as its heartbeat
// expires or goes.
//
// # No state of its own
//
// Everything the bridge knows it reads back from the stream and KV: the
// last phase event (its sequence, epoch and checkpoint, or <run>.HEAD once
// it aged out), the acks, the manifests. A bridge killed at any point and
// started again finishes or aborts what was open: Recover replays the open
// operation's phases into a fresh machine, which does only what remains;
// Status names the open operation from the same replay.
//
// The controller reaches the bridge through its Go methods, the HTTP JSON
// API (Handler; docs/API.md), the same API as a NATS micro service (Serve:
// stillpoint-bridge on spsvc.<run>.bridge.<name>.<endpoint>), the Go client
// in package client over either, or the stillpoint CLI. Both transports
// call one set of endpoints (service.go), so a request answers the same
// JSON on each. The requests, results, errors, routes and endpoints they
// share are the types of package bridgeapi. Package timeline reads a run
// back for `stillpoint timeline` (timeline.Read).
package bridge
