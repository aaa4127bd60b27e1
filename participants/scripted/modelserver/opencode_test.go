package modelserver_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

// openCodeTools are the tools OpenCode 1.18.33 offers, as captured from
// one of its requests (the parameter schemas without their descriptions).
func openCodeTools(t *testing.T) json.RawMessage {
	t.Helper()
	b, err := os.ReadFile("testdata/opencode-1.18.33-tools.json")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var fix = modelserver.Script{"fix": {
	{Content: "Reading.", ToolCalls: []modelserver.ToolCall{modelserver.ReadCall("c0", "calc.sh")}},
	{ToolCalls: []modelserver.ToolCall{modelserver.EditCall("c1", "calc.sh", "a - b", "a + b"), modelserver.WriteCall("c2", "NOTES.md", "fixed\n")}},
	{ToolCalls: []modelserver.ToolCall{modelserver.BashCall("c3", "sh test.sh")}},
	{Content: "Fixed."},
}}

// openCodeRequest is a request as OpenCode sends one.
func openCodeRequest(t *testing.T, url string, body map[string]any) *http.Response {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(b))
	req.Header.Set(modelserver.TaskHeader, "fix")
	req.Header.Set("User-Agent", "opencode/1.18.33 ai-sdk/provider-utils/4.0.23 runtime/bun/1.3.14")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func msg(role, content string) map[string]any {
	return map[string]any{"role": role, "content": content}
}

func assistantCalls(content string, calls ...modelserver.ToolCall) map[string]any {
	return map[string]any{"role": "assistant", "content": content, "tool_calls": calls}
}

func toolResult(id, content string) map[string]any {
	return map[string]any{"role": "tool", "tool_call_id": id, "content": content}
}

// reply is a streamed reply put together again.
type reply struct {
	text   string
	calls  map[int]*modelserver.ToolCall
	finish string
	usage  bool
	done   bool
}

func readStream(t *testing.T, r io.Reader) reply {
	t.Helper()
	out := reply{calls: map[int]*modelserver.ToolCall{}}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			out.done = true
			continue
		}
		var c struct {
			Choices []struct {
				Delta struct {
					Content   string `json:"content"`
					ToolCalls []struct {
						Index    int    `json:"index"`
						ID       string `json:"id"`
						Function struct {
							Name      string `json:"name"`
							Arguments string `json:"arguments"`
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				TotalTokens int `json:"total_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("chunk %q: %v", line, err)
		}
		if c.Usage != nil {
			out.usage = true
		}
		for _, ch := range c.Choices {
			out.text += ch.Delta.Content
			for _, tc := range ch.Delta.ToolCalls {
				cur := out.calls[tc.Index]
				if cur == nil {
					cur = &modelserver.ToolCall{ID: tc.ID}
					cur.Function.Name = tc.Function.Name
					out.calls[tc.Index] = cur
				}
				cur.Function.Arguments += tc.Function.Arguments
			}
			if ch.FinishReason != nil {
				out.finish = *ch.FinishReason
			}
		}
	}
	return out
}

// OpenCode's requests: streamed with a usage chunk, the tool calls in
// pieces that add up to the script's, checked against the offered tools;
// the turn is the assistant messages so far, less an empty one (a reply
// cut mid-stream) and one whose every call came back interrupted (then
// the turn is answered again, under new call ids, marked retried).
func TestOpenCodeConversation(t *testing.T) {
	s := modelserver.New(fix)
	srv := httptest.NewServer(s)
	defer srv.Close()
	tools := openCodeTools(t)
	req := func(msgs ...map[string]any) reply {
		resp := openCodeRequest(t, srv.URL, map[string]any{"model": "scripted", "stream": true,
			"stream_options": map[string]bool{"include_usage": true}, "tools": tools, "tool_choice": "auto", "messages": msgs})
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		return readStream(t, resp.Body)
	}
	sys, user := msg("system", "You are a scripted test."), msg("user", "Fix calc.sh.")
	r0 := req(sys, user)
	if r0.text != "Reading." || r0.finish != "tool_calls" || !r0.usage || !r0.done || len(r0.calls) != 1 {
		t.Fatalf("turn 0: %+v", r0)
	}
	if c := r0.calls[0]; c.ID != "c0" || c.Function.Name != "read" || c.Function.Arguments != fix["fix"][0].ToolCalls[0].Function.Arguments {
		t.Fatalf("turn 0's call, put together again: %+v", c)
	}
	a0 := assistantCalls("Reading.", *r0.calls[0])
	r1 := req(sys, user, a0, toolResult("c0", "a - b"))
	if len(r1.calls) != 2 || r1.calls[1].Function.Name != "write" {
		t.Fatalf("turn 1: %+v", r1)
	}
	a1 := assistantCalls("", *r1.calls[0], *r1.calls[1])
	past1 := []map[string]any{sys, user, a0, toolResult("c0", "a - b"), a1, toolResult("c1", "ok"), toolResult("c2", "ok")}
	r2 := req(past1...)
	if r2.calls[0].ID != "c3" {
		t.Fatalf("turn 2: %+v", r2)
	}
	// Killed mid-tool, then continued: the call comes back interrupted.
	a2 := assistantCalls("", *r2.calls[0])
	interrupted := append(slices.Clone(past1), a2, toolResult("c3", modelserver.Interrupted))
	r2again := req(interrupted...)
	if len(r2again.calls) != 1 || r2again.calls[0].ID != "c3.r1" || r2again.calls[0].Function.Arguments != r2.calls[0].Function.Arguments {
		t.Fatalf("turn 2 after an interruption: %+v", r2again.calls[0])
	}
	// Then cut mid-stream and continued: an empty assistant message.
	a2again := assistantCalls("", *r2again.calls[0])
	past2 := append(slices.Clone(interrupted), a2again, toolResult("c3.r1", "PASS"))
	if r3 := req(append(slices.Clone(past2), msg("assistant", ""))...); r3.text != "Fixed." || r3.finish != "stop" {
		t.Fatalf("turn 3 after an empty assistant message: %+v", r3)
	}
	var turns []int
	var retried []bool
	for _, e := range s.Ledger() {
		turns, retried = append(turns, e.Turn), append(retried, e.Retried)
		if e.UserTurns != 1 || e.Title || e.Chunks == 0 {
			t.Errorf("ledger entry %+v", e)
		}
	}
	if !slices.Equal(turns, []int{0, 1, 2, 2, 3}) || !slices.Equal(retried, []bool{false, false, false, true, false}) {
		t.Fatalf("ledger turns %v retried %v", turns, retried)
	}
	if r := s.Repeats(); len(r) != 0 {
		t.Fatalf("repeats %v", r)
	}
}

// OpenCode's title call (no tools) gets a title, is marked in the ledger
// and counts no turn; Hold does not hold it.
func TestOpenCodeTitleCall(t *testing.T) {
	s := modelserver.New(fix)
	srv := httptest.NewServer(s)
	defer srv.Close()
	s.Hold()
	resp := openCodeRequest(t, srv.URL, map[string]any{"model": "scripted", "stream": true, "stream_options": map[string]bool{"include_usage": true},
		"messages": []any{msg("system", "Title this."), msg("user", "Generate a title for this conversation:\n"), msg("user", "Fix calc.sh.")}})
	if r := readStream(t, resp.Body); r.text != modelserver.TitleReply || r.finish != "stop" {
		t.Fatalf("title reply %+v", r)
	}
	if l := s.Ledger(); len(l) != 1 || !l[0].Title || l[0].UserTurns != 1 {
		t.Fatalf("ledger %+v", l)
	}
}

// A scripted call that does not fit the offered tools is refused with a
// 400 that names it.
func TestOpenCodeToolCallsChecked(t *testing.T) {
	bad := modelserver.Script{"fix": {{ToolCalls: []modelserver.ToolCall{
		modelserver.Call("c0", "edit", map[string]string{"filePath": "calc.sh"}),
		modelserver.Call("c1", "apply_patch", map[string]string{"patch": "x"}),
	}}}}
	srv := httptest.NewServer(modelserver.New(bad))
	defer srv.Close()
	resp := openCodeRequest(t, srv.URL, map[string]any{"model": "scripted", "stream": true, "tools": openCodeTools(t), "messages": []any{msg("user", "x")}})
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), `needs \"oldString\"`) || !strings.Contains(string(b), `\"apply_patch\", which is not offered`) {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
}

// tool is an offered tool as the helpers' test reads it.
type tool struct {
	Function struct {
		Name       string `json:"name"`
		Parameters struct {
			Properties map[string]json.RawMessage `json:"properties"`
			Required   []string                   `json:"required"`
		} `json:"parameters"`
	} `json:"function"`
}

// The helpers' calls take exactly the parameters OpenCode's tools declare.
func TestHelpersFitOpenCodesTools(t *testing.T) {
	var offered []tool
	if err := json.Unmarshal(openCodeTools(t), &offered); err != nil {
		t.Fatal(err)
	}
	for _, c := range []modelserver.ToolCall{modelserver.BashCall("1", "ls"), modelserver.ReadCall("2", "a"),
		modelserver.EditCall("3", "a", "x", "y"), modelserver.WriteCall("4", "a", "z")} {
		i := slices.IndexFunc(offered, func(o tool) bool { return o.Function.Name == c.Function.Name })
		if i < 0 {
			t.Fatalf("%s is not one of OpenCode's tools", c.Function.Name)
		}
		var args map[string]string
		_ = json.Unmarshal([]byte(c.Function.Arguments), &args)
		p := offered[i].Function.Parameters
		for k := range args {
			if _, ok := p.Properties[k]; !ok {
				t.Errorf("%s: %q is not a parameter of OpenCode's %s (%v)", c.ID, k, c.Function.Name, slices.Sorted(maps.Keys(p.Properties)))
			}
		}
		for _, k := range p.Required {
			if _, ok := args[k]; !ok {
				t.Errorf("%s: %s misses %q", c.ID, c.Function.Name, k)
			}
		}
	}
}

// SlowNext spreads the next stream out, and the ledger tells how far it
// got.
func TestSlowNext(t *testing.T) {
	s := modelserver.New(fix)
	srv := httptest.NewServer(s)
	defer srv.Close()
	s.SlowNext(200 * time.Millisecond)
	resp := openCodeRequest(t, srv.URL, map[string]any{"model": "scripted", "stream": true, "tools": openCodeTools(t), "messages": []any{msg("user", "x")}})
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 5*time.Second, "the stream to be under way", func() bool { return s.Ledger()[0].Chunks >= 1 })
	if e := s.Ledger()[0]; !e.Delivered.IsZero() {
		t.Fatalf("a slow stream was delivered at once: %+v", e)
	}
	if r := readStream(t, br); !r.done {
		t.Fatalf("the slow stream did not end: %+v", r)
	}
	poll.Wait(t, 5*time.Second, "the delivery", func() bool { return !s.Ledger()[0].Delivered.IsZero() })
}
