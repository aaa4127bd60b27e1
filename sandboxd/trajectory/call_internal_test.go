package trajectory

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"testing"
	"time"
)

// A record's encoder writes what json.Marshal writes: byte for byte where
// nothing needs an HTML escape, and the same values where something does;
// and it refuses what json.Marshal refuses.
func TestAppendJSONIsMarshal(t *testing.T) {
	full := Call{V: Version, ID: "e1.l1.2", Episode: "e1", Launch: "l1", Parent: "e1.l1.1", Link: LinkTokenBreak, LinkWhy: "why \"quoted\"\n",
		Method: "POST", Path: "/v1/chat/completions", Model: "m", Params: json.RawMessage(`{ "temperature" : 1 }`), Keep: 3, Echo: true,
		Messages: []json.RawMessage{json.RawMessage(`{"role":"tool","content":"ok"}`), json.RawMessage(`{"role":"user","content":"é ☃ \u0001"}`)},
		Status:   200, Reply: json.RawMessage(`{"role":"assistant","content":"done"}`), FinishReason: "stop", Usage: json.RawMessage(`{"total_tokens":9}`),
		PolicyVersion: "v7", Tokens: true, PromptKeep: 12, PromptIDs: []int{1, 2, 300000}, CompletionIDs: []int{4, 0},
		Logprobs: []float64{-0.25, 0, -1e-7, -3.5e22, -123.456}, Started: time.Date(2026, 12, 6, 1, 2, 3, 456789, time.UTC),
		FirstByteMS: 0.001, DurationMS: 1234.5, Generation: 3, Resends: 1}
	cases := map[string]Call{
		"full":    full,
		"empty":   {},
		"failed":  {V: Version, ID: "e1.l1.1", Episode: "e1", Launch: "l1", Link: LinkRoot, Method: "POST", Path: "/p", Messages: []json.RawMessage{}, Status: 500, Error: "status 500"},
		"html":    {ID: "a<b>&c", Messages: []json.RawMessage{json.RawMessage(`{"content":"<b>&amp;</b>"}`)}},
		"invalid": {ID: "bad utf-8 \xff here"},
	}
	for name, c := range cases {
		want, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.appendJSON(nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if name != "html" && !bytes.Equal(got, want) {
			t.Errorf("%s:\n got %s\nwant %s", name, got, want)
		}
		var g, w any
		if err := json.Unmarshal(got, &g); err != nil {
			t.Fatalf("%s: %s does not decode: %v", name, got, err)
		}
		_ = json.Unmarshal(want, &w)
		if !reflect.DeepEqual(g, w) {
			t.Errorf("%s: decodes to %v, json.Marshal's to %v", name, g, w)
		}
	}
	for name, c := range map[string]Call{
		"infinite logprob": {Logprobs: []float64{math.Inf(-1)}},
		"NaN duration":     {DurationMS: math.NaN()},
		"raw not JSON":     {Reply: json.RawMessage(`{"a":`)},
		"message not JSON": {Messages: []json.RawMessage{json.RawMessage(`nope`)}},
	} {
		if _, err := json.Marshal(c); err == nil {
			t.Fatalf("%s: json.Marshal takes it", name)
		}
		if _, err := c.appendJSON(nil); err == nil {
			t.Errorf("%s: appendJSON takes what json.Marshal refuses", name)
		}
	}
}
