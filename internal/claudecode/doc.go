// Package claudecode holds the texts Claude Code's continuation of a saved
// session adds to its requests, in one place for the parts that read them:
// the Claude driver that continues a session (participants/claude/driver),
// the relay edit that removes them (sandboxd/relay, edit claude-continue)
// and the scripted model server that numbers turns
// (participants/scripted/modelserver). It imports nothing, so that the
// in-sandbox driver stays small.
package claudecode

// ContinuePrompt is the prompt that continues a saved session: Claude Code
// 2.1.332 continues one only with a prompt, `claude -p ContinuePrompt
// --resume <id>`, and the relay removes it before the model sees a
// request.
const ContinuePrompt = "[stillpoint: continue the saved session]"

// NoResponse is the text of the assistant message Claude Code adds before
// a prompt that continues a session ending on a user message or a tool
// result.
const NoResponse = "No response requested."
