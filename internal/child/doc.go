// Package child runs the processes a test or the demo starts: the
// stillpoint components, sandboxd and servers, each as a child of its own.
//
// Start starts one from a Spec: its path and arguments, environment added
// to this process's, working directory. What it writes to stdout and
// stderr goes to a buffer (Output, WaitOutput) and, if the Spec names one,
// to a log file; its stderr may go to a writer of its own instead (a
// terminal). It runs in a process group of its own, and gets SIGKILL if
// the thread that started it dies, so that a killed test or demo leaves no
// process behind.
//
// A Process ends in one of three ways:
//
//   - Stop: the stop signal (SIGTERM by default), a grace period, then
//     SIGKILL; then whatever is left of its process group is killed too,
//     and the process is reaped. This is how a run ends.
//   - Kill: SIGKILL to the process alone, as in a crash; the rest of its
//     group (the sandboxes of an owner, say) is left running until Stop,
//     as after a real crash.
//   - on its own: Wait returns how it ended once it exited, after killing
//     what is left of its group.
//
// The group is only ever signalled while the process is not yet reaped:
// an exited child stays a zombie until Stop or Wait reaps it, so that its
// process id, which is the group's id, cannot have been given to another
// process (pid_max can be small and the tests start many processes).
//
// StartForTest is Start for a test: the test's cleanup stops the process
// and, if the test failed, writes its output to the test's log.
//
// A Process starts one goroutine that waits for the exit, and os/exec's
// for the output; Stop and Wait wait for them. Start is Linux only
// (process groups and the parent-death signal); elsewhere it returns an
// error wrapping errors.ErrUnsupported.
package child
