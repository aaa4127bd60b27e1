// Package sandboxd is the process-supervision core of the in-sandbox daemon
// (PROTOCOL §6): it launches the agent's harness (or any command), finds
// every process the launch starts, pauses and continues them, stops them,
// and records what happened, so that a checkpoint can hold a sandbox still
// and nothing of a launch is ever lost or left behind. The bus member that
// answers phases is built on top of it, in package sandboxd/daemon.
// docs/SANDBOXD.md is the long form: every rule below, and how the daemon
// takes part in a checkpoint.
//
// # Shape
//
// A Supervisor is created with New (which finds out what the host allows:
// Modes) and served by Run(ctx), which makes the process a child subreaper
// with one reap loop, locks the state directory, and ends the launches a
// previous supervisor left (ErrSupervisorRestarted). While Run runs:
//
//	rec, err := sup.Launch(ctx, sandboxd.Spec{ID: "r1", Command: "opencode run ..."})
//	res, err := sup.Pause(ctx, "r1", sandboxapi.ModeDefault) // a sandboxapi.PauseResult
//	res, err = sup.Continue(ctx, "r1")
//	rc, err := sup.Stop(ctx, "r1") // or Cancel, or Wait
//
// Each launch has a driver goroutine that owns its Machine, a pure state
// machine (Step(now, input) -> effects; no I/O, no clock): pending -> held
// | running; running <-> paused; running | paused -> stopping -> ended.
// Every operation on a launch is serialised on its driver.
//
// The launch record, its receipt, the pause result and the enums they
// carry (Mode, State, Outcome, StopReason, Identity) are the wire types of
// package sandboxapi: the supervisor keeps them on disk, the daemon serves
// them, and an agent reads them without building the supervisor.
//
// # The rules it keeps
//
//  1. Launching: a launch runs in a new session and process group, marked
//     in its environment with STILLPOINT_LAUNCH_MARK=<tag>/<id> (the tag
//     names the supervisor's state directory: ids repeat across
//     supervisors on a host, marks do not), in a cgroup v2 of its own where
//     freeze is available, under a cgroup that is this supervisor's alone;
//     its exit is subscribed before it starts, and one reap loop reaps
//     every child.
//  2. Finding processes: a launch's processes are its tree, read from
//     /proc/<pid>/task/*/children, never a scan of /proc (but as the last
//     resort of a kill), plus the orphans the subreaper adopts, attributed
//     only on positive evidence (cgroup, session or process group, mark,
//     an earlier walk); in freeze mode the cgroup is the authority.
//  3. Records: <state>/<id>/record.json, replaced atomically
//     (internal/atomicfile; durably for the launch accepted, started and
//     ended), holds the launch and, once it ended, its Receipt; a stop
//     file keeps a launch from starting, a pause file holds it until
//     Continue.
//  4. Stopping: SIGINT, SIGKILL after Config.Grace (10 s), SIGKILL again to
//     whatever is still found, until none is (PROTOCOL §6, Stop).
//  5. Deadlines: Spec.Timeout counts running time only.
//  6. Pausing: freeze, stop or hold (PROTOCOL §6, Pause modes), confirmed
//     within Config.ConfirmTimeout or undone (ErrUnconfirmed, with the
//     Fallback); never left half paused.
//
// # Linux only
//
// The supervisor needs /proc, pidfds, a child subreaper, and for freeze
// cgroup v2; elsewhere New returns errors.ErrUnsupported. The reap loop is
// process-wide: a process that runs a Supervisor must not start children
// any other way (os/exec's Wait would find them reaped).
package sandboxd
