// Package opencode is the agent's adapter of OpenCode (Adapter, an
// agent.Adapter named "opencode"), for OpenCode 1.18.33 (Version) run
// offline against an OpenAI-compatible model server. docs/OPENCODE.md
// tells the whole of it, with the behaviours of OpenCode it handles.
//
// # In the sandbox
//
// The sandbox owner shows three programs read-only at SandboxBinDir in
// every sandbox (`stillpoint owner --opencode DRIVER`; Host.Binds): the
// OpenCode binary, ripgrep, which its glob and grep tools run, and the
// static driver, cmd/opencode-driver (package driver). No snapshot copies
// them. Binary is the one place that finds OpenCode on the host:
// $STILLPOINT_OPENCODE, else an npm install of NPMPackage in SystemCache
// or UserCache (what .ci/run makes); Ripgrep finds rg.
//
// # The adapter
//
// A rollout's session lives in a session folder in the sandbox,
// <DataRoot>/<rollout>/<n>: OpenCode's XDG directories, TMPDIR and HOME,
// its generated opencode.json and the session store (opencode.db, -wal,
// -shm). Every launch is the driver: its run starts the task in a new
// session (`opencode run --title <rollout> --format json`, the prompt on
// standard input); after a relaunch that continues, its continue drives
// one more agent loop of the saved session through `opencode serve`, with
// no new user turn. Before a relaunch, ResumeDecision runs the driver's
// check, which reads the saved session from the store and continues it
// only if it starts with the task's prompt and holds a completed model
// response; otherwise the relaunch starts over in a fresh folder n+1. The
// state in the bookmark is the folder, its number and, once a check read
// it, the session's id. Answer reads the driver's summary line: the final
// text, or a failure when OpenCode reported an error or the last step was
// no answer. The adapter pauses at checkpoints: the daemon freezes or
// stops the driver, OpenCode and every tool process together.
//
// The task payload is a Task: the prompt, and the name the model server
// knows the task by; the rest is the owner's kind's.
package opencode
