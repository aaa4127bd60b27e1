// Package agent is the harness driver (PROTOCOL §6): a bus member whose
// work is rollouts of a CLI agent harness, each in a sandbox that a
// sandbox owner lends, through a small Adapter per harness.
//
// A harness is the CLI agent program a rollout drives (OpenCode, the
// scripted harness); its Adapter knows where it keeps its session and how
// to launch it.
//
// A rollout request (the micro endpoint spsvc.<run>.agent.<name>.run, or
// Agent.Rollout; package agentapi holds the request, the result, the
// bookmark and the client) is registered at its seed bookmark before it
// waits for a concurrency slot, then runs the stages seed → launch →
// verify → return, recording a v1 Bookmark before each (the launch stage
// is "harness" on the wire). Before every launch the driver asks the
// owner's sandbox_access which sandbox is current (a fork after a restore)
// and, on a relaunch, the adapter's ResumeDecision.
//
// At a checkpoint's prepare every run is asked to park. A run between
// stages waits at its bookmark. A run whose harness runs is ready once its
// sandbox daemon has acked the prepare (read from the bus, not asked) and
// the launch is paused: it is exported with resume set, and after the
// resume the same launch goes on. An unconfirmed pause, or an adapter that
// does not pause, gets a stop instead and a relaunch on the saved session
// after the resume. A launch that ended before the park keeps its result.
// A launch whose sandbox's daemon is gone (its heartbeat in sp_daemons
// expired or was deleted: the daemon died, and with it the sandbox's init)
// is lost: the run does not wait for that daemon's ack, waits at its launch
// bookmark (a restore relaunches it in a fork), then ends sandbox_lost, as
// one whose session the owner no longer knows does; the controller starts
// such a rollout over one attempt later.
// A run waiting for its grade is ready at its verify bookmark: the
// checkpoint does not wait for the grade (PROTOCOL §6), and the owner
// answers it after the resume. Restart-only runs (the owner cannot capture the session) are never
// parked; they restart from their input after a crash.
//
// A restore installs the exported bookmarks; the controller then asks for
// each continued rollout as its next attempt, and the driver continues it
// from its bookmark: at launch it relaunches on the saved session in the
// forked sandbox, at verify it grades again without launching, at return
// it returns the stored result.
//
// The cleanup rule: a parked run leaves everything to the checkpoint; a
// verified one nothing (the owner ended the session); one that fails or is
// cancelled before verify has its launch killed and its session closed.
// A stopping or superseded agent touches nothing, as a crash would not.
//
// The agent calls the owner and the sandboxes' daemons through interfaces
// of its own, Owner (owner.go, the one file that names the owner's
// package) and Sandbox (sandbox.go), with only the calls it makes; Config
// can give other implementations, and by default they are the services'
// clients on the agent's connection.
package agent
