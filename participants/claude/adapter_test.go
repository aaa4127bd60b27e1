package claude_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/participants/agent"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/claude"
	"github.com/stillpoint/stillpoint/participants/claude/driver"
	"github.com/stillpoint/stillpoint/sandboxd/relay"
)

var task = json.RawMessage(`{"task":"fix-add","prompt":"Make test.sh pass.","check":{"command":["sh","test.sh"]}}`)

func launchContext(t *testing.T, a *claude.Adapter, root string) agent.LaunchContext {
	t.Helper()
	st, err := a.NewState(agentapi.Request{RolloutID: "r1", Task: task})
	if err != nil {
		t.Fatal(err)
	}
	return agent.LaunchContext{Rollout: "r1", Attempt: 2, Task: task, State: st,
		Session: agent.SessionInfo{SandboxID: "sb1", Workdir: "/work", Root: root}}
}

func flag(argv []string, name string) string {
	i := slices.Index(argv, name)
	if i < 0 || i+1 >= len(argv) {
		return ""
	}
	return argv[i+1]
}

// A session id is a UUID fixed by the rollout and the folder's number.
func TestSessionID(t *testing.T) {
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	a, b := claude.SessionID("r1", 0), claude.SessionID("r1", 1)
	if !uuid.MatchString(a) || !uuid.MatchString(b) || a == b || a != claude.SessionID("r1", 0) || a == claude.SessionID("r2", 0) {
		t.Fatalf("%s %s", a, b)
	}
}

// A first launch is the driver's run in the rollout's session folder, with
// the prompt, the model and the headers that name the task and episode;
// a relaunch that continues is its continue, which names the relay edit
// that removes the continuation's prompt.
func TestCommand(t *testing.T) {
	a := &claude.Adapter{ModelURL: "http://127.0.0.1:9", Timeout: 5 * time.Minute, ToolTimeout: 3 * time.Hour}
	lc := launchContext(t, a, "")
	cmd, err := a.Command(lc)
	if err != nil {
		t.Fatal(err)
	}
	id := claude.SessionID("r1", 0)
	want := []string{"/opt/stillpoint/claude/claude-driver", "run", "--claude", "/opt/stillpoint/claude/claude",
		"--home", "/var/lib/stillpoint-claude/r1/0", "--work", "/work", "--session", id, "--prompt", "Make test.sh pass.",
		"--model-url", "http://127.0.0.1:9", "--header", "X-Stillpoint-Task=fix-add", "--header", "X-Stillpoint-Episode=r1-a2", "--tool-timeout", "3h0m0s"}
	if !slices.Equal(cmd.Argv, want) {
		t.Fatalf("argv\n%q\nwant\n%q", cmd.Argv, want)
	}
	env := strings.Join(cmd.Env, " ")
	if cmd.Dir != "/work" || cmd.Timeout != 5*time.Minute || len(cmd.RelayEdits) != 0 || !strings.Contains(env, "HOME=/var/lib/stillpoint-claude/r1/0") ||
		!strings.Contains(env, "PATH=/opt/stillpoint/claude:") {
		t.Fatalf("command %+v", cmd)
	}
	lc.Resume = true
	cmd, err = a.Command(lc)
	if err != nil || cmd.Argv[1] != "continue" || flag(cmd.Argv, "--session") != id || slices.Contains(cmd.Argv, "--prompt") ||
		!slices.Equal(cmd.RelayEdits, []string{relay.ClaudeContinueEdit}) {
		t.Fatalf("continue: %q %v %v", cmd.Argv, cmd.RelayEdits, err)
	}
	if _, err := relay.LookupEdits(cmd.RelayEdits); err != nil {
		t.Fatal(err)
	}
	lc = launchContext(t, a, "/srv/sb1")
	lc.ModelURL = "http://10.0.0.1:7"
	cmd, _ = a.Command(lc)
	if cmd.Argv[0] != "/srv/sb1/opt/stillpoint/claude/claude-driver" || flag(cmd.Argv, "--home") != "/srv/sb1/var/lib/stillpoint-claude/r1/0" ||
		cmd.Dir != "/srv/sb1/work" || flag(cmd.Argv, "--model-url") != "http://10.0.0.1:7" {
		t.Fatalf("in a dir sandbox, through a relay: %q in %s", cmd.Argv, cmd.Dir)
	}
}

// The resume decision is the driver's check: continuing keeps the folder
// and its session; starting over moves to a fresh folder and session.
// Without a model relay it starts over without asking: nothing would take
// the continuation's turn out.
func TestResumeDecision(t *testing.T) {
	a := &claude.Adapter{ModelURL: "http://127.0.0.1:9"}
	lc := launchContext(t, a, "")
	lc.Exec = func(context.Context, []string) (agent.ExecResult, error) {
		t.Fatal("the check ran without a relay")
		return agent.ExecResult{}, nil
	}
	d, err := a.ResumeDecision(t.Context(), lc)
	if err != nil || d.Continue || !strings.Contains(d.Reason, "no model relay") || !strings.Contains(string(d.State), `"fresh":1`) {
		t.Fatalf("without a relay: %+v %s %v", d, d.State, err)
	}
	lc.Relay = true
	var asked []string
	answer := ""
	lc.Exec = func(_ context.Context, argv []string) (agent.ExecResult, error) {
		asked = argv
		return agent.ExecResult{Output: answer + "\n"}, nil
	}
	b, _ := json.Marshal(driver.Decision{Continue: true, Reason: "ok", Session: claude.SessionID("r1", 0)})
	answer = string(b)
	d, err = a.ResumeDecision(t.Context(), lc)
	if err != nil || !d.Continue || d.State != nil {
		t.Fatalf("continue: %+v %v", d, err)
	}
	if asked[1] != "check" || flag(asked, "--prompt") != "Make test.sh pass." || flag(asked, "--session") != claude.SessionID("r1", 0) {
		t.Fatalf("check argv %q", asked)
	}
	b, _ = json.Marshal(driver.Decision{Reason: "no saved session"})
	answer = string(b)
	d, err = a.ResumeDecision(t.Context(), lc)
	want := `{"home":"/var/lib/stillpoint-claude/r1/1","fresh":1,"session":"` + claude.SessionID("r1", 1) + `"}`
	if err != nil || d.Continue || d.Reason != "no saved session" || string(d.State) != want {
		t.Fatalf("start over: %+v %s %v", d, d.State, err)
	}
	answer = "claude-driver check: boom"
	if _, err := a.ResumeDecision(t.Context(), lc); err == nil {
		t.Fatal("a check that printed no decision decides")
	}
}

// The answer is the summary's text; a failed launch is an error.
func TestAnswer(t *testing.T) {
	a := &claude.Adapter{}
	line := func(s driver.Summary) string {
		s.Kind = driver.SummaryKind
		return "{\"type\":\"result\"}\n" + string(s.Line()) + "\n"
	}
	ans, err := a.Answer(agent.LaunchContext{}, agent.ExecResult{Output: line(driver.Summary{Result: true, Stop: "end_turn", Text: "Fixed."})})
	if err != nil || string(ans) != `"Fixed."` {
		t.Fatalf("answer %s %v", ans, err)
	}
	_, err = a.Answer(agent.LaunchContext{}, agent.ExecResult{Output: line(driver.Summary{Result: true, Stop: "end_turn", Text: "x", Error: "the saved user turns changed"})})
	if !errors.Is(err, driver.ErrFailed) || !strings.Contains(err.Error(), "user turns changed") {
		t.Fatalf("a continuation that changed the user turns: %v", err)
	}
	if _, err := a.Answer(agent.LaunchContext{}, agent.ExecResult{ExitCode: 2, Output: "usage"}); !errors.Is(err, driver.ErrFailed) {
		t.Fatalf("no summary: %v", err)
	}
}

// Binds stages the two programs in one directory, shown at SandboxBinDir;
// Binary takes STILLPOINT_CLAUDE first, and says how to install.
func TestBindsAndBinary(t *testing.T) {
	dir := t.TempDir()
	exe := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Setenv(claude.BinaryEnv, exe("cl"))
	h, err := claude.Locate(exe("drv"))
	if err != nil || h.Claude != filepath.Join(dir, "cl") {
		t.Fatalf("%+v %v", h, err)
	}
	stage := filepath.Join(dir, "stage")
	for range 2 {
		binds, err := h.Binds(stage)
		if err != nil || len(binds) != 1 || binds[0].HostDir != stage || binds[0].SandboxDir != "opt/stillpoint/claude" {
			t.Fatalf("%+v %v", binds, err)
		}
	}
	ents, _ := os.ReadDir(stage)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"claude", "claude-driver"}) {
		t.Fatalf("staged %v", names)
	}
	t.Setenv(claude.BinaryEnv, filepath.Join(dir, "missing"))
	if _, err := claude.Binary(); !errors.Is(err, claude.ErrNotInstalled) || !strings.Contains(err.Error(), "npm install") {
		t.Fatalf("a missing binary: %v", err)
	}
}

// A task needs a prompt.
func TestParseTask(t *testing.T) {
	for _, bad := range []string{`{"task":"t"}`, `{"prompt":" "}`, `[]`, `{"prompt":"p","task":"a\nb"}`} {
		if _, err := claude.ParseTask(json.RawMessage(bad)); !errors.Is(err, claude.ErrTask) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}
