package modelserver_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/claudecode"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

// claudeTools are the tools Claude Code 2.1.332 offers that the scripts
// use, as captured from one of its requests (the schemas without their
// descriptions).
func claudeTools(t *testing.T) json.RawMessage {
	t.Helper()
	b, err := os.ReadFile("testdata/claude-2.1.332-tools.json")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var claudeFix = modelserver.Script{"fix": {
	{Content: "Reading.", ToolCalls: []modelserver.ToolCall{modelserver.ClaudeReadCall("toolu_0", "/w/calc.sh")}},
	{ToolCalls: []modelserver.ToolCall{modelserver.ClaudeEditCall("toolu_1", "/w/calc.sh", "a - b", "a + b"), modelserver.ClaudeWriteCall("toolu_2", "/w/NOTES.md", "fixed\n")}},
	{ToolCalls: []modelserver.ToolCall{modelserver.ClaudeBashCall("toolu_3", "sh test.sh")}},
	{Content: "Fixed."},
}}

// claudeRequest posts a Messages request as Claude Code sends one.
func claudeRequest(t *testing.T, url string, body map[string]any) *http.Response {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/messages?beta=true", bytes.NewReader(b))
	req.Header.Set(modelserver.TaskHeader, "fix")
	req.Header.Set("User-Agent", "claude-cli/2.1.332 (external, sdk-cli)")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func blocks(role string, bs ...map[string]any) map[string]any {
	return map[string]any{"role": role, "content": bs}
}

func text(s string) map[string]any { return map[string]any{"type": "text", "text": s} }

func toolUse(c modelserver.ToolCall) map[string]any {
	return map[string]any{"type": "tool_use", "id": c.ID, "name": c.Function.Name, "input": json.RawMessage(c.Function.Arguments)}
}

func toolResultBlock(id, content string) map[string]any {
	return map[string]any{"type": "tool_result", "tool_use_id": id, "content": content, "is_error": false}
}

// messagesReply is a streamed Messages reply put together again.
type messagesReply struct {
	events []string
	blocks []map[string]any
	stop   string
}

func readMessagesStream(t *testing.T, r io.Reader) messagesReply {
	t.Helper()
	out, err := parseMessagesStream(r)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// parseMessagesStream puts a streamed Messages reply together again; it
// calls no t.Fatal, so that a test's goroutine can use it.
func parseMessagesStream(r io.Reader) (messagesReply, error) {
	var out messagesReply
	partial := map[int]*strings.Builder{}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	event := ""
	for sc.Scan() {
		line := sc.Text()
		if e, ok := strings.CutPrefix(line, "event: "); ok {
			event = e
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var v struct {
			Type         string         `json:"type"`
			Index        int            `json:"index"`
			ContentBlock map[string]any `json:"content_block"`
			Delta        struct {
				Type        string `json:"type"`
				Text        string `json:"text"`
				PartialJSON string `json:"partial_json"`
				StopReason  string `json:"stop_reason"`
			} `json:"delta"`
		}
		if err := json.Unmarshal([]byte(data), &v); err != nil || v.Type != event {
			return out, fmt.Errorf("event %q data %s: %v", event, data, err)
		}
		out.events = append(out.events, v.Type)
		switch v.Type {
		case "content_block_start":
			out.blocks = append(out.blocks, v.ContentBlock)
			partial[v.Index] = &strings.Builder{}
		case "content_block_delta":
			switch v.Delta.Type {
			case "text_delta":
				out.blocks[v.Index]["text"] = out.blocks[v.Index]["text"].(string) + v.Delta.Text
			case "input_json_delta":
				partial[v.Index].WriteString(v.Delta.PartialJSON)
			}
		case "content_block_stop":
			if p := partial[v.Index].String(); p != "" {
				out.blocks[v.Index]["input"] = json.RawMessage(p)
			}
		case "message_delta":
			out.stop = v.Delta.StopReason
		}
	}
	return out, sc.Err()
}

// messagesResult is what a test's goroutine got for a Messages request.
type messagesResult struct {
	r   messagesReply
	err error
}

// sendMessages posts body to /v1/messages for task fix and reads the
// streamed reply, in a goroutine of its own; the result comes on the
// channel.
func sendMessages(url string, body map[string]any) <-chan messagesResult {
	out := make(chan messagesResult, 1)
	go func() {
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/messages", bytes.NewReader(b))
		req.Header.Set(modelserver.TaskHeader, "fix")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- messagesResult{err: err}
			return
		}
		defer resp.Body.Close()
		r, err := parseMessagesStream(resp.Body)
		out <- messagesResult{r, err}
	}()
	return out
}

// A Claude conversation: each turn streams as Messages events, tool calls
// with their arguments as input; the {"role":"system"} entry and tool
// results are no user turns; the ledger says the API.
func TestMessagesConversation(t *testing.T) {
	s := modelserver.New(claudeFix)
	srv := httptest.NewServer(s)
	defer srv.Close()
	tools := claudeTools(t)
	msgs := []any{blocks("user", text("<system-reminder>x</system-reminder>"), text("fix calc.sh")), blocks("system", text("# Environment"))}
	req := func() messagesReply {
		return readMessagesStream(t, claudeRequest(t, srv.URL, map[string]any{"model": "claude-opus-5-5", "stream": true, "tools": tools, "messages": msgs, "max_tokens": 128000}).Body)
	}
	for turn, want := range claudeFix["fix"] {
		r := req()
		if r.events[0] != "message_start" || r.events[len(r.events)-1] != "message_stop" {
			t.Fatalf("turn %d: events %v", turn, r.events)
		}
		wantStop := "end_turn"
		if len(want.ToolCalls) > 0 {
			wantStop = "tool_use"
		}
		if r.stop != wantStop {
			t.Fatalf("turn %d: stop %q", turn, r.stop)
		}
		var results []map[string]any
		k := 0
		if want.Content != "" {
			if r.blocks[0]["text"] != want.Content {
				t.Fatalf("turn %d: text %v", turn, r.blocks[0])
			}
			k = 1
		}
		for i, c := range want.ToolCalls {
			b := r.blocks[k+i]
			var got, exp any
			_ = json.Unmarshal(b["input"].(json.RawMessage), &got)
			_ = json.Unmarshal([]byte(c.Function.Arguments), &exp)
			gb, _ := json.Marshal(got)
			eb, _ := json.Marshal(exp)
			if b["type"] != "tool_use" || b["id"] != c.ID || b["name"] != c.Function.Name || string(gb) != string(eb) {
				t.Fatalf("turn %d: block %v, want %+v", turn, b, c)
			}
			results = append(results, toolResultBlock(c.ID, "ok"))
		}
		msgs = append(msgs, blocks("assistant", r.blocks...))
		if len(results) > 0 {
			msgs = append(msgs, blocks("user", results...))
		}
	}
	for i, e := range s.Ledger() {
		if e.API != "messages" || e.Turn != i || e.UserTurns != 1 || !e.Stream || e.Delivered.IsZero() || e.Sent != len(e.TokenIDs) {
			t.Fatalf("ledger %d: %+v", i, e)
		}
	}
	if r := s.Repeats(); len(r) != 0 {
		t.Fatalf("repeats %v", r)
	}
}

// Without stream the reply is one JSON message.
func TestMessagesPlainReply(t *testing.T) {
	s := modelserver.New(claudeFix)
	srv := httptest.NewServer(s)
	defer srv.Close()
	var out struct {
		Type       string           `json:"type"`
		Role       string           `json:"role"`
		Content    []map[string]any `json:"content"`
		StopReason string           `json:"stop_reason"`
	}
	resp := claudeRequest(t, srv.URL, map[string]any{"model": "m", "tools": claudeTools(t), "messages": []any{blocks("user", text("fix"))}})
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if out.Type != "message" || out.Role != "assistant" || out.StopReason != "tool_use" || len(out.Content) != 2 ||
		out.Content[0]["text"] != "Reading." || out.Content[1]["name"] != "Read" {
		t.Fatalf("reply %+v", out)
	}
	if e := s.Ledger()[0]; e.Stream || e.Delivered.IsZero() || e.Sent != len(e.TokenIDs) {
		t.Fatalf("ledger %+v", e)
	}
}

// A tool call whose result came back as Claude's interruption is answered
// again under a new id (Retried, no repeat); Claude's synthetic "No
// response requested." is no turn; a text block beside a tool result, and
// a new prompt, are user turns.
func TestMessagesContinuedSession(t *testing.T) {
	s := modelserver.New(claudeFix)
	srv := httptest.NewServer(s)
	defer srv.Close()
	read := claudeFix["fix"][0].ToolCalls[0]
	base := []any{blocks("user", text("fix")), blocks("system", text("# Environment")),
		blocks("assistant", text("Reading."), toolUse(read))}
	post := func(msgs ...any) messagesReply {
		return readMessagesStream(t, claudeRequest(t, srv.URL, map[string]any{"model": "m", "stream": true, "tools": claudeTools(t), "messages": msgs}).Body)
	}
	interrupted := blocks("user", toolResultBlock(read.ID, modelserver.ClaudeInterrupted+": the session ended before this call's result was recorded…]"))
	r := post(append(base, interrupted)...)
	if r.blocks[1]["id"] != read.ID+"_r1" || r.blocks[1]["name"] != "Read" {
		t.Fatalf("the retried turn: %v", r.blocks)
	}
	l := s.Ledger()
	if e := l[0]; e.Turn != 0 || !e.Retried || e.UserTurns != 1 {
		t.Fatalf("ledger %+v", e)
	}
	post(append(base, interrupted, blocks("assistant", text(claudecode.NoResponse)), blocks("user", text("continue")))...)
	if e := s.Ledger()[1]; e.Turn != 0 || e.UserTurns != 2 {
		t.Fatalf("a resume with a prompt: %+v", e)
	}
	withText := blocks("user", toolResultBlock(read.ID, "1\tx"), text("Continue from where you left off."))
	post(append(base, withText)...)
	if e := s.Ledger()[2]; e.Turn != 1 || e.UserTurns != 2 || e.Retried {
		t.Fatalf("a tool result with a text block: %+v", e)
	}
}

// A scripted call that does not fit Claude's tools is refused with a
// Messages API error naming the problem.
func TestMessagesToolCallsChecked(t *testing.T) {
	bad := modelserver.Script{"fix": {{ToolCalls: []modelserver.ToolCall{modelserver.BashCall("c0", "ls")}}}}
	srv := httptest.NewServer(modelserver.New(bad))
	defer srv.Close()
	resp := claudeRequest(t, srv.URL, map[string]any{"model": "m", "stream": true, "tools": claudeTools(t), "messages": []any{blocks("user", text("fix"))}})
	var out struct {
		Type  string `json:"type"`
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&out)
	if resp.StatusCode != http.StatusBadRequest || out.Type != "error" || !strings.Contains(out.Error.Message, `"bash", which is not offered`) {
		t.Fatalf("%d %+v", resp.StatusCode, out)
	}
}

// The Claude helpers build calls that Claude's tools accept.
func TestHelpersFitClaudesTools(t *testing.T) {
	s := modelserver.New(claudeFix)
	srv := httptest.NewServer(s)
	defer srv.Close()
	for turn := range 3 {
		msgs := []any{blocks("user", text("fix"))}
		for range turn {
			msgs = append(msgs, blocks("assistant", text("x")), blocks("user", text("y")))
		}
		resp := claudeRequest(t, srv.URL, map[string]any{"model": "m", "stream": true, "tools": claudeTools(t), "messages": msgs})
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("turn %d: %d %s", turn, resp.StatusCode, b)
		}
	}
}

// Hold, CutNext and SlowNext work on Messages streams: a held reply waits,
// a cut one stops after the events asked (no message_stop, not delivered),
// a slow one can be caught mid-stream.
func TestMessagesHoldCutSlow(t *testing.T) {
	s := modelserver.New(claudeFix)
	srv := httptest.NewServer(s)
	defer srv.Close()
	body := map[string]any{"model": "m", "stream": true, "tools": claudeTools(t), "messages": []any{blocks("user", text("fix"))}}

	s.Hold()
	got := sendMessages(srv.URL, body)
	poll.Wait(t, 5*time.Second, "the reply to be held", func() bool { return s.Held() == 1 })
	select {
	case <-got:
		t.Fatal("a held reply came")
	case <-time.After(50 * time.Millisecond):
	}
	s.Release()
	if r := <-got; r.err != nil || r.r.stop != "tool_use" {
		t.Fatalf("the released reply: %+v %v", r.r, r.err)
	}

	s.CutNext(3)
	r := readMessagesStream(t, claudeRequest(t, srv.URL, body).Body)
	if len(r.events) != 3 || r.stop != "" {
		t.Fatalf("a cut stream: %v", r.events)
	}
	if e := s.Ledger()[1]; !e.Cut || e.Chunks != 3 || !e.Delivered.IsZero() || e.Sent >= len(e.TokenIDs) {
		t.Fatalf("ledger of the cut stream: %+v", e)
	}

	s.SlowNext(200 * time.Millisecond)
	done := sendMessages(srv.URL, body)
	poll.Wait(t, 5*time.Second, "the stream to be under way", func() bool { l := s.Ledger(); return len(l) == 3 && l[2].Chunks >= 1 })
	if r := <-done; r.err != nil || r.r.stop != "tool_use" || s.Ledger()[2].Delivered.IsZero() {
		t.Fatalf("the slow stream: %+v %v", r.r, r.err)
	}
	// The same call again, after the conversation moved on: a repeat.
	claudeRequest(t, srv.URL, map[string]any{"model": "m", "tools": claudeTools(t), "messages": []any{blocks("user", text("fix")), blocks("assistant", text("a")), blocks("user", text("b"))}})
	claudeRequest(t, srv.URL, body)
	if r := s.Repeats(); len(r["fix"]) == 0 {
		t.Fatalf("no repeat: %v", r)
	}
}
