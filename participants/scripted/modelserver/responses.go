package modelserver

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// The OpenAI Responses API (POST /v1/responses), as Codex 0.171.0 speaks
// it: every call streams and sends the session so far as input items
// (developer and user messages of input_text parts, the assistant's
// messages of output_text parts, function_call items and their
// function_call_output), and offers Codex's tools in the API's flat shape
// ({"type":"function","name":…,"parameters":…}). The server reads the
// items as a chat conversation (responsesMessages): consecutive
// assistant-side items (a message, function calls, reasoning) are one
// assistant message, the turn of the script they answered, and a
// function_call_output is a tool message. The rest is the chat rules:
// the turn is the assistant messages so far; one whose every call came
// back Aborted is answered again (Retried); a trailing assistant message
// with no call after the last user or tool message is a reply cut
// mid-stream that Codex keeps when it asks again, no turn.
//
// UserTurns counts every user message item, text or not: Codex's
// <environment_context> message, the prompt, and the empty message `codex
// exec resume <id> ""` adds, so that the ledger shows that addition when
// it reaches the model.

// Aborted is the output Codex sends for a function call that did not
// finish because Codex was killed while it ran.
const Aborted = "aborted"

// ResponsesRequest is the part of a Responses API request the server
// reads.
type ResponsesRequest struct {
	Model string `json:"model"`
	// Input is a string (one user message) or a list of Items.
	Input        json.RawMessage `json:"input"`
	Instructions string          `json:"instructions,omitempty"`
	// Tools are the tools the caller offers, in the API's flat shape.
	Tools  json.RawMessage `json:"tools,omitempty"`
	Stream bool            `json:"stream,omitempty"`
}

// Item is one input item of a Responses request: a message (Role and
// Content, a list of input_text or output_text parts), a function_call
// (CallID, Name, Arguments), or a function_call_output (CallID, Output).
type Item struct {
	Type      string          `json:"type,omitempty"`
	Role      string          `json:"role,omitempty"`
	Content   json.RawMessage `json:"content,omitempty"`
	CallID    string          `json:"call_id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Arguments string          `json:"arguments,omitempty"`
	Output    json.RawMessage `json:"output,omitempty"`
}

// ExecCall runs cmd in Codex's exec_command tool. Codex returns after
// 10 s with a session id if the command still runs (yield_time_ms, at
// most 30 s): keep scripted commands shorter.
func ExecCall(id, cmd string) ToolCall {
	return Call(id, "exec_command", map[string]string{"cmd": cmd})
}

// responsesItems returns the input's items: a string input is one user
// message.
func responsesItems(input json.RawMessage) ([]Item, error) {
	var s string
	if json.Unmarshal(input, &s) == nil {
		c, _ := json.Marshal(s)
		return []Item{{Type: "message", Role: "user", Content: c}}, nil
	}
	var items []Item
	if err := json.Unmarshal(input, &items); err != nil {
		return nil, fmt.Errorf("the input is neither a string nor a list of items: %v", err)
	}
	return items, nil
}

// partsText returns the text of a message's content: a string, or the
// text of its input_text, output_text and text parts.
func partsText(c json.RawMessage) string {
	var s string
	if json.Unmarshal(c, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	_ = json.Unmarshal(c, &parts)
	var b strings.Builder
	for _, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text":
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

func textContent(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

// assistantSide tells the items of the model's own reply.
func assistantSide(it Item) bool {
	switch it.Type {
	case "function_call", "reasoning", "custom_tool_call":
		return true
	case "message", "":
		return it.Role == "assistant"
	}
	return false
}

// responsesMessages reads a Responses conversation as chat messages (see
// above): instructions as a system message, each message by its role
// with its text, each run of assistant-side items as one assistant
// message with their calls, each call's output as a tool message; other
// items are left out.
func responsesMessages(instructions string, items []Item) []Message {
	var out []Message
	if instructions != "" {
		out = append(out, Message{Role: "system", Content: textContent(instructions)})
	}
	var text strings.Builder
	var calls []ToolCall
	open := false
	flush := func() {
		if !open {
			return
		}
		m := Message{Role: "assistant", Content: textContent(text.String())}
		if len(calls) > 0 {
			m.ToolCalls, _ = json.Marshal(calls)
		}
		out = append(out, m)
		text.Reset()
		calls, open = nil, false
	}
	for _, it := range items {
		if assistantSide(it) {
			open = true
			switch it.Type {
			case "function_call", "custom_tool_call":
				var tc ToolCall
				tc.ID, tc.Type = it.CallID, "function"
				tc.Function.Name, tc.Function.Arguments = it.Name, it.Arguments
				calls = append(calls, tc)
			case "message", "":
				text.WriteString(partsText(it.Content))
			}
			continue
		}
		flush()
		switch it.Type {
		case "message", "":
			out = append(out, Message{Role: it.Role, Content: textContent(partsText(it.Content))})
		case "function_call_output", "custom_tool_call_output":
			out = append(out, Message{Role: "tool", ToolCallID: it.CallID, Content: textContent(partsText(it.Output))})
		}
	}
	flush()
	return out
}

// responsesTurn numbers the turn of a Responses conversation (see above).
func responsesTurn(msgs []Message) (turn, retries int) {
	if n := len(msgs); n > 0 && msgs[n-1].Role == "assistant" && len(msgs[n-1].ToolCalls) == 0 {
		msgs = msgs[:n-1] // a reply cut mid-stream, kept
	}
	return countTurns(msgs, func(r string) bool { return r == Aborted })
}

// flatTool is a tool as the Responses API offers it.
type flatTool struct {
	Type       string          `json:"type"`
	Name       string          `json:"name"`
	Parameters json.RawMessage `json:"parameters"`
}

// chatTools returns the function tools of a Responses request in the chat
// shape, for checkToolCalls.
func chatTools(tools json.RawMessage) (json.RawMessage, error) {
	if len(tools) == 0 {
		return nil, nil
	}
	var flat []flatTool
	if err := json.Unmarshal(tools, &flat); err != nil {
		return nil, fmt.Errorf("the request's tools do not decode: %v", err)
	}
	var out []map[string]any
	for _, t := range flat {
		if t.Type == "function" {
			out = append(out, map[string]any{"type": "function", "function": map[string]any{"name": t.Name, "parameters": t.Parameters}})
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return json.Marshal(out)
}

// responses answers POST /v1/responses.
func (s *Server) responses(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
	if err != nil {
		apiError(w, http.StatusBadRequest, "reading the body: %v", err)
		return
	}
	var req ResponsesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		apiError(w, http.StatusBadRequest, "the body is not a Responses request: %v", err)
		return
	}
	items, err := responsesItems(req.Input)
	if err != nil {
		apiError(w, http.StatusBadRequest, "%v", err)
		return
	}
	task := r.Header.Get(TaskHeader)
	turns, ok := s.script[task]
	if !ok {
		apiError(w, http.StatusNotFound, "no script for task %q", task)
		return
	}
	msgs := responsesMessages(req.Instructions, items)
	turn, retries := responsesTurn(msgs)
	if turn >= len(turns) {
		apiError(w, http.StatusBadRequest, "task %q has %d turns; the request is at turn %d", task, len(turns), turn)
		return
	}
	branch, seed := requestBranch(r)
	t := retry(turns[turn].ForBranch(branch), retries)
	tools, err := chatTools(req.Tools)
	if err == nil {
		err = checkToolCalls(tools, t.ToolCalls)
	}
	if err != nil {
		apiError(w, http.StatusBadRequest, "task %q turn %d: %v", task, turn, err)
		return
	}
	users := 0
	for _, it := range items {
		if (it.Type == "message" || it.Type == "") && it.Role == "user" {
			users++
		}
	}
	prompt, completion := PromptTokens(Request{Messages: msgs, Tools: req.Tools}), completionTokens(t)
	prevSaved, _ := time.Parse(time.RFC3339Nano, r.Header.Get(SavedHeader))
	entry := Entry{API: APIResponses, Task: task, Episode: r.Header.Get(EpisodeHeader), Branch: branch, Seed: seed, Digest: Digest(msgs), PrevSaved: prevSaved,
		Messages: len(items), Turn: turn, UserTurns: users, Stream: req.Stream, Retried: retries > 0,
		PromptTokenIDs: prompt, TokenIDs: ids(completion), Time: time.Now()}
	index, o, ok := s.admit(r, entry)
	if !ok {
		return
	}
	rr := responseReply{id: fmt.Sprintf("resp_%s_%d", entry.Digest[:12], turn), model: req.Model, t: t, prompt: prompt}
	delivered := false
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		if json.NewEncoder(w).Encode(rr.object("completed", rr.output(), len(completion))) == nil {
			delivered = true
			s.progress(index, 0, len(completion))
		}
	} else {
		o.sent = func(n, tokens int) { s.progress(index, n, tokens) }
		delivered = rr.stream(w, o)
	}
	if delivered && r.Context().Err() == nil {
		s.mu.Lock()
		s.ledger[index].Delivered = time.Now()
		s.mu.Unlock()
	}
}

// responseReply renders one scripted turn as a Responses reply.
type responseReply struct {
	id, model string
	t         Turn
	prompt    []int
}

func (rr responseReply) messageID() string { return "msg_" + strings.TrimPrefix(rr.id, "resp_") }

func (rr responseReply) callID(i int) string {
	return fmt.Sprintf("fc_%s_%d", strings.TrimPrefix(rr.id, "resp_"), i)
}

func (rr responseReply) message() map[string]any {
	return map[string]any{"type": "message", "id": rr.messageID(), "role": "assistant", "status": "completed",
		"content": []any{map[string]any{"type": "output_text", "text": rr.t.Content, "annotations": []any{}}}}
}

func (rr responseReply) call(i int, args string) map[string]any {
	tc := rr.t.ToolCalls[i]
	status := "completed"
	if args != tc.Function.Arguments {
		status = "in_progress"
	}
	return map[string]any{"type": "function_call", "id": rr.callID(i), "call_id": tc.ID, "name": tc.Function.Name, "arguments": args, "status": status}
}

// output is the reply's output items: the text as a message, if any, then
// each call.
func (rr responseReply) output() []any {
	var out []any
	if rr.t.Content != "" {
		out = append(out, rr.message())
	}
	for i, tc := range rr.t.ToolCalls {
		out = append(out, rr.call(i, tc.Function.Arguments))
	}
	return out
}

// object is the reply's response object; usage counts completion tokens
// of the server's tokenizer. created_at is 0, not the clock: every answer
// to a request is the same bytes, as a relay re-sending a cut call needs.
func (rr responseReply) object(status string, output []any, completion int) map[string]any {
	if output == nil {
		output = []any{}
	}
	o := map[string]any{"id": rr.id, "object": "response", "created_at": 0, "status": status, "model": rr.model, "output": output}
	if status == "completed" {
		o["usage"] = map[string]int{"input_tokens": len(rr.prompt), "output_tokens": completion, "total_tokens": len(rr.prompt) + completion}
	}
	return o
}

// event is one server-sent event of a streamed reply and the completion
// tokens it carries.
type event struct {
	data   map[string]any
	tokens []Token
}

// events renders the reply as the Responses API streams it:
// response.created; the text as a message item (output_item.added, the
// text in up to three output_text.delta, output_item.done); each call as
// a function_call item (output_item.added with its name, its arguments in
// up to three function_call_arguments.delta, output_item.done); then
// response.completed, which carries TokEnd. Their tokens joined are the
// completion.
func (rr responseReply) events() []event {
	out := []event{{data: map[string]any{"type": "response.created", "response": rr.object("in_progress", nil, 0)}}}
	index := 0
	if rr.t.Content != "" {
		added := rr.message()
		added["status"], added["content"] = "in_progress", []any{}
		out = append(out, event{data: map[string]any{"type": "response.output_item.added", "output_index": index, "item": added}})
		for _, g := range group(Pieces(rr.t.Content), 3) {
			out = append(out, event{data: map[string]any{"type": "response.output_text.delta", "item_id": rr.messageID(), "output_index": index, "content_index": 0, "delta": joinText(g)}, tokens: g})
		}
		out = append(out, event{data: map[string]any{"type": "response.output_item.done", "output_index": index, "item": rr.message()}})
		index++
	}
	for i, tc := range rr.t.ToolCalls {
		head := callTokens(tc.Function.Name, "")
		out = append(out, event{data: map[string]any{"type": "response.output_item.added", "output_index": index, "item": rr.call(i, "")}, tokens: head})
		compact := compactJSON(tc.Function.Arguments)
		groups := group(Pieces(compact), 3)
		if compact != tc.Function.Arguments {
			groups = [][]Token{Pieces(compact)} // sent as they are: one delta
		}
		for _, g := range groups {
			delta := joinText(g)
			if len(groups) == 1 {
				delta = tc.Function.Arguments
			}
			out = append(out, event{data: map[string]any{"type": "response.function_call_arguments.delta", "item_id": rr.callID(i), "output_index": index, "delta": delta}, tokens: g})
		}
		out = append(out, event{data: map[string]any{"type": "response.output_item.done", "output_index": index, "item": rr.call(i, tc.Function.Arguments)}})
		index++
	}
	completion := len(completionTokens(rr.t))
	return append(out, event{data: map[string]any{"type": "response.completed", "response": rr.object("completed", rr.output(), completion)}, tokens: []Token{special(TokEnd)}})
}

// stream writes the reply's events (event: and data: lines), waiting
// o.slow before each after the first, and stopping after o.cut of them
// when o.cut > 0 (no response.completed: Codex then asks again). It tells
// whether the whole reply was written.
func (rr responseReply) stream(w http.ResponseWriter, o streamOptions) bool {
	fl, ok := w.(http.Flusher)
	if !ok {
		apiError(w, http.StatusInternalServerError, "streaming unsupported")
		return false
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	tokens := 0
	for n, e := range rr.events() {
		if o.cut > 0 && n >= o.cut {
			return false
		}
		if n > 0 && o.slow > 0 {
			t := time.NewTimer(o.slow)
			select {
			case <-t.C:
			case <-o.done:
			}
			t.Stop()
		}
		e.data["sequence_number"] = n
		b, _ := json.Marshal(e.data)
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", e.data["type"], b); err != nil {
			return false
		}
		fl.Flush()
		tokens += len(e.tokens)
		if o.sent != nil {
			o.sent(n+1, tokens)
		}
	}
	return true
}
