package modelserver_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// branchScript is a task whose second turn diverges by branch: b1 has its
// own, every other branch the "*" one, a request of no branch the turn
// itself; each names its branch through {{branch}}.
func branchScript(first, call modelserver.ToolCall) modelserver.Script {
	return modelserver.Script{"fix": {
		{Content: "Looking.", ToolCalls: []modelserver.ToolCall{first}},
		{Content: "base[{{branch}}]", Branches: map[string]modelserver.Turn{
			"b1": {Content: "one[{{branch}}]"},
			"*":  {Content: "any[{{branch}}]", ToolCalls: []modelserver.ToolCall{call}},
		}},
	}}
}

// branchCase is one API's two requests: the prompt, and the prompt with
// the first turn's call and its output.
type branchCase struct {
	name   string
	script modelserver.Script
	path   string
	bodies [2][]byte
	// read returns a reply's text and its tool calls' arguments.
	read func(t *testing.T, b []byte) (string, []string)
}

func branchCases(t *testing.T) []branchCase {
	chatFirst := modelserver.BashCall("c0", "cat calc.sh")
	chatCall := modelserver.BashCall("c1", "echo {{branch}}")
	chatPrompt := []modelserver.Message{user("fix it")}
	chat := func(msgs []modelserver.Message) []byte {
		b, _ := json.Marshal(modelserver.Request{Model: "m", Messages: msgs})
		return b
	}
	tc, _ := json.Marshal([]modelserver.ToolCall{chatFirst})
	chatSecond := append(chatPrompt, modelserver.Message{Role: "assistant", ToolCalls: tc},
		modelserver.Message{Role: "tool", ToolCallID: "c0", Content: json.RawMessage(`"x"`)})

	claudeFirst := modelserver.ClaudeBashCall("toolu_0", "cat calc.sh")
	claudeCall := modelserver.ClaudeBashCall("toolu_1", "echo {{branch}}")
	claude := func(msgs ...any) []byte {
		b, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 64, "tools": claudeTools(t), "messages": msgs})
		return b
	}
	execFirst := modelserver.ExecCall("c0", "cat calc.sh")
	execCall := modelserver.ExecCall("c1", "echo {{branch}}")
	return []branchCase{
		{name: "chat", script: branchScript(chatFirst, chatCall), path: "/v1/chat/completions",
			bodies: [2][]byte{chat(chatPrompt), chat(chatSecond)},
			read: func(t *testing.T, b []byte) (string, []string) {
				var out struct {
					Choices []struct {
						Message struct {
							Content   string                 `json:"content"`
							ToolCalls []modelserver.ToolCall `json:"tool_calls"`
						} `json:"message"`
					} `json:"choices"`
				}
				if err := json.Unmarshal(b, &out); err != nil || len(out.Choices) != 1 {
					t.Fatalf("reply %s: %v", b, err)
				}
				var args []string
				for _, c := range out.Choices[0].Message.ToolCalls {
					args = append(args, c.Function.Arguments)
				}
				return out.Choices[0].Message.Content, args
			}},
		{name: "messages", script: branchScript(claudeFirst, claudeCall), path: "/v1/messages",
			bodies: [2][]byte{claude(blocks("user", text("fix it"))),
				claude(blocks("user", text("fix it")), blocks("assistant", text("Looking."), toolUse(claudeFirst)), blocks("user", toolResultBlock("toolu_0", "x")))},
			read: func(t *testing.T, b []byte) (string, []string) {
				var out struct {
					Content []struct {
						Type  string          `json:"type"`
						Text  string          `json:"text"`
						Input json.RawMessage `json:"input"`
					} `json:"content"`
				}
				if err := json.Unmarshal(b, &out); err != nil {
					t.Fatalf("reply %s: %v", b, err)
				}
				var txt string
				var args []string
				for _, c := range out.Content {
					if c.Type == "text" {
						txt += c.Text
					} else {
						args = append(args, string(c.Input))
					}
				}
				return txt, args
			}},
		{name: "responses", script: branchScript(execFirst, execCall), path: "/v1/responses",
			bodies: [2][]byte{responsesBody(t, false, item("user", "fix it")),
				responsesBody(t, false, item("user", "fix it"), item("assistant", "Looking."), callItem(execFirst), outputItem("c0", "x"))},
			read: func(t *testing.T, b []byte) (string, []string) {
				var out struct {
					Output []struct {
						Type      string `json:"type"`
						Arguments string `json:"arguments"`
						Content   []struct {
							Text string `json:"text"`
						} `json:"content"`
					} `json:"output"`
				}
				if err := json.Unmarshal(b, &out); err != nil {
					t.Fatalf("reply %s: %v", b, err)
				}
				var txt string
				var args []string
				for _, o := range out.Output {
					for _, c := range o.Content {
						txt += c.Text
					}
					if o.Type == "function_call" {
						args = append(args, o.Arguments)
					}
				}
				return txt, args
			}},
	}
}

// sendBranch posts body to path as branch label (none: "") with seed.
func sendBranch(t *testing.T, url, path string, body []byte, label, seed string) []byte {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+path, bytes.NewReader(body))
	req.Header.Set(modelserver.TaskHeader, "fix")
	req.Header.Set(modelserver.EpisodeHeader, "e1")
	if label != "" {
		req.Header.Set(sandboxapi.BranchHeader, label)
		req.Header.Set(sandboxapi.SeedHeader, seed)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s as %q: %d %s", path, label, resp.StatusCode, b.String())
	}
	return b.Bytes()
}

// On each API, a branch's request is answered from its label's entry,
// else "*", else the turn, {{branch}} become the label in the text and
// the tool calls' arguments; the ledger names each request's branch and
// seed; the same conversation from the parent and two branches (one
// episode: a fork continuing in place) is no repeat, while a branch
// repeating its own call is one.
func TestBranchContinuations(t *testing.T) {
	for _, c := range branchCases(t) {
		t.Run(c.name, func(t *testing.T) {
			s := modelserver.New(c.script)
			srv := httptest.NewServer(s)
			defer srv.Close()
			// The parent: both turns, then its branches from the second.
			sendBranch(t, srv.URL, c.path, c.bodies[0], "", "")
			for _, b := range []struct{ label, seed, text, arg string }{
				{"", "", "base[]", ""},
				{"b1", "11", "one[b1]", ""},
				{"b2", "22", "any[b2]", "echo b2"},
				{"b7", "77", "any[b7]", "echo b7"},
			} {
				txt, args := c.read(t, sendBranch(t, srv.URL, c.path, c.bodies[1], b.label, b.seed))
				if txt != b.text {
					t.Errorf("branch %q answered %q, want %q", b.label, txt, b.text)
				}
				if (b.arg == "") != (len(args) == 0) || b.arg != "" && !strings.Contains(args[0], b.arg) {
					t.Errorf("branch %q tool calls %q, want one with %q", b.label, args, b.arg)
				}
			}
			// The branches' first call again: each branch's own, once.
			sendBranch(t, srv.URL, c.path, c.bodies[0], "b1", "11")
			if r := s.RepeatList(); len(r) != 0 {
				t.Fatalf("the parent's and the branches' calls count as repeats: %+v", r)
			}
			if r := s.Reissued(); len(r) != 0 {
				t.Fatalf("the branches' calls count as re-issues: %+v", r)
			}
			sendBranch(t, srv.URL, c.path, c.bodies[1], "b1", "11")
			sendBranch(t, srv.URL, c.path, c.bodies[0], "b1", "11")
			if r := s.RepeatList(); len(r) != 1 || r[0].Branch != "b1" {
				t.Fatalf("a branch's own repeat: %+v", r)
			}
			l := s.Ledger()
			if e := l[2]; e.Branch != "b1" || e.Seed != 11 || e.Turn != 1 {
				t.Errorf("ledger entry of b1: %+v", e)
			}
			if e := l[1]; e.Branch != "" || e.Seed != 0 {
				t.Errorf("ledger entry of the parent: %+v", e)
			}
		})
	}
}

// A tasks file's branch entries are checked like its turns: a key that is
// no label, a branch turn with branches, a tool call without an id.
func TestBranchEntriesChecked(t *testing.T) {
	for _, bad := range []string{
		`{"branches":{"x1":{"content":"a"}}}`,
		`{"branches":{"b0":{"content":"a"}}}`,
		`{"branches":{"*":{"content":"a","branches":{"b1":{}}}}}`,
		`{"branches":{"b1":{"tool_calls":[{"function":{"name":"bash","arguments":"{}"}}]}}}`,
	} {
		line := `{"rollout_id":"r","task":{"task":"t"},"model":{"turns":[` + bad + `]}}`
		if _, err := modelserver.LoadTasks(strings.NewReader(line)); err == nil || !strings.Contains(err.Error(), "branches") {
			t.Errorf("turn %s: %v, want an error naming its branches", bad, err)
		}
	}
	line := `{"rollout_id":"r","task":{"task":"t"},"model":{"turns":[{"content":"a","branches":{"*":{"tool_calls":[{"id":"c","function":{"name":"bash","arguments":"{}"}}]}}}]}}`
	s, err := modelserver.LoadTasks(strings.NewReader(line))
	if err != nil {
		t.Fatal(err)
	}
	if tc := s["t"][0].Branches["*"].ToolCalls[0]; tc.Type != "function" {
		t.Errorf("a branch's tool call got type %q", tc.Type)
	}
}
