// Package claude is the agent's adapter of Claude Code (Adapter, an
// agent.Adapter named "claude"), for Claude Code 2.1.332 (Version) run
// offline against an Anthropic Messages API server. docs/CLAUDE.md tells
// the whole of it, with the behaviours of Claude Code it handles.
//
// # In the sandbox
//
// The sandbox owner shows two programs read-only at SandboxBinDir in
// every sandbox (`stillpoint owner --claude DRIVER`; Host.Binds): the
// Claude Code binary, a native program, and the static driver,
// cmd/claude-driver (package driver). No snapshot copies them. Binary is
// the one place that finds Claude Code on the host: $STILLPOINT_CLAUDE,
// else an npm install of NPMPackage in SystemCache or UserCache (what
// .ci/run makes).
//
// # The adapter
//
// A rollout's session lives in a session folder in the sandbox,
// <DataRoot>/<rollout>/<n>: Claude's HOME, CLAUDE_CONFIG_DIR (with the
// session file) and TMPDIR; its session id is chosen with the folder
// (SessionID). Every launch is the driver: its run starts the task in a
// new session (`claude -p --session-id <id>`, the prompt on standard
// input); after a relaunch that continues, its continue resumes the saved
// session with a fixed prompt that the model relay removes, with the
// message Claude adds before it (Command.RelayEdits names
// relay.ClaudeContinueEdit), so that the model sees no new turn. Before a
// relaunch, ResumeDecision runs the driver's check, which continues the
// session only if its first user turn is the task's prompt and it holds a
// completed model response; otherwise the relaunch starts over in a fresh
// folder n+1. Answer reads the driver's summary line, made from Claude's
// result event. The adapter pauses at checkpoints: the daemon freezes the
// driver, Claude and every tool process (each in a session of its own)
// together.
//
// The task payload is a Task: the prompt, and the name the model server
// knows the task by; the rest is the owner's kind's.
package claude
