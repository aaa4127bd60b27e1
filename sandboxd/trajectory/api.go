package trajectory

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// This file is the capture's three wire APIs on the request side: which
// one a call spoke (by its path), and a Messages or a Responses request in
// the trajectory's message form (chat completions' messages), so that
// lineage, the record's delta and a trainer read one form whatever the
// harness spoke. The raw API is named in the record (Call.API).

// API is the wire API a call spoke.
type API string

// The APIs.
const (
	// APIChat is OpenAI chat completions (/v1/chat/completions).
	APIChat API = "chat"
	// APIMessages is Anthropic Messages (/v1/messages, any query).
	APIMessages API = "messages"
	// APIResponses is OpenAI Responses (/v1/responses).
	APIResponses API = "responses"
	// APIOther is any other path (a count of tokens, a model list): the
	// capture records its request and status, no reply and no lineage.
	APIOther API = "other"
)

// APIOf returns the API a request path (with or without its query)
// speaks, by its last segments.
func APIOf(path string) API {
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	path = strings.TrimRight(path, "/")
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		return APIChat
	case strings.HasSuffix(path, "/messages"):
		return APIMessages
	case strings.HasSuffix(path, "/responses"):
		return APIResponses
	}
	return APIOther
}

// splitAPI splits a request of api into its model, its other members and
// its messages in the trajectory's form.
func splitAPI(api API, body []byte) (model string, params json.RawMessage, msgs []json.RawMessage, err error) {
	switch api {
	case APIChat:
		return splitRequest(body)
	case APIMessages, APIResponses:
	default:
		// Not a model call the capture knows: its fields as they are.
		model, params, msgs, err = splitRequest(body)
		if err != nil {
			return "", nil, nil, err
		}
		if msgs != nil {
			// Its messages (a count of tokens has them) stay its own, not
			// the lineage's: back into params.
			var m map[string]json.RawMessage
			if json.Unmarshal(body, &m) != nil {
				return "", nil, nil, errors.New("the request is not a JSON object")
			}
			params = marshalPlain(compactAll(m))
		}
		return model, params, nil, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil || m == nil {
		if err == nil {
			err = errors.New("null")
		}
		return "", nil, nil, notObject(err)
	}
	_ = json.Unmarshal(m["model"], &model)
	if api == APIMessages {
		msgs, err = messagesRequest(m["system"], m["messages"])
		delete(m, "system")
		delete(m, "messages")
	} else {
		msgs, err = responsesRequest(m["instructions"], m["input"])
		delete(m, "instructions")
		delete(m, "input")
	}
	if err != nil {
		return "", nil, nil, err
	}
	return model, marshalPlain(compactAll(m)), msgs, nil
}

// compactAll compacts every value of m in place.
func compactAll(m map[string]json.RawMessage) map[string]json.RawMessage {
	for k, v := range m {
		var b bytes.Buffer
		if json.Compact(&b, v) == nil {
			m[k] = b.Bytes()
		}
	}
	return m
}

// compact returns v without white space outside its strings (v when it is
// no JSON).
func compact(v json.RawMessage) json.RawMessage {
	var b bytes.Buffer
	if json.Compact(&b, v) != nil {
		return v
	}
	return b.Bytes()
}

// block is a content block of a Messages request, or a content part or an
// item of a Responses one: the members either reads.
type block struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Text      string          `json:"text"`
	Thinking  string          `json:"thinking"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
	Summary   []block         `json:"summary"`
}

// chatMsg is a message in the trajectory's form (chat completions').
type chatMsg struct {
	Role       string         `json:"role"`
	Content    any            `json:"content"`
	Reasoning  string         `json:"reasoning_content,omitempty"`
	ToolCalls  []chatToolCall `json:"tool_calls,omitempty"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
}

type chatToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function chatFunction `json:"function"`
}

type chatFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// textPart is a chat completion's text content part.
type textPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// messagesRequest returns a Messages request's system and messages in the
// trajectory's form: the system a system message; a user message's
// tool_result blocks each a tool message, before its other blocks (the
// text ones as text parts, any other as it is); an assistant message's
// text joined as its content, its thinking as reasoning_content, its
// tool_use blocks as tool calls (arguments the input's compact JSON).
func messagesRequest(system, messages json.RawMessage) ([]json.RawMessage, error) {
	var out []json.RawMessage
	if len(system) > 0 && string(system) != "null" {
		c, err := anthropicContent(system)
		if err != nil {
			return nil, fmt.Errorf("the request's system: %w", err)
		}
		out = append(out, marshalPlain(chatMsg{Role: "system", Content: c}))
	}
	if len(messages) == 0 || string(messages) == "null" {
		return out, nil
	}
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(messages, &msgs); err != nil {
		return nil, fmt.Errorf("the request's messages: %w", err)
	}
	for _, m := range msgs {
		var s string
		if json.Unmarshal(m.Content, &s) == nil {
			out = append(out, marshalPlain(chatMsg{Role: m.Role, Content: s}))
			continue
		}
		var blocks []json.RawMessage
		if err := json.Unmarshal(m.Content, &blocks); err != nil {
			return nil, fmt.Errorf("a %s message's content: %w", m.Role, err)
		}
		if m.Role == "assistant" {
			out = append(out, marshalPlain(assistantOf(blocks)))
			continue
		}
		var parts []any
		for _, raw := range blocks {
			var b block
			if json.Unmarshal(raw, &b) != nil {
				parts = append(parts, uncached(raw))
				continue
			}
			switch b.Type {
			case "tool_result":
				c, err := anthropicContent(b.Content)
				if err != nil {
					c = compact(b.Content)
				}
				out = append(out, marshalPlain(chatMsg{Role: "tool", ToolCallID: b.ToolUseID, Content: c}))
			case "text":
				parts = append(parts, textPart{Type: "text", Text: b.Text})
			default:
				parts = append(parts, uncached(raw))
			}
		}
		if len(parts) > 0 || len(blocks) == 0 {
			if parts == nil {
				parts = []any{}
			}
			out = append(out, marshalPlain(chatMsg{Role: m.Role, Content: oneText(parts)}))
		}
	}
	return out, nil
}

// assistantOf returns an assistant message of Messages content blocks.
func assistantOf(blocks []json.RawMessage) chatMsg {
	msg := chatMsg{Role: "assistant"}
	var text, reasoning strings.Builder
	for _, raw := range blocks {
		var b block
		if json.Unmarshal(raw, &b) != nil {
			continue
		}
		switch b.Type {
		case "text":
			text.WriteString(b.Text)
		case "thinking":
			reasoning.WriteString(b.Thinking)
		case "tool_use", "server_tool_use":
			args := "{}"
			if len(b.Input) > 0 && string(b.Input) != "null" {
				args = string(compact(b.Input))
			}
			msg.ToolCalls = append(msg.ToolCalls, chatToolCall{ID: b.ID, Type: "function", Function: chatFunction{Name: b.Name, Arguments: args}})
		}
	}
	msg.Content, msg.Reasoning = text.String(), reasoning.String()
	return msg
}

// anthropicContent returns a string content as it is, and blocks as text
// parts (the text ones) or as they are (the others).
func anthropicContent(c json.RawMessage) (any, error) {
	if len(c) == 0 || string(c) == "null" {
		return "", nil
	}
	var s string
	if json.Unmarshal(c, &s) == nil {
		return s, nil
	}
	var blocks []json.RawMessage
	if err := json.Unmarshal(c, &blocks); err != nil {
		return nil, err
	}
	parts := make([]any, 0, len(blocks))
	for _, raw := range blocks {
		var b block
		if json.Unmarshal(raw, &b) == nil && b.Type == "text" {
			parts = append(parts, textPart{Type: "text", Text: b.Text})
			continue
		}
		parts = append(parts, uncached(raw))
	}
	return oneText(parts), nil
}

// oneText returns content parts that are one text part as its text: Claude
// Code sends a message as one text block in one call and as a string in
// the next, and the two must be one message to lineage.
func oneText(parts []any) any {
	if len(parts) == 1 {
		if p, ok := parts[0].(textPart); ok {
			return p.Text
		}
	}
	return parts
}

// uncached returns a content block without its cache_control, which a
// harness moves from call to call, compact, its keys sorted.
func uncached(raw json.RawMessage) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return compact(raw)
	}
	delete(m, "cache_control")
	return marshalPlain(compactAll(m))
}

// responsesRequest returns a Responses request's instructions and input
// in the trajectory's form: the instructions a system message; a string
// input one user message; each message item a message of its role (its
// input_text and output_text parts as text parts); a run of the model's
// items (assistant messages, reasoning, function calls) one assistant
// message, as the reply that made them is recorded; a function call's
// output a tool message. An item of another type is kept as it is.
func responsesRequest(instructions, input json.RawMessage) ([]json.RawMessage, error) {
	var out []json.RawMessage
	var ins string
	if json.Unmarshal(instructions, &ins) == nil && ins != "" {
		out = append(out, marshalPlain(chatMsg{Role: "system", Content: ins}))
	}
	if len(input) == 0 || string(input) == "null" {
		return out, nil
	}
	var s string
	if json.Unmarshal(input, &s) == nil {
		return append(out, marshalPlain(chatMsg{Role: "user", Content: s})), nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(input, &items); err != nil {
		return nil, fmt.Errorf("the request's input: %w", err)
	}
	var run *responseRun
	flush := func() {
		if run != nil {
			out = append(out, marshalPlain(run.message()))
			run = nil
		}
	}
	for _, raw := range items {
		var b block
		if json.Unmarshal(raw, &b) != nil {
			flush()
			out = append(out, compact(raw))
			continue
		}
		if b.Type == "" && b.Role != "" {
			b.Type = "message"
		}
		if modelItem(b) {
			if run == nil {
				run = &responseRun{}
			}
			run.add(b)
			continue
		}
		flush()
		switch b.Type {
		case "message":
			out = append(out, marshalPlain(chatMsg{Role: b.Role, Content: responsesContent(b.Content)}))
		case "function_call_output", "custom_tool_call_output":
			var c any = compact(b.Output)
			var str string
			if json.Unmarshal(b.Output, &str) == nil {
				c = str
			} else if len(b.Output) == 0 {
				c = ""
			} else {
				c = responsesContent(b.Output)
			}
			out = append(out, marshalPlain(chatMsg{Role: "tool", ToolCallID: b.CallID, Content: c}))
		default:
			out = append(out, compact(raw))
		}
	}
	flush()
	return out, nil
}

// modelItem tells whether a Responses item is the model's: an assistant
// message, reasoning, a function call.
func modelItem(b block) bool {
	switch b.Type {
	case "message":
		return b.Role == "assistant"
	case "reasoning", "function_call", "custom_tool_call":
		return true
	}
	return false
}

// responseRun is a run of the model's Responses items, made one assistant
// message.
type responseRun struct {
	text, reasoning strings.Builder
	calls           []chatToolCall
}

func (r *responseRun) add(b block) {
	switch b.Type {
	case "message":
		var parts []block
		var s string
		if json.Unmarshal(b.Content, &s) == nil {
			r.text.WriteString(s)
		} else if json.Unmarshal(b.Content, &parts) == nil {
			for _, p := range parts {
				if p.Type == "output_text" || p.Type == "text" || p.Type == "input_text" {
					r.text.WriteString(p.Text)
				}
			}
		}
	case "reasoning":
		for _, p := range b.Summary {
			r.reasoning.WriteString(p.Text)
		}
	case "function_call":
		r.calls = append(r.calls, chatToolCall{ID: b.CallID, Type: "function", Function: chatFunction{Name: b.Name, Arguments: b.Arguments}})
	case "custom_tool_call":
		var in string
		_ = json.Unmarshal(b.Input, &in)
		r.calls = append(r.calls, chatToolCall{ID: b.CallID, Type: "custom", Function: chatFunction{Name: b.Name, Arguments: in}})
	}
}

func (r *responseRun) message() chatMsg {
	return chatMsg{Role: "assistant", Content: r.text.String(), Reasoning: r.reasoning.String(), ToolCalls: r.calls}
}

// responsesContent returns a Responses message's content: a string as it
// is, its text parts (input_text, output_text) as text parts, any other
// part as it is.
func responsesContent(c json.RawMessage) any {
	var s string
	if json.Unmarshal(c, &s) == nil {
		return s
	}
	var raws []json.RawMessage
	if json.Unmarshal(c, &raws) != nil {
		return compact(c)
	}
	parts := make([]any, 0, len(raws))
	for _, raw := range raws {
		var b block
		if json.Unmarshal(raw, &b) == nil && (b.Type == "input_text" || b.Type == "output_text" || b.Type == "text") {
			parts = append(parts, textPart{Type: "text", Text: b.Text})
			continue
		}
		parts = append(parts, compact(raw))
	}
	return parts
}

// ChatMessages returns the messages of a request of api in the
// trajectory's form (chat completions'): what the relay sends upstream
// when it translates a Messages or a Responses request.
func ChatMessages(api API, body []byte) ([]json.RawMessage, error) {
	_, _, msgs, err := splitAPI(api, body)
	return msgs, err
}
