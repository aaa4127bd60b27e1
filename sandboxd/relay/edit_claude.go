package relay

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/stillpoint/stillpoint/sandboxd/trajectory"

	"github.com/stillpoint/stillpoint/internal/claudecode"
)

// Claude Code's continuation (participants/claude): after a crash its
// saved session is continued with `claude -p <ClaudeContinuePrompt>
// --resume <id>`, the one way Claude Code 2.1.332 continues a session
// that no PreToolUse hook deferred. Claude then adds two messages to every
// later request of the session: an assistant message that is exactly the
// text ClaudeNoResponse (left out when the session already ends with an
// assistant message) and a user message that is exactly the text
// ClaudeContinuePrompt. The edit ClaudeContinueEdit removes each such
// message, and nothing else, so that the model sees the session as it was.

// ClaudeContinueEdit names the edit of Claude Code's continuation.
const ClaudeContinueEdit = "claude-continue"

// ClaudeContinuePrompt is the user turn that continues a saved Claude Code
// session; the relay removes it before the model sees a request.
const ClaudeContinuePrompt = claudecode.ContinuePrompt

// ClaudeNoResponse is the text of the assistant message Claude Code adds
// before a prompt that continues a session (the session ended on a user
// message or a tool result).
const ClaudeNoResponse = claudecode.NoResponse

func init() {
	Register(Edit{Name: ClaudeContinueEdit, Apply: claudeContinue})
}

// claudeMessage is the part of a Messages API message the edit reads.
type claudeMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// onlyText tells whether content is exactly one text block of text (or
// the string text): cache_control marks aside, nothing else.
func onlyText(content json.RawMessage, text string) bool {
	var s string
	if json.Unmarshal(content, &s) == nil {
		return s == text
	}
	var blocks []map[string]json.RawMessage
	if json.Unmarshal(content, &blocks) != nil || len(blocks) != 1 {
		return false
	}
	b := blocks[0]
	var typ, got string
	_ = json.Unmarshal(b["type"], &typ)
	_ = json.Unmarshal(b["text"], &got)
	for k := range b {
		if k != "type" && k != "text" && k != "cache_control" {
			return false
		}
	}
	return typ == "text" && got == text
}

// claudeContinue removes Claude Code's continuation messages from a
// Messages API request: each user message that is exactly
// ClaudeContinuePrompt, and the ClaudeNoResponse assistant message right
// before it. The rest of the body is kept byte for byte. A user message
// that holds the marker beside anything else is an error (the request
// then goes unedited, and its record says so): the edit removes its exact
// addition or nothing.
func claudeContinue(path string, body []byte) ([]byte, []json.RawMessage, error) {
	if trajectory.APIOf(path) != trajectory.APIMessages {
		return body, nil, nil
	}
	start, end, err := topLevelValue(body, "messages")
	if err != nil {
		return body, nil, fmt.Errorf("%s: %w", ClaudeContinueEdit, err)
	}
	if start < 0 {
		return body, nil, nil
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(body[start:end], &raw); err != nil {
		return body, nil, fmt.Errorf("claude-continue: the messages do not decode: %w", err)
	}
	msgs := make([]claudeMessage, len(raw))
	for i, r := range raw {
		_ = json.Unmarshal(r, &msgs[i])
	}
	drop := make([]bool, len(raw))
	n := 0
	for i, m := range msgs {
		if m.Role != "user" {
			continue
		}
		if !onlyText(m.Content, ClaudeContinuePrompt) {
			if bytes.Contains(raw[i], []byte(ClaudeContinuePrompt)) {
				// The marker, but not alone: not the addition this edit
				// knows, so nothing is removed and the record says why.
				return body, nil, fmt.Errorf("%s: message %d holds %q beside other content: not removed", ClaudeContinueEdit, i, ClaudeContinuePrompt)
			}
			continue
		}
		drop[i] = true
		n++
		if i > 0 && msgs[i-1].Role == "assistant" && onlyText(msgs[i-1].Content, ClaudeNoResponse) {
			drop[i-1] = true
			n++
		}
	}
	if n == 0 {
		return body, nil, nil
	}
	var removed []json.RawMessage
	var arr bytes.Buffer
	arr.WriteByte('[')
	for i, r := range raw {
		if drop[i] {
			removed = append(removed, r)
			continue
		}
		if arr.Len() > 1 {
			arr.WriteByte(',')
		}
		arr.Write(r)
	}
	arr.WriteByte(']')
	out := make([]byte, 0, len(body))
	out = append(append(append(out, body[:start]...), arr.Bytes()...), body[end:]...)
	return out, removed, nil
}
