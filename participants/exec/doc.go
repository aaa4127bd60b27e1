// Package exec is the agent's adapter of a harness defined in JSON, with no
// Go (Adapter, an agent.Adapter named "exec"; `stillpoint agent --adapter
// exec --harness-spec FILE`). docs/HARNESSES.md is the reference of the
// spec, with a worked example (package example).
//
// # The spec
//
// A Spec (LoadSpec, ParseSpec: strict JSON, every error naming the file
// and the field) gives:
//
//   - launch: the argv and environment of a new session of the task;
//   - continue: the argv (and more environment) that continues a saved
//     session with no new user turn, or "never": every relaunch then
//     starts over from the task;
//   - check: the argv that decides, before a relaunch, whether the saved
//     session can be continued: exit status 0 continues, 1 starts over in
//     a fresh session folder, anything else is an error;
//   - answer: "last_line" (the last non-empty line of the launch's
//     output) or {"file": "<path in the session folder>"};
//   - pause (default true), session_root, dir.
//
// Every argv element and environment value is a Template with
// placeholders, {prompt}, {task}, {rollout}, {attempt}, {episode},
// {model_url}, {session}, {workdir}, {sandbox_root} (Placeholders); an
// unknown one is refused. A placeholder fills part of one argv element or
// value, never more: nothing goes through a shell, so a prompt with
// spaces, quotes or newlines reaches the harness as it is.
//
// # The adapter
//
// A rollout's session lives in a session folder in the sandbox,
// <session_root>/<rollout>/<n>, which the harness makes; a relaunch that
// starts over takes n+1. The state in the bookmark is the folder and its
// number. The model server is told the task and the episode by the
// harness, which gets them as {task} and {episode} (the example sends them
// as modelserver.TaskHeader and EpisodeHeader).
package exec
