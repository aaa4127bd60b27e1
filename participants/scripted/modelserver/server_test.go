package modelserver_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

var script = modelserver.Script{
	"t1": {
		{ToolCalls: []modelserver.ToolCall{func() modelserver.ToolCall {
			var tc modelserver.ToolCall
			tc.ID, tc.Type = "call-1", "function"
			tc.Function.Name, tc.Function.Arguments = "bash", `{"command":"echo hi > a.txt"}`
			return tc
		}()}},
		{Content: "done: wrote a.txt"},
	},
}

func post(t *testing.T, url, task string, msgs []modelserver.Message, stream bool) *http.Response {
	t.Helper()
	b, _ := json.Marshal(modelserver.Request{Model: "m", Messages: msgs, Stream: stream})
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(b))
	req.Header.Set(modelserver.TaskHeader, task)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func user(s string) modelserver.Message {
	b, _ := json.Marshal(s)
	return modelserver.Message{Role: "user", Content: b}
}

// The reply is the turn the conversation is at; a repeated request shows in
// the ledger; an unknown task is refused.
func TestRepliesFollowTheConversation(t *testing.T) {
	s := modelserver.New(script)
	srv := httptest.NewServer(s)
	defer srv.Close()
	msgs := []modelserver.Message{user("write a.txt")}
	var out struct {
		Choices []struct {
			FinishReason string `json:"finish_reason"`
			Message      struct {
				Content   string                 `json:"content"`
				ToolCalls []modelserver.ToolCall `json:"tool_calls"`
			} `json:"message"`
		} `json:"choices"`
	}
	_ = json.NewDecoder(post(t, srv.URL, "t1", msgs, false).Body).Decode(&out)
	if out.Choices[0].FinishReason != "tool_calls" || out.Choices[0].Message.ToolCalls[0].Function.Name != "bash" {
		t.Fatalf("turn 0: %+v", out)
	}
	msgs = append(msgs, modelserver.Message{Role: "assistant", ToolCalls: json.RawMessage(`[{"id":"call-1"}]`)},
		modelserver.Message{Role: "tool", ToolCallID: "call-1", Content: json.RawMessage(`"ok"`)})
	_ = json.NewDecoder(post(t, srv.URL, "t1", msgs, false).Body).Decode(&out)
	if out.Choices[0].Message.Content != "done: wrote a.txt" {
		t.Fatalf("turn 1: %+v", out)
	}
	if r := s.Repeats(); len(r) != 0 {
		t.Fatalf("repeats %v", r)
	}
	post(t, srv.URL, "t1", msgs, false) // the last call again: its reply may not have been saved
	if r := s.Repeats(); len(r) != 0 {
		t.Fatalf("a call sent again before its reply was saved counts as a repeat: %v", r)
	}
	post(t, srv.URL, "t1", msgs[:1], false) // the first call again, after the conversation moved on
	if r := s.Repeats(); len(r["t1"]) != 1 {
		t.Fatalf("a repeated call is not in the ledger: %v", r)
	}
	for _, e := range s.Ledger() {
		if e.UserTurns != 1 {
			t.Errorf("ledger entry %+v has %d user turns", e, e.UserTurns)
		}
	}
	if resp := post(t, srv.URL, "nope", msgs, false); resp.StatusCode != http.StatusNotFound {
		t.Errorf("unknown task: %d", resp.StatusCode)
	}
}

// Streaming: the content arrives in chunks and ends with [DONE]; a cut
// stream stops early without it.
func TestStreamAndCut(t *testing.T) {
	s := modelserver.New(script)
	srv := httptest.NewServer(s)
	defer srv.Close()
	msgs := []modelserver.Message{user("x"), {Role: "assistant", Content: json.RawMessage(`""`)}}
	read := func(resp *http.Response) (text string, done bool) {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			line := strings.TrimPrefix(sc.Text(), "data: ")
			if line == "[DONE]" {
				done = true
				continue
			}
			var c struct {
				Choices []struct {
					Delta struct{ Content string } `json:"delta"`
				} `json:"choices"`
			}
			if json.Unmarshal([]byte(line), &c) == nil && len(c.Choices) > 0 {
				text += c.Choices[0].Delta.Content
			}
		}
		return text, done
	}
	if text, done := read(post(t, srv.URL, "t1", msgs, true)); text != "done: wrote a.txt" || !done {
		t.Fatalf("stream: %q done %v", text, done)
	}
	s.CutNext(1)
	if text, done := read(post(t, srv.URL, "t1", msgs, true)); done || text == "done: wrote a.txt" {
		t.Fatalf("cut stream: %q done %v", text, done)
	}
}

// A held reply waits until Release.
func TestHold(t *testing.T) {
	s := modelserver.New(script)
	srv := httptest.NewServer(s)
	defer srv.Close()
	s.Hold()
	got := make(chan *http.Response, 1)
	go func() {
		b, _ := json.Marshal(modelserver.Request{Model: "m", Messages: []modelserver.Message{user("x")}})
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", bytes.NewReader(b))
		req.Header.Set(modelserver.TaskHeader, "t1")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			got <- resp
		}
		close(got)
	}()
	poll.Wait(t, 5*time.Second, "the reply to be held", func() bool {
		select {
		case <-got:
			t.Fatal("a held reply was answered")
		default:
		}
		return s.Held() == 1
	})
	s.Release()
	select {
	case resp := <-got:
		if resp == nil || resp.StatusCode != 200 {
			t.Fatalf("after release: %v", resp)
		}
		resp.Body.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("not released")
	}
}

// postAsync posts msgs for task and sends the reply's status on the
// channel returned (0 when the request failed), for a reply that may be
// held.
func postAsync(url, task string, msgs []modelserver.Message) <-chan int {
	got := make(chan int, 1)
	go func() {
		b, _ := json.Marshal(modelserver.Request{Model: "m", Messages: msgs})
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(b))
		req.Header.Set(modelserver.TaskHeader, task)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			got <- 0
			return
		}
		resp.Body.Close()
		got <- resp.StatusCode
	}()
	return got
}

// HoldFrom holds the replies of its turn and later ones only: an earlier
// turn is answered at once, the later one waits until Release.
func TestHoldFrom(t *testing.T) {
	s := modelserver.New(script)
	srv := httptest.NewServer(s)
	defer srv.Close()
	s.HoldFrom(1)
	if resp := post(t, srv.URL, "t1", []modelserver.Message{user("x")}, false); resp.StatusCode != 200 {
		t.Fatalf("turn 0 under HoldFrom(1): %s", resp.Status)
	}
	if s.Held() != 0 {
		t.Fatalf("turn 0 was held")
	}
	calls, _ := json.Marshal(script["t1"][0].ToolCalls)
	turn1 := []modelserver.Message{user("x"), {Role: "assistant", ToolCalls: calls}, {Role: "tool", ToolCallID: "call-1", Content: json.RawMessage(`"ok"`)}}
	got := postAsync(srv.URL, "t1", turn1)
	poll.Wait(t, 5*time.Second, "turn 1 to be held", func() bool {
		select {
		case <-got:
			t.Fatal("turn 1 was answered under HoldFrom(1)")
		default:
		}
		return s.Held() == 1
	})
	s.Release()
	if code := <-got; code != 200 {
		t.Fatalf("turn 1 after the release: %d", code)
	}
}

// HoldLast holds each task's last turn but lets the first spare tasks to
// get there through: an earlier turn is answered at once, the first task's
// last turn too, the second's waits until Release.
func TestHoldLast(t *testing.T) {
	s := modelserver.New(modelserver.Script{"t1": script["t1"], "t2": script["t1"]})
	srv := httptest.NewServer(s)
	defer srv.Close()
	s.HoldLast(1)
	calls, _ := json.Marshal(script["t1"][0].ToolCalls)
	last := []modelserver.Message{user("x"), {Role: "assistant", ToolCalls: calls}, {Role: "tool", ToolCallID: "call-1", Content: json.RawMessage(`"ok"`)}}
	if resp := post(t, srv.URL, "t2", []modelserver.Message{user("x")}, false); resp.StatusCode != 200 {
		t.Fatalf("t2's turn 0 under HoldLast(1): %s", resp.Status)
	}
	if resp := post(t, srv.URL, "t1", last, false); resp.StatusCode != 200 {
		t.Fatalf("t1's last turn, the first there, under HoldLast(1): %s", resp.Status)
	}
	if s.Held() != 0 {
		t.Fatal("a reply HoldLast(1) lets through was held")
	}
	got := postAsync(srv.URL, "t2", last)
	poll.Wait(t, 5*time.Second, "t2's last turn to be held", func() bool {
		select {
		case <-got:
			t.Fatal("t2's last turn was answered under HoldLast(1)")
		default:
		}
		return s.Held() == 1
	})
	// The task let through is let through again (a harness that retries).
	if resp := post(t, srv.URL, "t1", last, false); resp.StatusCode != 200 {
		t.Fatalf("t1's last turn again: %s", resp.Status)
	}
	s.Release()
	if code := <-got; code != 200 {
		t.Fatalf("t2's last turn after the release: %d", code)
	}
}
