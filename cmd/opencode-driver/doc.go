// Command opencode-driver is the in-sandbox half of the OpenCode adapter
// (package participants/opencode/driver): a small static program the
// agent launches in a rollout's sandbox instead of OpenCode itself. `run`
// starts a task in a new session, `continue` continues the saved session
// with no new user turn through `opencode serve`, `check` decides whether
// a saved session can be continued. Build it static (CGO_ENABLED=0 go
// build ./cmd/opencode-driver); `stillpoint owner --opencode` shows it,
// OpenCode and ripgrep read-only in every sandbox.
package main
