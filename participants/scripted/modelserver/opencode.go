package modelserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// What the server knows of OpenCode's requests (OpenCode 1.18.33 through
// its bundled @ai-sdk/openai-compatible provider): every call streams with
// stream_options.include_usage and offers OpenCode's tools; the title call
// offers none; the session so far is sent whole, one assistant message per
// step; a step whose tool OpenCode never finished (it was killed mid-tool)
// is sent with the tool result Interrupted; a reply that was cut off
// mid-stream is kept as an empty assistant message.

// Interrupted is the tool result OpenCode sends for a tool call that did
// not finish because OpenCode stopped (or was killed) while it ran.
const Interrupted = "[Tool execution was interrupted]"

// TitleReply is the answer to OpenCode's title call.
const TitleReply = "Scripted title"

// OpenCodeAgent is how OpenCode's User-Agent header starts.
const OpenCodeAgent = "opencode/"

// isTitleCall tells OpenCode's title call: a request from OpenCode that
// offers no tools. (With --title OpenCode makes none.)
func isTitleCall(r *http.Request, req Request) bool {
	return len(req.Tools) == 0 && strings.HasPrefix(r.UserAgent(), OpenCodeAgent)
}

// openCodeTurn numbers the turn of a request that offers tools: the
// assistant messages so far, less those that are no answer of the script
// (empty: a reply cut mid-stream) and those whose every tool call came
// back Interrupted, which the turn answers again, as a model would
// re-issue a call that did not run. retries counts the latter since the
// last answer that counted. Codex's Aborted and Claude Code's
// ClaudeInterrupted count as Interrupted: a relay that translates their
// calls to chat completions sends them here.
func openCodeTurn(msgs []Message) (turn, retries int) { return countTurns(msgs, interruptedOnChat) }

// interruptedOnChat tells a tool result on chat completions that says its
// call was interrupted, in any harness's words.
func interruptedOnChat(r string) bool {
	return r == Interrupted || r == Aborted || strings.HasPrefix(r, ClaudeInterrupted)
}

// countTurns is openCodeTurn with interrupted telling the tool results a
// harness sends for a call a crash interrupted.
func countTurns(msgs []Message, interrupted func(string) bool) (turn, retries int) {
	for i, m := range msgs {
		if m.Role != "assistant" {
			continue
		}
		var calls []ToolCall
		_ = json.Unmarshal(m.ToolCalls, &calls)
		if len(calls) == 0 && isEmptyContent(m.Content) {
			continue
		}
		if len(calls) > 0 && allInterrupted(calls, msgs[i+1:], interrupted) {
			retries++
			continue
		}
		turn, retries = turn+1, 0
	}
	return turn, retries
}

// retry returns t for its retries-th answer again: the same calls under
// ids of their own, as a model names each call anew.
func retry(t Turn, retries int) Turn {
	if retries == 0 || len(t.ToolCalls) == 0 {
		return t
	}
	t.ToolCalls = slices.Clone(t.ToolCalls)
	for i := range t.ToolCalls {
		t.ToolCalls[i].ID = fmt.Sprintf("%s.r%d", t.ToolCalls[i].ID, retries)
	}
	return t
}

func isEmptyContent(c json.RawMessage) bool {
	var s string
	switch t := strings.TrimSpace(string(c)); {
	case t == "" || t == "null" || t == "[]":
		return true
	case json.Unmarshal(c, &s) == nil:
		return strings.TrimSpace(s) == ""
	}
	return false
}

// allInterrupted tells whether each of calls has a result among the tool
// messages that follow, and interrupted tells each result is a harness's
// word for a call a crash interrupted.
func allInterrupted(calls []ToolCall, after []Message, interrupted func(string) bool) bool {
	results := map[string]string{}
	for _, m := range after {
		if m.Role != "tool" {
			break
		}
		results[m.ToolCallID] = trajectory.MessageText(m.Content)
	}
	for _, c := range calls {
		if r, ok := results[c.ID]; !ok || !interrupted(r) {
			return false
		}
	}
	return true
}

// offeredTool is the part of an offered tool the server checks.
type offeredTool struct {
	Function struct {
		Name       string `json:"name"`
		Parameters struct {
			Required []string `json:"required"`
		} `json:"parameters"`
	} `json:"function"`
}

// errToolCall is wrapped by checkToolCalls.
var errToolCall = errors.New("modelserver: the script's tool call does not fit the offered tools")

// checkToolCalls checks a scripted answer against the tools the request
// offers, when it offers some: each call names one of them and its
// arguments are a JSON object with every required parameter. A script
// that does not fit gets a 400 that says why, not a call the harness
// would fail in a way that is harder to read.
func checkToolCalls(tools json.RawMessage, calls []ToolCall) error {
	if len(tools) == 0 || len(calls) == 0 {
		return nil
	}
	var offered []offeredTool
	if err := json.Unmarshal(tools, &offered); err != nil {
		return fmt.Errorf("%w: the request's tools do not decode: %v", errToolCall, err)
	}
	var errs []error
	for _, c := range calls {
		i := slices.IndexFunc(offered, func(o offeredTool) bool { return o.Function.Name == c.Function.Name })
		if i < 0 {
			errs = append(errs, fmt.Errorf("%w: %s calls %q, which is not offered", errToolCall, c.ID, c.Function.Name))
			continue
		}
		var args map[string]json.RawMessage
		if err := json.Unmarshal([]byte(c.Function.Arguments), &args); err != nil {
			errs = append(errs, fmt.Errorf("%w: %s: the arguments are not a JSON object: %v", errToolCall, c.ID, err))
			continue
		}
		for _, p := range offered[i].Function.Parameters.Required {
			if _, ok := args[p]; !ok {
				errs = append(errs, fmt.Errorf("%w: %s: %s needs %q", errToolCall, c.ID, c.Function.Name, p))
			}
		}
	}
	return errors.Join(errs...)
}

// Call returns a tool call of tool name with args (marshalled to JSON).
func Call(id, name string, args any) ToolCall {
	var tc ToolCall
	tc.ID, tc.Type = id, "function"
	tc.Function.Name = name
	// As a model writes them: `2>&1`, not the \u003e\u0026 of Go's HTML
	// escaping, which a harness that re-encodes the arguments (OpenCode)
	// would not send back, breaking the prompt's tokens from the reply's.
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(args)
	tc.Function.Arguments = strings.TrimSuffix(b.String(), "\n")
	return tc
}

// BashCall runs command in OpenCode's bash tool (and in the scripted
// harness, whose one tool takes the same argument).
func BashCall(id, command string) ToolCall {
	return Call(id, "bash", map[string]string{"command": command})
}

// ReadCall reads a file with OpenCode's read tool; a relative path is
// taken from the working directory.
func ReadCall(id, path string) ToolCall {
	return Call(id, "read", map[string]string{"filePath": path})
}

// EditCall replaces old with new in a file with OpenCode's edit tool (old
// must occur once in it).
func EditCall(id, path, old, new string) ToolCall {
	return Call(id, "edit", map[string]string{"filePath": path, "oldString": old, "newString": new})
}

// WriteCall writes a whole file with OpenCode's write tool.
func WriteCall(id, path, content string) ToolCall {
	return Call(id, "write", map[string]string{"filePath": path, "content": content})
}
