package trajectory

import (
	"encoding/json"
	"net/http"
	"testing"
)

// A request sent again and again (a harness retrying, a relay re-sending)
// keeps the index's lookups as short as for one: each send replaces the
// one before, and only the latest stays a candidate parent.
func TestIndexListsDoNotGrowWithARepeatedRequest(t *testing.T) {
	x := NewIndex()
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
	reply := Reply{Message: json.RawMessage(`{"role":"assistant","content":"hello"}`), FinishReason: "stop", Tokens: true,
		PromptIDs: []int{1, 2, 3}, CompletionIDs: []int{4, 5}, Logprobs: []float64{-0.1, -0.2}}
	const n = 200
	for i := range n {
		if _, err := x.Add(Exchange{Episode: "e", Launch: "l", N: i + 1, Method: http.MethodPost, Path: "/v1/chat/completions",
			Body: body, Status: 200, Reply: reply}); err != nil {
			t.Fatal(err)
		}
	}
	for k, l := range x.byMsgs {
		if len(l) != 1 {
			t.Errorf("byMsgs[%x] holds %d calls, want the latest", k, len(l))
		}
	}
	for k, l := range x.byChain {
		if len(l) != 1 {
			t.Errorf("byChain[%x] holds %d calls, want the latest", k, len(l))
		}
	}
	rep := Check(x.Calls())
	if rep.Replaced != n-1 || rep.Duplicates != 0 || !rep.OK() {
		t.Fatalf("check %+v: want %d replaced, the rest clean", rep, n-1)
	}
	// The next turn continues the latest send.
	next := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"more"}]}`)
	c, err := x.Add(Exchange{Episode: "e", Launch: "l", N: n + 1, Method: http.MethodPost, Path: "/v1/chat/completions", Body: next, Status: 200,
		Reply: Reply{Message: json.RawMessage(`{"role":"assistant","content":"ok"}`), FinishReason: "stop", Tokens: true,
			PromptIDs: []int{1, 2, 3, 4, 5, 6, 7}, CompletionIDs: []int{8}, Logprobs: []float64{-0.3}}})
	if err != nil {
		t.Fatal(err)
	}
	if c.Parent != "e.l.200" || c.Link != LinkResolved {
		t.Fatalf("the next turn's parent %q (%s), want e.l.200, resolved", c.Parent, c.Link)
	}
}

// A call whose messages continue a later call than its token ids do (the
// harness sent a reply back otherwise than the model wrote it) is that
// later call's child by a token break: not a second child of the call the
// ids reach, which would count a branch.
func TestMessagesDeeperThanTokensIsATokenBreak(t *testing.T) {
	x := NewIndex()
	add := func(n int, msgs string, prompt, completion []int, reply string) *Call {
		t.Helper()
		c, err := x.Add(Exchange{Episode: "e", Launch: "l", N: n, Method: http.MethodPost, Path: "/v1/chat/completions",
			Body: []byte(`{"model":"m","messages":[` + msgs + `]}`), Status: 200,
			Reply: Reply{Message: json.RawMessage(reply), FinishReason: "stop", Tokens: true, PromptIDs: prompt, CompletionIDs: completion,
				Logprobs: make([]float64, len(completion))}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	u := `{"role":"user","content":"go"}`
	a1 := `{"role":"assistant","content":"one"}`
	b1 := `{"role":"assistant","content":"two"}`
	tool := `{"role":"user","content":"next"}`
	add(1, u, []int{1, 2}, []int{3}, a1)
	b := add(2, u+","+a1+","+tool, []int{1, 2, 3, 4}, []int{5, 6}, b1)
	c := add(3, u+","+a1+","+tool+","+b1+","+tool, []int{1, 2, 3, 4, 5, 99, 7}, []int{8}, a1)
	if b.Parent != "e.l.1" || b.Link != LinkResolved {
		t.Fatalf("call 2: parent %q (%s)", b.Parent, b.Link)
	}
	if c.Parent != "e.l.2" || c.Link != LinkTokenBreak {
		t.Fatalf("call 3: parent %q (%s: %s), want e.l.2 by a token break", c.Parent, c.Link, c.LinkWhy)
	}
	if rep := Check(x.Calls()); rep.Branches != 0 || rep.TokenBreaks != 1 {
		t.Fatalf("check %+v: want no branch, one token break", rep)
	}
}
