package trajectory

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// decodePayloadStd is how chunk decoded a payload before decodePayload:
// the oracle decodePayload is held to.
func decodePayloadStd(data []byte, p *payload) error { return json.Unmarshal(data, p) }

// chunkStd is chunk as it was before decodePayload (encoding/json decodes
// the payload and a message's content), kept to hold chunk to and to
// measure it against.
func (a *Assembler) chunkStd(data []byte) {
	var p payload
	if err := decodePayloadStd(data, &p); err != nil {
		a.fail(fmt.Sprintf("a chunk that is not JSON: %v", err))
		return
	}
	if len(p.Error) > 0 && string(p.Error) != "null" {
		a.fail("the upstream sent an error: " + string(p.Error))
	}
	if p.Model != "" {
		a.model = p.Model
	}
	if len(p.Usage) > 0 && string(p.Usage) != "null" {
		a.usage = append(json.RawMessage(nil), p.Usage...)
	}
	if p.PromptTokenIDs != nil {
		a.prompt, a.hasPrompt = p.PromptTokenIDs, true
	}
	for _, c := range p.Choices {
		if c.Index != 0 {
			a.fail(fmt.Sprintf("choice %d: a capture keeps one choice", c.Index))
			continue
		}
		if c.PromptTokenIDs != nil {
			a.prompt, a.hasPrompt = c.PromptTokenIDs, true
		}
		if c.TokenIDs != nil {
			a.completion, a.hasIDs = append(a.completion, c.TokenIDs...), true
		}
		if c.Logprobs != nil {
			for _, t := range c.Logprobs.Content {
				a.logprobs = append(a.logprobs, t.Logprob)
				if id, ok := strings.CutPrefix(t.Token, "token_id:"); ok && a.lpNamed {
					if n, err := strconv.Atoi(id); err == nil {
						a.lpIDs = append(a.lpIDs, n)
						continue
					}
				}
				a.lpNamed = false
			}
		}
		if c.FinishReason != nil && *c.FinishReason != "" {
			a.finish = *c.FinishReason
		}
		d := c.Delta
		if d == nil {
			d = c.Message
		}
		if d != nil {
			a.deltaStd(d)
		}
	}
}

// deltaStd is delta as it was before decodePayload.
func (a *Assembler) deltaStd(d *delta) {
	if d.Role != "" && a.role.Len() == 0 {
		a.role.WriteString(d.Role)
	}
	var s string
	if json.Unmarshal(d.Content, &s) == nil {
		a.content.WriteString(s)
	}
	if d.ReasoningContent != nil {
		a.reasoning.WriteString(*d.ReasoningContent)
	} else if d.Reasoning != nil {
		a.reasoning.WriteString(*d.Reasoning)
	}
	for k, tc := range d.ToolCalls {
		i := k
		if tc.Index != nil {
			i = *tc.Index
		}
		if i < 0 || i > 1024 {
			a.fail(fmt.Sprintf("tool call index %d", i))
			continue
		}
		for len(a.calls) <= i {
			a.calls = append(a.calls, &toolCall{})
		}
		c := a.calls[i]
		if tc.ID != "" {
			c.id = tc.ID
		}
		if tc.Type != "" {
			c.typ = tc.Type
		}
		if tc.Function.Name != "" {
			c.name += tc.Function.Name
		}
		c.args.WriteString(tc.Function.Arguments)
	}
}

// The bodies BenchmarkRelay's model server sends when asked for tokens: a
// plain reply, and a stream chunk after the first.
var (
	benchPlain = `{"prompt_token_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24],"id":"c1","object":"chat.completion",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"` + strings.Repeat("x", 200) + `"},"finish_reason":"stop",` +
		`"token_ids":[` + strings.TrimSuffix(strings.Repeat("300,", 16), ",") + `],"logprobs":{"content":[` +
		strings.TrimSuffix(strings.Repeat(`{"token":"x","logprob":-0.5,"bytes":[120],"top_logprobs":[]},`, 16), ",") + `]}}]}`
	benchChunk = `{"choices":[{"index":0,"delta":{"content":"tok"},"finish_reason":null,"token_ids":[300],` +
		`"logprobs":{"content":[{"token":"tok","logprob":-0.25,"bytes":[116,111,107],"top_logprobs":[]}]}}]}`
)

// payloadSeeds are replies and stream chunks as vLLM and SGLang send them,
// and the corners of encoding/json's decoding decodePayload must match.
var payloadSeeds = []string{
	benchPlain,
	benchChunk,
	// vLLM, a plain reply with everything.
	`{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"Qwen/Qwen3-8B","choices":[{"index":0,` +
		`"message":{"role":"assistant","content":"Hello!","refusal":null,"annotations":null,"audio":null,"function_call":null,"tool_calls":[],"reasoning_content":"think"},` +
		`"logprobs":{"content":[{"token":"token_id:9707","logprob":-0.01,"bytes":[72,101],"top_logprobs":[{"token":"token_id:1","logprob":-5.5,"bytes":null}]},{"token":"token_id:0","logprob":0}]},` +
		`"finish_reason":"stop","stop_reason":null,"token_ids":[9707,0]}],"service_tier":null,"system_fingerprint":null,` +
		`"usage":{"prompt_tokens":10,"total_tokens":11,"completion_tokens":1,"prompt_tokens_details":null},"prompt_logprobs":null,"prompt_token_ids":[1,2,3],"kv_transfer_params":null}`,
	`{"id":"chatcmpl-2","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[` +
		`{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}},{"id":"call_2","type":"function","function":{"name":"now","arguments":"{}"}}]},` +
		`"logprobs":null,"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":5,"completion_tokens":9,"total_tokens":14}}`,
	// vLLM, a stream.
	`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[1,2]}`,
	`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" world"},"logprobs":null,"finish_reason":null,"token_ids":[1917]}]}`,
	`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]},"finish_reason":null}]}`,
	`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": \"Par"}}]},"finish_reason":null}]}`,
	`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"name":"x","arguments":"is\"}"}}]},"finish_reason":null}]}`,
	`{"choices":[{"index":0,"delta":{},"finish_reason":"stop","stop_reason":null,"token_ids":[]}]}`,
	`{"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"length","stop_reason":null}]}`,
	`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}`,
	`{"choices":[{"index":0,"delta":{"reasoning_content":"hmm, "},"finish_reason":null}]}`,
	`{"choices":[{"index":0,"delta":{"reasoning":"hmm","reasoning_content":null},"finish_reason":null}]}`,
	// SGLang: the prompt's ids per choice.
	`{"id":"x","object":"chat.completion","created":1,"model":"default","choices":[{"index":0,"message":{"role":"assistant","content":"hi","reasoning_content":null,"tool_calls":null},` +
		`"logprobs":null,"finish_reason":"stop","matched_stop":151645,"prompt_token_ids":[1,2,3],"token_ids":[4,5]}],"usage":{"prompt_tokens":3,"total_tokens":5,"completion_tokens":2,"prompt_tokens_details":null}}`,
	// Errors.
	`{"object":"error","message":"The model does not exist.","type":"NotFoundError","param":null,"code":404}`,
	`{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":400}}`,
	`{"error":null,"model":"m"}`,
	`{"error":"boom","usage":null}`,
	`{"choices":[{"index":1,"delta":{"content":"x"}}]}`,
	`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":null,"id":"a"},{"index":-1},{"index":2000}]}}]}`,
	// Strings.
	`{"model":"caf\u00e9","choices":[{"index":0,"delta":{"content":"caf\u00e9 \ud83d\ude00 \ud800 x \udc00\ud800\udc00 \ud800\u0041 \"q\" \\ \/ \b\f\n\r\t \u0000"},"finish_reason":null}]}`,
	"{\"model\":\"café 😀 \xff\xfe \xe2\x82 \xed\xa0\x80 \xef\xbf\xbd\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\xc3(\\n\xe2\x82\xac\"}}]}",
	`{"choices":[{"index":0,"message":{"content":[{"type":"text","text":"hi"}]}},{"index":0,"delta":{"content":null}},{"index":0,"delta":{"content":5}}]}`,
	// Keys: given twice, in another case, escaped.
	`{"model":"a","model":"b","model":null}`,
	`{"choices":[{"index":0,"message":{"role":"a","content":"x"}}],"choices":[{"finish_reason":"stop"}]}`,
	`{"choices":[{"index":0},{"index":0,"token_ids":[7]}],"choices":[{}],"choices":[null,null,{"delta":{}}]}`,
	`{"prompt_token_ids":[1,2,3],"prompt_token_ids":[4],"prompt_token_ids":[5,null,null]}`,
	`{"prompt_token_ids":[1],"prompt_token_ids":[]}`,
	`{"prompt_token_ids":[1],"prompt_token_ids":null}`,
	`{"choices":[{"index":0,"message":{"role":"a"},"message":{"content":"c"},"logprobs":{"content":[{"token":"a"}]},"logprobs":{}}]}`,
	`{"Model":"m","CHOICES":[{"Index":0,"Delta":{"Content":"x","ROLE":"r"},"Finish_Reason":"stop"}],"Usage":{}}`,
	"{\"choices\":[{\"to\u212aen_ids\":[1],\"finiſh_reason\":\"stop\",\"\u0130ndex\":1,\"ındex\":2}]}",
	`{"\u006dodel":"esc","\u0063hoices":[{"inde\u0078":0,"to\u212Aen_ids":[3]}],"mod\u00e9l":"no"}`,
	// Numbers.
	`{"choices":[{"index":1e0}]}`,
	`{"choices":[{"index":1.0}]}`,
	`{"choices":[{"index":-0}]}`,
	`{"prompt_token_ids":[9223372036854775807,-9223372036854775808,0,-1]}`,
	`{"prompt_token_ids":[9223372036854775808]}`,
	`{"prompt_token_ids":[-9223372036854775809]}`,
	`{"choices":[{"index":0,"logprobs":{"content":[{"token":"t","logprob":1e2},{"logprob":-0.5},{"logprob":1E-400},{"logprob":-0}]}}]}`,
	`{"choices":[{"index":0,"logprobs":{"content":[{"logprob":1e400}]}}]}`,
	`{"choices":[{"index":0,"logprobs":{"content":[{"logprob":null,"token":null}]}}],"prompt_token_ids":[null,1]}`,
	`{"choices":[null,{"index":0,"logprobs":null,"delta":null,"message":null,"finish_reason":null}]}`,
	// Kinds that are not the field's.
	`{"model":5}`,
	`{"model":true}`,
	`{"choices":{}}`,
	`{"prompt_token_ids":"x"}`,
	`{"prompt_token_ids":[[1]]}`,
	`{"choices":[{"index":"0"}]}`,
	`{"choices":[{"finish_reason":true}]}`,
	`{"choices":[{"logprobs":[]}]}`,
	`{"choices":[{"delta":{"tool_calls":[{"function":"f"}]}}]}`,
	`{"choices":[{"delta":{"tool_calls":[{"function":null,"index":1}]}}]}`,
	// Not JSON, or not an object.
	``, ` `, `{oops`, `{"model":"m"} x`, `{"a":[1,2,]}`, `{"a":01}`, "{\"a\":\"\x01\"}", `{"a":"\q"}`, `{"a":"\u12"}`,
	`{"a":tru}`, `[`, ` null `, `nul`, `"str"`, `[]`, `5`, `true`, `{"a":1,}`, `{,}`, `{"a" 1}`, `{"a":-}`, `{"a":1.}`, `{"a":1e}`, `{"a":.5}`,
	`{"usage":{"a":[{"b":null}],"c":-1.5e+3},"error":"boom"}`,
	" \t\r\n{ \"model\" : \"m\" , \"choices\" : [ ] } \n",
}

// decodePayload takes arrays and objects nested as deep as encoding/json
// does, and fails past that as it does: where it skips a value, takes one
// raw, and decodes one.
func TestDecodePayloadDepth(t *testing.T) {
	nest := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	for _, n := range []int{9998, 9999, 10000} {
		for _, body := range []string{
			`{"x":` + nest(n) + `}`,
			`{"usage":` + nest(n) + `}`,
			`{"choices":[{"index":0,"delta":{"content":` + nest(n-3) + `}}]}`,
			`{"choices":[{"index":0,"logprobs":{"content":[{"top_logprobs":` + nest(n-5) + `}]}}]}`,
		} {
			var want, got payload
			errStd, errOwn := decodePayloadStd([]byte(body), &want), decodePayload([]byte(body), &got)
			if (errStd == nil) != (errOwn == nil) || !reflect.DeepEqual(want, got) {
				t.Errorf("%d deep, %.40s…: json.Unmarshal: %v; decodePayload: %v", n, body, errStd, errOwn)
			}
		}
	}
}

// FuzzDecodePayload holds decodePayload to json.Unmarshal: the same error
// or not and, without one, the same payload; and chunk to chunkStd, what
// it was: the same reply from the same chunks. Only the text of a "not
// JSON" error may differ.
func FuzzDecodePayload(f *testing.F) {
	for _, s := range payloadSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var want, got payload
		errStd := decodePayloadStd(data, &want)
		errOwn := decodePayload(data, &got)
		if (errStd == nil) != (errOwn == nil) {
			t.Fatalf("%q:\njson.Unmarshal: %v\ndecodePayload:  %v", data, errStd, errOwn)
		}
		if errStd == nil && !reflect.DeepEqual(want, got) {
			t.Fatalf("%q:\njson.Unmarshal: %s\ndecodePayload:  %s", data, dumpPayload(want), dumpPayload(got))
		}
		std, own := NewAssembler(true), NewAssembler(true)
		for range 2 {
			std.chunkStd(data)
			own.chunk(data)
		}
		rs, ro := std.Reply(200), own.Reply(200)
		const notJSON = "a chunk that is not JSON: "
		if strings.HasPrefix(rs.Error, notJSON) && strings.HasPrefix(ro.Error, notJSON) {
			rs.Error, ro.Error = notJSON, notJSON
		}
		if !reflect.DeepEqual(rs, ro) {
			t.Fatalf("%q:\nchunkStd: %+v\nchunk:    %+v", data, rs, ro)
		}
	})
}

// dumpPayload shows a payload with what its pointers point to.
func dumpPayload(p payload) string {
	b, err := json.Marshal(p)
	if err != nil {
		return fmt.Sprintf("%+v", p)
	}
	return string(b)
}

// BenchmarkAssemblerChunk measures chunk on the bodies BenchmarkRelay's
// model server sends when asked for tokens (a plain reply, 1.3 KB, and a
// stream chunk), decoding with encoding/json (std) and with
// decodePayload (own).
//
//	go test -run '^$' -bench AssemblerChunk -benchtime 20000x ./sandboxd/trajectory/
func BenchmarkAssemblerChunk(b *testing.B) {
	for _, shape := range []struct {
		name   string
		stream bool
		body   []byte
	}{{"plain", false, []byte(benchPlain)}, {"stream", true, []byte(benchChunk)}} {
		for _, dec := range []struct {
			name  string
			chunk func(*Assembler, []byte)
		}{{"std", (*Assembler).chunkStd}, {"own", (*Assembler).chunk}} {
			b.Run(shape.name+"/"+dec.name, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(shape.body)))
				for b.Loop() {
					a := NewAssembler(shape.stream)
					dec.chunk(a, shape.body)
					if a.err != "" {
						b.Fatal(a.err)
					}
				}
			})
		}
	}
}

// careIn finds each byte plain says needs care, wherever it is in a word:
// scanString's eight bytes at a time miss none.
func TestCareIn(t *testing.T) {
	for c := range 256 {
		for pos := range 8 {
			for k, fill := range []byte{'a', 0xc3} {
				high := uint64(0x8080808080808080)
				if k == 1 {
					high = 0
				}
				w := make([]byte, 8)
				for j := range w {
					w[j] = fill
				}
				w[pos] = byte(c)
				got := careIn(binary.LittleEndian.Uint64(w), high) != 0
				if want := !plain[k][c] || k == 0 && fill >= 0x80; got != want {
					t.Errorf("careIn(%q, %#x) = %v, want %v", w, high, got, want)
				}
			}
		}
	}
}
