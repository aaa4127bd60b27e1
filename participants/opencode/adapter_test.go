package opencode_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/participants/agent"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/opencode"
	"github.com/stillpoint/stillpoint/participants/opencode/driver"
)

var task = json.RawMessage(`{"task":"fix-add","prompt":"Make test.sh pass.","check":{"command":["sh","test.sh"]}}`)

func launchContext(t *testing.T, a *opencode.Adapter, root string) agent.LaunchContext {
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

// A first launch is the driver's run in the rollout's session folder, with
// the prompt, the model and the headers that name the task and episode;
// a relaunch that continues is its continue, on the saved session.
func TestCommand(t *testing.T) {
	a := &opencode.Adapter{ModelURL: "http://127.0.0.1:9", Timeout: 5 * time.Minute, ToolTimeout: 3 * time.Hour}
	lc := launchContext(t, a, "")
	cmd, err := a.Command(lc)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/opt/stillpoint/opencode/opencode-driver", "run", "--opencode", "/opt/stillpoint/opencode/opencode",
		"--home", "/var/lib/stillpoint-opencode/r1/0", "--work", "/work", "--title", "r1", "--prompt", "Make test.sh pass.",
		"--model-url", "http://127.0.0.1:9", "--header", "X-Stillpoint-Task=fix-add", "--header", "X-Stillpoint-Episode=r1-a2", "--tool-timeout", "3h0m0s"}
	if !slices.Equal(cmd.Argv, want) {
		t.Fatalf("argv\n%q\nwant\n%q", cmd.Argv, want)
	}
	env := strings.Join(cmd.Env, " ")
	if cmd.Dir != "/work" || cmd.Timeout != 5*time.Minute || !strings.Contains(env, "PWD=/work") || !strings.Contains(env, "BASH_DEFAULT_TIMEOUT_MS=10800000") ||
		!strings.Contains(env, "XDG_DATA_HOME=/var/lib/stillpoint-opencode/r1/0/data") || !strings.Contains(env, "PATH=/opt/stillpoint/opencode:") {
		t.Fatalf("command %+v", cmd)
	}
	lc.Resume = true
	lc.State = json.RawMessage(`{"home":"/var/lib/stillpoint-opencode/r1/0","session":"ses_1"}`)
	cmd, err = a.Command(lc)
	if err != nil || cmd.Argv[1] != "continue" || flag(cmd.Argv, "--session") != "ses_1" || slices.Contains(cmd.Argv, "--prompt") {
		t.Fatalf("continue: %q %v", cmd.Argv, err)
	}
	// A sandbox whose processes see the host's paths (the dir provider).
	lc = launchContext(t, a, "/srv/sb1")
	cmd, _ = a.Command(lc)
	if cmd.Argv[0] != "/srv/sb1/opt/stillpoint/opencode/opencode-driver" || flag(cmd.Argv, "--home") != "/srv/sb1/var/lib/stillpoint-opencode/r1/0" || cmd.Dir != "/srv/sb1/work" {
		t.Fatalf("in a dir sandbox: %q in %s", cmd.Argv, cmd.Dir)
	}
}

// The resume decision is the driver's check: continuing keeps the folder
// and records the session; starting over moves to a fresh folder.
func TestResumeDecision(t *testing.T) {
	a := &opencode.Adapter{ModelURL: "http://127.0.0.1:9"}
	lc := launchContext(t, a, "")
	var asked []string
	answer := ""
	lc.Exec = func(_ context.Context, argv []string) (agent.ExecResult, error) {
		asked = argv
		return agent.ExecResult{Output: "Exporting session: ses_7\n" + answer + "\n"}, nil
	}
	b, _ := json.Marshal(driver.Decision{Continue: true, Reason: "ok", Session: "ses_7"})
	answer = string(b)
	d, err := a.ResumeDecision(t.Context(), lc)
	if err != nil || !d.Continue || string(d.State) != `{"home":"/var/lib/stillpoint-opencode/r1/0","session":"ses_7"}` {
		t.Fatalf("continue: %+v %s %v", d, d.State, err)
	}
	if asked[1] != "check" || flag(asked, "--prompt") != "Make test.sh pass." {
		t.Fatalf("check argv %q", asked)
	}
	b, _ = json.Marshal(driver.Decision{Reason: "no saved session"})
	answer = string(b)
	d, err = a.ResumeDecision(t.Context(), lc)
	if err != nil || d.Continue || d.Reason != "no saved session" || string(d.State) != `{"home":"/var/lib/stillpoint-opencode/r1/1","fresh":1}` {
		t.Fatalf("start over: %+v %s %v", d, d.State, err)
	}
	answer = "opencode-driver check: boom"
	if _, err := a.ResumeDecision(t.Context(), lc); err == nil {
		t.Fatal("a check that printed no decision decides")
	}
}

// The answer is the summary's text; a failed launch is an error.
func TestAnswer(t *testing.T) {
	a := &opencode.Adapter{}
	line := func(s driver.Summary) string {
		s.Kind = driver.SummaryKind
		b, _ := json.Marshal(s)
		return "{\"type\":\"text\"}\n" + string(b) + "\n"
	}
	ans, err := a.Answer(agent.LaunchContext{}, agent.ExecResult{Output: line(driver.Summary{Steps: 3, Finish: "stop", Text: "Fixed."})})
	if err != nil || string(ans) != `"Fixed."` {
		t.Fatalf("answer %s %v", ans, err)
	}
	_, err = a.Answer(agent.LaunchContext{}, agent.ExecResult{Output: line(driver.Summary{Steps: 1, Finish: "tool-calls", ToolErrors: []string{"edit: no match"}})})
	if !errors.Is(err, driver.ErrFailed) || !strings.Contains(err.Error(), "edit: no match") {
		t.Fatalf("a run that ended on a failed tool: %v", err)
	}
	if _, err := a.Answer(agent.LaunchContext{}, agent.ExecResult{ExitCode: 2, Output: "usage"}); !errors.Is(err, driver.ErrFailed) {
		t.Fatalf("no summary: %v", err)
	}
}

// A task needs a prompt; the rest of the payload is the owner's.
func TestParseTask(t *testing.T) {
	if tk, err := opencode.ParseTask(task); err != nil || tk.Name != "fix-add" || tk.Prompt != "Make test.sh pass." {
		t.Fatalf("%+v %v", tk, err)
	}
	for _, bad := range []string{`{"task":"t"}`, `{"prompt":" "}`, `[]`, `{"prompt":"p","task":"a\nb"}`} {
		if _, err := opencode.ParseTask(json.RawMessage(bad)); !errors.Is(err, opencode.ErrTask) {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

// Binds stages the three programs in one directory, shown at
// SandboxBinDir; Binary takes STILLPOINT_OPENCODE first.
func TestBindsAndBinary(t *testing.T) {
	dir := t.TempDir()
	exe := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Setenv(opencode.BinaryEnv, exe("oc"))
	t.Setenv(opencode.RipgrepEnv, exe("ripgrep"))
	h, err := opencode.Locate(exe("drv"))
	if err != nil || h.OpenCode != filepath.Join(dir, "oc") {
		t.Fatalf("%+v %v", h, err)
	}
	stage := filepath.Join(dir, "stage")
	for range 2 { // again, as a restarted owner does
		binds, err := h.Binds(stage)
		if err != nil || len(binds) != 1 || binds[0].HostDir != stage || binds[0].SandboxDir != "opt/stillpoint/opencode" {
			t.Fatalf("%+v %v", binds, err)
		}
	}
	ents, _ := os.ReadDir(stage)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"opencode", "opencode-driver", "rg"}) {
		t.Fatalf("staged %v", names)
	}
	t.Setenv(opencode.BinaryEnv, filepath.Join(dir, "missing"))
	if _, err := opencode.Binary(); !errors.Is(err, opencode.ErrNotInstalled) || !strings.Contains(err.Error(), "npm install") {
		t.Fatalf("a missing binary: %v", err)
	}
}
