// Package commandkind is the command kind of task (owner.TaskKind, with
// setup and fork spec): a task defined entirely in its JSON payload, with
// no Go to write. `stillpoint owner --task-kind command` serves it, and
// docs/TASKS.md is the reference of the payload.
//
// # The task
//
// A command task names a workspace (a host directory, a tarball, or a git
// repository at a commit), the commands that set the session up, the
// workspace paths the grade pins, and the verify command whose exit code
// or JSON output is the reward:
//
//	{"task": "py-calc",
//	 "prompt": "The tests of calc.py fail. Fix calc.py.",
//	 "workspace": {"dir": "/srv/repos/py-calc"},
//	 "setup": [{"command": ["python3", "-c", "print('{\"python\": 3}')"]}],
//	 "pin": ["test_calc.py"],
//	 "verify": {"command": ["python3", "-m", "unittest", "-v"], "reward": "exit"}}
//
// ParseTask decodes and checks a payload completely: every field, every
// path, id, duration and size, each error naming its field. The agent's
// adapter reads the same payload: "task" is the task's name (the
// scripted harness's model script) and "prompt" what the harness is asked;
// "harness" is left to adapters.
//
// # The session
//
// Spec builds the sandbox (sb-<episode>, sandboxd as its first process,
// the harness copied in or shown with the bound binaries directory, the
// working directory Task.Workdir). Setup copies the workspace into the
// working directory (a tar stream through the provider's Exec, so it needs
// tar in the sandbox; a git repository is cloned on the host and checked
// out at the commit, with no remote left), runs the setup commands in
// order (a failing one fails the seed with its output; a JSON object on
// the last line of a command's stdout is merged into the setup data), and
// records the pinned paths as a tar archive. The session data holds all
// that the grade needs (Data): the verify command, the environment, the
// setup data and the pinned archive. It is exported beside the session's
// snapshot and restored with it, out of the agent's reach.
//
// # The grade
//
// Grade writes every pinned path back from the session data (the agent's
// edits to them are undone, as SWE-bench applies its test files again
// before it grades), then runs the verify command in the working directory
// with the task's environment and the setup data in
// STILLPOINT_SESSION_DATA. The reward (a Verdict) is 1 for exit 0 and 0
// otherwise ("exit"), or the "reward" number of the JSON object on the
// last line of its stdout ("json"); a verify that times out or prints no
// reward gets 0 and says why. A restored fork grades the same way: the
// session data comes back with it, so the same files are pinned again.
package commandkind
