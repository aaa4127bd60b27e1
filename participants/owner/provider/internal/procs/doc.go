// Package procs holds what the providers that run host processes share
// about them: whether a process still runs, the provider.ExecResult of a
// command, and the retry of an exec that a concurrent fork's open write
// descriptor makes fail with ETXTBSY.
package procs
