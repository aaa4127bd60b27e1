package trajectory

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// splitRequestStd is splitRequest as it was, with encoding/json: the
// oracle splitRequest is held to and measured against.
func splitRequestStd(body []byte) (model string, params json.RawMessage, msgs []json.RawMessage, err error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return "", nil, nil, fmt.Errorf("the request is not a JSON object: %w", err)
	}
	if m, ok := fields["messages"]; ok {
		if err := json.Unmarshal(m, &msgs); err != nil {
			return "", nil, nil, fmt.Errorf("the request's messages are not an array: %w", err)
		}
		delete(fields, "messages")
	}
	_ = json.Unmarshal(fields["model"], &model)
	params = marshalPlain(fields) // keys sorted: one form for equal fields
	for i, m := range msgs {
		var c bytes.Buffer
		if json.Compact(&c, m) == nil {
			msgs[i] = c.Bytes()
		}
	}
	return model, params, msgs, nil
}

// benchRequestSmall is a chat request of about 1 KB: a short system
// prompt, a user turn, an assistant's tool call and its result, as a
// harness sends them (compact, as httpx writes JSON).
var benchRequestSmall = `{"model":"Qwen/Qwen3-8B","messages":[` +
	`{"role":"system","content":"You are a coding agent working in a sandbox. Use the tools to read and edit files; answer briefly."},` +
	`{"role":"user","content":"The tests in pkg/parse fail since the last commit: find out why and fix it. Run go test ./pkg/parse/ when done."},` +
	`{"role":"assistant","content":null,"tool_calls":[{"id":"call_0","type":"function","function":{"name":"bash","arguments":"{\"command\":\"cd /repo && go test ./pkg/parse/ 2>&1 | head -40\"}"}}]},` +
	`{"role":"tool","tool_call_id":"call_0","content":"--- FAIL: TestParseQuoted (0.00s)\n    parse_test.go:41: Parse(\"a\\\\\"b\") = \"a\", want \"a\\\"b\"\nFAIL\nexit status 1\nFAIL\tgithub.com/x/y/pkg/parse\t0.003s"}],` +
	`"tools":[{"type":"function","function":{"name":"bash","description":"Run a command in bash; returns its output.","parameters":{"type":"object","properties":{"command":{"type":"string","description":"The command."}},"required":["command"]}}}],` +
	`"tool_choice":"auto","temperature":0.7,"top_p":0.95,"max_tokens":2048,"stream":true,"stream_options":{"include_usage":true},"logprobs":true,"return_token_ids":true}`

// benchRequestLarge is a chat request of about 20 KB: a long system
// prompt and a dozen tools with their JSON schemas, written as Python's
// json.dumps writes by default (", " and ": "): the white space is
// dropped.
var benchRequestLarge = func() string {
	var b strings.Builder
	b.WriteString(`{"model": "meta-llama/Llama-3.1-70B-Instruct", "messages": [{"role": "system", "content": "`)
	for i := range 100 {
		fmt.Fprintf(&b, "Rule %d: when a tool fails, read its error <stderr> & retry once with a fixed command; never guess a file's content. \\n", i)
	}
	b.WriteString(`"}, {"role": "user", "content": "Fix the failing build in \u00e9t\u00e9/ and explain the cause in one paragraph."}, ` +
		`{"role": "assistant", "content": "I will look at the build log first.", "tool_calls": [{"id": "call_1", "type": "function", ` +
		`"function": {"name": "read_file", "arguments": "{\"path\": \"build.log\"}"}}]}, ` +
		`{"role": "tool", "tool_call_id": "call_1", "content": "error: undefined: parseQuoted\n\tat pkg/parse/parse.go:12"}], "tools": [`)
	for i := range 12 {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, `{"type": "function", "function": {"name": "tool_%d", "description": "Tool %d reads or edits the sandbox's files; paths are relative to the repository's root and must not leave it.", `+
			`"parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "The file's path."}, `+
			`"start": {"type": "integer", "minimum": 1, "description": "The first line."}, "end": {"type": "integer", "minimum": 1}, `+
			`"mode": {"type": "string", "enum": ["read", "write", "append"]}, "content": {"type": ["string", "null"]}}, `+
			`"required": ["path", "mode"], "additionalProperties": false}}}`, i, i)
	}
	b.WriteString(`], "tool_choice": "auto", "parallel_tool_calls": false, "temperature": 0.0, "seed": 1234, "max_tokens": 4096, ` +
		`"stream": false, "logprobs": true, "top_logprobs": 0, "extra_body": {"return_token_ids": true, "skip_special_tokens": false}}`)
	return b.String()
}()

// splitRequestSeeds are request bodies FuzzSplitRequest starts from.
var splitRequestSeeds = []string{
	benchRequestSmall,
	benchRequestLarge,
	`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
	`{"messages":[{"role":"system","content":"be <brief> & exact"},{"role":"user","content":"a\u2028b\u2029c \u003c\u003e\u0026"}],"model":"m","stop":["</s>","<|im_end|>"]}`,
	`{ "model" : "m" , "messages" : [ { "role" : "user" , "content" : [ { "type" : "text" , "text" : "look" } , { "type" : "image_url" , "image_url" : { "url" : "data:image/png;base64,AAAA" } } ] } ] , "stream" : true }`,
	"{\"messages\":[\t{\"role\" :\r\n\"user\",\t\"content\":\"a\\tb\"}\r\n, [ 1 ,\t2 ]\r],\"stop\":\t[\r\n\"\\n\"\t]}",
	"\t\r\n{\n  \"model\": \"m\",\n  \"messages\": [\n    {\"role\": \"user\", \"content\": \"x\"}\n  ],\n  \"n\": 1\n}\n ",
	`{"model":"a","model":"b","messages":{"not":"an array"},"messages":[1,null,"s",true,{}]}`,
	`{"messages":[{"role":"user"}],"messages":null}`,
	`{"messages":null,"model":null}`,
	`{"messages":[],"model":7}`,
	`{"messages":"no"}`,
	`{"messages":{"role":"user"}}`,
	`{"mod\u0065l":"escaped name","m\u0065ssages":[{"a":1}],"model":"plain"}`,
	`{"\u0000":0,"\n\t\"\\/":1,"\u2028":2,"<&>":3,"\ud800":4,"\udc00\ud800x":5,"\u00e9":6,"é":7,"\u007f":8}`,
	"{\"bad utf8 \xff\xfe\":\"\xc3\x28\",\"model\":\"a\xffb\"}",
	`{"b":1,"a":2,"B":3,"A":4,"":5,"aa":6,"a":7}`,
	`{"temperature":1e-7,"top_p":-0.0,"max_tokens":1E+3,"logit_bias":{"50256":-100,"1":1.5}}`,
	`{"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","properties":{"a":{"type":"array","items":{"type":"number"}}}}}}}`,
	`{}`,
	` { } `,
	`null`,
	` null `,
	`[]`,
	`[{"model":"m"}]`,
	`"model"`,
	`42`,
	`true`,
	``,
	`{`,
	`{"model":"m",}`,
	`{"model":"m"} {}`,
	`{"model":"m","messages":[1,]}`,
	`{"messages":[{"role":"user","content":"x"}]`,
	`{"model":"m","messages":[{"role":"user","content":"\x"}]}`,
	`{"model":nul}`,
	`{"model":"m","messages":[] , "x" : [ [ ] , { } , "" , 0 ] }`,
	"\ufeff{}",
}

// splitRequest agrees with splitRequestStd on arrays and objects nested
// as deep as encoding/json takes and one deeper, in the messages and out.
func TestSplitRequestDepth(t *testing.T) {
	nest := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	for _, n := range []int{9998, 9999, 10000} {
		for _, body := range []string{
			`{"x":` + nest(n) + `}`,
			`{"messages":` + nest(n) + `}`,
			`{"messages":[{"content":` + nest(n-2) + `}]}`,
			`{"messages":{"a":` + nest(n-1) + `}}`,
			`{"model":` + nest(n) + `}`,
		} {
			checkSplitRequest(t, []byte(body))
		}
	}
}

// splitRequest gives slices of their own, each cut to its length: an
// append to one changes no other, and nothing aliases the body.
func TestSplitRequestOwnsItsSlices(t *testing.T) {
	body := []byte(benchRequestSmall)
	_, params, msgs, err := splitRequest(body)
	if err != nil {
		t.Fatal(err)
	}
	if cap(params) != len(params) {
		t.Errorf("params: cap %d, len %d", cap(params), len(params))
	}
	for k, m := range msgs {
		if cap(m) != len(m) {
			t.Errorf("message %d: cap %d, len %d", k, cap(m), len(m))
		}
	}
}

// checkSplitRequest fails t if splitRequest and splitRequestStd differ on
// body: in error or not (and which), model, params or messages, bytes
// and nil or not. splitRequest is given a copy, overwritten after: what
// it returns is its own.
func checkSplitRequest(t *testing.T, body []byte) {
	t.Helper()
	model, params, msgs, err := splitRequestStd(body)
	cp := bytes.Clone(body)
	gotModel, gotParams, gotMsgs, gotErr := splitRequest(cp)
	for k := range cp {
		cp[k] = '#'
	}
	if (err == nil) != (gotErr == nil) {
		t.Fatalf("%.200q:\nsplitRequestStd: %v\nsplitRequest:    %v", body, err, gotErr)
	}
	if err != nil {
		want, _, _ := strings.Cut(err.Error(), ":")
		if got, _, _ := strings.Cut(gotErr.Error(), ":"); got != want {
			t.Fatalf("%.200q:\nsplitRequestStd: %v\nsplitRequest:    %v", body, err, gotErr)
		}
		return
	}
	if model != gotModel {
		t.Fatalf("%.200q: model %q, want %q", body, gotModel, model)
	}
	if !bytes.Equal(params, gotParams) || (params == nil) != (gotParams == nil) {
		t.Fatalf("%.200q: params\n%q, want\n%q", body, gotParams, params)
	}
	if len(msgs) != len(gotMsgs) || (msgs == nil) != (gotMsgs == nil) {
		t.Fatalf("%.200q: %d messages (nil %v), want %d (nil %v)", body, len(gotMsgs), gotMsgs == nil, len(msgs), msgs == nil)
	}
	for k := range msgs {
		if !bytes.Equal(msgs[k], gotMsgs[k]) {
			t.Fatalf("%.200q: message %d\n%q, want\n%q", body, k, gotMsgs[k], msgs[k])
		}
	}
}

// FuzzSplitRequest holds splitRequest to splitRequestStd, what it was:
// the same error or not and, without one, the same model, params and
// messages, byte for byte. Only the text of an error past its prefix may
// differ.
func FuzzSplitRequest(f *testing.F) {
	for _, s := range splitRequestSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(checkSplitRequest)
}

// BenchmarkSplitRequest measures splitRequest on a 1 KB and a 20 KB chat
// request, with encoding/json as it was (std) and in one pass (own).
//
//	go test -run '^$' -bench SplitRequest -benchtime 2000x ./sandboxd/trajectory/
func BenchmarkSplitRequest(b *testing.B) {
	for _, size := range []struct {
		name string
		body []byte
	}{{"1KB", []byte(benchRequestSmall)}, {"20KB", []byte(benchRequestLarge)}} {
		for _, split := range []struct {
			name  string
			split func([]byte) (string, json.RawMessage, []json.RawMessage, error)
		}{{"std", splitRequestStd}, {"own", splitRequest}} {
			b.Run(size.name+"/"+split.name, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(size.body)))
				for b.Loop() {
					if _, _, _, err := split.split(size.body); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
