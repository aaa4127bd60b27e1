// Package sandboxd is the process-supervision core of the in-sandbox daemon
// (PROTOCOL.md §6): it launches the agent's harness (or any command), finds
// every process the launch starts, pauses and continues them, stops them,
// and records what happened, so that a checkpoint can hold a sandbox still
// and nothing of a launch is ever lost or left behind. The bus member that subscribes to
// phases and acks them is built on top of it.
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
// machine (Step(now, input) -> effects; no I/O, no clock) in the manner of
// etcd's raft: pending -> held | running; running <-> paused; running |
// paused -> stopping -> ended. Requests, the process's exit and timers are
// its inputs; the driver carries out the effects (spawn, pause, continue,
// SIGINT, kill, cleanup, persist). Every operation on a launch is
// serialised on its driver.
//
// The launch record, its receipt, the pause result and the enums they
// carry (Mode, State, Outcome, StopReason, Identity) are the wire types of
// package sandboxapi: the supervisor keeps them on disk, the daemon
// (package sandboxd/daemon) serves them, and an agent reads them without
// building the supervisor. The Machine that moves a launch through the
// states stays here.
//
// # The rules it keeps
//
//  1. Launching. A launch's process (its root: the harness when an agent
//     launches one) runs as /bin/sh -c Command (or Argv) in a new
//     session and process group, with STILLPOINT_LAUNCH=<id> and
//     STILLPOINT_LAUNCH_MARK=<tag>/<id> added to its environment (the tag
//     names the supervisor's state directory: ids repeat across
//     supervisors on a host, marks do not, and only a process with this
//     supervisor's mark is ever taken for its own), stdin from
//     /dev/null, stdout and stderr appended to
//     <state>/<id>/output.log. Where freeze is available it is started
//     directly in its own cgroup v2, <root>/sup-<pid>-<start>-<tag>/
//     launch-<id>, with CLONE_INTO_CGROUP: the root (default <the
//     supervisor's cgroup>/stillpoint-sandboxd) is shared by every
//     supervisor that uses it, the sup- cgroup is this supervisor's
//     alone (its identity and its tag), and empty ones of supervisors
//     that are gone are removed by the next to start or stop; no
//     controller is enabled, so the no-internal-process rule does not
//     apply. Its exit is subscribed before it is started (containerd's
//     reaper), and one reap loop reaps every child, launch roots and the
//     orphans the subreaper adopts.
//  2. Finding processes. A launch's processes are its tree, read from
//     /proc/<pid>/task/*/children (one read per process, never a scan of
//     /proc), plus the orphans reparented to the supervisor, which are
//     attributed to a launch by its cgroup, its session or process group,
//     its mark or an earlier walk, and to none on anything less (another
//     Supervisor's launches are children of the process too). In freeze
//     mode the cgroup is the authority. A scan of /proc for the mark (and
//     the session) is the last resort, used only when killing.
//  3. Records. <state>/<id>/record.json holds the launch: id, command, start,
//     the supervisor's Identity (pid and start time, so a restarted
//     supervisor is told apart), state, pauses (count, sequence, paused
//     time), and once it has ended its Receipt: the process's own exit code
//     or signal, outcome finished | interrupted | failed, and whether the
//     cleanup was confirmed. Every write replaces it atomically and
//     durably (fsync of the file, rename, fsync of the directory). A stop
//     file (<state>/<id>/stop) keeps a launch that has not started from
//     starting; a pause file holds it until Continue. A launch that ended
//     just before a pause keeps its result and is not paused.
//  4. Stopping. Stop sends SIGINT to the group and the tree, SIGKILL to
//     everything after the grace (Config.Grace, 10 s), and SIGKILL again to
//     whatever is still found, until none is: cgroup.kill and "populated 0"
//     with a cgroup, then the tree, then the host scan. A paused launch is
//     killed at once (SIGKILL works on stopped and cgroup-frozen tasks);
//     Cancel skips the grace. When the process exits by itself, whatever it
//     left is killed the same way.
//  5. Deadlines. Spec.Timeout counts running time only: the deadline is
//     start + Timeout + time paused; when it passes, the launch is stopped
//     and its receipt says TimedOut.
//  6. Pausing. Every pause and continue returns a PauseResult: mode,
//     pause_seq, identity, wall clock, uptime (CLOCK_BOOTTIME), the pids,
//     the processes counted paused in D, and on failure the Fallback.
//     ModeFreeze writes 1 to cgroup.freeze and waits for "frozen 1"
//     (ppoll(POLLPRI) on cgroup.events, plus a re-read every 50 µs to 1 ms,
//     since the kernel sends at most one notification per 10 ms); the
//     processes see nothing. ModeStop walks the tree level by level:
//     SIGSTOP a whole level through pidfds (pidfd_open, then the parent or
//     start time checked, then pidfd_send_signal: never a reused pid),
//     confirm every thread of every process of the level stopped (T; or D
//     with its leader stopped, with SIGSTOP pending, or in a vfork wait),
//     only then read its children, and check again until nothing new
//     appears; continue sends SIGCONT children first, to exactly the
//     processes the pause stopped, so a job-control shell never sees its
//     command stop. ModeHold acknowledges at once and signals nothing. A
//     pause is confirmed within Config.ConfirmTimeout (5 s), or up to
//     Config.PendingTimeout (30 s) while the only holdouts are in D;
//     otherwise it is undone (thawed, continued: never left half paused)
//     and returns ErrUnconfirmed with the Fallback, and the caller stops
//     and relaunches. Paused time never counts against the deadline.
//
// # Linux only
//
// The supervisor needs /proc, pidfds (Linux 5.3), a child subreaper, and
// for freeze cgroup v2 with cgroup.kill (5.14) and CLONE_INTO_CGROUP
// (5.7). Elsewhere New returns errors.ErrUnsupported. The reap loop is the
// one piece of process-wide state: waiting for any child is process-wide,
// so every Supervisor in a process shares it, and a process that runs a
// Supervisor must not start children any other way (os/exec's Wait would
// find them reaped).
package sandboxd
