// Package harness is the scripted coding-agent harness (the program is
// cmd/scripted-harness), which the end-to-end tests and the demo run in
// sandboxes: a CLI agent program whose behaviour Stillpoint can see. It
// keeps its session (the messages) durably in a data folder, calls a
// chat-completions model over HTTP, runs the tool commands the model asks
// for as child processes (they may start sessions of their own or
// daemonize), and can continue a saved session without adding a user
// message.
package harness
