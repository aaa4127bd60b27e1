package modelserver_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
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

// codexRequest is a request Codex 0.171.0 sent (its second: the prompt,
// a call of exec_command and its output), as captured.
func codexRequest(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile("testdata/codex-0.171.0-request.json")
	if err != nil {
		t.Fatal(err)
	}
	var req map[string]any
	if err := json.Unmarshal(b, &req); err != nil {
		t.Fatal(err)
	}
	return req
}

var codexScript = modelserver.Script{"fix": {
	{Content: "Looking.", ToolCalls: []modelserver.ToolCall{modelserver.ExecCall("c0", "cat calc.sh")}},
	{ToolCalls: []modelserver.ToolCall{modelserver.ExecCall("c1", "sh test.sh 2>&1")}},
	{Content: "Fixed."},
}}

func item(role, text string) map[string]any {
	kind := "input_text"
	if role == "assistant" {
		kind = "output_text"
	}
	return map[string]any{"type": "message", "role": role, "content": []any{map[string]any{"type": kind, "text": text}}}
}

func callItem(c modelserver.ToolCall) map[string]any {
	return map[string]any{"type": "function_call", "call_id": c.ID, "name": c.Function.Name, "arguments": c.Function.Arguments}
}

func outputItem(id, out string) map[string]any {
	return map[string]any{"type": "function_call_output", "call_id": id, "output": out}
}

// postResponses sends a Responses request as Codex does, with input in
// place of the captured one's.
func postResponses(t *testing.T, url string, stream bool, input ...map[string]any) *http.Response {
	t.Helper()
	resp, err := sendResponses(t.Context(), url, responsesBody(t, stream, input...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// responsesBody is the captured Codex request with input in place of its
// own.
func responsesBody(t *testing.T, stream bool, input ...map[string]any) []byte {
	t.Helper()
	body := codexRequest(t)
	body["input"], body["stream"] = input, stream
	b, _ := json.Marshal(body)
	return b
}

// sendResponses posts body to /v1/responses as Codex does; it calls no
// t.Fatal, so that a test's goroutine can use it.
func sendResponses(ctx context.Context, url string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/responses", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set(modelserver.TaskHeader, "fix")
	req.Header.Set(modelserver.EpisodeHeader, "e1")
	return http.DefaultClient.Do(req)
}

// responsesReply is a streamed Responses reply put together again.
type responsesReply struct {
	types     []string
	text      string
	calls     []map[string]any
	completed bool
	usage     map[string]int
}

func readResponses(t *testing.T, r io.Reader) responsesReply {
	t.Helper()
	out, err := parseResponses(r)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// parseResponses puts a streamed Responses reply together again; it calls
// no t.Fatal, so that a test's goroutine can use it.
func parseResponses(r io.Reader) (responsesReply, error) {
	var out responsesReply
	var name string
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			name = v
			continue
		}
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var e struct {
			Type     string         `json:"type"`
			Delta    string         `json:"delta"`
			Item     map[string]any `json:"item"`
			Response struct {
				Usage map[string]int `json:"usage"`
			} `json:"response"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			return out, fmt.Errorf("event %q: %v", line, err)
		}
		if e.Type != name {
			return out, fmt.Errorf("event: %s with data of type %s", name, e.Type)
		}
		out.types = append(out.types, e.Type)
		switch e.Type {
		case "response.output_text.delta":
			out.text += e.Delta
		case "response.output_item.done":
			if e.Item["type"] == "function_call" {
				out.calls = append(out.calls, e.Item)
			}
		case "response.completed":
			out.completed, out.usage = true, e.Response.Usage
		}
	}
	return out, sc.Err()
}

func asCall(t *testing.T, m map[string]any) modelserver.ToolCall {
	t.Helper()
	var c modelserver.ToolCall
	c.ID, c.Type = m["call_id"].(string), "function"
	c.Function.Name, c.Function.Arguments = m["name"].(string), m["arguments"].(string)
	return c
}

// Codex's conversation: the reply streams as Codex reads it (the text as
// a message item, each call as a function_call item, response.completed
// last), checked against the offered tools; consecutive assistant-side
// items are one turn; a call that came back aborted is answered again
// under a new id (Retried); a reply cut and kept at the end is no turn;
// every user message counts as a user turn, an empty one included.
func TestResponsesConversation(t *testing.T) {
	s := modelserver.New(codexScript)
	srv := httptest.NewServer(s)
	defer srv.Close()
	req := func(input ...map[string]any) responsesReply {
		resp := postResponses(t, srv.URL, true, input...)
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		return readResponses(t, resp.Body)
	}
	start := []map[string]any{item("developer", "You are Codex."), item("developer", "<skills_instructions>…"),
		item("user", "<environment_context>…</environment_context>"), item("user", "Fix calc.sh.")}
	r0 := req(start...)
	if !r0.completed || r0.text != "Looking." || len(r0.calls) != 1 || r0.types[0] != "response.created" || r0.usage["output_tokens"] == 0 {
		t.Fatalf("turn 0: %+v", r0)
	}
	c0 := asCall(t, r0.calls[0])
	if c0 != codexScript["fix"][0].ToolCalls[0] {
		t.Fatalf("turn 0's call %+v", c0)
	}
	past := append(slices.Clone(start), item("assistant", "Looking."), callItem(c0), outputItem("c0", "a - b"))
	r1 := req(past...)
	if len(r1.calls) != 1 || r1.calls[0]["call_id"] != "c1" {
		t.Fatalf("turn 1: %+v", r1)
	}
	// Killed mid-tool and resumed with "": the call comes back aborted,
	// after it an empty user message.
	c1 := asCall(t, r1.calls[0])
	aborted := append(slices.Clone(past), callItem(c1), outputItem("c1", modelserver.Aborted), item("user", ""))
	r1again := req(aborted...)
	if len(r1again.calls) != 1 || r1again.calls[0]["call_id"] != "c1.r1" {
		t.Fatalf("turn 1 after an abort: %+v", r1again)
	}
	// Then a cut, the partial reply kept.
	c1r := asCall(t, r1again.calls[0])
	past2 := append(slices.Clone(aborted), callItem(c1r), outputItem("c1.r1", "PASS"))
	if r2 := req(append(slices.Clone(past2), item("assistant", "Fix"))...); r2.text != "Fixed." || len(r2.calls) != 0 {
		t.Fatalf("turn 2 after a kept partial reply: %+v", r2)
	}
	var turns, users []int
	var retried []bool
	for _, e := range s.Ledger() {
		turns, users, retried = append(turns, e.Turn), append(users, e.UserTurns), append(retried, e.Retried)
		if e.API != modelserver.APIResponses || e.Episode != "e1" || e.Delivered.IsZero() || e.Sent != len(e.TokenIDs) {
			t.Errorf("ledger entry %+v", e)
		}
	}
	if !slices.Equal(turns, []int{0, 1, 1, 2}) || !slices.Equal(retried, []bool{false, false, true, false}) || !slices.Equal(users, []int{2, 2, 3, 3}) {
		t.Fatalf("ledger turns %v retried %v user turns %v", turns, retried, users)
	}
	if r := s.Repeats(); len(r) != 0 {
		t.Fatalf("repeats %v", r)
	}
	// The same request again is a repeat.
	req(past...)
	if r := s.Repeats(); len(r["fix"]) != 1 {
		t.Fatalf("repeats %v", r)
	}
}

// With stream false the reply is one response object.
func TestResponsesNotStreamed(t *testing.T) {
	srv := httptest.NewServer(modelserver.New(codexScript))
	defer srv.Close()
	resp := postResponses(t, srv.URL, false, item("user", "Fix calc.sh."))
	var r struct {
		Object, Status string
		Output         []map[string]any
		Usage          map[string]int
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	if r.Object != "response" || r.Status != "completed" || len(r.Output) != 2 || r.Output[0]["type"] != "message" || r.Output[1]["call_id"] != "c0" || r.Usage["total_tokens"] == 0 {
		t.Fatalf("reply %+v", r)
	}
}

// Two answers to the same request are the same bytes, streamed or not,
// even a second apart: a relay re-sending a cut call continues only if the
// new reply starts with what it already delivered.
func TestResponsesSameRequestSameBytes(t *testing.T) {
	srv := httptest.NewServer(modelserver.New(codexScript))
	defer srv.Close()
	for _, stream := range []bool{true, false} {
		answer := func() []byte {
			b, err := io.ReadAll(postResponses(t, srv.URL, stream, item("user", "Fix calc.sh.")).Body)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		first, sent := answer(), time.Now().Unix()
		poll.Wait(t, 3*time.Second, "the next second", func() bool { return time.Now().Unix() > sent })
		if again := answer(); !bytes.Equal(first, again) {
			t.Fatalf("stream %v: the same request answered\n%s\nthen\n%s", stream, first, again)
		}
	}
}

// A scripted call that does not fit Codex's tools is refused with a 400.
func TestResponsesToolCallsChecked(t *testing.T) {
	bad := modelserver.Script{"fix": {{ToolCalls: []modelserver.ToolCall{modelserver.BashCall("c0", "ls"),
		modelserver.Call("c1", "exec_command", map[string]string{"command": "ls"})}}}}
	srv := httptest.NewServer(modelserver.New(bad))
	defer srv.Close()
	resp := postResponses(t, srv.URL, true, item("user", "x"))
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), `\"bash\", which is not offered`) || !strings.Contains(string(b), `needs \"cmd\"`) {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
}

// Hold holds a Responses reply from its turn on, and CutNext stops the
// next stream without response.completed (not delivered).
func TestResponsesHoldAndCut(t *testing.T) {
	s := modelserver.New(codexScript)
	srv := httptest.NewServer(s)
	defer srv.Close()
	s.CutNext(3)
	if r := readResponses(t, postResponses(t, srv.URL, true, item("user", "x")).Body); r.completed || len(r.types) != 3 {
		t.Fatalf("cut stream: %+v", r)
	}
	if e := s.Ledger()[0]; !e.Cut || e.Chunks != 3 || e.Sent >= len(e.TokenIDs) || !e.Delivered.IsZero() {
		t.Fatalf("cut entry %+v", e)
	}
	s.HoldFrom(1)
	if r := readResponses(t, postResponses(t, srv.URL, true, item("user", "x")).Body); !r.completed {
		t.Fatalf("turn 0 was held: %+v", r)
	}
	type result struct {
		r   responsesReply
		err error
	}
	got := make(chan result, 1)
	c0 := codexScript["fix"][0].ToolCalls[0]
	body := responsesBody(t, true, item("user", "x"), callItem(c0), outputItem("c0", "ok"))
	go func() {
		resp, err := sendResponses(t.Context(), srv.URL, body)
		if err != nil {
			got <- result{err: err}
			return
		}
		defer resp.Body.Close()
		r, err := parseResponses(resp.Body)
		got <- result{r, err}
	}()
	poll.Wait(t, 5*time.Second, "turn 1 to be held", func() bool { return s.Held() == 1 })
	select {
	case r := <-got:
		t.Fatalf("a held reply came: %+v %v", r.r, r.err)
	case <-time.After(100 * time.Millisecond):
	}
	s.Release()
	if r := <-got; r.err != nil || !r.r.completed || len(r.r.calls) != 1 {
		t.Fatalf("released reply %+v %v", r.r, r.err)
	}
	if l := s.Ledger(); len(l) != 3 || l[2].Turn != 1 || l[2].Delivered.IsZero() {
		t.Fatalf("ledger %+v", l)
	}
}

// codexTool is a tool Codex offers, as the test reads it.
type codexTool struct {
	Name       string `json:"name"`
	Parameters struct {
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
	} `json:"parameters"`
}

// ExecCall fits the exec_command tool Codex offers.
func TestExecCallFitsCodexTool(t *testing.T) {
	tools, _ := json.Marshal(codexRequest(t)["tools"])
	var offered []codexTool
	if err := json.Unmarshal(tools, &offered); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(offered, func(o codexTool) bool { return o.Name == "exec_command" })
	if i < 0 || !slices.Equal(offered[i].Parameters.Required, []string{"cmd"}) || offered[i].Parameters.Properties["cmd"] == nil {
		t.Fatalf("Codex's exec_command is not what ExecCall calls: %+v", offered)
	}
}

// A Codex conversation a relay translated to chat completions: a call
// that came back Aborted is answered again, as on /v1/responses.
func TestAbortedInChat(t *testing.T) {
	s := modelserver.New(codexScript)
	srv := httptest.NewServer(s)
	defer srv.Close()
	tools := []map[string]any{{"type": "function", "function": map[string]any{"name": "exec_command",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"cmd": map[string]string{"type": "string"}}, "required": []string{"cmd"}}}}}
	c0 := codexScript["fix"][0].ToolCalls[0]
	resp := openCodeRequest(t, srv.URL, map[string]any{"model": "m", "stream": true, "tools": tools, "messages": []any{
		msg("system", "You are Codex."), msg("user", "Fix calc.sh."), assistantCalls("Looking.", c0), toolResult(c0.ID, modelserver.Aborted)}})
	if r := readStream(t, resp.Body); len(r.calls) != 1 || r.calls[0].ID != "c0.r1" {
		t.Fatalf("reply %+v", r)
	}
	if l := s.Ledger(); len(l) != 1 || l[0].Turn != 0 || !l[0].Retried || l[0].API != modelserver.APIChat {
		t.Fatalf("ledger %+v", l)
	}
}
