package modelserver

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/stillpoint/stillpoint/internal/claudecode"
)

// The Anthropic Messages API (POST /v1/messages, also with ?beta=true), as
// Claude Code 2.1.332 speaks it: every call streams (server-sent events,
// each with an `event:` and a `data:` line) and offers Claude's tools; the
// session so far is sent whole, content as blocks (text, tool_use,
// tool_result), with a {"role":"system"} entry among the messages; a tool
// call Claude never finished (it was killed mid-tool) comes back, on a
// continued session, as a tool_result starting ClaudeInterrupted.

// ClaudeInterrupted is how the tool result starts that Claude Code sends
// for a tool call whose result its session never recorded (it was killed
// while the tool ran).
const ClaudeInterrupted = "[Tool call interrupted"

// MessagesRequest is the part of an Anthropic Messages request the server
// reads.
type MessagesRequest struct {
	Model    string           `json:"model"`
	Messages []MessagesEntry  `json:"messages"`
	System   json.RawMessage  `json:"system,omitempty"`
	Tools    json.RawMessage  `json:"tools,omitempty"`
	Stream   bool             `json:"stream,omitempty"`
	Metadata *json.RawMessage `json:"metadata,omitempty"`
}

// MessagesEntry is one message of a Messages request: its content is a
// string or a list of blocks.
type MessagesEntry struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// Block is a content block of the Messages API.
type Block struct {
	Type      string          `json:"type"`
	Text      string          `json:"text,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	ToolUseID string          `json:"tool_use_id,omitempty"`
	Content   json.RawMessage `json:"content,omitempty"`
	IsError   bool            `json:"is_error,omitempty"`
}

// Blocks returns the content blocks of m: a string content is one text
// block.
func (m MessagesEntry) Blocks() []Block {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return []Block{{Type: "text", Text: s}}
	}
	var bs []Block
	_ = json.Unmarshal(m.Content, &bs)
	return bs
}

// blockText returns the text of a tool_result's content: a string, or the
// text blocks of a list joined.
func blockText(c json.RawMessage) string {
	var s string
	if json.Unmarshal(c, &s) == nil {
		return s
	}
	var bs []Block
	_ = json.Unmarshal(c, &bs)
	var b strings.Builder
	for _, x := range bs {
		b.WriteString(x.Text)
	}
	return b.String()
}

// claudeTurn numbers the turn of a Messages request: the assistant
// messages so far, less those that are no answer of the script (empty, or
// Claude's synthetic claudecode.NoResponse) and those whose every tool call
// came back interrupted (ClaudeInterrupted), which the turn answers
// again; retries counts the latter since the last answer that counted.
// users counts the user messages with content a user typed or a CLI
// added: any block but a tool_result.
func claudeTurn(msgs []MessagesEntry) (turn, retries, users int) {
	for i, m := range msgs {
		switch m.Role {
		case "user":
			if slices.ContainsFunc(m.Blocks(), func(b Block) bool { return b.Type != "tool_result" }) {
				users++
			}
			continue
		case "assistant":
		default:
			continue
		}
		var calls []string
		text := ""
		for _, b := range m.Blocks() {
			switch b.Type {
			case "tool_use":
				calls = append(calls, b.ID)
			case "text":
				text += b.Text
			}
		}
		if len(calls) == 0 && (strings.TrimSpace(text) == "" || text == claudecode.NoResponse) {
			continue
		}
		if len(calls) > 0 && i+1 < len(msgs) && claudeInterrupted(calls, msgs[i+1]) {
			retries++
			continue
		}
		turn, retries = turn+1, 0
	}
	return turn, retries, users
}

// claudeInterrupted tells whether each of calls has a result in next and
// each result is Claude's interruption.
func claudeInterrupted(calls []string, next MessagesEntry) bool {
	if next.Role != "user" {
		return false
	}
	results := map[string]string{}
	for _, b := range next.Blocks() {
		if b.Type == "tool_result" {
			results[b.ToolUseID] = blockText(b.Content)
		}
	}
	for _, id := range calls {
		r, ok := results[id]
		if !ok || !strings.HasPrefix(r, ClaudeInterrupted) {
			return false
		}
	}
	return true
}

// claudeRetry returns t for its retries-th answer again: the same calls
// under ids of their own (in the id alphabet the Messages API allows).
func claudeRetry(t Turn, retries int) Turn {
	if retries == 0 || len(t.ToolCalls) == 0 {
		return t
	}
	t.ToolCalls = slices.Clone(t.ToolCalls)
	for i := range t.ToolCalls {
		t.ToolCalls[i].ID = fmt.Sprintf("%s_r%d", t.ToolCalls[i].ID, retries)
	}
	return t
}

// offeredMessagesTool is the part of a Messages API tool the server checks.
type offeredMessagesTool struct {
	Name        string `json:"name"`
	InputSchema struct {
		Required []string `json:"required"`
	} `json:"input_schema"`
}

// checkMessagesToolCalls checks a scripted answer against the tools a
// Messages request offers, as checkToolCalls does for chat completions.
func checkMessagesToolCalls(tools json.RawMessage, calls []ToolCall) error {
	if len(tools) == 0 || len(calls) == 0 {
		return nil
	}
	var offered []offeredMessagesTool
	if err := json.Unmarshal(tools, &offered); err != nil {
		return fmt.Errorf("%w: the request's tools do not decode: %v", errToolCall, err)
	}
	var errs []error
	for _, c := range calls {
		i := slices.IndexFunc(offered, func(o offeredMessagesTool) bool { return o.Name == c.Function.Name })
		if i < 0 {
			errs = append(errs, fmt.Errorf("%w: %s calls %q, which is not offered", errToolCall, c.ID, c.Function.Name))
			continue
		}
		var args map[string]json.RawMessage
		if err := json.Unmarshal([]byte(c.Function.Arguments), &args); err != nil {
			errs = append(errs, fmt.Errorf("%w: %s: the arguments are not a JSON object: %v", errToolCall, c.ID, err))
			continue
		}
		for _, p := range offered[i].InputSchema.Required {
			if _, ok := args[p]; !ok {
				errs = append(errs, fmt.Errorf("%w: %s: %s needs %q", errToolCall, c.ID, c.Function.Name, p))
			}
		}
	}
	return errors.Join(errs...)
}

// The Claude helpers write each call's input as Claude Code sends it back
// in the next request (its keys in Claude's order, its defaults filled
// in), so that a reply is a prefix of the next prompt.

// ClaudeBashCall runs command in Claude Code's Bash tool.
func ClaudeBashCall(id, command string) ToolCall {
	return Call(id, "Bash", struct {
		Command     string `json:"command"`
		Description string `json:"description"`
	}{command, "Run " + firstWord(command)})
}

// ClaudeReadCall reads a file with Claude Code's Read tool; a relative
// path is taken from the working directory.
func ClaudeReadCall(id, path string) ToolCall {
	return Call(id, "Read", map[string]string{"file_path": path})
}

// ClaudeEditCall replaces old with new in a file with Claude Code's Edit
// tool (old must occur once in it, and the session must have read the
// file). The input carries replace_all false first, as Claude adds it.
func ClaudeEditCall(id, path, old, new string) ToolCall {
	return Call(id, "Edit", struct {
		ReplaceAll bool   `json:"replace_all"`
		FilePath   string `json:"file_path"`
		OldString  string `json:"old_string"`
		NewString  string `json:"new_string"`
	}{false, path, old, new})
}

// ClaudeWriteCall writes a whole file with Claude Code's Write tool (an
// existing file must have been read first); file_path comes first.
func ClaudeWriteCall(id, path, content string) ToolCall {
	return Call(id, "Write", struct {
		FilePath string `json:"file_path"`
		Content  string `json:"content"`
	}{path, content})
}

func firstWord(s string) string {
	if f := strings.Fields(s); len(f) > 0 {
		return f[0]
	}
	return "a command"
}

// messagesError writes an error in the Messages API's shape.
func messagesError(w http.ResponseWriter, status int, format string, args ...any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"type": "error",
		"error": map[string]string{"type": "invalid_request_error", "message": fmt.Sprintf(format, args...)}})
}

// MessagesDigest returns the ledger digest of a Messages request's
// messages: canonical JSON less the cache_control marks, which Claude
// moves from message to message.
func MessagesDigest(msgs []MessagesEntry) string {
	b, _ := json.Marshal(msgs)
	var v any
	_ = json.Unmarshal(b, &v)
	b, _ = json.Marshal(dropKey(v, "cache_control"))
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func dropKey(v any, key string) any {
	switch x := v.(type) {
	case map[string]any:
		delete(x, key)
		for k, e := range x {
			x[k] = dropKey(e, key)
		}
	case []any:
		for i, e := range x {
			x[i] = dropKey(e, key)
		}
	}
	return v
}

// chatMessages renders a Messages request as chat messages, for the
// tokenizer: the system prompt first, tool_use blocks as tool calls,
// tool_result blocks as tool messages.
func chatMessages(req MessagesRequest) []Message {
	str := func(s string) json.RawMessage { b, _ := json.Marshal(s); return b }
	var out []Message
	if sys := blockText(req.System); sys != "" {
		out = append(out, Message{Role: "system", Content: str(sys)})
	}
	for _, m := range req.Messages {
		var text strings.Builder
		var calls []ToolCall
		var results []Message
		for _, b := range m.Blocks() {
			switch b.Type {
			case "text":
				text.WriteString(b.Text)
			case "tool_use":
				var c ToolCall
				c.ID, c.Type, c.Function.Name, c.Function.Arguments = b.ID, "function", b.Name, string(b.Input)
				calls = append(calls, c)
			case "tool_result":
				results = append(results, Message{Role: "tool", ToolCallID: b.ToolUseID, Content: str(blockText(b.Content))})
			}
		}
		out = append(out, results...)
		if text.Len() > 0 || len(calls) > 0 || len(results) == 0 {
			msg := Message{Role: m.Role, Content: str(text.String())}
			if len(calls) > 0 {
				msg.ToolCalls, _ = json.Marshal(calls)
			}
			out = append(out, msg)
		}
	}
	return out
}

func stopReason(t Turn) string {
	if len(t.ToolCalls) > 0 {
		return "tool_use"
	}
	return "end_turn"
}

// messagesBlocks returns the content blocks of reply t: its text, then
// each tool call with its parsed arguments as input.
func messagesBlocks(t Turn) []map[string]any {
	var out []map[string]any
	if t.Content != "" {
		out = append(out, map[string]any{"type": "text", "text": t.Content})
	}
	for _, c := range t.ToolCalls {
		input := json.RawMessage(compactJSON(c.Function.Arguments))
		if !json.Valid(input) {
			input = json.RawMessage(`{}`)
		}
		out = append(out, map[string]any{"type": "tool_use", "id": c.ID, "name": c.Function.Name, "input": input})
	}
	return out
}

// messages answers POST /v1/messages.
func (s *Server) messages(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
	if err != nil {
		messagesError(w, http.StatusBadRequest, "reading the body: %v", err)
		return
	}
	var req MessagesRequest
	if err := json.Unmarshal(body, &req); err != nil {
		messagesError(w, http.StatusBadRequest, "the body is not a Messages request: %v", err)
		return
	}
	task := r.Header.Get(TaskHeader)
	turns, ok := s.script[task]
	if !ok {
		// 400, not 404: Claude Code takes a 404 for an unknown model and
		// shows its own message instead of this one.
		messagesError(w, http.StatusBadRequest, "no script for task %q", task)
		return
	}
	turn, retries, users := claudeTurn(req.Messages)
	if turn >= len(turns) {
		messagesError(w, http.StatusBadRequest, "task %q has %d turns; the request is at turn %d", task, len(turns), turn)
		return
	}
	branch, seed := requestBranch(r)
	t := claudeRetry(turns[turn].ForBranch(branch), retries)
	if err := checkMessagesToolCalls(req.Tools, t.ToolCalls); err != nil {
		messagesError(w, http.StatusBadRequest, "task %q turn %d: %v", task, turn, err)
		return
	}
	prompt := PromptTokens(Request{Tools: req.Tools, Messages: chatMessages(req)})
	completion := completionTokens(t)
	prevSaved, _ := time.Parse(time.RFC3339Nano, r.Header.Get(SavedHeader))
	entry := Entry{API: APIMessages, Task: task, Episode: r.Header.Get(EpisodeHeader), Branch: branch, Seed: seed, Messages: len(req.Messages), PrevSaved: prevSaved,
		Digest: MessagesDigest(req.Messages), Turn: turn, UserTurns: users, Stream: req.Stream, Retried: retries > 0,
		PromptTokenIDs: prompt, TokenIDs: ids(completion), Time: time.Now()}
	index, o, ok := s.admit(r, entry)
	if !ok {
		return
	}
	id := fmt.Sprintf("msg_%s_%d", entry.Digest[:12], turn)
	u := map[string]int{"input_tokens": len(prompt), "output_tokens": len(completion)}
	delivered := false
	if !req.Stream {
		reply := map[string]any{"id": id, "type": "message", "role": "assistant", "model": req.Model, "content": messagesBlocks(t),
			"stop_reason": stopReason(t), "stop_sequence": nil, "usage": u}
		w.Header().Set("Content-Type", "application/json")
		if json.NewEncoder(w).Encode(reply) == nil {
			delivered = true
			s.progress(index, 0, len(completion))
		}
	} else {
		delivered = s.streamMessages(w, id, req.Model, t, len(prompt), o, func(n, tokens int) { s.progress(index, n, tokens) })
	}
	if delivered && r.Context().Err() == nil {
		s.mu.Lock()
		s.ledger[index].Delivered = time.Now()
		s.mu.Unlock()
	}
}

// streamMessages sends t as the Messages API's server-sent events:
// message_start; per block a content_block_start, its deltas (the text,
// or the input JSON, in up to three pieces) and a content_block_stop;
// message_delta with the stop reason; message_stop. With o.cut > 0 it
// stops after o.cut events; with o.slow > 0 it waits that long before
// each event after the first. It tells whether the whole reply was
// written.
func (s *Server) streamMessages(w http.ResponseWriter, id, model string, t Turn, promptLen int, o streamOptions, sent func(n, tokens int)) bool {
	fl, ok := w.(http.Flusher)
	if !ok {
		messagesError(w, http.StatusInternalServerError, "streaming unsupported")
		return false
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	n, pos := 0, 0
	write := func(event string, v map[string]any, tokens int) bool {
		if o.cut > 0 && n >= o.cut {
			return false
		}
		if n > 0 && o.slow > 0 {
			tm := time.NewTimer(o.slow)
			select {
			case <-tm.C:
			case <-o.done:
			}
			tm.Stop()
		}
		v["type"] = event
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(v)
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n", event, b.Bytes()); err != nil {
			return false
		}
		fl.Flush()
		n++
		pos += tokens
		sent(n, pos)
		return true
	}
	start := map[string]any{"id": id, "type": "message", "role": "assistant", "model": model, "content": []any{},
		"stop_reason": nil, "stop_sequence": nil, "usage": map[string]int{"input_tokens": promptLen, "output_tokens": 1}}
	if !write("message_start", map[string]any{"message": start}, 0) {
		return false
	}
	index := 0
	block := func(head map[string]any, deltas []map[string]any, tokens [][]Token) bool {
		if !write("content_block_start", map[string]any{"index": index, "content_block": head}, 0) {
			return false
		}
		for k, d := range deltas {
			if !write("content_block_delta", map[string]any{"index": index, "delta": d}, len(tokens[k])) {
				return false
			}
		}
		ok := write("content_block_stop", map[string]any{"index": index}, 0)
		index++
		return ok
	}
	if t.Content != "" {
		var deltas []map[string]any
		var toks [][]Token
		for _, g := range group(Pieces(t.Content), 3) {
			deltas = append(deltas, map[string]any{"type": "text_delta", "text": joinText(g)})
			toks = append(toks, g)
		}
		if !block(map[string]any{"type": "text", "text": ""}, deltas, toks) {
			return false
		}
	}
	for _, c := range t.ToolCalls {
		compact := compactJSON(c.Function.Arguments)
		groups := group(Pieces(compact), 3)
		if len(groups) == 0 {
			groups = [][]Token{nil}
		}
		var deltas []map[string]any
		var toks [][]Token
		for k, g := range groups {
			tk := g
			if k == 0 {
				tk = append(callTokens(c.Function.Name, ""), g...)
			}
			deltas = append(deltas, map[string]any{"type": "input_json_delta", "partial_json": joinText(g)})
			toks = append(toks, tk)
		}
		head := map[string]any{"type": "tool_use", "id": c.ID, "name": c.Function.Name, "input": map[string]any{}}
		if !block(head, deltas, toks) {
			return false
		}
	}
	all := len(completionTokens(t))
	if !write("message_delta", map[string]any{"delta": map[string]any{"stop_reason": stopReason(t), "stop_sequence": nil},
		"usage": map[string]int{"output_tokens": all}}, 1) {
		return false
	}
	return write("message_stop", map[string]any{}, 0)
}
