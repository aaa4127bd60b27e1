// Package scripted is the scripted kind of task, both of its sides: the
// agent's adapter of the scripted coding-agent harness (Adapter, an
// agent.Adapter) and the owner's kind (Kind, an owner.TaskKind). The
// harness program itself is package harness (built as
// cmd/scripted-harness) and the OpenAI-compatible model that drives it is
// package modelserver; the bundled task set of the tests and the demo is
// controller-bridge/collect/tasks.
//
// # The task
//
// A scripted task's payload is a Task: the model script the harness
// follows, the first user message, the check its grade runs, and files
// the sandbox's working directory starts with (a small repository):
//
//	{"task": "task-003",
//	 "prompt": "Task 3: compute 6*7+3 into out/answer.txt.",
//	 "check": {"command": ["sh", "-c", "cat out/answer.txt"], "expect": "45"}}
//
// # The agent's side
//
// Adapter launches the harness in the sandbox the owner lent
// (--model-url, --task, --data <session folder>, --work <workdir>), with
// --continue instead of --prompt after a relaunch, and asks the harness
// (--check) whether a saved session can be continued. The answer is the
// last line it prints.
//
// # The owner's side
//
// Kind builds each session's sandbox (sb-<episode>, sandboxd as its first
// process, the harness copied in or shown with the bound binaries
// directory), pins the task's check into the session data when it sets the
// session up (the data is exported with the snapshot and restored with
// it, so the agent cannot change what is graded), starts sandboxd again in
// every fork a restore makes, and grades by running the pinned check:
// reward 1 when the command prints what the check expects, compared field
// by field, else 0 with what it printed. `stillpoint owner --task-kind
// scripted` serves it.
package scripted
