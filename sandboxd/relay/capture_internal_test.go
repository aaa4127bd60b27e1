package relay

import (
	"encoding/json"
	"reflect"
	"testing"
)

// strip drops the token ids and nulls the logprobs the harness did not ask
// for, wherever they are, and nothing else: not a string that spells them,
// not a member of another name.
func TestStrip(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		a        asked
	}{
		{`{"a":1,"token_ids":[1,2],"b":2}`, `{"a":1,"b":2}`, asked{}},
		{`{"token_ids":[1]}`, `{}`, asked{}},
		{`{"a":1, "token_ids" : [1] }`, `{"a":1 }`, asked{}},
		{`{"prompt_token_ids":[1],"choices":[{"index":0,"delta":{"content":"\"token_ids\":[9]"},"token_ids":[3],"logprobs":{"content":[{"token":"x","logprob":-1}]}}]}`,
			`{"choices":[{"index":0,"delta":{"content":"\"token_ids\":[9]"},"logprobs":null}]}`, asked{}},
		{`{"choices":[{"token_ids":[3],"logprobs":{"content":[]}}]}`, `{"choices":[{"token_ids":[3],"logprobs":null}]}`, asked{ids: true}},
		{`{"choices":[{"token_ids":[3],"logprobs":{"content":[]}}]}`, `{"choices":[{"logprobs":{"content":[]}}]}`, asked{logprobs: true}},
		{`{"content":"token_ids","x":"a\\"b"}`, `{"content":"token_ids","x":"a\\"b"}`, asked{}},
		{`{"broken":`, `{"broken":`, asked{}},
	} {
		got := string(strip([]byte(tc.in), tc.a))
		if got != tc.want {
			t.Errorf("strip(%s, %+v)\n got %s\nwant %s", tc.in, tc.a, got, tc.want)
		}
		if json.Valid([]byte(tc.in)) && !json.Valid([]byte(got)) {
			t.Errorf("strip(%s) is not JSON: %s", tc.in, got)
		}
	}
}

// augment adds the fields in front of a body that has none of them, and
// sets them in one that has some, keeping what the harness asked.
func TestAugment(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want map[string]any
		a    asked
	}{
		{`{"model":"m","messages":[]}`, map[string]any{"model": "m", "messages": []any{}, "return_token_ids": true, "logprobs": true, "top_logprobs": 0.0}, asked{}},
		{` { } `, map[string]any{"return_token_ids": true, "logprobs": true, "top_logprobs": 0.0}, asked{}},
		{`{"logprobs":true,"top_logprobs":3}`, map[string]any{"return_token_ids": true, "logprobs": true, "top_logprobs": 3.0}, asked{logprobs: true}},
		{`{"messages":[{"role":"user","content":"what are logprobs"}],"logprobs":false}`,
			map[string]any{"messages": []any{map[string]any{"role": "user", "content": "what are logprobs"}}, "return_token_ids": true, "logprobs": true, "top_logprobs": 0.0}, asked{}},
	} {
		out, a := augment([]byte(tc.in))
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil || !reflect.DeepEqual(got, tc.want) || a != tc.a {
			t.Errorf("augment(%s) = %s %+v, want %v %+v (%v)", tc.in, out, a, tc.want, tc.a, err)
		}
	}
	if out, _ := augment([]byte(`{"return_token_ids":true,"logprobs":true}`)); out != nil {
		t.Errorf("a body that asks for everything was changed: %s", out)
	}
	if out, _ := augment([]byte(`[1]`)); out != nil {
		t.Errorf("a body that is no object was changed: %s", out)
	}
}
