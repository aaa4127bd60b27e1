package harness_test

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/e2e/harness"
	"github.com/stillpoint/stillpoint/e2e/modelserver"
)

func bash(id, command string) modelserver.ToolCall {
	var tc modelserver.ToolCall
	tc.ID, tc.Type = id, "function"
	tc.Function.Name, tc.Function.Arguments = "bash", `{"command":"`+command+`"}`
	return tc
}

var script = modelserver.Script{"t1": {
	{ToolCalls: []modelserver.ToolCall{bash("c1", "echo hello > a.txt")}},
	{ToolCalls: []modelserver.ToolCall{bash("c2", "cat a.txt > b.txt")}},
	{Content: "wrote a.txt and b.txt"},
}}

// A run calls the model, runs the tools in the work dir, keeps the session
// on disk and prints the answer; each model call is made once.
func TestRun(t *testing.T) {
	ms := modelserver.New(script)
	srv := httptest.NewServer(ms)
	defer srv.Close()
	dir := t.TempDir()
	var out strings.Builder
	err := harness.Run(t.Context(), harness.Config{ModelURL: srv.URL, Task: "t1", Prompt: "write files", DataDir: filepath.Join(dir, "data"), WorkDir: dir, Out: &out})
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out.String()) != "wrote a.txt and b.txt" {
		t.Fatalf("answer %q", out.String())
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "b.txt")); string(b) != "hello\n" {
		t.Fatalf("b.txt %q", b)
	}
	s, err := harness.Load(filepath.Join(dir, "data"))
	if err != nil || len(s.Messages) != 6 {
		t.Fatalf("session: %+v %v", s, err)
	}
	if r := ms.Repeats(); len(r) != 0 || len(ms.Ledger()) != 3 {
		t.Fatalf("ledger %d entries, repeats %v", len(ms.Ledger()), r)
	}
}

// A run stopped while a model reply is pending is continued from its saved
// session without a new user message: no call is repeated except the one
// that never got its answer, and the user turn count stays one.
func TestContinueAfterAStop(t *testing.T) {
	ms := modelserver.New(script)
	srv := httptest.NewServer(ms)
	defer srv.Close()
	dir := t.TempDir()
	cfg := harness.Config{ModelURL: srv.URL, Task: "t1", Prompt: "write files", DataDir: filepath.Join(dir, "data"), WorkDir: dir}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- harness.Run(ctx, cfg) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, _ := os.ReadFile(filepath.Join(dir, "a.txt")); len(b) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first tool did not run")
		}
		time.Sleep(5 * time.Millisecond)
	}
	ms.Hold()
	for ms.Held() == 0 {
		select {
		case err := <-done:
			t.Fatalf("the run ended early: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancel() // the harness is stopped with the reply pending
	<-done
	ms.Release()
	cfg.Continue = true
	var out strings.Builder
	cfg.Out = &out
	if err := harness.Run(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(out.String()) != "wrote a.txt and b.txt" {
		t.Fatalf("answer %q", out.String())
	}
	for _, e := range ms.Ledger() {
		if e.UserTurns != 1 {
			t.Fatalf("a user turn was injected: %+v", e)
		}
	}
}
