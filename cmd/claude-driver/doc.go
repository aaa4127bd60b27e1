// Command claude-driver is the in-sandbox half of the Claude Code adapter
// (package participants/claude/driver): a small static program the agent
// launches in a rollout's sandbox instead of Claude Code itself. `run`
// starts a task in a new session, `continue` continues the saved session
// with no new user turn the model sees, `check` decides whether a saved
// session can be continued. Build it static (CGO_ENABLED=0 go build
// ./cmd/claude-driver); `stillpoint owner --claude` shows it and Claude
// Code read-only in every sandbox.
package main
