// Package driver is the in-sandbox half of the Claude Code adapter, the
// program cmd/claude-driver: it runs Claude Code 2.1.332 (Version) in a
// rollout's session folder and reads what it did from Claude's own
// record, its stream-json events and its session file.
//
// Claude runs with Environ: HOME, CLAUDE_CONFIG_DIR and TMPDIR in the
// session folder, the model server as ANTHROPIC_BASE_URL with the
// headers in ANTHROPIC_CUSTOM_HEADERS, the switches that keep it offline,
// and its timers above any pause. Its tools are Tools, allowed without
// asking.
//
//   - Run (`run`): a new session, `claude -p --session-id <id>` with the
//     prompt as its standard input; the events are copied to stdout and
//     the result event summarised.
//   - Continue (`continue`): the saved session, `claude -p ContinuePrompt
//     --resume <id>`; the relay removes the prompt and Claude's synthetic
//     NoResponse message from every request (relay edit claude-continue),
//     so the model sees no new turn. The user turns of the session file
//     must be the ones before. A session that already ends with the
//     model's answer is not continued: that answer is the summary.
//   - Check (`check`): the resume decision, from the session file
//     (ReadSession).
//
// run and continue end their output with a Summary line (ReadSummary
// finds it); check prints a Decision. SIGINT or SIGTERM kills Claude at
// once.
package driver
