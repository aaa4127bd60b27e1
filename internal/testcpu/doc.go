// Package testcpu shares the machine's cores among the tests of every
// test process running on it. go test runs several packages' test
// binaries at once (make test: -p 3), and a few of their tests keep a
// core busy for minutes: a QEMU guest under TCG, a fleet of OpenCode
// processes. Left alone they crowd each other and the end-to-end tests
// off the CPU, so that a wait sized on a machine that ran one of them at
// a time runs out. A test that calls Take holds a share of the cores
// until it ends; tests that wait more than they compute do not call it.
//
// The shares are flock(2) locks on slot files in one directory of the
// machine (Dir): a share is released when its test ends or its process
// dies, whatever way it dies, so no run can leak one into the next.
package testcpu
