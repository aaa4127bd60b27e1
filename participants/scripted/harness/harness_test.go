package harness_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/participants/scripted/harness"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
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

// closingListener closes the first n connections it accepts before the
// server reads a byte, as a server's header timeout does to a client
// frozen between connecting and writing its request.
type closingListener struct {
	net.Listener
	n atomic.Int32
}

func (l *closingListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil || l.n.Add(-1) < 0 {
			return c, err
		}
		c.Close()
	}
}

// A model call whose connection the server closed before reading it is
// sent again, and is one call in the ledger; one that never gets through
// fails after CallTries with the cause.
func TestModelCallSentAgainOnAClosedConnection(t *testing.T) {
	for _, tc := range []struct {
		closed int32
		ok     bool
	}{{2, true}, {harness.CallTries, false}} {
		ms := modelserver.New(script)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		cl := &closingListener{Listener: ln}
		cl.n.Store(tc.closed)
		srv := &http.Server{Handler: ms, ReadHeaderTimeout: 10 * time.Second}
		go srv.Serve(cl)
		dir := t.TempDir()
		var out strings.Builder
		err = harness.Run(t.Context(), harness.Config{ModelURL: "http://" + ln.Addr().String(), Task: "t1", Prompt: "write files",
			DataDir: filepath.Join(dir, "data"), WorkDir: dir, Out: &out})
		srv.Close()
		switch {
		case tc.ok && err != nil:
			t.Errorf("%d connections closed: %v", tc.closed, err)
		case tc.ok && (len(ms.Ledger()) != 3 || len(ms.Repeats()) != 0):
			t.Errorf("%d connections closed: ledger %d entries, repeats %v; want 3, none", tc.closed, len(ms.Ledger()), ms.Repeats())
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), fmt.Sprintf("try %d of %d", harness.CallTries, harness.CallTries))):
			t.Errorf("every connection closed: %v; want the last try's error", err)
		case !tc.ok && len(ms.Ledger()) != 0:
			t.Errorf("every connection closed: ledger %d entries", len(ms.Ledger()))
		}
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
	// The reply after the first tool is held from the start: a hold made
	// once the tool's file shows raced the harness through its last turns.
	ms.HoldFrom(1)
	go func() { done <- harness.Run(ctx, cfg) }()
	poll.Wait(t, 10*time.Second, "a held model call", func() bool {
		select {
		case err := <-done:
			t.Fatalf("the run ended early: %v", err)
		default:
		}
		return ms.Held() > 0
	})
	if b, _ := os.ReadFile(filepath.Join(dir, "a.txt")); string(b) != "hello\n" {
		t.Fatalf("a.txt %q when turn 1 was asked, want the first tool run", b)
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

// childEnv makes the test binary run the harness as a process of its own,
// configured by the rest of the environment, as cmd/scripted-harness does.
const childEnv = "STILLPOINT_HARNESS_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "" {
		leak.VerifyTestMain(m)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	err := harness.Run(ctx, harness.Config{ModelURL: os.Getenv("MODEL_URL"), Task: "t2", Prompt: "compute",
		DataDir: os.Getenv("DATA_DIR"), WorkDir: os.Getenv("WORK_DIR"), Continue: os.Getenv("CONTINUE") != ""})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// A stop signals the tool a little before the harness sees its own
// signal: the tool is taken as interrupted, its call stays pending, and the
// continuation runs it again instead of going on with the signal as its
// result.
func TestToolKilledByAStopStaysPending(t *testing.T) {
	ms := modelserver.New(modelserver.Script{"t2": {
		{ToolCalls: []modelserver.ToolCall{bash("c1", "echo $$ > tool.pid; until [ -e go ]; do sleep 0.02; done; echo 42 > answer.txt")}},
		{Content: "done"},
	}})
	srv := httptest.NewServer(ms)
	defer srv.Close()
	dir := t.TempDir()
	run := func(cont bool) *child.Process {
		env := []string{childEnv + "=1", "MODEL_URL=" + srv.URL, "DATA_DIR=" + filepath.Join(dir, "data"), "WORK_DIR=" + dir}
		if cont {
			env = append(env, "CONTINUE=1")
		}
		// Its own process group; the test's cleanup stops it and kills
		// what is left of the group.
		return child.StartForTest(t, child.Spec{Name: "harness", Path: os.Args[0], Env: env})
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		if b, _ := os.ReadFile(filepath.Join(dir, "tool.pid")); len(b) > 0 {
			if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
				_ = syscall.Kill(-pid, syscall.SIGKILL)
			}
		}
	})
	// wait waits for a harness run, at most a minute.
	wait := func(p *child.Process) child.Exit {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		exit, err := p.Wait(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return exit
	}
	p := run(false)
	var tool int
	poll.Wait(t, 10*time.Second, "the tool to start", func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, "tool.pid"))
		tool, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return tool > 0
	})
	// The tool (its own process group) first; once the harness has reaped
	// it, the harness, within the InterruptGrace it waits for a signal of
	// its own.
	if err := syscall.Kill(-tool, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 10*time.Second, "the harness to reap the tool", func() bool { return syscall.Kill(tool, 0) != nil })
	_ = p.SignalGroup(syscall.SIGINT)
	if exit := wait(p); exit.Success() {
		t.Fatal("the interrupted harness exited 0")
	}
	s, err := harness.Load(filepath.Join(dir, "data"))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(s.Messages); n != 2 || s.Messages[n-1].Role != "assistant" {
		t.Fatalf("saved session holds %d messages, the last %q: want the tool call still pending", n, s.Messages[n-1].Role)
	}
	// The continuation runs the tool again, to its end this time.
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if exit := wait(run(true)); !exit.Success() {
		t.Fatalf("continuation: %s", exit)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "answer.txt")); string(b) != "42\n" {
		t.Fatalf("answer.txt %q: the interrupted tool was not run again", b)
	}
	if r := ms.Repeats(); len(r) != 0 {
		t.Fatalf("repeated model calls %v", r)
	}
}
