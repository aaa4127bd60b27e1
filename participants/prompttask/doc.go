// Package prompttask is the task payload the adapters of harness CLIs
// read (OpenCode, Claude Code, Codex, exec): a prompt, the first user
// message, and optionally the name a model server knows the task by. The
// rest of a payload is the owner's kind's, which builds the sandbox from
// it and grades with it; the adapters leave it alone.
package prompttask
