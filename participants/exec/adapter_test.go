package exec

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/participants/agent"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/sandboxd"
	"github.com/stillpoint/stillpoint/sandboxd/relay"
)

const testSpec = `{
  "launch": {"argv": ["{sandbox_root}/bin/h", "run", "--prompt", "{prompt}", "--session={session}"],
             "env": {"URL": "{model_url}/v1", "TASK": "{task}", "EP": "{episode}", "R": "{rollout}:{attempt}"}},
  "continue": {"argv": ["{sandbox_root}/bin/h", "continue", "{session}"], "env": {"MORE": "1"}},
  "check": {"argv": ["{sandbox_root}/bin/h", "check", "{session}", "{prompt}"]},
  "answer": {"file": "out/answer.txt"}
}`

// prompt is a prompt no shell would pass through whole.
const prompt = "Fix it: \"quotes\", 'single', $HOME, `ticks`;\nand a second line\t{braces}"

func testAdapter(t *testing.T, spec string) *Adapter {
	t.Helper()
	s, err := ParseSpec("test.json", []byte(spec))
	if err != nil {
		t.Fatal(err)
	}
	return &Adapter{Spec: s, ModelURL: "http://model:8000/"}
}

func launchContext(t *testing.T, a *Adapter, root string) agent.LaunchContext {
	t.Helper()
	task, _ := json.Marshal(map[string]any{"task": "t-1", "prompt": prompt, "check": map[string]any{"command": []string{"true"}}})
	st, err := a.NewState(agentapi.Request{RolloutID: "r-1", Task: task})
	if err != nil {
		t.Fatal(err)
	}
	return agent.LaunchContext{Rollout: "r-1", Attempt: 2, Task: task, State: st,
		Session: agent.SessionInfo{SandboxID: "sb", Workdir: "/work", Root: root}}
}

func TestCommandFillsThePlaceholders(t *testing.T) {
	a := testAdapter(t, testSpec)
	lc := launchContext(t, a, "/")
	c, err := a.Command(lc)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/bin/h", "run", "--prompt", prompt, "--session=/var/lib/stillpoint-exec/r-1/0"}
	if !slices.Equal(c.Argv, want) {
		t.Fatalf("argv %q, want %q", c.Argv, want)
	}
	wantEnv := []string{"EP=r-1-a2", "R=r-1:2", "TASK=t-1", "URL=http://model:8000/v1", "PATH=" + DefaultPath}
	if !slices.Equal(c.Env, wantEnv) || c.Dir != "/work" {
		t.Fatalf("env %q dir %q, want %q in /work", c.Env, c.Dir, wantEnv)
	}
	// Continued, on a dir sandbox (its processes see host paths), through
	// the sandbox's relay.
	lc = launchContext(t, a, "/srv/sb/root/")
	lc.Resume, lc.ModelURL = true, "http://127.0.0.1:4100"
	c, err = a.Command(lc)
	if err != nil {
		t.Fatal(err)
	}
	want = []string{"/srv/sb/root/bin/h", "continue", "/srv/sb/root/var/lib/stillpoint-exec/r-1/0"}
	if !slices.Equal(c.Argv, want) || c.Dir != "/srv/sb/root/work" || !slices.Contains(c.Env, "URL=http://127.0.0.1:4100/v1") || !slices.Contains(c.Env, "MORE=1") {
		t.Fatalf("continue: argv %q env %q dir %q", c.Argv, c.Env, c.Dir)
	}
}

func TestTheTaskNameDefaultsToTheRollout(t *testing.T) {
	a := testAdapter(t, testSpec)
	lc := launchContext(t, a, "/")
	lc.Task = json.RawMessage(`{"prompt": "p"}`)
	c, err := a.Command(lc)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(c.Env, "TASK=r-1") {
		t.Fatalf("env %q", c.Env)
	}
	for _, bad := range []string{`{"task": "t"}`, `{"prompt": "a\u0000b"}`, `{"prompt": "p", "task": "a\nb"}`, `[]`} {
		if err := a.ValidateTask(json.RawMessage(bad)); err == nil {
			t.Errorf("task %s: no error", bad)
		}
	}
}

func TestResumeDecisionByTheCheck(t *testing.T) {
	a := testAdapter(t, testSpec)
	for _, c := range []struct {
		exit    int
		goOn    bool
		session string
		err     string
	}{
		{exit: 0, goOn: true},
		{exit: 1, session: "/var/lib/stillpoint-exec/r-1/1"},
		{exit: 2, err: "exited 2 (want 0 to continue, 1 to start over): one\nTraceback: why"},
	} {
		lc := launchContext(t, a, "/")
		var ran []string
		lc.Exec = func(_ context.Context, argv []string) (agent.ExecResult, error) {
			ran = argv
			return agent.ExecResult{ExitCode: c.exit, Output: "one\nTraceback: why\n"}, nil
		}
		d, err := a.ResumeDecision(context.Background(), lc)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("exit %d: error %v, want %q", c.exit, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"/bin/h", "check", "/var/lib/stillpoint-exec/r-1/0", prompt}; !slices.Equal(ran, want) {
			t.Fatalf("check argv %q, want %q", ran, want)
		}
		if d.Continue != c.goOn || d.Reason != "check: Traceback: why" {
			t.Errorf("exit %d: decision %+v", c.exit, d)
		}
		if c.session != "" {
			st, _ := parseState(d.State)
			if st.Session != c.session || st.Fresh != 1 {
				t.Errorf("exit %d: state %s, want %s", c.exit, d.State, c.session)
			}
		} else if d.State != nil {
			t.Errorf("exit %d: state %s, want none", c.exit, d.State)
		}
	}
}

// A continue that names relay edits starts over when no model relay
// would apply them; with one, the check decides.
func TestRelayEditsNeedARelay(t *testing.T) {
	relay.Register(relay.Edit{Name: "exec-adapter-test", Apply: func(_ string, b []byte) ([]byte, []json.RawMessage, error) { return b, nil, nil }})
	a := testAdapter(t, `{"launch": {"argv": ["/bin/h", "{prompt}"]}, "continue": {"argv": ["/bin/h", "--continue"], "relay_edits": ["exec-adapter-test"]},
		"check": {"argv": ["/bin/h", "check"]}, "answer": "last_line"}`)
	lc := launchContext(t, a, "/")
	checks := 0
	lc.Exec = func(context.Context, []string) (agent.ExecResult, error) {
		checks++
		return agent.ExecResult{Output: "ok\n"}, nil
	}
	d, err := a.ResumeDecision(context.Background(), lc)
	if err != nil || d.Continue || checks != 0 || !strings.Contains(d.Reason, "no model relay") {
		t.Fatalf("without a relay: %+v %v, %d checks", d, err, checks)
	}
	lc.Relay = true
	if d, err = a.ResumeDecision(context.Background(), lc); err != nil || !d.Continue || checks != 1 {
		t.Fatalf("with a relay: %+v %v, %d checks", d, err, checks)
	}
	lc.Resume = true
	if cmd, err := a.Command(lc); err != nil || !slices.Equal(cmd.RelayEdits, []string{"exec-adapter-test"}) {
		t.Fatalf("the continuation's edits: %+v %v", cmd, err)
	}
}

func TestNeverContinueStartsOver(t *testing.T) {
	a := testAdapter(t, minimal)
	lc := launchContext(t, a, "/")
	lc.Exec = func(context.Context, []string) (agent.ExecResult, error) {
		t.Fatal("a spec that never continues ran a check")
		return agent.ExecResult{}, nil
	}
	d, err := a.ResumeDecision(context.Background(), lc)
	if err != nil || d.Continue || !strings.Contains(string(d.State), "r-1/1") {
		t.Fatalf("decision %+v %v", d, err)
	}
	lc.Resume = true
	if _, err := a.Command(lc); err == nil {
		t.Fatal("a continue of a spec that never continues")
	}
	if a.PausesAtCheckpoints() != true {
		t.Fatal("pause defaults to true")
	}
	a.NoPause = true
	if a.PausesAtCheckpoints() {
		t.Fatal("--no-pause pauses")
	}
}

func TestAnswerFromTheLastLine(t *testing.T) {
	a := testAdapter(t, minimal)
	lc := launchContext(t, a, "/")
	ans, err := a.Answer(lc, agent.ExecResult{Output: "log line\nthe answer \n\n"})
	if err != nil || string(ans) != `"the answer"` {
		t.Fatalf("answer %s %v", ans, err)
	}
	if _, err := a.Answer(lc, agent.ExecResult{Output: " \n"}); err == nil {
		t.Fatal("an answer of no output")
	}
	if _, err := a.Answer(lc, agent.ExecResult{ExitCode: 3, Output: "half\n"}); err == nil || !strings.Contains(err.Error(), "exited 3") {
		t.Fatalf("a harness that failed: %v", err)
	}
}

func TestAnswerFromAFile(t *testing.T) {
	a := testAdapter(t, testSpec)
	lc := launchContext(t, a, "/root/sb")
	var out agent.ExecResult
	lc.Exec = func(_ context.Context, argv []string) (agent.ExecResult, error) {
		if want := []string{"cat", "--", "/root/sb/var/lib/stillpoint-exec/r-1/0/out/answer.txt"}; !slices.Equal(argv, want) {
			t.Fatalf("argv %q, want %q", argv, want)
		}
		return out, nil
	}
	out = agent.ExecResult{Output: "line one\nline two\n"}
	ans, err := a.Answer(lc, agent.ExecResult{Output: "whatever it printed"})
	if err != nil || string(ans) != `"line one\nline two"` {
		t.Fatalf("answer %s %v", ans, err)
	}
	out = agent.ExecResult{ExitCode: 1, Output: "cat: no such file"}
	if _, err := a.Answer(lc, agent.ExecResult{Output: "log"}); err == nil || !strings.Contains(err.Error(), "cat: no such file") {
		t.Fatalf("a missing answer: %v", err)
	}
	if maxAnswer != sandboxd.OutputTailBytes {
		t.Fatalf("maxAnswer %d is not the receipt's output tail, %d", maxAnswer, sandboxd.OutputTailBytes)
	}
	out = agent.ExecResult{Output: strings.Repeat("x", sandboxd.OutputTailBytes)}
	if _, err := a.Answer(lc, agent.ExecResult{}); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("an answer too long: %v", err)
	}
}
