package relay

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// CodexEmptyTurn names the edit of a Codex continuation. Codex 0.171.0
// cannot continue a saved session without a user message: the least it
// takes is `codex exec resume <id> ""`, which appends an empty user
// message ({"type":"message","role":"user","content":[{"type":
// "input_text","text":""}]}) to the session, so it is in the request of
// the continuation and, as history, in every later one. The edit removes
// every such message from a /v1/responses request's input, and nothing
// else: a request without one passes unchanged, byte for byte, and the
// rest of an edited body keeps its bytes and key order. (Codex also
// re-sends its skills message on such a continuation; the Codex adapter's
// config turns that message off altogether, so there is none to remove.)
const CodexEmptyTurn = "codex-empty-user-turn"

func init() { Register(Edit{Name: CodexEmptyTurn, Apply: removeCodexEmptyTurns}) }

// removeCodexEmptyTurns is CodexEmptyTurn's Apply.
func removeCodexEmptyTurns(path string, body []byte) ([]byte, []json.RawMessage, error) {
	if p, _, _ := strings.Cut(path, "?"); !strings.HasSuffix(p, "/responses") {
		return body, nil, nil
	}
	start, end, err := topLevelValue(body, "input")
	if err != nil {
		return body, nil, fmt.Errorf("%s: %w", CodexEmptyTurn, err)
	}
	if start < 0 {
		return body, nil, nil
	}
	var items []json.RawMessage
	if json.Unmarshal(body[start:end], &items) != nil {
		return body, nil, nil // a string input: no items
	}
	var kept, removed []json.RawMessage
	for _, it := range items {
		if isEmptyUserMessage(it) {
			removed = append(removed, it)
		} else {
			kept = append(kept, it)
		}
	}
	if len(removed) == 0 {
		return body, nil, nil
	}
	var b bytes.Buffer
	b.Write(body[:start])
	b.WriteByte('[')
	for i, it := range kept {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(it)
	}
	b.WriteByte(']')
	b.Write(body[end:])
	return b.Bytes(), removed, nil
}

// isEmptyUserMessage tells an input item that is a user message whose
// content is one or more input_text parts, every one empty, and nothing
// else.
func isEmptyUserMessage(raw json.RawMessage) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return false
	}
	for k := range m {
		switch k {
		case "type", "role", "content", "id":
		default:
			return false
		}
	}
	var typ, role string
	_ = json.Unmarshal(m["type"], &typ)
	_ = json.Unmarshal(m["role"], &role)
	if typ != "message" || role != "user" {
		return false
	}
	var parts []map[string]json.RawMessage
	if json.Unmarshal(m["content"], &parts) != nil || len(parts) == 0 {
		return false
	}
	for _, p := range parts {
		if len(p) != 2 || string(p["type"]) != `"input_text"` || string(p["text"]) != `""` {
			return false
		}
	}
	return true
}
