package modelserver_test

import (
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

// A tasks file's lines carry their model turns beside the payload; the
// script is named by the payload's task (or model.script, or the rollout
// id), and a line without a model is skipped.
func TestLoadTasks(t *testing.T) {
	file := strings.Join([]string{
		`{"rollout_id":"r1","task":{"task":"t1","prompt":"p"},"model":{"turns":[{"tool_calls":[{"id":"c1","function":{"name":"bash","arguments":"{\"command\":\"echo hi > a.txt\"}"}}]},{"content":"done"}]}}`,
		`{"rollout_id":"r2","task":{"prompt":"no name"},"model":{"turns":[{"content":"r2 done"}]}}`,
		`{"rollout_id":"r3","task":{"task":"x"},"model":{"script":"named","turns":[{"content":"named done"}]}}`,
		`{"rollout_id":"r4","task":{"task":"t4"}}`,
		``,
		`{"rollout_id":"r5","task":{"task":"t1"},"model":{"turns":[{"tool_calls":[{"id":"c1","function":{"name":"bash","arguments":"{\"command\":\"echo hi > a.txt\"}"}}]},{"content":"done"}]}}`,
	}, "\n")
	s, err := modelserver.LoadTasks(strings.NewReader(file))
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 3 || len(s["t1"]) != 2 || s["r2"][0].Content != "r2 done" || s["named"][0].Content != "named done" {
		t.Fatalf("script %+v", s)
	}
	if tc := s["t1"][0].ToolCalls[0]; tc.Type != "function" {
		t.Errorf("a tool call without a type: %+v, want function", tc)
	}
	srv := httptest.NewServer(modelserver.New(s))
	defer srv.Close()
	var out struct {
		Choices []struct {
			Message struct {
				ToolCalls []modelserver.ToolCall `json:"tool_calls"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(post(t, srv.URL, "t1", []modelserver.Message{user("go")}, false).Body).Decode(&out); err != nil ||
		out.Choices[0].Message.ToolCalls[0].Function.Name != "bash" {
		t.Fatalf("reply of a loaded script: %+v %v", out, err)
	}

	for _, bad := range []struct{ file, says string }{
		{`{"rollout_id":"r1","task":{}}`, "no line has model turns"},
		{`not json`, "line 1"},
		{`{"rollout_id":"r1","task":{"task":"t"},"model":{"turns":[]}}`, "model.turns: none"},
		{`{"rollout_id":"r1","task":{"task":"t"},"model":{"turns":[{"tool_calls":[{"function":{"name":"bash","arguments":"{}"}}]}]}}`, "no id"},
		{`{"rollout_id":"r1","task":{"task":"t"},"model":{"turns":[{"tool_calls":[{"id":"c","function":{"name":"bash","arguments":"{"}}]}]}}`, "not JSON"},
		{`{"rollout_id":"r1","task":{"task":"t"},"model":{"turns":[{"content":"a"}]}}` + "\n" +
			`{"rollout_id":"r2","task":{"task":"t"},"model":{"turns":[{"content":"b"}]}}`, "other turns on line 1"},
	} {
		_, err := modelserver.LoadTasks(strings.NewReader(bad.file))
		if !errors.Is(err, modelserver.ErrNoScript) || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("LoadTasks(%s) = %v, want ErrNoScript saying %q", bad.file, err, bad.says)
		}
	}
}
