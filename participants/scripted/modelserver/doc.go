// Package modelserver is a scripted, OpenAI-compatible chat-completions
// server, the model of the scripted harness in the end-to-end tests and
// the demo: it answers POST /v1/chat/completions, streaming (server-sent
// events) or not, from a script per task, tool calls included, and keeps
// a ledger of every request so that a test can prove that no model call
// was repeated and no user turn injected across a pause, a checkpoint or a
// restore (PROTOCOL §7, invariant 4).
//
// A request names its task with the header X-Stillpoint-Task (or, failing
// that, the request's "user" field). The reply is the script's turn number
// n, where n is the number of assistant messages already in the request:
// the conversation so far decides the answer, so a continued session gets
// the next turn and a repeated call gets the same one (and shows in the
// ledger as a repeat).
//
// A script comes from JSON (LoadScript: {"task": [turns...]}) or from a
// tasks file whose lines carry their turns beside the payload (LoadTasks,
// TaskLine: "model": {"turns": [...]}), which `stillpoint tasks` writes
// and `stillpoint modelserver --tasks` serves.
//
// For tests of in-flight calls, Hold makes replies wait until Release, and
// CutNext makes the next streamed reply stop after a number of chunks.
package modelserver
