// Command codex-driver is the in-sandbox half of the Codex adapter
// (package participants/codex/driver): a small static program the agent
// launches in a rollout's sandbox instead of Codex itself. `run` starts a
// task in a new session, `continue` continues the saved session with no
// new turn of the user's (`codex exec resume <thread> ""`), `check`
// decides whether a saved session can be continued. Build it static
// (CGO_ENABLED=0 go build ./cmd/codex-driver); `stillpoint owner --codex`
// shows it and Codex read-only in every sandbox.
package main
