package trajectory

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// A record leaves out what the rest of it says, and fill puts back
// exactly the call that was recorded; what it cannot tell stays written.
func TestRecordLeavesOutOnlyWhatFillRestores(t *testing.T) {
	started := time.Date(2026, 12, 6, 7, 0, 0, 0, time.UTC)
	base := func(id string) Call {
		return Call{V: Version, ID: id, Episode: "e1", Launch: "l2.x1", Method: DefaultMethod, Path: DefaultPath,
			Model: "m", Messages: []json.RawMessage{json.RawMessage(`{"role":"user","content":"hi"}`)}, Status: 200,
			Reply: json.RawMessage(`{"role":"assistant","content":"ok"}`), Started: started}
	}
	withTokens := func(c Call, usage string) Call {
		c.Tokens, c.PromptKeep, c.PromptIDs, c.CompletionIDs, c.Logprobs = true, 4, []int{7, 8}, []int{9}, []float64{-0.5}
		if usage != "" {
			c.Usage = json.RawMessage(usage)
		}
		return c
	}
	resolved := func(c Call, parent string) Call {
		c.Link, c.Parent, c.Keep, c.Echo = LinkResolved, parent, 1, true
		return c
	}
	for _, tc := range []struct {
		name    string
		c       Call
		left    []string // fields the record leaves out
		written []string // fields it must keep
	}{
		{"a root without tokens", func() Call {
			c := base("e1.l2.x1.1")
			c.Link = LinkRoot
			c.Usage = json.RawMessage(`{"prompt_tokens":3}`)
			return c
		}(),
			[]string{`"episode"`, `"launch"`, `"method"`, `"path"`, `"parent"`, `"tokens"`}, []string{`"usage":{"prompt_tokens":3}`}},
		{"the call before it as parent, a usage that counts the ids", withTokens(resolved(base("e1.l2.x1.3"), "e1.l2.x1.2"), `{"completion_tokens":1,"prompt_tokens":6,"total_tokens":7}`),
			[]string{`"parent"`, `"tokens"`, `"usage"`}, []string{`"prompt_keep":4`}},
		{"a parent of another launch", withTokens(resolved(base("e1.l2.x1.1"), "e1.l1.5"), `{"prompt_tokens":6,"completion_tokens":1,"total_tokens":7}`),
			[]string{`"tokens"`, `"usage"`}, []string{`"parent":"e1.l1.5"`}},
		{"a parent further back", withTokens(resolved(base("e1.l2.x1.9"), "e1.l2.x1.7"), ""),
			[]string{`"tokens"`}, []string{`"parent":"e1.l2.x1.7"`, `"usage":null`}},
		{"a usage that says more than the ids", withTokens(resolved(base("e1.l2.x1.2"), "e1.l2.x1.1"), `{"prompt_tokens":6,"completion_tokens":1,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":4}}`),
			[]string{`"parent"`, `"tokens"`}, []string{`"cached_tokens":4`}},
		{"a usage that counts otherwise", withTokens(resolved(base("e1.l2.x1.2"), "e1.l2.x1.1"), `{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}`),
			[]string{`"parent"`, `"tokens"`}, []string{`"prompt_tokens":5`}},
		{"a token break", func() Call {
			c := withTokens(resolved(base("e1.l2.x1.2"), "e1.l2.x1.1"), "")
			c.Link = LinkTokenBreak
			return c
		}(),
			[]string{`"parent"`, `"tokens"`}, []string{`"link":"token_break"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := tc.c.record()
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range tc.left {
				if strings.Contains(string(b), f) {
					t.Errorf("the record keeps %s: %s", f, b)
				}
			}
			for _, f := range tc.written {
				if !strings.Contains(string(b), f) {
					t.Errorf("the record leaves out %s: %s", f, b)
				}
			}
			var got Call
			dec := json.NewDecoder(strings.NewReader(string(b)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&got); err != nil {
				t.Fatal(err)
			}
			if err := got.fill(); err != nil {
				t.Fatal(err)
			}
			if err := got.check(); err != nil {
				t.Fatal(err)
			}
			want := tc.c
			if want.Usage != nil && got.Usage != nil && sameUsage(want.Usage, got.Usage) {
				want.Usage = got.Usage // restored in one order of its three fields
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("read back\n%+v\nwant\n%+v\n(record %s)", got, want, b)
			}
		})
	}
}
