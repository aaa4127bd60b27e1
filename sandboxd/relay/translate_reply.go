package relay

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// This file translates a chat completion's reply back into the API the
// harness spoke (Config.Translate): a stream chunk by chunk, a plain reply
// whole. A Messages stream is the events Claude Code takes (message_start,
// content_block_start, _delta and _stop, message_delta, message_stop), its
// text and tool input streamed as they come; a Responses stream is
// response.created at the first chunk, then, once the completion is
// whole, each output item (response.output_item.done) and
// response.completed, the sequence Codex takes. The model's reasoning is
// not sent back. The same upstream bytes give the same bytes, so a re-sent
// call continues what was delivered. A stream is closed (message_stop,
// response.completed) only once a finish reason came: an error the
// upstream sent in the stream (vLLM's `data: {"error":...}`) becomes the
// harness API's own (an error event, response.failed), and a stream that
// ends without a finish reason is left unfinished, as it would be on the
// native path, so that the harness does not take it for a whole reply.

// replyTranslator is the translation of one reply.
type replyTranslator struct {
	api    trajectory.API
	stream bool

	// started: the first event went out; stopped: the last one did (the
	// close, or an error); failed: it was an error.
	started, stopped, failed bool
	id, model                string
	promptTokens             int
	usage                    *chatUsage
	finish                   string
	completionIDs            int

	// Messages: the open content block (-1: none) and its kind, the next
	// index, and each chat tool call's block.
	open     int
	openKind string
	next     int
	toolAt   map[int]int
	anyTool  bool

	// Responses: the text and the tool calls so far.
	text  strings.Builder
	calls []*translatedCall
}

type translatedCall struct{ id, name, args string }

type chatUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
}

// chatChunk is what the translation reads of a chat completion (a chunk,
// or a plain reply).
type chatChunk struct {
	Error          json.RawMessage `json:"error"`
	ID             string          `json:"id"`
	Model          string          `json:"model"`
	PromptTokenIDs []int           `json:"prompt_token_ids"`
	Usage          *chatUsage      `json:"usage"`
	Choices        []struct {
		Index        int     `json:"index"`
		FinishReason *string `json:"finish_reason"`
		TokenIDs     []int   `json:"token_ids"`
		Delta        *struct {
			Content   *string `json:"content"`
			ToolCalls []struct {
				Index    *int   `json:"index"`
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
	} `json:"choices"`
}

func newReplyTranslator(api trajectory.API, stream bool) *replyTranslator {
	return &replyTranslator{api: api, stream: stream, open: -1, toolAt: map[int]int{}}
}

// event appends one server-sent event to out.
func event(out []byte, name string, data any) []byte {
	b, _ := json.Marshal(data)
	out = append(out, "event: "+name+"\ndata: "...)
	out = append(out, b...)
	return append(out, "\n\n"...)
}

// line translates one line of a chat completion stream (with its line
// end) and returns the harness's bytes for it.
func (t *replyTranslator) line(l []byte) []byte {
	data, ok := bytes.CutPrefix(bytes.TrimRight(l, "\r\n"), []byte("data:"))
	if !ok {
		return nil // the chat stream's own framing: the translation makes its own
	}
	data = bytes.TrimSpace(data)
	if t.stopped {
		return nil // closed, or failed: nothing more reaches the harness
	}
	if string(data) == "[DONE]" {
		return t.finishStream(nil)
	}
	var c chatChunk
	if json.Unmarshal(data, &c) != nil {
		return nil
	}
	if upstreamError(c.Error) {
		return t.fail(nil, c.Error)
	}
	var out []byte
	if c.ID != "" && t.id == "" {
		t.id = c.ID
	}
	if c.Model != "" {
		t.model = c.Model
	}
	if c.PromptTokenIDs != nil {
		t.promptTokens = len(c.PromptTokenIDs)
	}
	if c.Usage != nil {
		t.usage = c.Usage
	}
	if !t.started {
		t.started = true
		out = t.start(out)
	}
	for _, ch := range c.Choices {
		if ch.Index != 0 {
			continue
		}
		t.completionIDs += len(ch.TokenIDs)
		if d := ch.Delta; d != nil {
			if d.Content != nil && *d.Content != "" {
				out = t.text1(out, *d.Content)
			}
			for k, tc := range d.ToolCalls {
				i := k
				if tc.Index != nil {
					i = *tc.Index
				}
				out = t.tool(out, i, tc.ID, tc.Function.Name, tc.Function.Arguments)
			}
		}
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			t.finish = *ch.FinishReason
		}
	}
	return out
}

func (t *replyTranslator) msgID() string {
	if t.id == "" {
		return "relay"
	}
	return t.id
}

// start is the first event of a stream.
func (t *replyTranslator) start(out []byte) []byte {
	if t.api == trajectory.APIMessages {
		return event(out, "message_start", map[string]any{"type": "message_start", "message": map[string]any{
			"id": "msg_" + t.msgID(), "type": "message", "role": "assistant", "model": t.model, "content": []any{},
			"stop_reason": nil, "stop_sequence": nil, "usage": map[string]int{"input_tokens": t.inputTokens(), "output_tokens": 0}}})
	}
	return event(out, "response.created", map[string]any{"type": "response.created", "response": map[string]any{
		"id": "resp_" + t.msgID(), "object": "response", "model": t.model, "status": "in_progress", "output": []any{}}})
}

func (t *replyTranslator) inputTokens() int {
	if t.usage != nil && t.usage.PromptTokens > 0 {
		return t.usage.PromptTokens
	}
	return t.promptTokens
}

func (t *replyTranslator) outputTokens() int {
	if t.usage != nil && t.usage.CompletionTokens > 0 {
		return t.usage.CompletionTokens
	}
	return t.completionIDs
}

// closeBlock ends the open Messages content block.
func (t *replyTranslator) closeBlock(out []byte) []byte {
	if t.open < 0 {
		return out
	}
	out = event(out, "content_block_stop", map[string]any{"type": "content_block_stop", "index": t.open})
	t.open, t.openKind = -1, ""
	return out
}

// text1 takes a piece of the reply's text.
func (t *replyTranslator) text1(out []byte, s string) []byte {
	if t.api != trajectory.APIMessages {
		t.text.WriteString(s)
		return out
	}
	if t.openKind != "text" {
		out = t.closeBlock(out)
		t.open, t.openKind = t.next, "text"
		t.next++
		out = event(out, "content_block_start", map[string]any{"type": "content_block_start", "index": t.open,
			"content_block": map[string]string{"type": "text", "text": ""}})
	}
	return event(out, "content_block_delta", map[string]any{"type": "content_block_delta", "index": t.open,
		"delta": map[string]string{"type": "text_delta", "text": s}})
}

// tool takes a piece of chat tool call i.
func (t *replyTranslator) tool(out []byte, i int, id, name, args string) []byte {
	if t.api != trajectory.APIMessages {
		for len(t.calls) <= i && i < 1024 {
			t.calls = append(t.calls, &translatedCall{})
		}
		if i >= len(t.calls) || i < 0 {
			return out
		}
		c := t.calls[i]
		if id != "" {
			c.id = id
		}
		c.name += name
		c.args += args
		return out
	}
	t.anyTool = true
	at, ok := t.toolAt[i]
	if !ok {
		out = t.closeBlock(out)
		at = t.next
		t.next++
		t.toolAt[i] = at
		t.open, t.openKind = at, "tool"
		out = event(out, "content_block_start", map[string]any{"type": "content_block_start", "index": at,
			"content_block": map[string]any{"type": "tool_use", "id": id, "name": name, "input": map[string]any{}}})
	}
	if args == "" {
		return out
	}
	return event(out, "content_block_delta", map[string]any{"type": "content_block_delta", "index": at,
		"delta": map[string]string{"type": "input_json_delta", "partial_json": args}})
}

// stopReason is the chat finish reason as Messages names it.
func (t *replyTranslator) stopReason() string {
	switch {
	case t.finish == "tool_calls" || t.anyTool && t.finish != "length":
		return "tool_use"
	case t.finish == "length":
		return "max_tokens"
	}
	return "end_turn"
}

// finishStream returns the stream's last events, once, if a finish reason
// came: at [DONE], or at the end of a stream that had none. Without a
// finish reason it returns nothing more: the harness's stream stays
// unfinished, as the upstream's was.
func (t *replyTranslator) finishStream(out []byte) []byte {
	if t.stopped || !t.started || t.finish == "" {
		return out
	}
	t.stopped = true
	if t.api == trajectory.APIMessages {
		out = t.closeBlock(out)
		out = event(out, "message_delta", map[string]any{"type": "message_delta",
			"delta": map[string]any{"stop_reason": t.stopReason(), "stop_sequence": nil}, "usage": map[string]int{"output_tokens": t.outputTokens()}})
		return event(out, "message_stop", map[string]string{"type": "message_stop"})
	}
	items := t.responseItems()
	for i, it := range items {
		out = event(out, "response.output_item.done", map[string]any{"type": "response.output_item.done", "output_index": i, "item": it})
	}
	return event(out, "response.completed", map[string]any{"type": "response.completed", "response": t.response(items)})
}

// upstreamError tells whether a chat chunk's error member is set.
func upstreamError(raw json.RawMessage) bool {
	return len(raw) > 0 && string(raw) != "null"
}

// errorMessage is the message of an upstream's error member: its
// message, or the member's JSON.
func errorMessage(raw json.RawMessage) string {
	var e struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(raw, &e) == nil && e.Message != "" {
		return "upstream error: " + e.Message
	}
	var s string
	if json.Unmarshal(raw, &s) == nil && s != "" {
		return "upstream error: " + s
	}
	return "upstream error: " + string(raw)
}

// fail ends a stream with the upstream's error raw as the harness's API
// says an error: Messages' error event, Responses' response.failed.
func (t *replyTranslator) fail(out []byte, raw json.RawMessage) []byte {
	t.stopped, t.failed = true, true
	if t.api == trajectory.APIMessages {
		return event(out, "error", messagesError(raw))
	}
	return event(out, "response.failed", map[string]any{"type": "response.failed", "response": t.failedResponse(raw)})
}

// messagesError is the Messages API's error object for an upstream error.
func messagesError(raw json.RawMessage) map[string]any {
	return map[string]any{"type": "error", "error": map[string]string{"type": "api_error", "message": errorMessage(raw)}}
}

// failedResponse is a Responses reply that failed with an upstream error.
func (t *replyTranslator) failedResponse(raw json.RawMessage) map[string]any {
	return map[string]any{"id": "resp_" + t.msgID(), "object": "response", "model": t.model, "status": "failed", "output": []any{},
		"error": map[string]string{"code": "server_error", "message": errorMessage(raw)}}
}

// incomplete says why the harness's stream did not end as a whole reply
// ("" if it did): an upstream error, or no finish reason. The capture
// records it as the reply's error, so the record says what the harness
// got.
func (t *replyTranslator) incomplete() string {
	switch {
	case !t.stream:
		if t.failed {
			return "relay: translate: the upstream sent an error"
		}
		return ""
	case t.failed:
		return "relay: translate: the upstream sent an error; the harness got it as its API's error"
	case !t.stopped:
		return "relay: translate: the stream ended without a finish reason; the harness's stream was left unfinished"
	}
	return ""
}

// responseItems are a Responses reply's output items: the text as an
// assistant message, then each function call.
func (t *replyTranslator) responseItems() []any {
	items := []any{}
	if t.text.Len() > 0 {
		items = append(items, map[string]any{"type": "message", "id": "msg_" + t.msgID(), "status": "completed", "role": "assistant",
			"content": []any{map[string]any{"type": "output_text", "text": t.text.String(), "annotations": []any{}}}})
	}
	for i, c := range t.calls {
		items = append(items, map[string]any{"type": "function_call", "id": fmt.Sprintf("fc_%s_%d", t.msgID(), i), "status": "completed",
			"call_id": c.id, "name": c.name, "arguments": c.args})
	}
	return items
}

func (t *replyTranslator) response(items []any) map[string]any {
	in, out := t.inputTokens(), t.outputTokens()
	return map[string]any{"id": "resp_" + t.msgID(), "object": "response", "model": t.model, "status": "completed", "output": items,
		"usage": map[string]int{"input_tokens": in, "output_tokens": out, "total_tokens": in + out}}
}

// plain translates a plain chat completion, whole.
func (t *replyTranslator) plain(body []byte) []byte {
	var c struct {
		chatChunk
		Choices []struct {
			Index        int    `json:"index"`
			FinishReason string `json:"finish_reason"`
			TokenIDs     []int  `json:"token_ids"`
		} `json:"choices"`
	}
	if json.Unmarshal(body, &c) != nil {
		return body
	}
	if upstreamError(c.Error) {
		// A body of the harness's API all the same: Messages' error object,
		// or a failed response.
		t.failed = true
		var out []byte
		if t.api == trajectory.APIMessages {
			out, _ = json.Marshal(messagesError(c.Error))
		} else {
			out, _ = json.Marshal(t.failedResponse(c.Error))
		}
		return append(out, '\n')
	}
	t.id, t.model, t.usage, t.promptTokens = c.ID, c.Model, c.Usage, len(c.PromptTokenIDs)
	for _, ch := range c.Choices {
		if ch.Index == 0 {
			t.finish, t.completionIDs = ch.FinishReason, len(ch.TokenIDs)
		}
	}
	a := trajectory.NewAssembler(false)
	_, _ = a.Write(body)
	var msg struct {
		Content   string `json:"content"`
		ToolCalls []struct {
			ID       string `json:"id"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	}
	_ = json.Unmarshal(a.Reply(200).Message, &msg)
	var out []byte
	if t.api == trajectory.APIMessages {
		content := []any{}
		if msg.Content != "" {
			content = append(content, map[string]string{"type": "text", "text": msg.Content})
		}
		for _, tc := range msg.ToolCalls {
			t.anyTool = true
			in := json.RawMessage(tc.Function.Arguments)
			if !json.Valid(in) {
				in = json.RawMessage("{}")
			}
			content = append(content, map[string]any{"type": "tool_use", "id": tc.ID, "name": tc.Function.Name, "input": in})
		}
		out, _ = json.Marshal(map[string]any{"id": "msg_" + t.msgID(), "type": "message", "role": "assistant", "model": t.model,
			"content": content, "stop_reason": t.stopReason(), "stop_sequence": nil,
			"usage": map[string]int{"input_tokens": t.inputTokens(), "output_tokens": t.outputTokens()}})
	} else {
		t.text.WriteString(msg.Content)
		for _, tc := range msg.ToolCalls {
			t.calls = append(t.calls, &translatedCall{id: tc.ID, name: tc.Function.Name, args: tc.Function.Arguments})
		}
		out, _ = json.Marshal(t.response(t.responseItems()))
	}
	return append(out, '\n')
}
