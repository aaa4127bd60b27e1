package trajectory

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestAPIOf(t *testing.T) {
	for path, want := range map[string]API{
		"/v1/chat/completions": APIChat, "/chat/completions?x=1": APIChat,
		"/v1/messages": APIMessages, "/v1/messages?beta=true": APIMessages,
		"/v1/responses": APIResponses, "/v1/responses/": APIResponses,
		"/v1/messages/count_tokens": APIOther, "/v1/models": APIOther, "/": APIOther,
	} {
		if got := APIOf(path); got != want {
			t.Errorf("APIOf(%q) = %s, want %s", path, got, want)
		}
	}
}

func joinRaw(msgs []json.RawMessage) string {
	s := make([]string, len(msgs))
	for i, m := range msgs {
		s[i] = string(m)
	}
	return strings.Join(s, "\n")
}

// A Messages request's system, blocks, tool uses and results, and Claude
// Code's system message among the messages, in the trajectory's form.
func TestMessagesRequest(t *testing.T) {
	body := `{"model":"claude","max_tokens":8,"system":[{"type":"text","text":"sys","cache_control":{"type":"ephemeral"}}],"messages":[
		{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
		{"role":"system","content":"# Environment"},
		{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"s"},{"type":"text","text":"ok"},{"type":"tool_use","id":"t1","name":"Bash","input":{"command": "ls"}}]},
		{"role":"user","content":[{"tool_use_id":"t1","type":"tool_result","content":"x","is_error":false},{"type":"text","text":"Continue from where you left off."}]},
		{"role":"user","content":"plain"}]}`
	model, params, msgs, err := splitAPI(APIMessages, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"role":"system","content":"sys"}
{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}
{"role":"system","content":"# Environment"}
{"role":"assistant","content":"ok","reasoning_content":"hmm","tool_calls":[{"id":"t1","type":"function","function":{"name":"Bash","arguments":"{\"command\":\"ls\"}"}}]}
{"role":"tool","content":"x","tool_call_id":"t1"}
{"role":"user","content":"Continue from where you left off."}
{"role":"user","content":"plain"}`
	if model != "claude" || string(params) != `{"max_tokens":8,"model":"claude"}` || joinRaw(msgs) != want {
		t.Fatalf("model %q params %s messages\n%s", model, params, joinRaw(msgs))
	}
	// Claude Code sends a message as one text block, then as a string,
	// and moves cache_control: one message either way.
	a, _ := messagesRequest(nil, json.RawMessage(`[{"role":"system","content":[{"type":"text","text":"env","cache_control":{"type":"ephemeral"}}]},{"role":"user","content":[{"type":"image","source":{},"cache_control":{}}]}]`))
	b, _ := messagesRequest(nil, json.RawMessage(`[{"role":"system","content":"env"},{"role":"user","content":[{"type":"image","source":{}}]}]`))
	if joinRaw(a) != joinRaw(b) {
		t.Errorf("renderings differ:\n%s\n%s", joinRaw(a), joinRaw(b))
	}
}

// A Responses request's instructions, items and the model's run of items
// (reasoning, message, function calls) made one assistant message.
func TestResponsesRequest(t *testing.T) {
	body := `{"model":"gpt","instructions":"be brief","input":[
		{"type":"message","role":"developer","content":[{"type":"input_text","text":"base"}]},
		{"role":"user","content":"hi"},
		{"type":"reasoning","summary":[{"type":"summary_text","text":"think"}],"encrypted_content":"zz"},
		{"type":"message","role":"assistant","content":[{"type":"output_text","text":"sure"}]},
		{"type":"function_call","call_id":"c1","name":"exec","arguments":"{}"},
		{"type":"function_call","call_id":"c2","name":"exec","arguments":"{\"a\":1}"},
		{"type":"function_call_output","call_id":"c1","output":"one"},
		{"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"two"}]},
		{"type":"compaction","encrypted_content":"q"}],"store":false}`
	_, params, msgs, err := splitAPI(APIResponses, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"role":"system","content":"be brief"}
{"role":"developer","content":[{"type":"text","text":"base"}]}
{"role":"user","content":"hi"}
{"role":"assistant","content":"sure","reasoning_content":"think","tool_calls":[{"id":"c1","type":"function","function":{"name":"exec","arguments":"{}"}},{"id":"c2","type":"function","function":{"name":"exec","arguments":"{\"a\":1}"}}]}
{"role":"tool","content":"one","tool_call_id":"c1"}
{"role":"tool","content":[{"type":"text","text":"two"}],"tool_call_id":"c2"}
{"type":"compaction","encrypted_content":"q"}`
	if string(params) != `{"model":"gpt","store":false}` || joinRaw(msgs) != want {
		t.Fatalf("params %s messages\n%s", params, joinRaw(msgs))
	}
	if _, _, msgs, _ := splitAPI(APIResponses, []byte(`{"input":"just this"}`)); joinRaw(msgs) != `{"role":"user","content":"just this"}` {
		t.Errorf("a string input: %s", joinRaw(msgs))
	}
	for _, bad := range []string{`{"input":5}`, `[1]`, `null`, `{"messages":{}}`} {
		api := APIResponses
		if strings.Contains(bad, "messages") {
			api = APIMessages
		}
		if _, _, _, err := splitAPI(api, []byte(bad)); err == nil {
			t.Errorf("%s split", bad)
		}
	}
}

// A reply's message normalizes as the message the harness sends back: the
// lineage's test (normalize).
func TestNativeReplyEchoes(t *testing.T) {
	cases := []struct {
		api          API
		stream       bool
		reply, echo  string
		finish       string
		finishedLate bool // finished only at the last event
	}{
		{APIMessages, true, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"model\":\"m\",\"usage\":{\"input_tokens\":4}}}\n\n" +
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hm\"}}\n\n" +
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"ok\"}}\n\n" +
			"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t1\",\"name\":\"Bash\",\"input\":{}}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"command\\\": \\\"ls\\\"}\"}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":9}}\n\n",
			`{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"x"},{"type":"text","text":"ok"},{"type":"tool_use","id":"t1","name":"Bash","input":{"command":"ls"}}]}`, "tool_use", true},
		{APIMessages, false, `{"type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"done"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}`,
			`{"role":"assistant","content":"done"}`, "end_turn", false},
		{APIResponses, true, "event: response.output_item.done\ndata: {\"type\":\"response.output_item.done\",\"item\":{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"exec\",\"arguments\":\"{\\\"cmd\\\":\\\"ls\\\"}\"}}\n\n" +
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\"}}\n\n",
			`{"type":"function_call","status":"completed","id":"fc_1","name":"exec","arguments":"{\"cmd\": \"ls\"}","call_id":"c1"}`, "completed", true},
		{APIResponses, false, `{"object":"response","status":"completed","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"fine"}]}]}`,
			`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"fine"}]}`, "completed", false},
	}
	for i, c := range cases {
		a := NewAPIAssembler(c.api, c.stream)
		lines := strings.SplitAfter(c.reply, "\n")
		for k, l := range lines {
			a.Write([]byte(l))
			if c.stream && a.Finished() && k < len(lines)-3 {
				t.Errorf("case %d: finished early, at line %d", i, k)
			}
		}
		if c.stream && !a.Finished() {
			t.Errorf("case %d: not finished", i)
		}
		r := a.Reply(200)
		if r.Error != "" || r.FinishReason != c.finish || r.Tokens {
			t.Errorf("case %d: %+v", i, r)
		}
		var echo []json.RawMessage
		if c.api == APIMessages {
			echo, _ = messagesRequest(nil, json.RawMessage(`[`+c.echo+`]`))
		} else {
			echo, _ = responsesRequest(nil, json.RawMessage(`[`+c.echo+`]`))
		}
		if len(echo) != 1 || normalize(echo[0]) != normalize(r.Message) || normalize(r.Message) == "" {
			t.Errorf("case %d: reply %s, echoed %s", i, r.Message, joinRaw(echo))
		}
	}
	// A stream cut before its final event is no reply.
	a := NewAPIAssembler(APIResponses, true)
	a.Write([]byte("data: {\"type\":\"response.output_item.done\",\"item\":{\"type\":\"message\",\"role\":\"assistant\",\"content\":[]}}\n"))
	if r := a.Reply(200); r.Error == "" || a.Finished() {
		t.Errorf("a cut stream: %+v", r)
	}
}

// Whatever a request of a native API holds, splitting it does not panic,
// and what splits gives messages that are each JSON.
func FuzzSplitAPI(f *testing.F) {
	for _, s := range []string{`{"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"text"}]}]}]}`,
		`{"system":"s","messages":[{"role":"assistant","content":[{"type":"tool_use","input":null}]}]}`,
		`{"input":[{"type":"function_call"},{"role":"user","content":[1]}]}`, `{"input":"x","instructions":7}`, `{`, `null`} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, body []byte, messages bool) {
		api := APIResponses
		if messages {
			api = APIMessages
		}
		_, params, msgs, err := splitAPI(api, body)
		if err != nil {
			return
		}
		if !json.Valid(params) {
			t.Fatalf("params %q", params)
		}
		for _, m := range msgs {
			if !json.Valid(m) {
				t.Fatalf("message %q", m)
			}
		}
	})
}

// Whatever a native reply holds, assembling it does not panic, and its
// message is JSON.
func FuzzAssembleNative(f *testing.F) {
	f.Add([]byte("data: {\"type\":\"content_block_delta\",\"index\":3}\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"x\"}}\n"), true, true)
	f.Add([]byte(`{"type":"message","content":[{"type":"tool_use","input":"x"}]}`), false, true)
	f.Add([]byte("data: {\"type\":\"response.completed\",\"response\":{\"output\":[{\"type\":\"function_call\"}]}}\n"), true, false)
	f.Fuzz(func(t *testing.T, body []byte, stream, messages bool) {
		api := APIResponses
		if messages {
			api = APIMessages
		}
		a := NewAPIAssembler(api, stream)
		a.Write(body)
		a.Finished()
		if r := a.Reply(200); !json.Valid(r.Message) {
			t.Fatalf("message %q", r.Message)
		}
	})
}
