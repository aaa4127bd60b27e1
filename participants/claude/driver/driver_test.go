package driver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/build"
	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/procfs"
	"github.com/stillpoint/stillpoint/internal/testcpu"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/claude"
	"github.com/stillpoint/stillpoint/participants/claude/driver"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
	"github.com/stillpoint/stillpoint/sandboxd/relay"
)

// fixAdd is a small repository task in Claude's tools: calc.sh's add
// subtracts, test.sh says so; the script reads, edits, runs the test
// (slowly, until the file "resumed" exists), writes a note and answers.
func fixAdd(work string) []modelserver.Turn {
	calc := filepath.Join(work, "calc.sh")
	return []modelserver.Turn{
		{Content: "Reading calc.sh.", ToolCalls: []modelserver.ToolCall{modelserver.ClaudeReadCall("toolu_0", calc)}},
		{ToolCalls: []modelserver.ToolCall{modelserver.ClaudeEditCall("toolu_1", calc, "$1 - $2", "$1 + $2")}},
		{ToolCalls: []modelserver.ToolCall{modelserver.ClaudeBashCall("toolu_2", "test -e resumed || perl -e 'sleep 60'; sh test.sh")}},
		{ToolCalls: []modelserver.ToolCall{modelserver.ClaudeWriteCall("toolu_3", filepath.Join(work, "NOTES.md"), "add adds now\n")}},
		{Content: "Fixed add: test.sh passes."},
	}
}

const (
	prompt  = "Make test.sh pass.\nThe bug is in calc.sh."
	session = "0f8fad5b-d9cb-469f-a165-70867728950e"
)

type world struct {
	t    *testing.T
	ms   *modelserver.Server
	url  string
	drv  string
	cl   string
	home string
	work string
}

// newWorld serves the scripted model behind the relay's claude-continue
// edit, as the sandbox's relay does for a continuation.
func newWorld(t *testing.T) *world {
	t.Helper()
	testcpu.Take(t, 1)
	cl, err := claude.Binary()
	if err != nil {
		t.Fatal(err)
	}
	drv := build.StaticForTest(t, build.ClaudeDriver)[build.ClaudeDriver]
	dir := t.TempDir()
	w := &world{t: t, drv: drv, cl: cl, home: filepath.Join(dir, "home"), work: filepath.Join(dir, "work")}
	w.ms = modelserver.New(modelserver.Script{"fix-add": fixAdd(w.work)})
	edits, err := relay.LookupEdits([]string{relay.ClaudeContinueEdit})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w.url = "http://" + ln.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if out, _, err := edits[0].Apply(r.URL.RequestURI(), body); err == nil {
			body = out
		}
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		w.ms.ServeHTTP(rw, r)
	})}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-served })
	if err := os.MkdirAll(w.work, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"calc.sh": "add() { echo $(($1 - $2)); }\n",
		"test.sh": ". ./calc.sh\n[ \"$(add 2 3)\" = 5 ] && echo PASS || { echo FAIL; exit 1; }\n",
	} {
		if err := os.WriteFile(filepath.Join(w.work, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

// sessionHolds tells whether Claude Code's saved session (its transcript
// under the home directory) holds s.
func (w *world) sessionHolds(s string) bool {
	found := false
	_ = filepath.WalkDir(w.home, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != session+".jsonl" {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(s)) {
			found = true
		}
		return nil
	})
	return found
}

func (w *world) driver(name, cmd string, args ...string) *child.Process {
	w.t.Helper()
	argv := append([]string{cmd, "--claude", w.cl, "--home", w.home, "--work", w.work, "--session", session}, args...)
	return child.StartForTest(w.t, child.Spec{Name: name, Path: w.drv, Args: argv, Dir: w.work})
}

func (w *world) model(task string) []string {
	return []string{"--model-url", w.url, "--header", modelserver.TaskHeader + "=" + task, "--header", modelserver.EpisodeHeader + "=r1"}
}

func (w *world) finish(p *child.Process) driver.Summary {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := p.Wait(ctx); err != nil {
		w.t.Fatal(err)
	}
	s, err := driver.ReadSummary(p.Output())
	if err != nil {
		w.t.Fatalf("%s: %v\n%s", p.Name(), err, p.Output())
	}
	return s
}

// crash kills p's whole tree with SIGKILL, as a machine's crash would:
// Claude's Bash tool runs in a session of its own, so the tree is walked
// (each process stopped before its children are read).
func crash(t *testing.T, p *child.Process) {
	t.Helper()
	var killed []int
	for {
		pids, err := procfs.Tree(p.Pid())
		if err != nil {
			break
		}
		more := false
		for _, pid := range pids {
			seen := false
			for _, k := range killed {
				seen = seen || k == pid
			}
			if !seen {
				_ = syscall.Kill(pid, syscall.SIGSTOP)
				killed, more = append(killed, pid), true
			}
		}
		if !more {
			break
		}
	}
	for _, pid := range killed {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 30*time.Second, "the killed processes to go", func() bool {
		for _, pid := range killed[1:] {
			if st, _, err := procfs.ReadStat(pid, nil); err == nil && st.State != 'Z' {
				return false
			}
		}
		return true
	})
}

func hasProcess(pid int, comm string) bool {
	pids, _ := procfs.Tree(pid)
	for _, p := range pids {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p)); err == nil && strings.TrimSpace(string(b)) == comm {
			return true
		}
	}
	return false
}

var decisionLine = regexp.MustCompile(`(?m)^\{"continue".*$`)

func decision(t *testing.T, p *child.Process) driver.Decision {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if ex, err := p.Wait(ctx); err != nil || !ex.Success() {
		t.Fatalf("%s: %v %v\n%s", p.Name(), ex, err, p.Output())
	}
	var d driver.Decision
	if err := json.Unmarshal([]byte(decisionLine.FindString(p.Output())), &d); err != nil {
		t.Fatalf("%s printed no decision: %v\n%s", p.Name(), err, p.Output())
	}
	return d
}

// TestDriverContinuesAfterACrashMidTool: Claude Code runs the task through
// the driver against the scripted model and is killed (the whole tree,
// SIGKILL) while its test command runs; the check continues the saved
// session; the continuation (the marker prompt, which the relay's edit
// removes with Claude's synthetic message) re-issues the interrupted call,
// finishes the task (the repository really edited) and leaves the user
// turns as they were. The model saw one user turn in every call and no
// call twice.
func TestDriverContinuesAfterACrashMidTool(t *testing.T) {
	tier.E2E(t)
	w := newWorld(t)
	run := w.driver("run", "run", append([]string{"--prompt", prompt}, w.model("fix-add")...)...)
	// Claude Code writes the call's reply to its saved session after it
	// started the tool, and not at once: a crash before that write loses
	// the reply, and the continuation asks that turn anew (the crash test
	// of the relay's ledger). This test is of the reply saved: it crashes
	// once the session holds the tool's call.
	poll.Wait(t, 2*time.Minute, "the slow test command, its call saved in the session", func() bool {
		select {
		case <-run.Exited():
			t.Fatalf("run exited early:\n%s", run.Output())
		default:
		}
		return hasProcess(run.Pid(), "perl") && w.sessionHolds(`"toolu_2"`)
	})
	crash(t, run)

	if d := decision(t, w.driver("check", "check", "--prompt", prompt)); !d.Continue || d.Session != session {
		t.Fatalf("check after the crash: %+v", d)
	}
	if d := decision(t, w.driver("check-other", "check", "--prompt", "another task")); d.Continue {
		t.Fatalf("check of another prompt continues: %+v", d)
	}
	if err := os.WriteFile(filepath.Join(w.work, "resumed"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	before := len(w.ms.Ledger())
	s := w.finish(w.driver("continue", "continue", w.model("fix-add")...))
	if err := s.Err(); err != nil || s.Text != "Fixed add: test.sh passes." || !s.Continued || s.UserTurns != 1 || s.Session != session {
		t.Fatalf("continuation: %+v %v", s, err)
	}
	cmd := exec.Command("sh", "-c", "sh test.sh && cat NOTES.md")
	cmd.Dir = w.work
	if out, err := cmd.CombinedOutput(); err != nil || string(out) != "PASS\nadd adds now\n" {
		t.Fatalf("the repository after the task: %v: %q", err, out)
	}
	l := w.ms.Ledger()
	var turns []string
	for i, e := range l {
		if e.UserTurns != 1 || e.API != "messages" {
			t.Errorf("call %d: %d user turns, API %q", i, e.UserTurns, e.API)
		}
		turns = append(turns, fmt.Sprintf("%d%s", e.Turn, map[bool]string{true: "r"}[e.Retried]))
	}
	if got := strings.Join(turns, " "); got != "0 1 2 2r 3 4" {
		t.Errorf("turns called %q, want 0 1 2 2r 3 4 (the interrupted call re-issued once, as a new request)", got)
	}
	if !l[before].Retried || l[before].Turn != 2 {
		t.Errorf("the continuation's first call: %+v", l[before])
	}
	if r := w.ms.Repeats(); len(r) != 0 {
		t.Errorf("repeated model calls: %v", r)
	}

	// Continued again, the session that has answered makes no call.
	n := len(w.ms.Ledger())
	if s := w.finish(w.driver("again", "continue", w.model("fix-add")...)); s.Err() != nil || s.Text != "Fixed add: test.sh passes." {
		t.Fatalf("continuing an answered session: %+v", s)
	}
	if len(w.ms.Ledger()) != n {
		t.Fatal("continuing an answered session called the model")
	}
}

// A run the model refuses fails with the model's message in the summary.
func TestDriverReportsAFailedRun(t *testing.T) {
	tier.E2E(t)
	w := newWorld(t)
	s := w.finish(w.driver("run", "run", append([]string{"--prompt", prompt}, w.model("no-such-task")...)...))
	err := s.Err()
	if err == nil || !strings.Contains(err.Error(), "no script for task") {
		t.Fatalf("a run against a model that refuses it: %+v: %v", s, err)
	}
	if d := decision(t, w.driver("check", "check", "--prompt", prompt)); d.Continue {
		t.Fatalf("a session with no response continues: %+v", d)
	}
}
