package driver_test

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/build"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/testcpu"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/codex"
	"github.com/stillpoint/stillpoint/participants/codex/driver"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

const prompt = "Make test.sh pass."

// world is a session folder, a project and a scripted model server for
// the real Codex, driven through the real driver.
type world struct {
	t                *testing.T
	ms               *modelserver.Server
	url, drv, cx     string
	home, work       string
	episode          string
	lastOut, lastErr string
}

func newWorld(t *testing.T, turns []modelserver.Turn) *world {
	t.Helper()
	testcpu.Take(t, 1)
	cx, err := codex.Binary()
	if err != nil {
		t.Fatal(err)
	}
	drv := build.StaticForTest(t, build.CodexDriver)[build.CodexDriver]
	ms := modelserver.New(modelserver.Script{"fix": turns})
	srv := httptest.NewServer(ms)
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	w := &world{t: t, ms: ms, url: srv.URL, drv: drv, cx: cx, home: filepath.Join(dir, "session"), work: filepath.Join(dir, "work"), episode: "r1-a0"}
	if err := os.MkdirAll(w.work, 0o755); err != nil {
		t.Fatal(err)
	}
	return w
}

// cmd is the driver's command, in a process group of its own.
func (w *world) cmd(args ...string) *exec.Cmd {
	argv := append([]string{args[0], "--codex", w.cx, "--home", w.home, "--work", w.work}, args[1:]...)
	if args[0] != "check" {
		argv = append(argv, "--model-url", w.url, "--header", modelserver.TaskHeader+"=fix", "--header", modelserver.EpisodeHeader+"="+w.episode)
	}
	c := exec.Command(w.drv, argv...)
	c.Dir = w.work
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return c
}

// run runs the driver to its end and returns its summary.
func (w *world) run(args ...string) driver.Summary {
	w.t.Helper()
	c := w.cmd(args...)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	err := c.Run()
	w.lastOut, w.lastErr = out.String(), errb.String()
	s, serr := driver.ReadSummary(out.String())
	if serr != nil {
		w.t.Fatalf("%s: %v %v\n%s\n%s", args[0], err, serr, out.String(), errb.String())
	}
	return s
}

func (w *world) check() driver.Decision {
	w.t.Helper()
	out, err := w.cmd("check", "--prompt", prompt).Output()
	var d driver.Decision
	if err != nil || json.Unmarshal(out, &d) != nil {
		w.t.Fatalf("check: %v: %s", err, out)
	}
	return d
}

func (w *world) userTexts() []string {
	w.t.Helper()
	p, err := driver.FindRollout(filepath.Join(w.home, driver.Dirs.Codex), "")
	if err != nil {
		w.t.Fatal(err)
	}
	r, err := driver.ReadRollout(p)
	if err != nil {
		w.t.Fatal(err)
	}
	return r.UserTexts
}

// Killed (SIGKILL, the driver, Codex and the tool) while a tool ran, the
// session is continued with no new turn of the user's: the saved user
// messages are the ones before and the one empty message of `resume ""`,
// the model is asked the turn again (Retried, its call came back
// aborted), and the answer comes; a session that answered is not
// continued again.
func TestKilledMidToolContinues(t *testing.T) {
	tier.E2E(t)
	w := newWorld(t, []modelserver.Turn{
		{Content: "Testing.", ToolCalls: []modelserver.ToolCall{modelserver.ExecCall("c0", "echo $$ > tool.pid; while [ ! -e resume ]; do sleep 0.1; done; echo resumed")}},
		{Content: "Done: test.sh passes."},
	})
	if d := w.check(); d.Continue || d.Reason != "no saved session" {
		t.Fatalf("an empty folder: %+v", d)
	}
	c := w.cmd("run", "--prompt", prompt)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	pidFile := filepath.Join(w.work, "tool.pid")
	poll.Wait(t, time.Minute, "the tool to run", func() bool { b, _ := os.ReadFile(pidFile); return strings.HasSuffix(string(b), "\n") })
	b, _ := os.ReadFile(pidFile)
	tool, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
	_ = syscall.Kill(-tool, syscall.SIGKILL) // the tool runs in a session of its own
	_ = c.Wait()
	before := w.userTexts()
	if len(before) != 2 || before[1] != prompt {
		t.Fatalf("saved user messages %q", before)
	}
	d := w.check()
	if !d.Continue || d.Thread == "" {
		t.Fatalf("check after the kill: %+v", d)
	}
	if err := os.WriteFile(filepath.Join(w.work, "resume"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	w.episode = "r1-a1"
	s := w.run("continue", "--session", d.Thread)
	if s.Err() != nil || s.Text != "Done: test.sh passes." || !s.Continued || s.Thread != d.Thread || s.UserTurns != 3 {
		t.Fatalf("continue: %+v\n%s", s, w.lastErr)
	}
	if after := w.userTexts(); !slices.Equal(after, append(before, "")) {
		t.Fatalf("user messages %q after, %q before", after, before)
	}
	l := w.ms.Ledger()
	var turns []int
	for _, e := range l {
		turns = append(turns, e.Turn)
	}
	if !slices.Equal(turns, []int{0, 0, 1}) || !l[1].Retried || l[1].UserTurns != 3 || l[0].UserTurns != 2 || l[1].Episode != "r1-a1" {
		t.Fatalf("ledger %+v", l)
	}
	if r := w.ms.Repeats(); len(r) != 0 {
		t.Fatalf("repeats %v", r)
	}
	// Answered: continue gives the answer and asks no model.
	if s := w.run("continue"); s.Err() != nil || !s.Answered || s.Text != "Done: test.sh passes." || len(w.ms.Ledger()) != 3 {
		t.Fatalf("continue of an answered session: %+v", s)
	}
}

// check continues only the task's session with a completed response.
func TestCheckWrongPrompt(t *testing.T) {
	tier.E2E(t)
	w := newWorld(t, []modelserver.Turn{{Content: "Hello."}})
	if s := w.run("run", "--prompt", "Something else."); s.Err() != nil || s.Text != "Hello." || s.Turns != 1 || s.UserTurns != 2 {
		t.Fatalf("run: %+v\n%s", s, w.lastErr)
	}
	if d := w.check(); d.Continue || !strings.Contains(d.Reason, "prompt is not the task's") {
		t.Fatalf("check: %+v", d)
	}
	b, _ := os.ReadFile(filepath.Join(w.home, driver.Dirs.Codex, "config.toml"))
	for _, want := range []string{`wire_api = "responses"`, `"X-Stillpoint-Task" = "fix"`, "check_for_update_on_startup = false", "include_instructions = false"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("config.toml lacks %s:\n%s", want, b)
		}
	}
}
