// Package driver is the in-sandbox half of the Codex adapter, the program
// cmd/codex-driver: it runs Codex CLI 0.171.0 (Version) in a rollout's
// session folder and reads what it did from Codex's own record, its
// --json events and the session's rollout file.
//
// Every launch first prepares the folder (Config.Home): the directories
// of Dirs (CODEX_HOME, HOME, TMPDIR) and a config.toml (ConfigTOML) whose
// one provider is the model server on the Responses API, with headers on
// every call and the switches that keep Codex offline. Codex runs with
// Environ: everything of it in the folder.
//
//   - Run (`run`): a new session, `codex exec --json
//     --dangerously-bypass-approvals-and-sandbox … -C WORK PROMPT` with
//     stdin /dev/null. The events are copied to stdout and summarised; the
//     thread id goes to SessionFile as soon as thread.started names it.
//   - Continue (`continue`): the saved session, `codex exec … resume
//     <thread> ""`: Codex cannot continue without a user message, and the
//     empty one it then adds is removed by the relay edit
//     relay.CodexEmptyTurn before the model sees it. The rollout's user
//     messages must be the ones before and that empty one. A session
//     whose last response is the model's answer is not continued: that
//     answer is the summary.
//   - Check (`check`): the resume decision (Decide), from the rollout
//     (ReadRollout).
//
// run and continue end their output with a Summary line (ReadSummary
// finds it); check prints a Decision.
package driver
