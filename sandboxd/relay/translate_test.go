package relay_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/sandboxd/relay"
	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// nativeHarness drives captureScript through url in api as Claude Code
// (Messages) or Codex (Responses) would, each reply echoed in the API's
// own shapes and each tool call answered; it returns the raw replies.
func nativeHarness(t *testing.T, url string, api trajectory.API, stream bool) []string {
	t.Helper()
	var history []any
	if api == trajectory.APIMessages {
		history = append(history, map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "look at a.txt"}}})
	} else {
		history = append(history, map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "look at a.txt"}}})
	}
	path := "/v1/messages?beta=true"
	if api == trajectory.APIResponses {
		path = "/v1/responses"
	}
	var bodies []string
	for range captureScript["t"] {
		req := map[string]any{"model": "m", "stream": stream}
		if api == trajectory.APIMessages {
			req["system"] = []any{map[string]any{"type": "text", "text": "You are a coder."}}
			req["messages"], req["max_tokens"] = history, 1024
			req["tools"] = []any{map[string]any{"name": "bash", "description": "run", "input_schema": map[string]any{"type": "object"}}}
		} else {
			req["input"], req["store"] = history, false
			req["tools"] = []any{map[string]any{"type": "function", "name": "bash", "parameters": map[string]any{"type": "object"}},
				map[string]any{"type": "web_search"}}
		}
		b, _ := json.Marshal(req)
		resp, err := http.Post(url+path, "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, raw)
		}
		if stream && !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			t.Fatalf("a stream answered as %s", resp.Header.Get("Content-Type"))
		}
		bodies = append(bodies, string(raw))
		a := trajectory.NewAPIAssembler(api, stream)
		a.Write(raw)
		if stream && !a.Finished() {
			t.Fatalf("the reply did not finish: %s", raw)
		}
		r := a.Reply(200)
		if r.Error != "" {
			t.Fatalf("the reply does not read as %s: %s\n%s", api, r.Error, raw)
		}
		var msg struct {
			Content   string `json:"content"`
			ToolCalls []struct {
				ID       string `json:"id"`
				Function struct{ Name, Arguments string }
			} `json:"tool_calls"`
		}
		_ = json.Unmarshal(r.Message, &msg)
		if api == trajectory.APIMessages {
			var blocks []any
			if msg.Content != "" {
				blocks = append(blocks, map[string]any{"type": "text", "text": msg.Content})
			}
			var results []any
			for _, tc := range msg.ToolCalls {
				blocks = append(blocks, map[string]any{"type": "tool_use", "id": tc.ID, "name": tc.Function.Name, "input": json.RawMessage(tc.Function.Arguments)})
				results = append(results, map[string]any{"type": "tool_result", "tool_use_id": tc.ID, "content": "x"})
			}
			history = append(history, map[string]any{"role": "assistant", "content": blocks})
			if results != nil {
				history = append(history, map[string]any{"role": "user", "content": results})
			}
			continue
		}
		if msg.Content != "" {
			history = append(history, map[string]any{"type": "message", "role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": msg.Content}}})
		}
		for _, tc := range msg.ToolCalls {
			history = append(history, map[string]any{"type": "function_call", "call_id": tc.ID, "name": tc.Function.Name, "arguments": tc.Function.Arguments})
		}
		for _, tc := range msg.ToolCalls {
			history = append(history, map[string]any{"type": "function_call_output", "call_id": tc.ID, "output": "x"})
		}
	}
	return bodies
}

// With Translate, a Messages or a Responses harness's calls go to the
// scripted model server's chat completions path, come back whole in the
// harness's API, streamed or not, and are recorded with the token ids and
// logprobs the server gave, each linked to the one before.
func TestTranslateToChat(t *testing.T) {
	for _, api := range []trajectory.API{trajectory.APIMessages, trajectory.APIResponses} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", api, stream), func(t *testing.T) {
				m := newModel(t)
				rec, err := trajectory.OpenRecorder(filepath.Join(t.TempDir(), trajectory.FileName))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { rec.Close() })
				r := serveRelay(t, relay.Config{Upstream: m.URL, Capture: rec, Tokens: true, Translate: true})
				if err := r.Label("e", "l", nil); err != nil {
					t.Fatal(err)
				}
				bodies := nativeHarness(t, r.URL(), api, stream)
				for _, b := range bodies {
					if strings.Contains(b, "token_ids") || strings.Contains(b, "chat.completion") {
						t.Errorf("the harness got chat completion bytes: %s", b)
					}
				}
				if !strings.Contains(bodies[2], "empty.") {
					t.Errorf("the last reply: %s", bodies[2])
				}
				calls := rec.Calls()
				l := m.Ledger()
				if len(calls) != 3 || len(l) != 3 {
					t.Fatalf("%d calls recorded, %d answered", len(calls), len(l))
				}
				for i, c := range calls {
					if c.API != api || c.Via != trajectory.APIChat || !c.Tokens || c.Error != "" {
						t.Fatalf("call %d: api %s via %s tokens %v error %q", i, c.API, c.Via, c.Tokens, c.Error)
					}
					if !slices.Equal(c.AllPromptIDs, l[i].PromptTokenIDs) || !slices.Equal(c.CompletionIDs, l[i].TokenIDs) || len(c.Logprobs) != len(c.CompletionIDs) {
						t.Errorf("call %s: tokens are not the ledger's", c.ID)
					}
					if i > 0 && (c.Parent != calls[i-1].ID || c.Link != trajectory.LinkResolved) {
						t.Errorf("call %s: parent %s link %s (%s)", c.ID, c.Parent, c.Link, c.LinkWhy)
					}
				}
				if rep := trajectory.Check(calls); !rep.OK() || rep.TokenBreaks != 0 {
					t.Errorf("check: %s %v", rep, rep.Problems)
				}
				if seqs := trajectory.Chains(calls); len(seqs) != 1 || len(seqs[0].Calls) != 3 {
					t.Errorf("chains %+v", seqs)
				}
			})
		}
	}
}

// A translated call cut by a re-point before its reply began is sent again
// as the same chat completion request, and the harness gets one whole
// reply in its API; without a capture, the translation still answers in
// the harness's API.
func TestTranslateResentAndUncaptured(t *testing.T) {
	gone := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ []byte) { <-r.Context().Done() })
	m := newModel(t)
	rec, err := trajectory.OpenRecorder(filepath.Join(t.TempDir(), trajectory.FileName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Close() })
	r := serveRelay(t, relay.Config{Upstream: gone.URL, Capture: rec, Tokens: true, Translate: true})
	r.Label("e", "l", nil)
	body := `{"model":"m","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"look at a.txt"}]}`
	cut := post(t, r, "/v1/messages", body)
	sent := <-gone.got
	if !strings.Contains(sent, `"return_token_ids":true`) || !strings.Contains(sent, `"messages":[{"content":"look at a.txt","role":"user"}]`) {
		t.Fatalf("upstream got %s", sent)
	}
	r.Hold()
	if _, err := r.Repoint(m.URL, 1); err != nil {
		t.Fatal(err)
	}
	r.Release()
	g := wait(t, cut)
	a := trajectory.NewAPIAssembler(trajectory.APIMessages, true)
	a.Write([]byte(g.body))
	if rep := a.Reply(200); g.status != 200 || !a.Finished() || rep.Error != "" || rep.FinishReason != "tool_use" {
		t.Fatalf("%d %+v\n%s", g.status, rep, g.body)
	}
	if calls := rec.Calls(); len(calls) != 1 || calls[0].Resends != 1 || !calls[0].Tokens {
		t.Fatalf("recorded %+v", calls)
	}

	plain := serveRelay(t, relay.Config{Upstream: m.URL, Translate: true})
	g = wait(t, post(t, plain, "/v1/responses", `{"model":"m","input":"look at a.txt"}`))
	var resp struct {
		Object string `json:"object"`
		Output []struct {
			Type string `json:"type"`
		} `json:"output"`
	}
	if err := json.Unmarshal([]byte(g.body), &resp); err != nil || g.status != 200 || resp.Object != "response" || len(resp.Output) == 0 {
		t.Fatalf("%d %s", g.status, g.body)
	}
}

// chatStream answers a chat completion stream of lines, each a data line.
func chatStream(lines ...string) func(w http.ResponseWriter, r *http.Request, _ []byte) {
	return func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, l := range lines {
			fmt.Fprintf(w, "data: %s\n\n", l)
		}
	}
}

// A translated stream is closed for the harness only once the upstream
// gave a finish reason: an error the upstream sent in its stream reaches
// the harness as its API's error, and a stream that ends without a finish
// reason (at [DONE] or at its end) is left unfinished; the record says
// the same.
func TestTranslateUnfinishedReplies(t *testing.T) {
	const (
		first  = `{"id":"c1","model":"m","prompt_token_ids":[1,2],"choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"},"token_ids":[7],"logprobs":{"content":[{"token":"token_id:7","logprob":-0.5}]}}]}`
		finish = `{"id":"c1","model":"m","choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop","token_ids":[8],"logprobs":{"content":[{"token":"token_id:8","logprob":-0.1}]}}]}`
		fail   = `{"error":{"message":"generation failed: boom","type":"InternalServerError","code":500}}`
	)
	cases := []struct {
		name   string
		lines  []string
		whole  bool   // the harness gets a finished reply
		failed string // the harness gets its API's error, with this text
	}{
		{"finished", []string{first, finish, "[DONE]"}, true, ""},
		{"error", []string{first, fail, "[DONE]"}, false, "boom"},
		{"error-first", []string{fail, "[DONE]"}, false, "boom"},
		{"done-without-finish", []string{first, "[DONE]"}, false, ""},
		{"cut-short", []string{first}, false, ""},
	}
	for _, api := range []trajectory.API{trajectory.APIMessages, trajectory.APIResponses} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%s/%s", api, tc.name), func(t *testing.T) {
				up := newUpstream(t, chatStream(tc.lines...))
				rec, err := trajectory.OpenRecorder(filepath.Join(t.TempDir(), trajectory.FileName))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { rec.Close() })
				r := serveRelay(t, relay.Config{Upstream: up.URL, Capture: rec, Tokens: true, Translate: true})
				if err := r.Label("e", "l", nil); err != nil {
					t.Fatal(err)
				}
				path, body := "/v1/messages", `{"model":"m","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
				if api == trajectory.APIResponses {
					path, body = "/v1/responses", `{"model":"m","stream":true,"input":"hi"}`
				}
				g := wait(t, post(t, r, path, body))
				if g.status != 200 {
					t.Fatalf("%d %s", g.status, g.body)
				}
				a := trajectory.NewAPIAssembler(api, true)
				a.Write([]byte(g.body))
				closed := strings.Contains(g.body, "message_stop") || strings.Contains(g.body, "response.completed")
				if closed != tc.whole || tc.whole && (!a.Finished() || a.Reply(200).Error != "") {
					t.Fatalf("closed %v (want %v), finished %v %q:\n%s", closed, tc.whole, a.Finished(), a.Reply(200).Error, g.body)
				}
				if tc.failed != "" {
					ev := "event: error\n"
					if api == trajectory.APIResponses {
						ev = "event: response.failed\n"
					}
					if !strings.Contains(g.body, ev) || !strings.Contains(g.body, tc.failed) || a.Reply(200).Error == "" {
						t.Fatalf("the harness did not get the upstream's error as its API's (%q):\n%s", a.Reply(200).Error, g.body)
					}
				} else if strings.Contains(g.body, "event: error") || strings.Contains(g.body, "response.failed") {
					t.Fatalf("an error the upstream did not send:\n%s", g.body)
				}
				calls := rec.Calls()
				if len(calls) != 1 {
					t.Fatalf("%d calls recorded", len(calls))
				}
				if got := calls[0].Error != ""; got == tc.whole {
					t.Fatalf("the record's error %q, the harness's reply whole: %v", calls[0].Error, tc.whole)
				}
			})
		}
	}
}

// A plain chat reply that is an upstream error reaches the harness as its
// API's error body, and is recorded as an error.
func TestTranslatePlainError(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"error":{"message":"boom","code":500}}`)
	})
	for _, tc := range []struct{ path, body, want string }{
		{"/v1/messages", `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`, `"type":"api_error"`},
		{"/v1/responses", `{"model":"m","input":"hi"}`, `"status":"failed"`},
	} {
		rec, err := trajectory.OpenRecorder(filepath.Join(t.TempDir(), trajectory.FileName))
		if err != nil {
			t.Fatal(err)
		}
		r := serveRelay(t, relay.Config{Upstream: up.URL, Capture: rec, Tokens: true, Translate: true})
		r.Label("e", "l", nil)
		g := wait(t, post(t, r, tc.path, tc.body))
		if !strings.Contains(g.body, tc.want) || !strings.Contains(g.body, "boom") {
			t.Errorf("%s: %d %s", tc.path, g.status, g.body)
		}
		if calls := rec.Calls(); len(calls) != 1 || calls[0].Error == "" {
			t.Errorf("%s: recorded %+v", tc.path, calls)
		}
		rec.Close()
	}
}

// A translated plain reply is kept whole until it is translated: the bytes
// it keeps count in the open calls' budget, and one over the bound a
// plain reply may keep fails its call with the relay's error (a
// translation cannot pass half a body), never a 200 cut short.
func TestTranslatePlainReplyKept(t *testing.T) {
	const first = `{"id":"c","model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"`
	more := make(chan struct{})
	const bound = 1 << 20 // Config.MaxKeptReply, small: the reply over it is read and translated fast under -race
	big := strings.Repeat("a", bound+1)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(string(body), "big") {
			fmt.Fprint(w, first+big+`"}}]}`)
			return
		}
		fmt.Fprint(w, first+strings.Repeat("b", 100<<10))
		w.(http.Flusher).Flush()
		select {
		case <-more:
		case <-r.Context().Done():
		}
		fmt.Fprint(w, `"}}]}`)
	})
	rec, err := trajectory.OpenRecorder(filepath.Join(t.TempDir(), trajectory.FileName))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Close() })
	r := serveRelay(t, relay.Config{Upstream: up.URL, Capture: rec, Tokens: true, Translate: true, MaxKeptReply: bound})
	r.Label("e", "l", nil)

	kept := post(t, r, "/v1/messages", `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`)
	poll.Wait(t, 10*time.Second, "the held reply counted", func() bool { return r.Status().KeptBytes >= 100<<10 })
	close(more)
	if g := wait(t, kept); g.status != 200 || !strings.Contains(g.body, `"type":"message"`) {
		t.Fatalf("%d %.200s", g.status, g.body)
	}

	g := wait(t, post(t, r, "/v1/messages", `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":"big"}]}`))
	if g.status != http.StatusBadGateway || !strings.Contains(g.body, "translation cannot pass half a body") {
		t.Fatalf("%d %.300s", g.status, g.body)
	}
	poll.Wait(t, 10*time.Second, "nothing kept", func() bool { st := r.Status(); return len(st.Open) == 0 && st.KeptBytes == 0 })
	if st := r.Status(); st.Calls.Failed != 1 || st.Calls.Delivered != 1 {
		t.Fatalf("calls %+v", st.Calls)
	}
}

// A translated stream cut by a re-point after its first events reached the
// harness is sent again: a re-sent reply that translates to the same first
// bytes continues what was delivered, and the harness ends up with the
// bytes of a call never cut; one that does not has the harness's
// connection cut, never spliced.
func TestTranslateResendAfterDelivered(t *testing.T) {
	chunk := func(id, text string) string {
		return `{"id":"` + id + `","model":"m","choices":[{"index":0,"delta":{"content":"` + text + `"}}]}`
	}
	stream := func(id, second string) []string {
		return []string{chunk(id, "Hel"), chunk(id, second), chunk(id, " there"),
			`{"id":"` + id + `","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`, "[DONE]"}
	}
	for _, api := range []trajectory.API{trajectory.APIMessages, trajectory.APIResponses} {
		path, body := "/v1/messages", `{"model":"m","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
		delivered := func(b string) bool {
			return strings.Count(b, "event: content_block_delta") == 2 && strings.HasSuffix(b, "\n\n")
		}
		other := stream("c1", "LO") // its second event differs
		if api == trajectory.APIResponses {
			path, body = "/v1/responses", `{"model":"m","stream":true,"input":"hi"}`
			delivered = func(b string) bool { return strings.HasSuffix(b, "\n\n") && strings.Contains(b, "response.created") }
			other = stream("c9", "lo") // its first event (the response's id) differs
		}
		for _, same := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/same=%v", api, same), func(t *testing.T) {
				whole := stream("c1", "lo")
				direct := serveRelay(t, relay.Config{Upstream: newUpstream(t, chatStream(whole...)).URL, Translate: true})
				want := wait(t, post(t, direct, path, body))

				old := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
					w.Header().Set("Content-Type", "text/event-stream")
					for _, l := range whole[:2] {
						fmt.Fprintf(w, "data: %s\n\n", l)
					}
					w.(http.Flusher).Flush()
					<-r.Context().Done()
				})
				resent := whole
				if !same {
					resent = other
				}
				fresh := newUpstream(t, chatStream(resent...))
				rec, err := trajectory.OpenRecorder(filepath.Join(t.TempDir(), trajectory.FileName))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { rec.Close() })
				r := serveRelay(t, relay.Config{Upstream: old.URL, Capture: rec, Tokens: true, Translate: true})
				r.Label("e", "l", nil)
				resp, err := (&http.Client{Timeout: 10 * time.Second}).Post(r.URL()+path, "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				// Read the first events as the harness does, then re-point.
				var got []byte
				buf := make([]byte, 4096)
				for !delivered(string(got)) {
					n, err := resp.Body.Read(buf)
					got = append(got, buf[:n]...)
					if err != nil {
						t.Fatalf("before the cut: %v\n%s", err, got)
					}
				}
				if !strings.HasPrefix(want.body, string(got)) {
					t.Fatalf("delivered before the cut:\n%s\nnot the start of\n%s", got, want.body)
				}
				if _, err := r.Repoint(fresh.URL, 1); err != nil {
					t.Fatal(err)
				}
				rest, err := io.ReadAll(resp.Body)
				if same {
					if err != nil || string(got)+string(rest) != want.body {
						t.Fatalf("%v: the harness got\n%s%s\nwant\n%s", err, got, rest, want.body)
					}
					if calls := rec.Calls(); len(calls) != 1 || calls[0].Resends != 1 || calls[0].Error != "" {
						t.Fatalf("recorded %+v", calls)
					}
					return
				}
				if err == nil || len(rest) != 0 {
					t.Fatalf("a diverging re-send was spliced (%v): %s", err, rest)
				}
				poll.Wait(t, 5*time.Second, "the call failed", func() bool { return r.Status().Calls.Failed == 1 })
			})
		}
	}
}
