package codex_test

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
	"github.com/stillpoint/stillpoint/participants/codex"
	"github.com/stillpoint/stillpoint/participants/codex/driver"
	"github.com/stillpoint/stillpoint/sandboxd/relay"
)

var task = json.RawMessage(`{"task":"fix-add","prompt":"Make test.sh pass.","check":{"command":["sh","test.sh"]}}`)

func launchContext(t *testing.T, a *codex.Adapter, root string) agent.LaunchContext {
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
// a relaunch that continues is its continue, on the saved thread, and
// names the relay edit that removes the empty user message.
func TestCommand(t *testing.T) {
	a := &codex.Adapter{ModelURL: "http://127.0.0.1:9", Timeout: 5 * time.Minute}
	lc := launchContext(t, a, "")
	cmd, err := a.Command(lc)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/opt/stillpoint/codex/codex-driver", "run", "--codex", "/opt/stillpoint/codex/codex",
		"--home", "/var/lib/stillpoint-codex/r1/0", "--work", "/work", "--prompt", "Make test.sh pass.",
		"--model-url", "http://127.0.0.1:9", "--header", "X-Stillpoint-Task=fix-add", "--header", "X-Stillpoint-Episode=r1-a2"}
	if !slices.Equal(cmd.Argv, want) {
		t.Fatalf("argv\n%q\nwant\n%q", cmd.Argv, want)
	}
	env := strings.Join(cmd.Env, " ")
	if cmd.Dir != "/work" || cmd.Timeout != 5*time.Minute || len(cmd.RelayEdits) != 0 || !strings.Contains(env, "CODEX_HOME=/var/lib/stillpoint-codex/r1/0/codex") ||
		!strings.Contains(env, "TMPDIR=/var/lib/stillpoint-codex/r1/0/tmp") || !strings.Contains(env, "PATH=/opt/stillpoint/codex:") {
		t.Fatalf("command %+v", cmd)
	}
	lc.Resume = true
	lc.State = json.RawMessage(`{"home":"/var/lib/stillpoint-codex/r1/0","thread":"th-1"}`)
	cmd, err = a.Command(lc)
	if err != nil || cmd.Argv[1] != "continue" || flag(cmd.Argv, "--session") != "th-1" || slices.Contains(cmd.Argv, "--prompt") ||
		!slices.Equal(cmd.RelayEdits, []string{relay.CodexEmptyTurn}) {
		t.Fatalf("continue: %q %v %v", cmd.Argv, cmd.RelayEdits, err)
	}
	if _, err := relay.LookupEdits(cmd.RelayEdits); err != nil {
		t.Fatal(err)
	}
	// A sandbox whose processes see the host's paths (the dir provider).
	lc = launchContext(t, a, "/srv/sb1")
	cmd, _ = a.Command(lc)
	if cmd.Argv[0] != "/srv/sb1/opt/stillpoint/codex/codex-driver" || flag(cmd.Argv, "--home") != "/srv/sb1/var/lib/stillpoint-codex/r1/0" || cmd.Dir != "/srv/sb1/work" {
		t.Fatalf("in a dir sandbox: %q in %s", cmd.Argv, cmd.Dir)
	}
}

// The resume decision is the driver's check: continuing keeps the folder
// and records the thread; starting over moves to a fresh folder. Without
// a model relay it starts over without asking: nothing would take the
// continuation's empty user message out.
func TestResumeDecision(t *testing.T) {
	a := &codex.Adapter{ModelURL: "http://127.0.0.1:9"}
	lc := launchContext(t, a, "")
	lc.Exec = func(context.Context, []string) (agent.ExecResult, error) {
		t.Fatal("the check ran without a relay")
		return agent.ExecResult{}, nil
	}
	d, err := a.ResumeDecision(t.Context(), lc)
	if err != nil || d.Continue || !strings.Contains(d.Reason, "no model relay") || string(d.State) != `{"home":"/var/lib/stillpoint-codex/r1/1","fresh":1}` {
		t.Fatalf("without a relay: %+v %s %v", d, d.State, err)
	}
	lc.Relay = true
	var asked []string
	answer := ""
	lc.Exec = func(_ context.Context, argv []string) (agent.ExecResult, error) {
		asked = argv
		return agent.ExecResult{Output: answer + "\n"}, nil
	}
	b, _ := json.Marshal(driver.Decision{Continue: true, Reason: "ok", Thread: "th-7"})
	answer = string(b)
	d, err = a.ResumeDecision(t.Context(), lc)
	if err != nil || !d.Continue || string(d.State) != `{"home":"/var/lib/stillpoint-codex/r1/0","thread":"th-7"}` {
		t.Fatalf("continue: %+v %s %v", d, d.State, err)
	}
	if asked[1] != "check" || flag(asked, "--prompt") != "Make test.sh pass." {
		t.Fatalf("check argv %q", asked)
	}
	b, _ = json.Marshal(driver.Decision{Reason: "no saved session"})
	answer = string(b)
	d, err = a.ResumeDecision(t.Context(), lc)
	if err != nil || d.Continue || d.Reason != "no saved session" || string(d.State) != `{"home":"/var/lib/stillpoint-codex/r1/1","fresh":1}` {
		t.Fatalf("start over: %+v %s %v", d, d.State, err)
	}
	answer = "codex-driver check: boom"
	if _, err := a.ResumeDecision(t.Context(), lc); err == nil {
		t.Fatal("a check that printed no decision decides")
	}
}

// The answer is the summary's text; a failed launch is an error.
func TestAnswer(t *testing.T) {
	a := &codex.Adapter{}
	line := func(s driver.Summary) string {
		s.Kind = driver.SummaryKind
		return "{\"type\":\"turn.started\"}\n" + string(s.Line()) + "\n"
	}
	ans, err := a.Answer(agent.LaunchContext{}, agent.ExecResult{Output: line(driver.Summary{Turns: 1, Text: "Fixed."})})
	if err != nil || string(ans) != `"Fixed."` {
		t.Fatalf("answer %s %v", ans, err)
	}
	_, err = a.Answer(agent.LaunchContext{}, agent.ExecResult{Output: line(driver.Summary{Error: "turn.failed: stream disconnected"})})
	if !errors.Is(err, driver.ErrFailed) || !strings.Contains(err.Error(), "stream disconnected") {
		t.Fatalf("a failed turn: %v", err)
	}
	if _, err := a.Answer(agent.LaunchContext{}, agent.ExecResult{ExitCode: 2, Output: "usage"}); !errors.Is(err, driver.ErrFailed) {
		t.Fatalf("no summary: %v", err)
	}
}

// Binds stages the two programs in one directory, shown at SandboxBinDir;
// Binary takes STILLPOINT_CODEX first, and finds the npm install.
func TestBindsAndBinary(t *testing.T) {
	dir := t.TempDir()
	exe := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	t.Setenv(codex.BinaryEnv, exe("cx"))
	h, err := codex.Locate(exe("drv"))
	if err != nil || h.Codex != filepath.Join(dir, "cx") {
		t.Fatalf("%+v %v", h, err)
	}
	stage := filepath.Join(dir, "stage")
	for range 2 { // again, as a restarted owner does
		binds, err := h.Binds(stage)
		if err != nil || len(binds) != 1 || binds[0].HostDir != stage || binds[0].SandboxDir != "opt/stillpoint/codex" {
			t.Fatalf("%+v %v", binds, err)
		}
	}
	ents, _ := os.ReadDir(stage)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if !slices.Equal(names, []string{"codex", "codex-driver"}) {
		t.Fatalf("staged %v", names)
	}
	t.Setenv(codex.BinaryEnv, filepath.Join(dir, "missing"))
	if _, err := codex.Binary(); !errors.Is(err, codex.ErrNotInstalled) || !strings.Contains(err.Error(), "npm install") {
		t.Fatalf("a missing binary: %v", err)
	}
	t.Setenv(codex.BinaryEnv, "")
	if p, err := codex.Binary(); err != nil || !strings.HasSuffix(p, "/bin/codex") {
		t.Fatalf("the installed Codex: %s %v (%s)", p, err, codex.InstallHint)
	}
}
