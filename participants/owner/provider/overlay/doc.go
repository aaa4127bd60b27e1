// Package overlay is the overlay sandbox provider (root, Linux): a
// read-only base (the host's root file system by default) under an
// overlay per sandbox, the first process in new PID, mount and UTS
// namespaces and a cgroup v2 of its own (the sandbox's cgroup is the root
// of the hierarchy inside, so sandboxd can freeze its launches). A
// snapshot copies the upper directory with the sandbox frozen. It keeps
// the contract of package provider; docs/PROVIDERS.md says how.
//
// The sandbox's first process is this binary run again (init_linux.go):
// a program that starts overlay sandboxes imports this package, whose
// init function sets a sandbox up before main runs.
package overlay
