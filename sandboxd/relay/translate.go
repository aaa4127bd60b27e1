package relay

import (
	"encoding/json"
	"fmt"

	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// This file is the relay's translation of a request (Config.Translate): an
// Anthropic Messages or an OpenAI Responses request sent upstream as a chat
// completion, so that a model server whose native paths return no token
// ids (vLLM) returns them as it does for OpenCode. The reply is translated
// back into the API the harness spoke (translate_reply.go). What has no
// chat completions form (Anthropic's thinking and cache settings, Codex's
// non-function tools, reasoning and store settings) is left out upstream.

// translatePath is where a translated request goes.
const translatePath = "/v1/chat/completions"

// translateRequest returns the chat completion a request of api asks for,
// or an error when the body is no request of api (the call then goes as it
// came).
func translateRequest(api trajectory.API, body []byte) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil || m == nil {
		return nil, fmt.Errorf("relay: translate: the request is not a JSON object")
	}
	msgs, err := trajectory.ChatMessages(api, body)
	if err != nil {
		return nil, fmt.Errorf("relay: translate: %w", err)
	}
	out := map[string]any{"messages": upstreamMessages(msgs)}
	copyField := func(from, to string) {
		if v, ok := m[from]; ok && string(v) != "null" {
			out[to] = v
		}
	}
	copyField("model", "model")
	copyField("temperature", "temperature")
	copyField("top_p", "top_p")
	copyField("stream", "stream")
	if api == trajectory.APIMessages {
		copyField("max_tokens", "max_tokens")
		copyField("top_k", "top_k")
		copyField("stop_sequences", "stop")
		if tools := messagesTools(m["tools"]); len(tools) > 0 {
			out["tools"] = tools
			if tc := messagesToolChoice(m["tool_choice"]); tc != nil {
				out["tool_choice"] = tc
			}
		}
	} else {
		copyField("max_output_tokens", "max_tokens")
		copyField("seed", "seed") // a branch's (branch.go), or the harness's
		if tools := responsesTools(m["tools"]); len(tools) > 0 {
			out["tools"] = tools
			copyField("parallel_tool_calls", "parallel_tool_calls")
			if tc := responsesToolChoice(m["tool_choice"]); tc != nil {
				out["tool_choice"] = tc
			}
		}
	}
	var stream bool
	_ = json.Unmarshal(m["stream"], &stream)
	if stream {
		out["stream_options"] = map[string]bool{"include_usage": true}
	}
	return json.Marshal(out)
}

// upstreamMessages returns the trajectory's messages as a chat completions
// server takes them: a developer message a system one; content parts
// other than text left out; an item the trajectory keeps as it came (no
// role: a Responses item of no chat form) left out.
func upstreamMessages(msgs []json.RawMessage) []json.RawMessage {
	out := make([]json.RawMessage, 0, len(msgs))
	for _, raw := range msgs {
		var msg map[string]json.RawMessage
		if json.Unmarshal(raw, &msg) != nil {
			continue
		}
		var role string
		if json.Unmarshal(msg["role"], &role) != nil || role == "" {
			continue
		}
		if role == "developer" {
			msg["role"] = json.RawMessage(`"system"`)
		}
		var parts []map[string]json.RawMessage
		if json.Unmarshal(msg["content"], &parts) == nil {
			kept := make([]map[string]json.RawMessage, 0, len(parts))
			for _, p := range parts {
				if string(p["type"]) == `"text"` {
					kept = append(kept, p)
				}
			}
			msg["content"], _ = json.Marshal(kept)
		}
		b, err := json.Marshal(msg)
		if err == nil {
			out = append(out, b)
		}
	}
	return out
}

// chatTool is a chat completion's function tool.
type chatTool struct {
	Type     string       `json:"type"`
	Function chatFunction `json:"function"`
}

type chatFunction struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
}

// objectSchema is the parameters of a tool that names none.
var objectSchema = json.RawMessage(`{"type":"object","properties":{}}`)

// messagesTools returns Anthropic tools (name, description, input_schema)
// as chat tools; a server tool (no input_schema) is left out.
func messagesTools(raw json.RawMessage) []chatTool {
	var tools []struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		InputSchema json.RawMessage `json:"input_schema"`
	}
	_ = json.Unmarshal(raw, &tools)
	var out []chatTool
	for _, t := range tools {
		if t.Name == "" || len(t.InputSchema) == 0 {
			continue
		}
		out = append(out, chatTool{Type: "function", Function: chatFunction{Name: t.Name, Description: t.Description, Parameters: t.InputSchema}})
	}
	return out
}

// messagesToolChoice returns Anthropic's tool_choice in chat's form (nil:
// the server's default).
func messagesToolChoice(raw json.RawMessage) any {
	var tc struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if json.Unmarshal(raw, &tc) != nil {
		return nil
	}
	switch tc.Type {
	case "auto", "none":
		return tc.Type
	case "any":
		return "required"
	case "tool":
		return map[string]any{"type": "function", "function": map[string]string{"name": tc.Name}}
	}
	return nil
}

// responsesTools returns the Responses function tools (type function,
// name, description, parameters) as chat tools; the others (namespaces,
// web search, custom tools) are left out.
func responsesTools(raw json.RawMessage) []chatTool {
	var tools []struct {
		Type        string          `json:"type"`
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	}
	_ = json.Unmarshal(raw, &tools)
	var out []chatTool
	for _, t := range tools {
		if t.Type != "function" || t.Name == "" {
			continue
		}
		params := t.Parameters
		if len(params) == 0 || string(params) == "null" {
			params = objectSchema
		}
		out = append(out, chatTool{Type: "function", Function: chatFunction{Name: t.Name, Description: t.Description, Parameters: params}})
	}
	return out
}

// responsesToolChoice returns a Responses tool_choice in chat's form.
func responsesToolChoice(raw json.RawMessage) any {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		switch s {
		case "auto", "none", "required":
			return s
		}
		return nil
	}
	var tc struct {
		Type string `json:"type"`
		Name string `json:"name"`
	}
	if json.Unmarshal(raw, &tc) == nil && tc.Type == "function" && tc.Name != "" {
		return map[string]any{"type": "function", "function": map[string]string{"name": tc.Name}}
	}
	return nil
}
