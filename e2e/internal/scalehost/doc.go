// Command scalehost hosts many members of one run in one process, for the
// scale benchmark (e2e/scale_test.go, docs/SCALE.md): it is what 500
// sandbox daemons look like to the bus, without 500 sandboxes.
//
// Each member is a real participants/member Member of kind sandbox, driving
// a membertest participant with no live work, configured as sandboxd
// configures its member: a connection of its own (or, with -conns host, the
// process's one), its own phase feed and a state file of its own under
// -state-dir. Every ack a member sends is its own publish: nothing is
// batched across members. When every member has joined (its heartbeat key
// is written) the process prints
//
//	scalehost <name>: ready <k> members
//
// The same process also answers the bus floor (BenchmarkScale's floor
// rounds): a core-NATS request on -floor-subject names a round and a
// phase; every member of the process then publishes the once-only ack the
// protocol mandates for it, sp.<floor-run>.ack.<round>.<phase>.<member>
// with expected-last-subject-sequence 0 (and, when the request asks, a
// member manifest created once in sp_manifests), each on its member's own
// connection, and the process answers "ok" once the server has stored
// every one, or the first error.
//
// With -floor-only it starts no member and answers the floor alone, for
// sizes whose members this machine cannot run.
//
// It stops on SIGTERM or SIGINT: every member stops as a clean stop does,
// and the process exits 0.
package main
