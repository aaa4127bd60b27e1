// Package daemon is sandboxd as a bus member: it puts the process
// supervisor (package sandboxd) on the bus as member sandbox.<id> of a run,
// and serves the agent's requests for its sandbox.
//
//  1. Phases: the daemon reads its run's phases through an ordered consumer
//     and keeps its position in a state file (PROTOCOL §3: thousands of
//     sandbox daemons hold no consumer state on the server). At prepare it
//     closes admission (new launches wait for the resume) and starts
//     pausing every launch in its mode, in goroutines of its own that Run
//     waits for; Prepare returns at once, not ready with the launches still
//     pausing as its blockers, and each pause that ends calls
//     Member.Notify. Once every launch is paused, ended or stopped, the
//     prepare ack is ready and carries the pause report (mode, pause_seq,
//     identity, wall, uptime, pids). A pause that does not confirm stops
//     the launch instead and says so (fallback): the agent relaunches it
//     from its saved session after the resume. At resume, or when its
//     lease runs out, it cuts short the pauses still in flight, waits for
//     them, and continues exactly what it paused (a pause cut short may
//     still have completed), and reports that in the resume ack. A retire stops the launches of the
//     retired attempts. A sandbox daemon exports nothing: what a sandbox
//     holds is the owner's snapshot and the agent's bookmark.
//  2. Service: a NATS micro service on spsvc.<run>.sandbox.<id>.<endpoint>
//     with endpoints launch, status, pause, continue, stop and receipt, for
//     the agent that drives the sandbox; held, resume and collect for the
//     agent that takes over a launch a restored snapshot kept (Held,
//     Resume, Collect); relay_status and relay_repoint for the model relay
//     (Config.Relay), which the prepare holds before it pauses and the
//     resume releases after it continues: only a hold that checkpoint's
//     prepare took. A hold a restore left (a fork's daemon finds the relay
//     holding) ends at the take-over (resume, collect), or is dropped by a
//     failed take-over or a new launch; relay_repoint, like resume, is
//     refused while a checkpoint is open. Package sandboxapi is its contract
//     (request and answer types, error codes) and holds the agent's
//     Client. Its subjects are outside sp.>, so requests are not kept in
//     the audit stream.
//  3. Pause results and reports: each launch's pause or continue answers
//     with a sandboxapi.PauseResult; the prepare and resume acks carry one
//     events.PauseReport, the summary over all the launches touched.
//
// What the daemon decides is a pure core, Machine: Step takes an input
// (a prepare, a reopen, a launch, a take-over, the end of a job) and
// returns the effects; Daemon is its driver, which steps it under one
// lock and carries the effects out. The golden scripts in testdata/ play
// each phase path.
//
// docs/SANDBOXD.md, "On the bus", is the long form.
package daemon
