// Package example is the exec adapter's bundled harness (docs/HARNESSES.md):
// agent.py, a small coding agent in Python 3 (standard library only)
// against chat completions, and spec.json, its harness spec. The owner
// shows the folder in every sandbox at SandboxDir (`stillpoint owner
// --bind participants/exec/example:/opt/stillpoint/exec`), and the agent
// runs it with `--adapter exec --harness-spec participants/exec/example/spec.json`.
//
// The agent offers the model one tool, bash, runs the calls it makes in
// the working directory, and saves its session (session.json in the
// session folder) after every step. Its continue goes on from the saved
// session with no new user turn, running again a tool call that a crash
// interrupted; its check exits 0 for a saved session that starts with the
// task's prompt and holds a model response, 1 otherwise. The answer is
// the model's last text, in answer.txt.
//
// The files are embedded (Files), so that a program run from anywhere (the
// demo, the tests) can write them out (Write) and show them in sandboxes.
package example
