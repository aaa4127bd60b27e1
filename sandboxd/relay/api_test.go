package relay_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// sse writes one server-sent event with its name, as both APIs send them.
func sse(b *strings.Builder, name, data string) {
	fmt.Fprintf(b, "event: %s\ndata: %s\n\n", name, data)
}

// nativeReply is what the native test upstream answers a request of api
// whose last turn is (tool true) or is not a tool's result: a tool call
// first, then text. It is the minimal sequence each harness takes
// (harness-notes), with a text delta and usage besides.
func nativeReply(api trajectory.API, stream, tool bool) (ctype, body string) {
	var b strings.Builder
	switch api {
	case trajectory.APIMessages:
		if !stream {
			block := `{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"echo hi"}}`
			stop := "tool_use"
			if tool {
				block, stop = `{"type":"text","text":"done: hi"}`, "end_turn"
			}
			return "application/json", `{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[` + block +
				`],"stop_reason":"` + stop + `","stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":3}}`
		}
		sse(&b, "message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":10,"output_tokens":1}}}`)
		if tool {
			sse(&b, "content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
			sse(&b, "content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"done: "}}`)
			sse(&b, "content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}`)
			sse(&b, "content_block_stop", `{"type":"content_block_stop","index":0}`)
			sse(&b, "message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":3}}`)
			sse(&b, "message_stop", `{"type":"message_stop"}`)
		} else {
			sse(&b, "content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_1","name":"Bash","input":{}}}`)
			sse(&b, "content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"command\":"}}`)
			sse(&b, "content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":" \"echo hi\"}"}}`)
			sse(&b, "content_block_stop", `{"type":"content_block_stop","index":0}`)
			sse(&b, "message_delta", `{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":5}}`)
			// No message_stop: Claude Code takes a stream that ends here.
		}
	case trajectory.APIResponses:
		item := `{"type":"function_call","call_id":"call_1","name":"exec_command","arguments":"{\"cmd\":\"echo hi\"}"}`
		if tool {
			item = `{"type":"message","role":"assistant","content":[{"type":"output_text","text":"done: hi"}]}`
		}
		if !stream {
			return "application/json", `{"id":"resp_1","object":"response","model":"m","status":"completed","output":[` + item + `],"usage":{"input_tokens":10,"output_tokens":3}}`
		}
		sse(&b, "response.created", `{"type":"response.created","response":{"id":"resp_1"}}`)
		sse(&b, "response.output_item.done", `{"type":"response.output_item.done","output_index":0,"item":`+item+`}`)
		sse(&b, "response.completed", `{"type":"response.completed","response":{"id":"resp_1","model":"m","usage":{"input_tokens":10,"output_tokens":3}}}`)
	}
	return "text/event-stream", b.String()
}

// nativeAnswer answers as a Messages or a Responses server, by path.
func nativeAnswer(w http.ResponseWriter, r *http.Request, body []byte) {
	api := trajectory.APIOf(r.URL.Path)
	var req struct {
		Stream bool `json:"stream"`
	}
	_ = json.Unmarshal(body, &req)
	tool := strings.Contains(string(body), `"tool_result"`) || strings.Contains(string(body), `"function_call_output"`)
	ctype, out := nativeReply(api, req.Stream, tool)
	w.Header().Set("Content-Type", ctype)
	_, _ = w.Write([]byte(out))
}

// nativeTurns are a harness's two requests of api: the prompt, then the
// prompt, the model's tool call as the harness echoes it, and the tool's
// result.
func nativeTurns(api trajectory.API, stream bool) (path string, first, second string) {
	s := fmt.Sprint(stream)
	if api == trajectory.APIMessages {
		user := `{"role":"user","content":[{"type":"text","text":"<system-reminder>x</system-reminder>"},{"type":"text","text":"run a command","cache_control":{"type":"ephemeral"}}]}`
		first = `{"model":"m","system":[{"type":"text","text":"You are Claude."}],"messages":[` + user + `],"tools":[{"name":"Bash"}],"max_tokens":128,"stream":` + s + `}`
		second = `{"model":"m","system":[{"type":"text","text":"You are Claude."}],"messages":[` + user +
			`,{"role":"assistant","content":[{"type":"tool_use","id":"toolu_1","name":"Bash","input":{"command":"echo hi"}}]}` +
			`,{"role":"user","content":[{"tool_use_id":"toolu_1","type":"tool_result","content":"hi","is_error":false,"cache_control":{"type":"ephemeral"}}]}],"tools":[{"name":"Bash"}],"max_tokens":128,"stream":` + s + `}`
		return "/v1/messages?beta=true", first, second
	}
	items := `{"type":"message","role":"developer","content":[{"type":"input_text","text":"base"}]},{"type":"message","role":"user","content":[{"type":"input_text","text":"run a command"}]}`
	first = `{"model":"m","input":[` + items + `],"tools":[{"type":"function","name":"exec_command"}],"store":false,"stream":` + s + `}`
	second = `{"model":"m","input":[` + items +
		`,{"type":"function_call","status":"completed","id":"fc_1","name":"exec_command","arguments":"{\"cmd\": \"echo hi\"}","call_id":"call_1"}` +
		`,{"type":"function_call_output","id":"fco_1","call_id":"call_1","output":"hi"}],"tools":[{"type":"function","name":"exec_command"}],"store":false,"stream":` + s + `}`
	return "/v1/responses", first, second
}

// Through a capturing relay, a Messages and a Responses harness's calls,
// streamed or not, pass byte for byte (no token fields asked), are each
// recorded once under the API's name, their messages in the trajectory's
// form, and the second links to the first by messages.
func TestNativeAPIsCaptured(t *testing.T) {
	for _, api := range []trajectory.API{trajectory.APIMessages, trajectory.APIResponses} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", api, stream), func(t *testing.T) {
				up := newUpstream(t, nativeAnswer)
				r, rec := captureRelay(t, up.URL, filepath.Join(t.TempDir(), trajectory.FileName))
				if err := r.Label("e", "l", nil); err != nil {
					t.Fatal(err)
				}
				path, first, second := nativeTurns(api, stream)
				for i, body := range []string{first, second} {
					g := wait(t, post(t, r, path, body))
					_, want := nativeReply(api, stream, i == 1)
					if g.status != 200 || g.body != want {
						t.Fatalf("call %d: %d %s, want the upstream's bytes", i+1, g.status, g.body)
					}
					if got := <-up.got; got != body {
						t.Fatalf("call %d went upstream as %s", i+1, got)
					}
				}
				calls := rec.Calls()
				if len(calls) != 2 {
					t.Fatalf("%d calls recorded", len(calls))
				}
				c1, c2 := calls[0], calls[1]
				if c1.API != api || c2.API != api || c1.Tokens || c1.Error != "" || c2.Error != "" {
					t.Fatalf("records %+v / %+v", c1.Call, c2.Call)
				}
				// Codex re-renders the arguments it echoes ("{\"cmd\": ...}"):
				// linked by the normalized message, stored whole, not as an
				// echo.
				if c2.Parent != c1.ID || c2.Link != trajectory.LinkResolved || c2.Echo != (api == trajectory.APIMessages) {
					t.Errorf("call 2: parent %q link %s echo %v (%s)", c2.Parent, c2.Link, c2.Echo, c2.LinkWhy)
				}
				wantFinish := map[trajectory.API][2]string{trajectory.APIMessages: {"tool_use", "end_turn"}, trajectory.APIResponses: {"completed", "completed"}}[api]
				if c1.FinishReason != wantFinish[0] || c2.FinishReason != wantFinish[1] {
					t.Errorf("finish reasons %q %q", c1.FinishReason, c2.FinishReason)
				}
				var reply struct {
					Content   string `json:"content"`
					ToolCalls []struct {
						ID       string `json:"id"`
						Function struct{ Name, Arguments string }
					} `json:"tool_calls"`
				}
				_ = json.Unmarshal(c1.Reply, &reply)
				if len(reply.ToolCalls) != 1 || !strings.Contains(reply.ToolCalls[0].Function.Arguments, "echo hi") {
					t.Errorf("call 1 reply %s", c1.Reply)
				}
				_ = json.Unmarshal(c2.Reply, &reply)
				if reply.Content != "done: hi" {
					t.Errorf("call 2 reply %s", c2.Reply)
				}
				if len(c2.Usage) == 0 || !strings.Contains(string(c2.Usage), `"output_tokens":3`) {
					t.Errorf("call 2 usage %s", c2.Usage)
				}
				if rep := trajectory.Check(calls); !rep.OK() || rep.Roots != 1 {
					t.Errorf("check: %s %v", rep, rep.Problems)
				}
			})
		}
	}
}

// A native stream's finishing event (message_delta with its stop reason;
// response.completed) reaches the harness only after the call's record is
// in the file.
func TestNativeRecordBeforeTheFinish(t *testing.T) {
	for _, api := range []trajectory.API{trajectory.APIMessages, trajectory.APIResponses} {
		t.Run(string(api), func(t *testing.T) {
			up := newUpstream(t, nativeAnswer)
			r, rec := captureRelay(t, up.URL, filepath.Join(t.TempDir(), trajectory.FileName))
			r.Label("e", "l", nil)
			path, first, _ := nativeTurns(api, true)
			resp, err := http.Post(r.URL()+path, "application/json", strings.NewReader(first))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			finish := map[trajectory.API]string{trajectory.APIMessages: `"stop_reason":"tool_use"`, trajectory.APIResponses: `response.completed`}[api]
			saw := false
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "data:") && strings.Contains(sc.Text(), finish) {
					saw = true
					if rec.Len() != 1 {
						t.Fatal("the harness read the finishing event before the call was recorded")
					}
				}
			}
			if !saw {
				t.Fatal("no finishing event")
			}
		})
	}
}

// A native call the relay holds waits, and one a re-point cut is sent
// again, the same bytes, and recorded once with the reply that ended.
func TestNativeHeldAndResent(t *testing.T) {
	for _, api := range []trajectory.API{trajectory.APIMessages, trajectory.APIResponses} {
		t.Run(string(api), func(t *testing.T) {
			gone := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ []byte) { <-r.Context().Done() })
			up := newUpstream(t, nativeAnswer)
			r, rec := captureRelay(t, gone.URL, filepath.Join(t.TempDir(), trajectory.FileName))
			r.Label("e", "l", nil)
			path, first, second := nativeTurns(api, true)
			cut := post(t, r, path, first)
			sent := <-gone.got
			r.Hold()
			if _, err := r.Repoint(up.URL, 1); err != nil {
				t.Fatal(err)
			}
			noReplyFor(t, cut, 100*time.Millisecond)
			r.Release()
			_, want := nativeReply(api, true, false)
			if g := wait(t, cut); g.status != 200 || g.body != want {
				t.Fatalf("call 1: %+v", g)
			}
			if resent := <-up.got; resent != sent {
				t.Errorf("the re-send differs: %s", resent)
			}
			r.Hold()
			held := post(t, r, path, second)
			noReplyFor(t, held, 100*time.Millisecond)
			r.Release()
			_, want = nativeReply(api, true, true)
			if g := wait(t, held); g.status != 200 || g.body != want {
				t.Fatalf("call 2: %+v", g)
			}
			<-up.got
			calls := rec.Calls()
			if len(calls) != 2 || calls[0].ID != "e.l.1" || calls[0].Resends != 1 || calls[0].Generation != 1 {
				t.Fatalf("recorded %d calls, first %+v", len(calls), calls[0].Call)
			}
			if calls[1].Parent != "e.l.1" || calls[1].Link != trajectory.LinkResolved {
				t.Errorf("call 2: %s %s", calls[1].Parent, calls[1].LinkWhy)
			}
		})
	}
}

// A body the relay cannot parse, or a path of no API it knows, is
// forwarded and recorded as it came, on no chain; the upstream's answer
// reaches the harness.
func TestUnparseableForwardedAndRecorded(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request, body []byte) {
		w.Header().Set("Content-Type", "application/json")
		if !json.Valid(body) {
			http.Error(w, `{"error":"not JSON"}`, http.StatusBadRequest)
			return
		}
		fmt.Fprint(w, `{"input_tokens":3}`)
	})
	r, rec := captureRelay(t, up.URL, filepath.Join(t.TempDir(), trajectory.FileName))
	r.Label("e", "l", nil)
	for _, c := range []struct{ path, body string }{
		{"/v1/chat/completions", "not json {"},
		{"/v1/messages", `{"messages":"a string"}`},
		{"/v1/responses", `[1,2]`},
		{"/v1/messages/count_tokens", `{"model":"m","messages":[{"role":"user","content":"x"}]}`},
		{"/v1/messages/count_tokens", `{"model":"m","messages":[{"role":"user","content":"x"}]}`},
	} {
		g := wait(t, post(t, r, c.path, c.body))
		if g.err != nil || g.status == 0 {
			t.Fatalf("%s %q: %+v", c.path, c.body, g)
		}
		if got := <-up.got; got != c.body {
			t.Fatalf("went upstream as %q", got)
		}
	}
	calls := rec.Calls()
	if len(calls) != 5 {
		t.Fatalf("%d calls recorded", len(calls))
	}
	for i, c := range calls {
		if c.ModelCall() || c.Link != trajectory.LinkRoot || c.Reply != nil {
			t.Errorf("call %d: %+v", i+1, c.Call)
		}
	}
	if calls[0].RequestError == "" || string(calls[0].RawRequest) != "not json {" || calls[0].Status != 400 {
		t.Errorf("the non-JSON call: %+v", calls[0].Call)
	}
	if calls[3].API != trajectory.APIOther || calls[3].RequestError != "" || !strings.Contains(string(calls[3].Params), `"messages"`) {
		t.Errorf("the count of tokens: %+v", calls[3].Call)
	}
	if rep := trajectory.Check(calls); !rep.OK() || rep.Other != 5 || rep.Duplicates != 0 {
		t.Errorf("check: %s %+v", rep, rep)
	}
	// A reader reads the file back the same.
	rec.Close()
	f, err := os.Open(rec.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	x, err := trajectory.Read(f)
	if err != nil || x.Len() != 5 || string(x.Calls()[0].RawRequest) != "not json {" {
		t.Fatalf("read back: %v", err)
	}
}
