// Package driver is the in-sandbox half of the OpenCode adapter, the
// program cmd/opencode-driver: it runs OpenCode 1.18.33 (Version) in a
// rollout's session folder and reads what it did from OpenCode's own
// record, its --format json events and its session store.
//
// Every command first prepares the folder (Config.Home): the directories
// of Dirs, an opencode.json (ConfigJSON) whose one provider is the model
// server, with headers on every call and no timeouts, and the plugin stub
// that keeps OpenCode from running npm at start. OpenCode runs with
// Environ: everything of it in the folder, PWD the project directory, and
// the switches that keep it offline.
//
//   - Run (`run`): a new session, `opencode run --title T --format json`
//     with the prompt as its standard input. The events are copied to
//     stdout and summarised; the session's id goes to SessionFile as soon
//     as an event names it.
//   - Continue (`continue`): the saved session, with no new user turn.
//     `opencode serve` on a loopback port, with a password of its own; the
//     messages are read, a message with no parts is posted (OpenCode stores
//     an empty user message the model never sees and runs its loop again),
//     the messages are read again: the user turns with content must be the
//     ones before. A session whose last message is the model's answer,
//     finished or stored whole but not yet marked finished (a checkpoint
//     froze OpenCode in between), is not continued: that answer is the
//     summary.
//   - Check (`check`): the resume decision (Decide), from `opencode
//     export` of the folder's session.
//
// run and continue end their output with a Summary line (ReadSummary
// finds it); check prints a Decision. SIGINT or SIGTERM kills OpenCode at
// once: OpenCode itself goes on through SIGINT, with the next model call.
package driver
