// Package modelserver is a scripted, OpenAI-compatible chat-completions
// server, the model of the scripted harness and of OpenCode in the
// end-to-end tests and the demo: it answers POST /v1/chat/completions,
// streaming (server-sent events) or not, from a script per task, tool
// calls included, and keeps a ledger of every request so that a test can
// prove that no model call was repeated and no user turn injected across
// a pause, a checkpoint or a restore (PROTOCOL §7, invariant 4).
//
// A request names its task with the header X-Stillpoint-Task (or, failing
// that, the request's "user" field). The reply is the script's turn number
// n, where n is the number of assistant messages already in the request:
// the conversation so far decides the answer, so a continued session gets
// the next turn and a repeated call gets the same one (and shows in the
// ledger as a repeat).
//
// OpenCode's requests (opencode.go) offer its tools, and get three more
// rules. An empty assistant message (a reply cut mid-stream, as OpenCode
// stores it) is no turn. An assistant message whose every tool call came
// back as Interrupted (OpenCode was killed while the tool ran, and a
// continuation told the model so) is no turn either: the turn is answered
// again, the same calls under new ids, as a model re-issues a call that
// did not run; the ledger marks that request Retried, a new request and
// not a repeat. And each scripted tool call is checked against the tools
// the request offers (the name, the required arguments: BashCall,
// ReadCall, EditCall and WriteCall build calls of OpenCode's bash, read,
// edit and write). OpenCode's title call, which offers no tools, gets
// TitleReply and is marked Title. Streams end with a usage chunk when the
// request asks for one (stream_options.include_usage), and send each tool
// call in pieces, as a model does.
//
// Token ids and logprobs come in vLLM's shapes when a request asks
// (return_token_ids, logprobs with top_logprobs 0, and
// return_tokens_as_token_ids), streamed or not, from a small deterministic
// tokenizer of the server's own (tokens.go: Pieces, PromptTokens,
// CompletionTokens, Logprob); the ledger keeps every request's prompt and
// completion ids whether asked or not, so that a test can check a captured
// trajectory token by token against what the server answered.
//
// A script comes from JSON (LoadScript: {"task": [turns...]}) or from a
// tasks file whose lines carry their turns beside the payload (LoadTasks,
// TaskLine: "model": {"turns": [...]}), which `stillpoint tasks` writes
// and `stillpoint modelserver --tasks` serves.
//
// Claude Code speaks the Anthropic Messages API (messages.go): POST
// /v1/messages, answered as its server-sent events (message_start, a
// content block per text and tool_use with their deltas, message_delta
// with the stop reason, message_stop) or as one JSON message when the
// request does not stream. A scripted Turn renders as a text block and
// tool_use blocks whose input is the parsed arguments; the turn numbering
// follows OpenCode's, with Claude's own markers (an empty or
// claudecode.NoResponse assistant message is no turn, a tool call whose
// result starts ClaudeInterrupted is answered again), and calls are checked
// against the tools the request offers (ClaudeBashCall, ClaudeReadCall,
// ClaudeEditCall, ClaudeWriteCall).
//
// Codex's requests (responses.go) speak the OpenAI Responses API: POST
// /v1/responses, streamed as its server-sent events (response.created,
// the output items with their deltas, response.completed) or answered as
// one response object. The server reads their input items as a chat
// conversation, so the rules above hold: consecutive assistant-side items
// are one turn, a turn whose every call came back Aborted is answered
// again (Retried), a kept partial reply at the end is no turn, and each
// call is checked against the offered tools (ExecCall builds a call of
// Codex's exec_command). Every user message item is a user turn, an
// empty one included. Ledger entries name their API (APIChat,
// APIMessages, APIResponses).
//
// A branch's requests (PROTOCOL §5, Branch) carry its label in
// sandboxapi.BranchHeader ("b<k>") and its seed in SeedHeader, which the
// model relay adds (branch.go). A Turn may hold "branches": {"b1": Turn,
// ..., "*": Turn}: a branch's request at that turn is answered by its
// label's entry, else the "*" one, else the turn itself, and in the turn
// chosen {{branch}} (BranchPlaceholder) becomes the label, in the text
// and the tool calls' arguments ("" for a request of no branch). The
// ledger keeps each request's Branch and Seed, and a branch is a
// conversation of its own: the same messages from the parent and from a
// branch (or two branches), even in one episode, are no repeat and no
// re-issue (RepeatList, Reissued).
//
// For tests of in-flight calls, Hold makes replies wait until Release,
// CutNext makes the next streamed reply stop after a number of chunks, and
// SlowNext spreads the next one out (the ledger entry's Chunks says how
// far it got), so that a test can catch the caller mid-stream; on every
// API.
package modelserver
