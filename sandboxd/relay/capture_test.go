package relay_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
	"github.com/stillpoint/stillpoint/sandboxd/relay"
	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

var captureScript = modelserver.Script{"t": {
	{Content: "Listing.", ToolCalls: []modelserver.ToolCall{modelserver.BashCall("c1", "ls")}},
	{ToolCalls: []modelserver.ToolCall{modelserver.BashCall("c2", "cat a.txt")}},
	{Content: "a.txt is empty."},
}}

// model is a scripted model server that keeps the call id each request
// carried.
type model struct {
	*modelserver.Server
	URL string
	mu  sync.Mutex
	ids []string
}

func newModel(t *testing.T) *model {
	t.Helper()
	m := &model{Server: modelserver.New(captureScript)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		m.ids = append(m.ids, r.Header.Get(trajectory.IDHeader))
		m.mu.Unlock()
		r.Header.Set(modelserver.TaskHeader, "t")
		w.Header().Set(trajectory.PolicyHeader, "v7")
		m.Server.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	m.URL = srv.URL
	return m
}

func (m *model) callIDs() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.ids)
}

// captureRelay serves a relay that captures into path (with tokens) until
// the test ends, and then closes the recorder.
func captureRelay(t *testing.T, up, path string) (*relay.Relay, *trajectory.Recorder) {
	t.Helper()
	rec, err := trajectory.OpenRecorder(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Close() }) // after the relay's own cleanup
	return serveRelay(t, relay.Config{Upstream: up, Capture: rec, Tokens: true}), rec
}

// harness drives the script through url as a harness does, each reply
// sent back as it came; extra fields go in every request. It returns the
// raw reply bodies.
func harness(t *testing.T, url string, stream bool, extra map[string]any) []string {
	t.Helper()
	msgs := []any{map[string]any{"role": "user", "content": "look at a.txt"}}
	var bodies []string
	for range captureScript["t"] {
		req := map[string]any{"model": "m", "messages": msgs, "stream": stream}
		for k, v := range extra {
			req[k] = v
		}
		b, _ := json.Marshal(req)
		resp, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, raw)
		}
		bodies = append(bodies, string(raw))
		a := trajectory.NewAssembler(stream)
		a.Write(raw)
		var reply map[string]any
		_ = json.Unmarshal(a.Reply(200).Message, &reply)
		msgs = append(msgs, reply)
		if calls, ok := reply["tool_calls"].([]any); ok {
			msgs = append(msgs, map[string]any{"role": "tool", "tool_call_id": calls[0].(map[string]any)["id"], "content": "x"})
		}
	}
	return bodies
}

// Through a capturing relay, every call is recorded once with the token
// ids and logprobs the model server gave, linked to the one before, under
// the launch's label, and its id went upstream; the harness, which asked
// for no tokens, gets replies without them, streamed or not.
func TestCaptureRecordsEveryCall(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "stream"}[stream], func(t *testing.T) {
			m := newModel(t)
			path := filepath.Join(t.TempDir(), trajectory.FileName)
			r, rec := captureRelay(t, m.URL, path)
			if err := r.Label("r1-a1", "r1-a1.l1", nil); err != nil {
				t.Fatal(err)
			}
			bodies := harness(t, r.URL(), stream, nil)
			for _, b := range bodies {
				if strings.Contains(b, "token_ids") || strings.Contains(b, `"logprobs":{`) {
					t.Errorf("the harness got token fields it did not ask for: %s", b)
				}
			}
			calls := rec.Calls()
			l := m.Ledger()
			if len(calls) != 3 || len(l) != 3 {
				t.Fatalf("%d calls recorded, %d answered", len(calls), len(l))
			}
			for i, c := range calls {
				want := "r1-a1.l1." + string(rune('1'+i))
				if c.ID != want || !c.Tokens || c.PolicyVersion != "v7" || c.Status != 200 {
					t.Errorf("call %d: id %s tokens %v policy %q status %d", i, c.ID, c.Tokens, c.PolicyVersion, c.Status)
				}
				if !slices.Equal(c.AllPromptIDs, l[i].PromptTokenIDs) || !slices.Equal(c.CompletionIDs, l[i].TokenIDs) || len(c.Logprobs) != len(c.CompletionIDs) {
					t.Errorf("call %s: tokens are not the ledger's", c.ID)
				}
				if i > 0 && (c.Parent != calls[i-1].ID || c.Link != trajectory.LinkResolved) {
					t.Errorf("call %s: parent %s link %s", c.ID, c.Parent, c.Link)
				}
			}
			if ids := m.callIDs(); !slices.Equal(ids, []string{"r1-a1.l1.1", "r1-a1.l1.2", "r1-a1.l1.3"}) {
				t.Errorf("the upstream saw call ids %v", ids)
			}
			if rep := trajectory.Check(calls); !rep.OK() || rep.TokenBreaks != 0 {
				t.Errorf("check: %s %v", rep, rep.Problems)
			}
			st := r.Status()
			if st.Capture == nil || st.Capture.Recorded != 3 || st.Capture.Calls != 3 || st.Capture.Errors != 0 || st.Capture.Launch != "l1" {
				t.Errorf("capture status %+v", st.Capture)
			}
		})
	}
}

// A harness that asks for token ids and logprobs itself gets them as the
// model server gave them.
func TestCaptureKeepsWhatTheHarnessAsked(t *testing.T) {
	m := newModel(t)
	r, rec := captureRelay(t, m.URL, filepath.Join(t.TempDir(), trajectory.FileName))
	r.Label("e", "l", nil)
	bodies := harness(t, r.URL(), false, map[string]any{"return_token_ids": true, "logprobs": true})
	var got struct {
		PromptTokenIDs []int `json:"prompt_token_ids"`
		Choices        []struct {
			TokenIDs []int `json:"token_ids"`
			Logprobs struct {
				Content []any `json:"content"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	_ = json.Unmarshal([]byte(bodies[0]), &got)
	l := m.Ledger()
	if !slices.Equal(got.PromptTokenIDs, l[0].PromptTokenIDs) || !slices.Equal(got.Choices[0].TokenIDs, l[0].TokenIDs) || len(got.Choices[0].Logprobs.Content) != len(l[0].TokenIDs) {
		t.Errorf("the harness asked for tokens and got %s", bodies[0])
	}
	if rec.Len() != 3 {
		t.Errorf("%d calls recorded", rec.Len())
	}
}

// The end of a reply reaches the harness only after its record is in the
// file: when the harness reads a stream's finish, the call is recorded.
func TestCaptureRecordsBeforeTheHarnessHasTheReply(t *testing.T) {
	m := newModel(t)
	r, rec := captureRelay(t, m.URL, filepath.Join(t.TempDir(), trajectory.FileName))
	r.Label("e", "l", nil)
	m.SlowNext(20 * time.Millisecond)
	b, _ := json.Marshal(map[string]any{"model": "m", "stream": true, "messages": []any{map[string]any{"role": "user", "content": "x"}}})
	resp, err := http.Post(r.URL()+"/v1/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sawFinish := false
	for sc.Scan() {
		line := sc.Text()
		if strings.Contains(line, `"finish_reason":"`) {
			sawFinish = true
			if rec.Len() != 1 {
				t.Fatalf("the harness read the stream's finish before the call was recorded")
			}
		}
	}
	if !sawFinish {
		t.Fatal("no finish in the stream")
	}
}

// A call cut by a re-point (its model server gone) is sent again and
// recorded once, with the reply of the server that answered the re-send;
// a call with no label is forwarded but not recorded, and counted.
func TestCaptureRecordsACutCallOnce(t *testing.T) {
	gone := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ []byte) { <-r.Context().Done() })
	m := newModel(t)
	r, rec := captureRelay(t, gone.URL, filepath.Join(t.TempDir(), trajectory.FileName))
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": "x"}}})
	unlabeled := post(t, r, "/v1/chat/completions", string(b))
	<-gone.got
	r.Label("e", "l", nil)
	cut := post(t, r, "/v1/chat/completions", string(b))
	<-gone.got
	r.Hold()
	if _, err := r.Repoint(m.URL, 1); err != nil {
		t.Fatal(err)
	}
	r.Release()
	for _, ch := range []<-chan reply{unlabeled, cut} {
		if g := wait(t, ch); g.status != 200 {
			t.Fatalf("after the re-point: %+v", g)
		}
	}
	calls := rec.Calls()
	if len(calls) != 1 || calls[0].ID != "e.l.1" || calls[0].Resends != 1 || calls[0].Generation != 1 || !calls[0].Tokens {
		t.Fatalf("recorded %+v", calls)
	}
	if st := r.Status(); st.Capture.Unlabeled != 1 || st.Capture.Recorded != 1 {
		t.Errorf("capture status %+v", st.Capture)
	}
}

// A relay on a capture file that holds calls (a fork of a snapshot)
// numbers on from them and links its first call to theirs.
func TestCaptureContinuesTheFile(t *testing.T) {
	m := newModel(t)
	path := filepath.Join(t.TempDir(), trajectory.FileName)
	first, rec := captureRelay(t, m.URL, path)
	first.Label("e", "l", nil)
	msgs := []any{map[string]any{"role": "user", "content": "look at a.txt"}}
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	g := wait(t, post(t, first, "/v1/chat/completions", string(b)))
	rec.Close()
	var reply struct {
		Choices []struct {
			Message map[string]any `json:"message"`
		} `json:"choices"`
	}
	_ = json.Unmarshal([]byte(g.body), &reply)
	second, rec2 := captureRelay(t, m.URL, path)
	second.Label("e", "l", nil)
	msgs = append(msgs, reply.Choices[0].Message, map[string]any{"role": "tool", "tool_call_id": "c1", "content": "x"})
	b, _ = json.Marshal(map[string]any{"model": "m", "messages": msgs})
	wait(t, post(t, second, "/v1/chat/completions", string(b)))
	calls := rec2.Calls()
	if len(calls) != 2 || calls[1].ID != "e.l.2" || calls[1].Parent != "e.l.1" || calls[1].Link != trajectory.LinkResolved {
		t.Fatalf("after a reopen: %d calls, last %+v", len(calls), calls[len(calls)-1].Call)
	}
}

// Label refuses what cannot be part of a call id.
func TestCaptureLabel(t *testing.T) {
	m := newModel(t)
	r, _ := captureRelay(t, m.URL, filepath.Join(t.TempDir(), trajectory.FileName))
	for _, bad := range [][2]string{{"../x", "l1"}, {"e", "e.l/1"}, {"", "l"}} {
		if err := r.Label(bad[0], bad[1], nil); err == nil {
			t.Errorf("Label%q accepted", bad)
		}
	}
	if _, err := relay.New(relay.Config{Tokens: true}); err == nil {
		t.Error("Tokens without Capture accepted")
	}
}
