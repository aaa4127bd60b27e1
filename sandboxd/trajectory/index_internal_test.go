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

// Codex resumed after a restore re-asks a call whose record the snapshot
// held but whose reply its saved session did not: the same input (the
// relay's edit took out its empty user message), the same prompt and
// reply ids, but other client_metadata (a new turn id, a cold resume).
// The re-issue replaces the earlier call, and the relaunch's next call
// continues the re-issue: no ambiguous parent.
func TestCodexResumeReissueThenContinues(t *testing.T) {
	const (
		sys  = `"instructions":"You are Codex.",`
		tool = `"tools":[{"type":"function","name":"exec_command","parameters":{"type":"object"}}],"stream":true,"store":false`
		user = `{"type":"message","role":"user","content":[{"type":"input_text","text":"fix the test"}]}`
		fc1  = `{"type":"function_call","name":"exec_command","arguments":"{\"cmd\":\"ls\"}","call_id":"call_1"},{"type":"function_call_output","call_id":"call_1","output":"a.go"}`
		fc2  = `{"type":"function_call","name":"exec_command","arguments":"{\"cmd\":\"go test\"}","call_id":"call_2"},{"type":"function_call_output","call_id":"call_2","output":"ok"}`
	)
	meta := func(turn, init string) string {
		return `"client_metadata":{"session_id":"s1","turn_id":"` + turn + `","x-codex-turn-metadata":"{\"history_initialization\":\"` + init + `\"}"},`
	}
	body := func(m string, items ...string) []byte {
		in := ""
		for i, it := range items {
			if i > 0 {
				in += ","
			}
			in += it
		}
		return []byte(`{"model":"scripted",` + sys + m + `"input":[` + in + `],` + tool + `}`)
	}
	call := func(id, cmd string) json.RawMessage {
		return json.RawMessage(`{"role":"assistant","content":null,"tool_calls":[{"id":"` + id + `","type":"function","function":{"name":"exec_command","arguments":"{\"cmd\":\"` + cmd + `\"}"}}]}`)
	}
	reply := func(msg json.RawMessage, prompt, completion []int) Reply {
		return Reply{Message: msg, FinishReason: "tool_calls", Tokens: true, PromptIDs: prompt, CompletionIDs: completion, Logprobs: make([]float64, len(completion))}
	}
	p1, c1 := []int{1, 2, 3, 4}, []int{5, 6}
	p2, c2 := []int{1, 2, 3, 4, 5, 6, 7, 8}, []int{9, 10}
	p3, c3 := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, []int{13}
	first, resumed := meta("t1", "new"), meta("t2", "cold_resume")
	x := NewIndex()
	for _, ex := range []Exchange{
		{Episode: "cx", Launch: "l1", Body: body(first, user), Reply: reply(call("call_1", "ls"), p1, c1)},
		{Episode: "cx", Launch: "l1", Body: body(first, user, fc1), Reply: reply(call("call_2", "go test"), p2, c2)},
		// The restored attempt's relaunch: turn 2 again, its metadata new.
		{Episode: "cx-a1", Launch: "l2", Body: body(resumed, user, fc1), Reply: reply(call("call_2", "go test"), p2, c2)},
		{Episode: "cx-a1", Launch: "l2", Body: body(resumed, user, fc1, fc2), Reply: reply(json.RawMessage(`{"role":"assistant","content":"done"}`), p3, c3)},
	} {
		ex.Method, ex.Path, ex.Status, ex.Via = http.MethodPost, "/v1/responses", 200, APIChat
		if ex.Launch == "l2" {
			ex.Edits = []Edit{{Name: "codex-empty-user-turn", Removed: []json.RawMessage{json.RawMessage(`{"type":"message","role":"user","content":[{"type":"input_text","text":""}]}`)}}}
		}
		if _, err := x.Add(ex); err != nil {
			t.Fatal(err)
		}
	}
	calls := x.Calls()
	if calls[1].ReplacedBy != "cx-a1.l2.1" {
		t.Errorf("cx.l1.2 replaced by %q, want cx-a1.l2.1", calls[1].ReplacedBy)
	}
	if c := calls[3]; c.Link != LinkResolved || c.Parent != "cx-a1.l2.1" {
		t.Errorf("the relaunch's next call: %s %q parent %q, want cx-a1.l2.1", c.Link, c.LinkWhy, c.Parent)
	}
	if r := Check(calls); !r.OK() || r.Replaced != 1 {
		t.Errorf("check: %s %v", r, r.Problems)
	}
}
