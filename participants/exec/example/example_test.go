package example

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

// prompt is a prompt no shell would pass through whole.
const prompt = "Task: \"quotes\", 'single', $HOME, `ticks`;\nand a second line\t{braces}"

// python3 returns the python3 the sandboxes run, failing the test with how
// to install it when there is none.
func python3(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is required (the exec adapter's example agent): apt-get install python3: %v", err)
	}
	return p
}

// serve serves script on a loopback port until the test ends.
func serve(t *testing.T, script modelserver.Script) (*modelserver.Server, string) {
	t.Helper()
	ms := modelserver.New(script)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: ms, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-done })
	return ms, "http://" + ln.Addr().String()
}

type world struct {
	t                      *testing.T
	py, agent, url         string
	session, work, episode string
}

func (w world) cmd(args ...string) *exec.Cmd {
	c := exec.Command(w.py, append([]string{w.agent}, args...)...)
	c.Env = []string{"PATH=/usr/bin:/bin", "STILLPOINT_MODEL_URL=" + w.url, "STILLPOINT_TASK=t", "STILLPOINT_EPISODE=" + w.episode}
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return c
}

// check runs the agent's check and returns its exit status and reason.
func (w world) check(p string) (int, string) {
	out, err := w.cmd("check", "--session", w.session, "--prompt="+p).CombinedOutput()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		w.t.Fatal(err)
	}
	return code, strings.TrimSpace(string(out))
}

// TestAgentContinuesAfterACrashMidTool runs the example agent on the host
// against the scripted model server: killed (SIGKILL, with its tool)
// while its second tool call runs, its check says the saved session
// continues, and its continue runs the interrupted call again and answers,
// with no model call repeated and no user turn added.
func TestAgentContinuesAfterACrashMidTool(t *testing.T) {
	dir := t.TempDir()
	spec, err := Write(filepath.Join(dir, "example"))
	if err != nil {
		t.Fatal(err)
	}
	// The slow call runs until the crash the first time; again, it ends.
	slow := "if [ -e ran ]; then echo second run; else touch ran; echo $$ > tool.pid; exec sleep 60; fi"
	script := modelserver.Script{"t": {
		{Content: "Starting.", ToolCalls: []modelserver.ToolCall{modelserver.BashCall("c0", "echo one > out.txt")}},
		{ToolCalls: []modelserver.ToolCall{modelserver.BashCall("c1", slow)}},
		{Content: "done: the answer"},
	}}
	ms, url := serve(t, script)
	w := world{t: t, py: python3(t), agent: filepath.Join(filepath.Dir(spec), Agent), url: url,
		session: filepath.Join(dir, "session"), work: filepath.Join(dir, "work"), episode: "r-a0"}
	if err := os.MkdirAll(w.work, 0o755); err != nil {
		t.Fatal(err)
	}
	if code, why := w.check(prompt); code != 1 || why != "no saved session" {
		t.Fatalf("check of no session: %d %q", code, why)
	}
	run := w.cmd("run", "--session", w.session, "--workdir", w.work, "--prompt="+prompt)
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- run.Wait() }()
	pidFile := filepath.Join(w.work, "tool.pid")
	poll.Wait(t, 30*time.Second, "the slow tool call running", func() bool {
		_, err := os.Stat(pidFile)
		return err == nil
	})
	b, _ := os.ReadFile(pidFile)
	tool, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	_ = syscall.Kill(-run.Process.Pid, syscall.SIGKILL)
	_ = syscall.Kill(tool, syscall.SIGKILL)
	<-exited

	if code, why := w.check("another prompt"); code != 1 || !strings.Contains(why, "does not start with the task's prompt") {
		t.Fatalf("check of another prompt: %d %q", code, why)
	}
	code, why := w.check(prompt)
	if code != 0 {
		t.Fatalf("check after the crash: %d %q", code, why)
	}
	t.Logf("check: %s", why)
	w.episode = "r-a1"
	out, err := w.cmd("continue", "--session", w.session, "--workdir", w.work).CombinedOutput()
	if err != nil {
		t.Fatalf("continue: %v\n%s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "done: the answer" {
		t.Fatalf("continue printed %q", got)
	}
	ans, _ := os.ReadFile(filepath.Join(w.session, "answer.txt"))
	if string(ans) != "done: the answer\n" {
		t.Fatalf("answer.txt %q", ans)
	}
	var s struct {
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
	}
	b, _ = os.ReadFile(filepath.Join(w.session, "session.json"))
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	var roles []string
	for _, m := range s.Messages {
		roles = append(roles, m.Role)
	}
	if got := strings.Join(roles, " "); got != "user assistant tool assistant tool assistant" || s.Messages[0].Content != prompt ||
		!strings.HasPrefix(s.Messages[4].Content, "second run") {
		t.Fatalf("session %s", b)
	}
	var turns []string
	for _, e := range ms.Ledger() {
		turns = append(turns, fmt.Sprintf("%d@%s", e.Turn, e.Episode))
		if e.UserTurns != 1 || e.Task != "t" || e.Delivered.IsZero() {
			t.Errorf("call %+v: want task t, one user turn, delivered", e)
		}
	}
	if got := strings.Join(turns, " "); got != "0@r-a0 1@r-a0 2@r-a1" {
		t.Fatalf("turns called %s, want each once, the last after the continue", got)
	}
	if r := ms.Repeats(); len(r) != 0 {
		t.Fatalf("repeated calls %v", r)
	}
}

// TestAgentStoppedMidToolKeepsTheCallPending: a stop (SIGINT to the whole
// tree, as a daemon's) while a tool runs ends the agent without a result
// for the call, which the continue runs again.
func TestAgentStoppedMidToolKeepsTheCallPending(t *testing.T) {
	dir := t.TempDir()
	spec, err := Write(filepath.Join(dir, "example"))
	if err != nil {
		t.Fatal(err)
	}
	script := modelserver.Script{"t": {
		{ToolCalls: []modelserver.ToolCall{modelserver.BashCall("c0", "if [ -e ran ]; then echo again; else touch ran; exec sleep 60; fi")}},
		{Content: "ok"},
	}}
	ms, url := serve(t, script)
	w := world{t: t, py: python3(t), agent: filepath.Join(filepath.Dir(spec), Agent), url: url,
		session: filepath.Join(dir, "session"), work: filepath.Join(dir, "work"), episode: "r-a0"}
	_ = os.MkdirAll(w.work, 0o755)
	run := w.cmd("run", "--session", w.session, "--workdir", w.work, "--prompt=p")
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 30*time.Second, "the tool running", func() bool {
		_, err := os.Stat(filepath.Join(w.work, "ran"))
		return err == nil
	})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_ = syscall.Kill(-run.Process.Pid, syscall.SIGINT)
	go func() { <-ctx.Done(); _ = syscall.Kill(-run.Process.Pid, syscall.SIGKILL) }()
	if err := run.Wait(); err == nil || ctx.Err() != nil {
		t.Fatalf("the stopped agent exited %v (timed out: %v)", err, ctx.Err())
	}
	if code, why := w.check("p"); code != 0 {
		t.Fatalf("check: %d %s", code, why)
	}
	out, err := w.cmd("continue", "--session", w.session, "--workdir", w.work).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("continue: %v %s", err, out)
	}
	if n := len(ms.Ledger()); n != 2 {
		t.Fatalf("%d model calls, want 2", n)
	}
}
