// Package tasks is the bundled task set of the end-to-end tests and the
// demo: small scripted coding tasks (participants/scripted) whose tool
// calls write files, run commands (one mid-tool long enough for a
// checkpoint to catch it) and start a process in a session of its own,
// each with the check its grade runs, and the model script that drives
// them.
package tasks
