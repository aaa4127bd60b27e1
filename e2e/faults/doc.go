// Package faults is the fault matrix of issue 16 as end-to-end tests: each
// component of the system killed (SIGKILL, real processes) at each point of
// a checkpoint, a restore and a release, a stalled member, and a node of a
// 3-node cluster lost and back, through the chaos injector's --plan
// (e2e/cmd/chaos), with every PROTOCOL §7 invariant checked after each
// round. It is a package of
// its own, beside package e2e, so that its rows run beside the other
// end-to-end tests under a timeout of their own. docs/RELIABILITY.md says
// what each fault shows.
package faults
