package trajectory_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

var script = modelserver.Script{"t": {
	{Content: "Let me look.", ToolCalls: []modelserver.ToolCall{modelserver.BashCall("c1", "ls -la")}},
	{ToolCalls: []modelserver.ToolCall{modelserver.Call("c2", "write", map[string]string{"path": "a.txt", "content": "hello, world"})}},
	{Content: "Done: a.txt says hello, world."},
}}

// server is a scripted model server for the tests.
func server(t *testing.T) (*modelserver.Server, string) {
	t.Helper()
	s := modelserver.New(script)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return s, srv.URL
}

// exchange sends a request the way a harness does (through no relay) and
// returns what a relay would capture of it.
func exchange(t *testing.T, url string, req map[string]any, episode, launch string) trajectory.Exchange {
	t.Helper()
	body, _ := json.Marshal(req)
	upstream := maps(req)
	if req["_tokens"] != false {
		upstream["return_token_ids"], upstream["logprobs"], upstream["top_logprobs"] = true, true, 0
	}
	delete(upstream, "_tokens")
	delete(req, "_tokens")
	body, _ = json.Marshal(req)
	ub, _ := json.Marshal(upstream)
	hr, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(ub))
	hr.Header.Set(modelserver.TaskHeader, "t")
	start := time.Now()
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	stream, _ := req["stream"].(bool)
	a := trajectory.NewAssembler(stream)
	if _, err := io.Copy(a, resp.Body); err != nil {
		t.Fatal(err)
	}
	return trajectory.Exchange{Episode: episode, Launch: launch, Method: http.MethodPost, Path: "/v1/chat/completions", Body: body,
		Status: resp.StatusCode, Reply: a.Reply(resp.StatusCode), Started: start, Duration: time.Since(start)}
}

func maps(m map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

func msg(role, content string) map[string]any {
	return map[string]any{"role": role, "content": content}
}

// conversation drives the script to its end the way a harness does:
// each reply sent back as it came, each tool call answered. It returns
// the exchanges and the final messages.
func conversation(t *testing.T, url string, stream bool, episode string) ([]trajectory.Exchange, []any) {
	t.Helper()
	msgs := []any{msg("system", "You are a coding agent."), msg("user", "Write a.txt.")}
	var out []trajectory.Exchange
	for range script["t"] {
		ex := exchange(t, url, map[string]any{"model": "m", "messages": slices.Clone(msgs), "stream": stream, "temperature": 1}, episode, "l1")
		if ex.Status != 200 || ex.Reply.Error != "" {
			t.Fatalf("call %d: %d %s", len(out)+1, ex.Status, ex.Reply.Error)
		}
		out = append(out, ex)
		var reply map[string]any
		_ = json.Unmarshal(ex.Reply.Message, &reply)
		msgs = append(msgs, reply)
		if calls, ok := reply["tool_calls"].([]any); ok {
			for _, c := range calls {
				msgs = append(msgs, map[string]any{"role": "tool", "tool_call_id": c.(map[string]any)["id"], "content": "ok"})
			}
		}
	}
	return out, msgs
}

// A stream and a plain reply assemble to the same message and tokens, the
// tokens the server's ledger holds.
func TestAssembleStreamAndPlain(t *testing.T) {
	s, url := server(t)
	plain, _ := conversation(t, url, false, "e1")
	streamed, _ := conversation(t, url, true, "e2")
	l := s.Ledger()
	for i := range plain {
		p, st := plain[i].Reply, streamed[i].Reply
		if !bytes.Equal(p.Message, st.Message) || p.FinishReason != st.FinishReason {
			t.Errorf("call %d: plain %s %s, streamed %s %s", i+1, p.Message, p.FinishReason, st.Message, st.FinishReason)
		}
		for _, r := range []trajectory.Reply{p, st} {
			if !r.Tokens || !slices.Equal(r.PromptIDs, l[i].PromptTokenIDs) || !slices.Equal(r.CompletionIDs, l[i].TokenIDs) || len(r.Logprobs) != len(r.CompletionIDs) {
				t.Errorf("call %d: tokens %v prompt %d ids, completion %v, %d logprobs; ledger %d and %v", i+1, r.Tokens, len(r.PromptIDs), r.CompletionIDs, len(r.Logprobs), len(l[i].PromptTokenIDs), l[i].TokenIDs)
			}
		}
	}
}

// What is no completion is kept as an error: a status other than 200, a
// chunk that is not JSON, a stream that ends with no finish and no
// [DONE]; a reply that names its tokens only as token_id:<n> has them.
func TestAssembleRefusals(t *testing.T) {
	a := trajectory.NewAssembler(false)
	a.Write([]byte(`{"error":{"message":"no script"}}`))
	if r := a.Reply(404); !strings.Contains(r.Error, "404") || !strings.Contains(r.Error, "no script") {
		t.Errorf("404: %+v", r)
	}
	a = trajectory.NewAssembler(true)
	a.Write([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {not json\n\n"))
	if r := a.Reply(200); !strings.Contains(r.Error, "not JSON") {
		t.Errorf("a broken chunk: %+v", r)
	}
	a = trajectory.NewAssembler(true)
	a.Write([]byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n"))
	if r := a.Reply(200); !strings.Contains(r.Error, "without a finish") {
		t.Errorf("a cut stream: %+v", r)
	}
	a = trajectory.NewAssembler(true)
	for _, l := range []string{
		`data: {"prompt_token_ids":[1,2],"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		`data: {"choices":[{"index":0,"delta":{"content":"hi"},"logprobs":{"content":[{"token":"token_id:300","logprob":-0.5}]}}]}`,
		`data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop","logprobs":{"content":[{"token":"token_id:5","logprob":0}]}}]}`,
		`data: [DONE]`,
	} {
		a.Write([]byte(l + "\n\n"))
	}
	r := a.Reply(200)
	if r.Error != "" || !r.Tokens || !slices.Equal(r.PromptIDs, []int{1, 2}) || !slices.Equal(r.CompletionIDs, []int{300, 5}) || !slices.Equal(r.Logprobs, []float64{-0.5, 0}) || !a.Done() {
		t.Errorf("token names: %+v", r)
	}
}

// Each call continues the one before: its parent is resolved by tokens,
// its request and prompt are stored as deltas, and a reader rebuilds every
// call whole. The merged chain is the last prompt and completion, with the
// model's tokens marked and their logprobs.
func TestLineageAndChain(t *testing.T) {
	s, url := server(t)
	exs, final := conversation(t, url, true, "e1")
	x := trajectory.NewIndex()
	var recs []*trajectory.Call
	for _, ex := range exs {
		c, err := x.Add(ex)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, c)
	}
	if recs[0].Link != trajectory.LinkRoot || recs[0].ID != "e1.l1.1" {
		t.Errorf("first call %s: %s %s", recs[0].ID, recs[0].Link, recs[0].LinkWhy)
	}
	for i, c := range recs[1:] {
		if c.Link != trajectory.LinkResolved || c.Parent != recs[i].ID || !c.Echo || c.Keep == 0 || c.Params != nil || c.PromptKeep == 0 {
			t.Errorf("call %s: link %s parent %s echo %v keep %d params %s prompt keep %d", c.ID, c.Link, c.Parent, c.Echo, c.Keep, c.Params, c.PromptKeep)
		}
	}
	calls := x.Calls()
	if r := trajectory.Check(calls); !r.OK() || r.Roots != 1 || r.TokenBreaks != 0 || r.Calls != 3 {
		t.Errorf("check: %s %v", r, r.Problems)
	}
	chains := trajectory.Chains(calls)
	if len(chains) != 1 {
		t.Fatalf("%d chains", len(chains))
	}
	ch, l := chains[0], s.Ledger()
	last := l[len(l)-1]
	if got := append(slices.Clone(ch.PromptIDs), ch.ResponseIDs...); !slices.Equal(got, append(slices.Clone(last.PromptTokenIDs), last.TokenIDs...)) {
		t.Errorf("the chain's ids are not the last prompt and completion")
	}
	if !slices.Equal(ch.PromptIDs, l[0].PromptTokenIDs) {
		t.Errorf("the chain's prompt is not the first call's")
	}
	model, lps := 0, 0
	for i, m := range ch.ResponseMask {
		model += m
		if m == 0 && ch.ResponseLogprobs[i] != 0 {
			t.Errorf("a token not the model's has logprob %v", ch.ResponseLogprobs[i])
		}
		if m == 1 {
			lps++
		}
	}
	if want := len(l[0].TokenIDs) + len(l[1].TokenIDs) + len(l[2].TokenIDs); model != want {
		t.Errorf("%d tokens marked the model's, want %d", model, want)
	}
	// Rebuilt from the records alone, each call is whole again.
	var file bytes.Buffer
	for _, c := range recs {
		b, _ := json.Marshal(c)
		file.Write(append(b, '\n'))
	}
	y, err := trajectory.Read(&file)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range y.Calls() {
		want := calls[i]
		if !slices.Equal(c.AllPromptIDs, want.AllPromptIDs) || len(c.AllMessages) != len(want.AllMessages) {
			t.Fatalf("call %s rebuilt: %d prompt ids %d messages, want %d and %d", c.ID, len(c.AllPromptIDs), len(c.AllMessages), len(want.AllPromptIDs), len(want.AllMessages))
		}
		for k := range c.AllMessages {
			if !sameJSON(c.AllMessages[k], want.AllMessages[k]) {
				t.Errorf("call %s message %d rebuilt %s, sent %s", c.ID, k, c.AllMessages[k], want.AllMessages[k])
			}
		}
	}
	if fm, _ := json.Marshal(final); len(y.Calls()[2].AllMessages) != len(final)-1 {
		t.Errorf("the last call has %d messages; the conversation %s", len(y.Calls()[2].AllMessages), fm)
	}
}

func sameJSON(a, b []byte) bool {
	var x, y any
	_ = json.Unmarshal(a, &x)
	_ = json.Unmarshal(b, &y)
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return bytes.Equal(xb, yb)
}

// A capture file grows with the conversation: a long conversation's file
// is within 1.3 times its final messages and token arrays.
func TestStorageGrowsWithTheConversation(t *testing.T) {
	turns := make([]modelserver.Turn, 40)
	for i := range turns {
		turns[i] = modelserver.Turn{ToolCalls: []modelserver.ToolCall{modelserver.BashCall(fmt.Sprintf("c%d", i), "cat part"+strings.Repeat("x", i)+".txt")}}
	}
	turns = append(turns, modelserver.Turn{Content: "done"})
	s := modelserver.New(modelserver.Script{"t": turns})
	srv := httptest.NewServer(s)
	defer srv.Close()
	path := filepath.Join(t.TempDir(), trajectory.FileName)
	rec, err := trajectory.OpenRecorder(path)
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	msgs := []any{msg("system", strings.Repeat("You are a careful agent. ", 40)), msg("user", "Read every part.")}
	tools := []any{map[string]any{"type": "function", "function": map[string]any{"name": "bash", "description": strings.Repeat("Runs a command. ", 50)}}}
	for range turns {
		ex := exchange(t, srv.URL, map[string]any{"model": "m", "messages": slices.Clone(msgs), "stream": true, "tools": tools}, "e1", "l1")
		if _, err := rec.Record(ex); err != nil {
			t.Fatal(err)
		}
		var reply map[string]any
		_ = json.Unmarshal(ex.Reply.Message, &reply)
		msgs = append(msgs, reply)
		if calls, ok := reply["tool_calls"].([]any); ok {
			msgs = append(msgs, map[string]any{"role": "tool", "tool_call_id": calls[0].(map[string]any)["id"], "content": strings.Repeat("line of output\n", 20)})
		}
	}
	st, _ := os.Stat(path)
	l := s.Ledger()
	last := l[len(l)-1]
	conv, _ := json.Marshal(map[string]any{"messages": msgs, "tools": tools})
	ids, _ := json.Marshal(append(slices.Clone(last.PromptTokenIDs), last.TokenIDs...))
	var lps []float64
	for _, e := range l {
		for i, id := range e.TokenIDs {
			lps = append(lps, modelserver.Logprob(id, i))
		}
	}
	lpb, _ := json.Marshal(lps)
	base := len(conv) + len(ids) + len(lpb)
	ratio := float64(st.Size()) / float64(base)
	t.Logf("%d calls: file %d bytes, conversation %d + ids %d + logprobs %d = %d: %.2fx", len(turns), st.Size(), len(conv), len(ids), len(lpb), base, ratio)
	if ratio > 1.3 {
		t.Errorf("the capture file is %.2f times the conversation and its token arrays, over 1.3", ratio)
	}
	// ConversationBytes counts it from the file alone, with the arrays a
	// trainer reads (a mask, and a logprob per response id, 0 for the
	// tokens the model did not generate): more than the ledger's count,
	// and the file within 1.3 times it too.
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	x, err := trajectory.Read(f)
	if err != nil {
		t.Fatal(err)
	}
	calls := x.Calls()
	got := trajectory.ConversationBytes(calls, trajectory.Chains(calls))
	if got < int64(base) || float64(st.Size()) > 1.3*float64(got) {
		t.Errorf("ConversationBytes = %d: want at least %d, and at least the file's %d bytes over 1.3", got, base, st.Size())
	}
}

// A file read back is the same index; a last record cut short by a crash
// is cut off; a record that does not read is an error naming it.
func TestRecorderFile(t *testing.T) {
	_, url := server(t)
	exs, _ := conversation(t, url, false, "e1")
	path := filepath.Join(t.TempDir(), "s", trajectory.FileName)
	rec, err := trajectory.OpenRecorder(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, ex := range exs[:2] {
		if _, err := rec.Record(ex); err != nil {
			t.Fatal(err)
		}
	}
	rec.Close()
	whole, _ := os.ReadFile(path)
	// A crash mid-append: the third record half written.
	third, _ := json.Marshal(map[string]any{"v": 1, "id": "e1.l1.3"})
	os.WriteFile(path, append(slices.Clone(whole), third[:10]...), 0o600)
	rec, err = trajectory.OpenRecorder(path)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Len() != 2 {
		t.Fatalf("reopened with %d calls, want 2", rec.Len())
	}
	c, err := rec.Record(exs[2])
	if err != nil || c.ID != "e1.l1.3" || c.Parent != "e1.l1.2" || c.Link != trajectory.LinkResolved {
		t.Fatalf("the call after a reopen: %+v %v", c, err)
	}
	rec.Close()
	if b, _ := os.ReadFile(path); bytes.Count(b, []byte("\n")) != 3 || !bytes.HasPrefix(b, whole) {
		t.Fatalf("the file after the torn record was cut and one appended:\n%s", b)
	}
	for _, tc := range []struct {
		name, line, want string
	}{
		{"not JSON", "{oops", "record 2"},
		{"another version", `{"v":4,"id":"e1.l1.2"}`, "version 4"},
		{"a first call that continues the call before it", `{"v":3,"id":"e1.l2.1","link":"resolved"}`, "without a parent"},
		{"a parent left out before version 3", `{"v":2,"id":"e1.l1.2","link":"resolved"}`, "without a parent"},
		{"a path-like id", `{"v":2,"id":"../x.l1.1","link":"root"}`, "episode"},
		{"an id of one part", `{"v":2,"id":"e1","link":"root"}`, "not <episode>"},
		{"an unknown field", `{"v":1,"id":"e1.l1.2","surprise":1}`, "surprise"},
		{"a path-like id (version 1)", `{"v":1,"id":"../x.l1.1","episode":"..","launch":"l1","link":"root"}`, "episode"},
		{"a parent not before it", `{"v":1,"id":"e1.l1.2","episode":"e1","launch":"l1","link":"resolved","parent":"e1.l1.9"}`, "parent e1.l1.9"},
		{"an id not its own", `{"v":1,"id":"e1.l2.2","episode":"e1","launch":"l1","link":"root"}`, "not <episode>"},
		{"a duplicate id", `{"v":1,"id":"e1.l1.1","episode":"e1","launch":"l1","link":"root"}`, "twice"},
	} {
		first := bytes.SplitAfter(whole, []byte("\n"))[0]
		_, err := trajectory.Read(bytes.NewReader(append(slices.Clone(first), tc.line+"\n"...)))
		if !errors.Is(err, trajectory.ErrBadCall) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrBadCall naming %q", tc.name, err, tc.want)
		}
	}
}

// Records are made durable by the recorder's own fsync, a batch at a time
// within SyncDelay, and at once by Flush: what a checkpoint's hold waits
// for.
func TestRecorderSyncs(t *testing.T) {
	_, url := server(t)
	exs, _ := conversation(t, url, false, "e1")
	rec, err := trajectory.OpenRecorder(filepath.Join(t.TempDir(), trajectory.FileName))
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Close()
	for _, ex := range exs[:2] {
		if _, err := rec.Record(ex); err != nil {
			t.Fatal(err)
		}
	}
	if err := rec.Flush(); err != nil || !rec.Durable() {
		t.Fatalf("after Flush: durable %v, %v", rec.Durable(), err)
	}
	if _, err := rec.Record(exs[2]); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 10*time.Second, "the last record made durable without a Flush", rec.Durable)
}

// A record leaves out what its id and the defaults say (the episode, the
// launch, POST and /v1/chat/completions), and reads back with them;
// records of versions 1 and 2, which wrote them, still read.
func TestRecordLeavesOutWhatItsIDSays(t *testing.T) {
	_, url := server(t)
	exs, _ := conversation(t, url, false, "e1")
	path := filepath.Join(t.TempDir(), trajectory.FileName)
	rec, err := trajectory.OpenRecorder(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rec.Record(exs[0]); err != nil {
		t.Fatal(err)
	}
	rec.Close()
	b, _ := os.ReadFile(path)
	for _, field := range []string{`"episode"`, `"launch"`, `"method"`, `"path"`} {
		if bytes.Contains(b, []byte(field)) {
			t.Errorf("the record writes %s:\n%s", field, b)
		}
	}
	v1 := `{"v":1,"id":"e1.l1.x2.1","episode":"e1","launch":"l1.x2","link":"root","method":"POST","path":"/v1/completions","keep":0,"messages":[],"status":200,"started":"2026-12-06T00:00:00Z","first_byte_ms":0,"duration_ms":1}`
	for _, tc := range []struct{ name, file string }{{"version 3", string(b)}, {"version 1", v1 + "\n"}} {
		x, err := trajectory.Read(strings.NewReader(tc.file))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		c := x.Calls()[0].Call
		want := [4]string{"e1", "l1", "POST", "/v1/chat/completions"}
		if tc.name == "version 1" {
			want = [4]string{"e1", "l1.x2", "POST", "/v1/completions"}
		}
		if got := [4]string{c.Episode, c.Launch, c.Method, c.Path}; got != want {
			t.Errorf("%s reads as episode, launch, method, path %q, want %q", tc.name, got, want)
		}
	}
	// Version 2 wrote a parent, the token flag and a usage always.
	v2 := `{"v":2,"id":"e1.l1.1","link":"root","keep":0,"messages":[],"status":200,"tokens":true,"prompt_ids":[1,2],"completion_ids":[3],"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3},"started":"2026-12-06T00:00:00Z","first_byte_ms":0,"duration_ms":1}
{"v":2,"id":"e1.l1.2","parent":"e1.l1.1","link":"resolved","keep":0,"messages":[],"status":200,"tokens":true,"prompt_keep":3,"prompt_ids":[4],"completion_ids":[5],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5},"started":"2026-12-06T00:00:00Z","first_byte_ms":0,"duration_ms":1}
`
	x, err := trajectory.Read(strings.NewReader(v2))
	if err != nil {
		t.Fatalf("version 2: %v", err)
	}
	if c := x.Calls()[1].Call; c.Parent != "e1.l1.1" || !c.Tokens || string(c.Usage) != `{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}` {
		t.Errorf("version 2 reads as parent %q, tokens %v, usage %s", c.Parent, c.Tokens, c.Usage)
	}
}

// The ID of a call whose episode holds a dot (a branch's) cannot be split
// back into its episode and launch: its record keeps them, and it reads
// back whole, its parent left out and restored as for any other.
func TestDottedEpisodeKeepsItsParts(t *testing.T) {
	_, url := server(t)
	exs, _ := conversation(t, url, false, "r1.b2-a1")
	path := filepath.Join(t.TempDir(), trajectory.FileName)
	rec, err := trajectory.OpenRecorder(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, ex := range exs[:2] {
		if _, err := rec.Record(ex); err != nil {
			t.Fatalf("record of a dotted episode's call: %v", err)
		}
	}
	rec.Close()
	b, _ := os.ReadFile(path)
	if !bytes.Contains(b, []byte(`"episode":"r1.b2-a1"`)) {
		t.Errorf("the record does not keep its dotted episode:\n%s", b)
	}
	x, err := trajectory.Read(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	calls := x.Calls()
	if len(calls) != 2 {
		t.Fatalf("%d calls read back, want 2", len(calls))
	}
	c := calls[1].Call
	if c.Episode != "r1.b2-a1" || c.Launch != exs[1].Launch || c.Parent != calls[0].Call.ID || c.Link != trajectory.LinkResolved {
		t.Errorf("read back as episode %q launch %q parent %q link %s; want r1.b2-a1, %q, %q, resolved",
			c.Episode, c.Launch, c.Parent, c.Link, exs[1].Launch, calls[0].Call.ID)
	}
}

// A harness that re-renders what the model said (here, its text) chains
// by messages only: a token break, counted. One that compacts its history
// starts a new root. A reply sent again before anything continued it (a
// snapshot held the call but not the harness's save of it) is replaced,
// not duplicated; a call sent again after its reply was continued is a
// duplicate.
func TestBreaksRootsReplacedAndDuplicates(t *testing.T) {
	_, url := server(t)
	exs, _ := conversation(t, url, false, "e1")
	x := trajectory.NewIndex()
	add := func(ex trajectory.Exchange) *trajectory.Call {
		t.Helper()
		c, err := x.Add(ex)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	c1 := add(exs[0])
	// The call of turn 2 sent twice: the first attempt's reply was never
	// continued.
	a := add(exs[1])
	b := add(exs[1])
	if a.Parent != c1.ID || b.Parent != c1.ID {
		t.Fatalf("parents %s and %s", a.Parent, b.Parent)
	}
	c3 := add(exs[2])
	if c3.Parent != b.ID {
		t.Errorf("turn 3 continues %s, want the re-sent %s", c3.Parent, b.ID)
	}
	r := trajectory.Check(x.Calls())
	if !r.OK() || r.Replaced != 1 {
		t.Errorf("a replaced call: %s %v", r, r.Problems)
	}
	// The first call again, after it was continued: a duplicate.
	add(exs[0])
	if r := trajectory.Check(x.Calls()); r.Duplicates != 1 || r.OK() {
		t.Errorf("a duplicate: %s", r)
	}

	// A token break: the harness re-rendered the model's text.
	y := trajectory.NewIndex()
	first := exs[0]
	y.Add(first)
	var req map[string]any
	_ = json.Unmarshal(exs[1].Body, &req)
	ms := req["messages"].([]any)
	ms[2].(map[string]any)["content"] = "Let me look!"
	req["_tokens"] = true
	re := exchange(t, url, req, "e1", "l1")
	c, _ := y.Add(re)
	if c.Link != trajectory.LinkRoot || !strings.Contains(c.LinkWhy, "compacted or rewritten") {
		// Neither the messages (the text differs) nor the ids the server
		// made of them chain: a new root, reported as a rewrite.
		t.Errorf("re-rendered text: %s %q", c.Link, c.LinkWhy)
	}
	// Re-spaced tool arguments chain by messages (they normalize) and by
	// tokens (the template renders arguments compact).
	z := trajectory.NewIndex()
	z.Add(first)
	_ = json.Unmarshal(exs[1].Body, &req)
	ms = req["messages"].([]any)
	tc := ms[2].(map[string]any)["tool_calls"].([]any)[0].(map[string]any)["function"].(map[string]any)
	tc["arguments"] = `{ "command": "ls -la" }`
	c, _ = z.Add(exchange(t, url, req, "e1", "l1"))
	if c.Link != trajectory.LinkResolved || c.Echo {
		t.Errorf("re-spaced arguments: %s %s echo %v", c.Link, c.LinkWhy, c.Echo)
	}
	// A token break proper: the messages chain but the ids the server was
	// sent (another system prompt's tokens, same messages) do not.
	w := trajectory.NewIndex()
	w.Add(first)
	brk := exs[1]
	brk.Reply.PromptIDs = append([]int{9}, brk.Reply.PromptIDs...)
	c, _ = w.Add(brk)
	if c.Link != trajectory.LinkTokenBreak || c.Parent != "e1.l1.1" {
		t.Errorf("a token break: %s %s", c.Link, c.LinkWhy)
	}
	if r := trajectory.Check(w.Calls()); r.TokenBreaks != 1 || !r.OK() {
		t.Errorf("check of a token break: %s", r)
	}
	// A compacted history: a new root.
	_ = json.Unmarshal(exs[2].Body, &req)
	req["messages"] = []any{msg("system", "You are a coding agent."), msg("user", "Summary: listed, wrote a.txt. Go on.")}
	c, _ = w.Add(exchange(t, url, req, "e1", "l1"))
	if c.Link != trajectory.LinkRoot || !strings.Contains(c.LinkWhy, "compacted or rewritten") {
		t.Errorf("a compacted history: %s %q", c.Link, c.LinkWhy)
	}
}

// A relaunch that asks again, rendered anew, a call whose reply its saved
// session lost replaces that call; two calls of one launch that continue
// one call are a branch.
func TestRelaunchReissueReplaces(t *testing.T) {
	_, url := server(t)
	exs, _ := conversation(t, url, false, "e1")
	var req map[string]any
	_ = json.Unmarshal(exs[1].Body, &req)
	req["temperature"] = 0.5 // another rendering of the same turn
	for _, tc := range []struct {
		episode, launch string
		replaced        bool
		tokens          bool // the relaunch's calls carry token ids
	}{
		{"e1-a1", "l2", true, true}, // the restored attempt's relaunch
		{"e1-a1", "l2", true, false},
		{"e1", "l2", true, true},  // a relaunch in the same attempt
		{"e1", "l1", false, true}, // the same launch: a branch
	} {
		x := trajectory.NewIndex()
		for _, ex := range exs[:2] {
			if _, err := x.Add(ex); err != nil {
				t.Fatal(err)
			}
		}
		again := maps(req)
		again["_tokens"] = tc.tokens
		c, err := x.Add(exchange(t, url, again, tc.episode, tc.launch))
		if err != nil {
			t.Fatal(err)
		}
		if c.Parent != "e1.l1.1" {
			t.Fatalf("%s.%s: the re-issue continues %q, want e1.l1.1", tc.episode, tc.launch, c.Parent)
		}
		if tc.replaced {
			// The relaunch goes on from its re-issue, rendered as the
			// re-issue was: the next call continues the re-issue, not the
			// call it replaced, though both chain the same prompt and
			// reply.
			reissue := c.ID
			var next map[string]any
			_ = json.Unmarshal(exs[2].Body, &next)
			next["temperature"], next["_tokens"] = 0.5, tc.tokens
			c, err = x.Add(exchange(t, url, next, tc.episode, tc.launch))
			if err != nil {
				t.Fatal(err)
			}
			if c.Link != trajectory.LinkResolved || c.Parent != reissue {
				t.Errorf("%s.%s tokens %v: the call after the re-issue: %s %q parent %q, want %s", tc.episode, tc.launch, tc.tokens, c.Link, c.LinkWhy, c.Parent, reissue)
			}
		}
		r := trajectory.Check(x.Calls())
		if tc.replaced && (!r.OK() || r.Replaced != 1 || r.Branches != 0) {
			t.Errorf("%s.%s: want e1.l1.2 replaced: %s %v", tc.episode, tc.launch, r, r.Problems)
		}
		if !tc.replaced && (r.OK() || r.Replaced != 0 || r.Branches != 1) {
			t.Errorf("%s.%s: want a branch: %s %v", tc.episode, tc.launch, r, r.Problems)
		}
	}
	// A call the relaunch re-issues after something continued it is no
	// replacement: the relaunch branches.
	x := trajectory.NewIndex()
	for _, ex := range exs {
		x.Add(ex)
	}
	again := maps(req)
	again["_tokens"] = true
	x.Add(exchange(t, url, again, "e1", "l2"))
	if r := trajectory.Check(x.Calls()); r.OK() || r.Replaced != 0 || r.Branches != 1 {
		t.Errorf("a re-issue of a continued call: want a branch: %s %v", r, r.Problems)
	}
}

// Two different requests that chain equally far make the next call's
// parent ambiguous: it is not attributed, and the rollout is masked.
func TestAmbiguousParentMasks(t *testing.T) {
	_, url := server(t)
	exs, _ := conversation(t, url, false, "e1")
	x := trajectory.NewIndex()
	x.Add(exs[0])
	var req map[string]any
	_ = json.Unmarshal(exs[0].Body, &req)
	req["temperature"] = 0.5 // another request, the same prompt and reply
	req["_tokens"] = true
	x.Add(exchange(t, url, req, "e1", "l1"))
	c, _ := x.Add(exs[1])
	if c.Link != trajectory.LinkAmbiguous || c.Parent != "" || !strings.Contains(c.LinkWhy, "e1.l1.1") {
		t.Fatalf("ambiguous: %s %q parent %q", c.Link, c.LinkWhy, c.Parent)
	}
	if r := trajectory.Check(x.Calls()); r.Masked != 1 || r.OK() || r.MaskedWhy == "" {
		t.Errorf("check: %s", r)
	}
}

// Call ids refuse what is not an id.
func TestCallID(t *testing.T) {
	if id, err := trajectory.CallID("ep-1", "l_2", 3); err != nil || id != "ep-1.l_2.3" {
		t.Errorf("%q %v", id, err)
	}
	// A relaunch's id names the launch it replaces.
	if id, err := trajectory.CallID("ep-1", "l2.x1", 1); err != nil || id != "ep-1.l2.x1.1" {
		t.Errorf("%q %v", id, err)
	}
	// A rollout id may hold dots (a branch's, r1.b2).
	if id, err := trajectory.CallID("r1.b2-a1", "r1.b2-a1.l1", 4); err != nil || id != "r1.b2-a1.r1.b2-a1.l1.4" {
		t.Errorf("%q %v", id, err)
	}
	for _, bad := range [][2]string{{"../e", "l"}, {"e..x", "l"}, {".e", "l"}, {"e.", "l"}, {"e", "a/b"}, {"", "l"},
		{strings.Repeat("x", 129), "l"}, {"e", strings.Repeat("x", 129)}, {"e", ".l"}, {"e", "l."}, {"e", "l..x"}, {"e", ".."}, {"e", ""}} {
		if _, err := trajectory.CallID(bad[0], bad[1], 1); !errors.Is(err, trajectory.ErrBadCall) {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if _, err := trajectory.CallID("e", "l", 0); err == nil {
		t.Error("call 0 accepted")
	}
}
