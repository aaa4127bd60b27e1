// Package codex is the agent's adapter of the Codex CLI (Adapter, an
// agent.Adapter named "codex"), for Codex 0.171.0 (Version) run offline
// against a server of the OpenAI Responses API. docs/CODEX.md tells the
// whole of it, with the behaviours of Codex it handles.
//
// # In the sandbox
//
// The sandbox owner shows two programs read-only at SandboxBinDir in every
// sandbox (`stillpoint owner --codex DRIVER`; Host.Binds): the Codex
// binary (a static musl build) and the static driver, cmd/codex-driver
// (package driver). No snapshot copies them. Binary is the one place that
// finds Codex on the host: $STILLPOINT_CODEX, else an npm install of
// NPMPackage in SystemCache or UserCache (what .ci/run makes).
//
// # The adapter
//
// A rollout's session lives in a session folder in the sandbox,
// <DataRoot>/<rollout>/<n>: CODEX_HOME (the generated config.toml, the
// rollout files, Codex's databases), HOME and TMPDIR. Every launch is the
// driver: its run starts the task in a new session (`codex exec --json
// --dangerously-bypass-approvals-and-sandbox`, stdin /dev/null); after a
// relaunch that continues, its continue runs `codex exec … resume
// <thread> ""`, and the launch names the relay edit relay.CodexEmptyTurn,
// which removes the empty user message that adds before the model sees
// any request. Before a relaunch, ResumeDecision runs the driver's check,
// which continues the saved session only if its prompt is the task's and
// it holds a completed model response; otherwise the relaunch starts over
// in a fresh folder n+1. Answer reads the driver's summary line: the last
// agent message, or a failure. The adapter pauses at checkpoints: the
// daemon freezes the driver, Codex and every tool process together (a
// tool runs in a session of its own, in the same cgroup).
//
// The task payload is a Task: the prompt, and the name the model server
// knows the task by; the rest is the owner's kind's.
package codex
