package scripted

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/participants/agent"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/owner"
	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/dir"
)

func TestMain(m *testing.M) {
	leak.VerifyTestMain(m)
}

// task is a scripted task payload whose check reads out/answer.txt.
func task(t *testing.T, expect string) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(Task{Script: "t1", Prompt: "write the answer",
		Check: &Check{Command: []string{"sh", "-c", "cat out/answer.txt"}, Expect: expect}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A payload without a single-line script name, or with a check that runs
// nothing, is not a task; the adapter and the kind refuse it.
func TestParseTaskRefusesBadPayloads(t *testing.T) {
	for _, raw := range []string{`[1]`, `{"prompt":"no name"}`, `{"task":"a\nb"}`, `{"task":"t","check":{"expect":"x"}}`,
		`{"task":"t","files":{"../escape":"x"}}`, `{"task":"t","files":{"/etc/passwd":"x"}}`, `{"task":"t","files":{".":"x"}}`} {
		if _, err := ParseTask(json.RawMessage(raw)); !errors.Is(err, ErrTask) {
			t.Errorf("ParseTask(%s) = %v, want ErrTask", raw, err)
		}
		if err := (&Adapter{}).ValidateTask(json.RawMessage(raw)); err == nil {
			t.Errorf("the adapter takes %s", raw)
		}
	}
	if err := (&Adapter{}).ValidateTask(json.RawMessage(`{"task":"t","prompt":"p"}`)); err != nil {
		t.Errorf("the adapter refuses a task without a check (its grade is the owner's): %v", err)
	}
}

// The owner's kind needs the check: a task without one is refused at seed.
// Its sandbox runs sandboxd first, in Workdir, with the harness copied in,
// or bound with the binaries directory.
func TestKindSpec(t *testing.T) {
	k := Kind{Sandboxd: owner.SandboxdConfig{Binary: "/host/bin/sandboxd", NATSURL: "nats://127.0.0.1:4222", Run: "r"},
		Harness: "/host/bin/scripted-harness"}
	ep := events.Episode{Rollout: "task-1", Attempt: 2}
	if _, err := k.Spec("task-1", ep, json.RawMessage(`{"task":"t1","prompt":"p"}`)); !errors.Is(err, ErrNoCheck) {
		t.Fatalf("Spec of a task without a check: %v, want ErrNoCheck", err)
	}
	s, err := k.Spec("task-1", ep, task(t, "42"))
	if err != nil {
		t.Fatal(err)
	}
	if s.ID != "sb-task-1-a2" || s.Workdir != Workdir || len(s.Init) == 0 || s.Init[0] != owner.SandboxdPath {
		t.Fatalf("spec %+v", s)
	}
	if !slices.ContainsFunc(s.CopyIn, func(c provider.CopyIn) bool { return c.SandboxPath == HarnessPath[1:] }) {
		t.Errorf("the harness is not copied in: %+v", s.CopyIn)
	}
	k.Sandboxd.BinDir = "/host/bin"
	if s, err = k.Spec("task-1", ep, task(t, "42")); err != nil {
		t.Fatal(err)
	}
	if len(s.CopyIn) != 0 || len(s.Binds) != 1 || s.Init[0] != owner.BinDir+"/sandboxd" {
		t.Errorf("with the bound binaries directory: copy-in %+v, binds %+v, init %v", s.CopyIn, s.Binds, s.Init)
	}
	withFiles := json.RawMessage(`{"task":"t1","prompt":"p","check":{"command":["sh","test.sh"]},"files":{"calc.sh":"add","lib/x.sh":"x"}}`)
	if s, err = k.Spec("task-1", ep, withFiles); err != nil || string(s.Files["work/calc.sh"]) != "add" || string(s.Files["work/lib/x.sh"]) != "x" {
		t.Errorf("the task's files are not in the working directory: %v %v", s.Files, err)
	}
	if f := k.ForkSpec(provider.Spec{ID: "fork"}); len(f.Init) == 0 || !slices.Contains(f.Init, "fork") {
		t.Errorf("a fork does not start sandboxd under its own id: %v", f.Init)
	}
}

// The grade runs the check the setup pinned into the session data, in a
// real sandbox: reward 0 with what the sandbox holds until the answer is
// there, then 1. A session whose data holds no check cannot be graded.
func TestKindGradesThePinnedCheck(t *testing.T) {
	ctx := t.Context()
	p, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sb, err := p.Start(ctx, provider.Spec{ID: "sb1", Workdir: Workdir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(context.Background(), sb.ID); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	var k Kind
	data, err := k.Setup(ctx, p, &owner.Session{ID: "s1"}, task(t, "42"))
	if err != nil {
		t.Fatal(err)
	}
	s := &owner.Session{ID: "s1", Sandbox: sb, Workdir: Workdir, Data: data}
	grade := func() Verdict {
		t.Helper()
		raw, err := k.Grade(ctx, p, s)
		if err != nil {
			t.Fatal(err)
		}
		var v Verdict
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := grade(); v.Reward != 0 || v.Detail == "" {
		t.Fatalf("grade before the answer: %+v", v)
	}
	if res, err := p.Exec(ctx, sb.ID, []string{"sh", "-c", "mkdir -p out && echo '  42 ' > out/answer.txt"}, provider.ExecOptions{}); err != nil || res.ExitCode != 0 {
		t.Fatalf("write the answer: %v %+v", err, res)
	}
	if v := grade(); v.Reward != 1 {
		t.Fatalf("grade with the answer: %+v", v)
	}
	if _, err := k.Setup(ctx, p, &owner.Session{ID: "s2"}, json.RawMessage(`{"task":"t1"}`)); !errors.Is(err, ErrNoCheck) {
		t.Errorf("setup of a task without a check: %v, want ErrNoCheck", err)
	}
	if _, err := k.Grade(ctx, p, &owner.Session{ID: "s3", Sandbox: sb}); !errors.Is(err, ErrNoCheck) {
		t.Errorf("grade of a session without a check: %v, want ErrNoCheck", err)
	}
}

// The adapter launches the harness with the task's prompt, or with
// --continue on a relaunch, with every path as the sandbox's processes see
// it.
func TestAdapterCommand(t *testing.T) {
	a := &Adapter{Binary: HarnessPath, ModelURL: "http://model"}
	raw := task(t, "42")
	state, err := a.NewState(agentapi.Request{RolloutID: "task-1", Task: raw})
	if err != nil {
		t.Fatal(err)
	}
	lc := agent.LaunchContext{Rollout: "task-1", Attempt: 1, Task: raw, State: state,
		Session: ownerapi.SessionInfo{Workdir: Workdir, Root: "/srv/sb1"}}
	cmd, err := a.Command(lc)
	if err != nil {
		t.Fatal(err)
	}
	argv := strings.Join(cmd.Argv, " ")
	for _, want := range []string{"/srv/sb1" + HarnessPath, "--task t1", "--prompt write the answer", "--work /srv/sb1/work", "--episode task-1-a1"} {
		if !strings.Contains(argv, want) {
			t.Errorf("argv %q lacks %q", argv, want)
		}
	}
	lc.Resume = true
	if cmd, err = a.Command(lc); err != nil || !slices.Contains(cmd.Argv, "--continue") || slices.Contains(cmd.Argv, "--prompt") {
		t.Errorf("relaunch argv %q, %v", cmd.Argv, err)
	}
}
