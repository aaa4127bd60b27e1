package driver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/build"
	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/procfs"
	"github.com/stillpoint/stillpoint/internal/testcpu"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/opencode"
	"github.com/stillpoint/stillpoint/participants/opencode/driver"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

// fixAdd is a small repository task: calc.sh's add subtracts, test.sh
// says so; the script reads, edits, runs the test (slowly, until the file
// "resumed" exists), writes a note and answers.
var fixAdd = []modelserver.Turn{
	{Content: "Reading calc.sh.", ToolCalls: []modelserver.ToolCall{modelserver.ReadCall("c0", "calc.sh")}},
	{ToolCalls: []modelserver.ToolCall{modelserver.EditCall("c1", "calc.sh", "$1 - $2", "$1 + $2")}},
	{ToolCalls: []modelserver.ToolCall{modelserver.BashCall("c2", "test -e resumed || sleep 60; sh test.sh")}},
	{ToolCalls: []modelserver.ToolCall{modelserver.WriteCall("c3", "NOTES.md", "add adds now\n")}},
	{Content: "Fixed add: test.sh passes."},
}

const prompt = "Make test.sh pass.\nThe bug is in calc.sh."

type world struct {
	t    *testing.T
	ms   *modelserver.Server
	url  string
	drv  string
	oc   string
	home string
	work string
	// env is added to the driver's environment.
	env []string
	// calls counts the model calls, those the server refused too.
	calls atomic.Int64
}

func newWorld(t *testing.T) *world { return newScriptedWorld(t, fixAdd) }

// newScriptedWorld is a world whose task's script is turns.
func newScriptedWorld(t *testing.T, turns []modelserver.Turn) *world {
	t.Helper()
	testcpu.Take(t, 1) // OpenCode's start keeps a core busy for seconds
	oc, err := opencode.Binary()
	if err != nil {
		t.Fatal(err)
	}
	drv := build.StaticForTest(t, build.OpenCodeDriver)[build.OpenCodeDriver]
	ms := modelserver.New(modelserver.Script{"fix-add": turns})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, ms: ms, url: "http://" + ln.Addr().String(), drv: drv, oc: oc}
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/chat/completions" {
			w.calls.Add(1)
		}
		ms.ServeHTTP(rw, r)
	})}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-served })
	dir := t.TempDir()
	w.home, w.work = filepath.Join(dir, "home"), filepath.Join(dir, "work")
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

// driver starts the driver program with cmd and its flags.
func (w *world) driver(name, cmd string, args ...string) *child.Process {
	w.t.Helper()
	argv := append([]string{cmd, "--opencode", w.oc, "--home", w.home, "--work", w.work, "--title", "r1"}, args...)
	return child.StartForTest(w.t, child.Spec{Name: name, Path: w.drv, Args: argv, Dir: w.work, Env: w.env})
}

func (w *world) model() []string {
	return []string{"--model-url", w.url, "--header", modelserver.TaskHeader + "=fix-add", "--header", modelserver.EpisodeHeader + "=r1"}
}

// finish waits for p to end and returns its summary.
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

// delivered returns the ledger entries whose reply was delivered.
func (w *world) delivered() []modelserver.Entry {
	var out []modelserver.Entry
	for _, e := range w.ms.Ledger() {
		if !e.Delivered.IsZero() {
			out = append(out, e)
		}
	}
	return out
}

// crash kills p's whole tree with SIGKILL, as a machine's crash would:
// OpenCode's bash tool runs in a session of its own, so the tree is walked
// (parents first, each stopped before its children are read, so that none
// forks away).
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
			if !contains(killed, pid) {
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

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestDriverContinuesAfterACrashMidTool: OpenCode runs the task through the driver
// against the scripted model and is killed (the whole tree, SIGKILL) while
// its test command runs; the check finds the saved session and continues
// it; the continuation, through `opencode serve` and a message with no
// parts, re-issues the interrupted call, finishes the task (the repository
// really edited: the test passes) and leaves the user turns as they were.
// The model saw one user turn in every call and no call twice.
func TestDriverContinuesAfterACrashMidTool(t *testing.T) {
	tier.E2E(t)
	w := newWorld(t)
	run := w.driver("run", "run", append([]string{"--prompt", prompt}, w.model()...)...)
	// OpenCode's start is slow on a busy machine: the wait is for it to
	// get there, not a claim on its speed.
	poll.Wait(t, 3*time.Minute, "the slow test command", func() bool {
		exitedEarly(t, run)
		return len(w.delivered()) >= 3 && hasProcess(t, run.Pid(), "sleep")
	})
	crash(t, run)
	if b, _ := os.ReadFile(filepath.Join(w.home, driver.SessionFile)); !strings.Contains(string(b), "ses_") {
		t.Fatalf("run recorded no session: %q", b)
	}

	chk := w.driver("check", "check", "--prompt", prompt)
	d := decision(t, chk)
	if !d.Continue || !strings.HasPrefix(d.Session, "ses_") {
		t.Fatalf("check after the crash: %+v", d)
	}
	if d := decision(t, w.driver("check-other", "check", "--prompt", "another task")); d.Continue {
		t.Fatalf("check of another prompt continues: %+v", d)
	}

	if err := os.WriteFile(filepath.Join(w.work, "resumed"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	before := len(w.ms.Ledger())
	s := w.finish(w.driver("continue", "continue", append([]string{"--session", d.Session}, w.model()...)...))
	if err := s.Err(); err != nil || s.Text != "Fixed add: test.sh passes." || !s.Continued || s.UserTurns != 1 || s.Session != d.Session {
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
		if e.UserTurns != 1 || e.Title {
			t.Errorf("call %d: %d user turns (title %v)", i, e.UserTurns, e.Title)
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
}

// readAndAnswer reads calc.sh and answers with text alone.
var readAndAnswer = []modelserver.Turn{
	{ToolCalls: []modelserver.ToolCall{modelserver.ReadCall("c0", "calc.sh")}},
	{Content: "Read calc.sh: its add subtracts."},
}

// TestDriverTakesAReplyNotMarkedFinishedAsTheAnswer: OpenCode stores a
// reply's text only once the reply's stream has ended, and records the
// step's end (its finish) after that; a checkpoint that freezes it in
// between, and a crash, leave a session whose final reply is whole but
// not marked finished. Here OpenCode is killed at that point: the project
// is a git repository, so OpenCode's snapshot of it (git write-tree) comes
// between the two, and a git on PATH waits there once the answer is in
// the store. The check continues the session; the continuation takes that
// reply as the answer and makes no model call (the script has no turn
// after its answer: OpenCode's agent loop on the session would ask for
// one).
func TestDriverTakesAReplyNotMarkedFinishedAsTheAnswer(t *testing.T) {
	tier.E2E(t)
	w := newScriptedWorld(t, readAndAnswer)
	answer := readAndAnswer[len(readAndAnswer)-1].Content
	gitBin, err := exec.LookPath("git")
	if err != nil {
		t.Fatal("the test needs git (apt-get install git)")
	}
	git := func(args ...string) {
		cmd := exec.Command(gitBin, append([]string{"-c", "user.name=t", "-c", "user.email=t@example.invalid"}, args...)...)
		cmd.Dir = w.work
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git("init", "-q")
	git("add", ".")
	git("commit", "-q", "-m", "calc")
	bin := t.TempDir()
	armed, waiting := filepath.Join(bin, "armed"), filepath.Join(bin, "waiting")
	store := filepath.Join(w.home, driver.StoreFiles[0])
	wrapper := fmt.Sprintf(`#!/bin/sh
case " $* " in
*" write-tree "*)
	if [ -e %[1]q ] && cat %[3]q %[3]q-wal 2>/dev/null | grep -qF %[4]q; then
		: > %[2]q
		while [ -e %[1]q ]; do sleep 0.1; done
	fi;;
esac
exec %[5]q "$@"
`, armed, waiting, store, answer, gitBin)
	if err := os.WriteFile(filepath.Join(bin, "git"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(armed, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(armed) })
	w.env = []string{"PATH=" + bin + string(filepath.ListSeparator) + os.Getenv("PATH")}

	run := w.driver("run", "run", append([]string{"--prompt", prompt}, w.model()...)...)
	poll.Wait(t, 2*time.Minute, "OpenCode finishing the step of its answer", func() bool {
		exitedEarly(t, run)
		_, err := os.Stat(waiting)
		return err == nil
	})
	crash(t, run)
	if err := os.Remove(armed); err != nil {
		t.Fatal(err)
	}

	d := decision(t, w.driver("check", "check", "--prompt", prompt))
	e := w.export(d.Session)
	last := e.Messages[len(e.Messages)-1]
	if last.Info.Role != "assistant" || last.Info.Finish != "" || last.Info.Error != nil || strings.TrimSpace(messageText(last)) != answer {
		t.Fatalf("the saved session's last message %+v %+v: want the answer, not marked finished", last.Info, last.Parts)
	}
	if !d.Continue || !strings.Contains(d.Reason, "holds 2 completed model responses") {
		t.Fatalf("check: %+v, want a continuation of 2 completed responses", d)
	}
	calls := w.calls.Load()
	s := w.finish(w.driver("continue", "continue", append([]string{"--session", d.Session}, w.model()...)...))
	if err := s.Err(); err != nil || s.Text != answer || !s.Continued || s.UserTurns != 1 {
		t.Fatalf("continuation: %+v %v; want the saved answer", s, err)
	}
	if n := w.calls.Load(); n != calls {
		t.Errorf("the continuation made %d model calls, want none", n-calls)
	}
	var turns []string
	for _, e := range w.ms.Ledger() {
		turns = append(turns, fmt.Sprint(e.Turn))
	}
	if got := strings.Join(turns, " "); got != "0 1" {
		t.Errorf("turns called %q, want 0 1", got)
	}
}

// export returns OpenCode's export of session id in the world's folder.
func (w *world) export(id string) driver.Export {
	w.t.Helper()
	cmd := exec.Command(w.oc, "export", id)
	cmd.Dir, cmd.Env = w.work, driver.Environ(w.home, w.work, os.Getenv("PATH"), 0)
	out, err := cmd.Output()
	if err != nil {
		w.t.Fatalf("opencode export %s: %v", id, err)
	}
	var e driver.Export
	if err := json.Unmarshal(out, &e); err != nil || len(e.Messages) == 0 {
		w.t.Fatalf("opencode export %s: %v: %.300s", id, err, out)
	}
	return e
}

func messageText(m driver.Message) string {
	var b strings.Builder
	for _, p := range m.Parts {
		if p.Type == "text" {
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

// TestDriverReportsAFailedRun: a run whose model calls fail ends without an
// answer, and its summary says so.
func TestDriverReportsAFailedRun(t *testing.T) {
	tier.E2E(t)
	w := newWorld(t)
	s := w.finish(w.driver("run", "run", "--prompt", prompt, "--model-url", w.url, "--header", modelserver.TaskHeader+"=no-such-task"))
	err := s.Err()
	if err == nil || !strings.Contains(err.Error(), "no script for task") {
		t.Fatalf("a run against a model that refuses it: %+v: %v", s, err)
	}
	t.Log(err)
}

func exitedEarly(t *testing.T, p *child.Process) {
	t.Helper()
	select {
	case <-p.Exited():
		t.Fatalf("%s exited early:\n%s", p.Name(), p.Output())
	default:
	}
}

// hasProcess tells whether a process named comm is in pid's tree.
func hasProcess(t *testing.T, pid int, comm string) bool {
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
	// A check starts OpenCode (its export): as for the run's start, the
	// wait is for it to end, not a claim on its speed.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
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
