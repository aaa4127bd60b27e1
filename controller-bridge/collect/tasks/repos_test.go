package tasks

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/internal/testcpu"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/owner/commandkind"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

// checkout puts task's workspace into a fresh directory on this host, as
// the command kind puts it into a sandbox.
func checkout(t *testing.T, ws commandkind.Workspace) string {
	t.Helper()
	dir := t.TempDir()
	var cmd *exec.Cmd
	switch {
	case ws.Dir != "":
		cmd = exec.Command("cp", "-a", ws.Dir+"/.", dir)
	case ws.Tarball != "":
		cmd = exec.Command("tar", "-x", "-z", "-f", ws.Tarball, "-C", dir)
	case ws.Git != "":
		cmd = exec.Command("sh", "-c", `git clone -q "$1" "$2" && git -C "$2" checkout -q --detach "$3"`, "sh", ws.Git, dir, ws.Commit)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
	}
	return dir
}

// run runs argv in dir with env, as the kind runs setup and verify.
func run(t *testing.T, dir string, env []string, argv []string) (string, int) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return out.String(), ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%v: %v", argv, err)
	}
	return out.String(), 0
}

// Every repository of the set, checked out on this host: its setup runs,
// its verify fails as it comes, and passes after the fix its model script
// applies; the control task's script applies none. The scripts of both
// harnesses are run: the scripted harness's bash calls in a shell,
// OpenCode's read, edit, write and bash (and Claude Code's Read, Edit,
// Write and Bash) as those tools do them (the e2e tests run them in the
// real OpenCode and Claude Code).
func TestReposSolve(t *testing.T) {
	tier.Long(t) // it runs every repository's tests, Go's included, four times
	testcpu.Take(t, 1)
	for _, h := range []string{HarnessScripted, HarnessOpenCode, HarnessClaude} {
		t.Run(h, func(t *testing.T) { testReposSolve(t, h) })
	}
}

// apply does a tool call of harness h in dir, as the harness would.
func apply(t *testing.T, h, dir string, tc modelserver.ToolCall) {
	t.Helper()
	var a struct{ Command, FilePath, OldString, NewString, Content string }
	if err := json.Unmarshal([]byte(tc.Function.Arguments), &a); err != nil {
		t.Fatalf("tool call %+v: %v", tc, err)
	}
	name := tc.Function.Name
	if h == HarnessClaude { // Claude's tools are OpenCode's, named and keyed otherwise
		var c struct {
			FilePath  string `json:"file_path"`
			OldString string `json:"old_string"`
			NewString string `json:"new_string"`
		}
		_ = json.Unmarshal([]byte(tc.Function.Arguments), &c)
		a.FilePath, a.OldString, a.NewString = c.FilePath, c.OldString, c.NewString
		name, h = strings.ToLower(name), HarnessOpenCode
	}
	p := filepath.Join(dir, a.FilePath)
	switch {
	case name == "bash" && a.Command != "":
		run(t, dir, nil, []string{"/bin/sh", "-c", a.Command})
	case h == HarnessOpenCode && name == "read":
		if _, err := os.ReadFile(p); err != nil {
			t.Fatalf("read %s: %v", a.FilePath, err)
		}
	case h == HarnessOpenCode && name == "edit":
		b, err := os.ReadFile(p)
		if err != nil || strings.Count(string(b), a.OldString) != 1 {
			t.Fatalf("edit %s: %q is not there once (%v)", a.FilePath, a.OldString, err)
		}
		if err := os.WriteFile(p, []byte(strings.Replace(string(b), a.OldString, a.NewString, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
	case h == HarnessOpenCode && name == "write":
		if err := os.WriteFile(p, []byte(a.Content), 0o644); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("tool call %+v is not one of the %s harness's", tc, h)
	}
}

func testReposSolve(t *testing.T, h string) {
	ts, script, err := Repos(RepoOptions{Dir: t.TempDir(), Harness: h})
	if err != nil {
		t.Fatal(err)
	}
	tools := map[string]bool{}
	var ids []string
	langs := map[string]int{}
	for _, tk := range ts {
		ids = append(ids, tk.RolloutID)
		ct, err := commandkind.ParseTask(tk.Task)
		if err != nil {
			t.Fatalf("%s: %v", tk.RolloutID, err)
		}
		langs[ct.Verify.Command[0]]++
		dir := checkout(t, ct.Workspace)
		var data map[string]json.RawMessage
		for _, s := range ct.Setup {
			out, code := run(t, dir, ct.Env, s.Command)
			if code != 0 {
				t.Fatalf("%s: setup %v exited %d: %s", tk.RolloutID, s.Command, code, out)
			}
			lines := strings.Split(strings.TrimSpace(out), "\n")
			if err := json.Unmarshal([]byte(lines[len(lines)-1]), &data); err != nil {
				t.Fatalf("%s: setup %v printed no JSON object: %s", tk.RolloutID, s.Command, out)
			}
		}
		setup, _ := json.Marshal(data)
		env := append(slices.Clone(ct.Env), commandkind.SessionDataEnv+"="+string(setup))
		graded := func() bool {
			out, code := run(t, dir, env, ct.Verify.Command)
			if ct.Verify.Reward == commandkind.RewardJSON {
				lines := strings.Split(strings.TrimSpace(out), "\n")
				var v struct{ Reward float64 }
				if err := json.Unmarshal([]byte(lines[len(lines)-1]), &v); err != nil {
					t.Fatalf("%s: the verify printed no reward: %s", tk.RolloutID, out)
				}
				return v.Reward == 1
			}
			return code == 0
		}
		if graded() {
			t.Errorf("%s: the verify passes before the fix", tk.RolloutID)
		}
		turns := script[tk.RolloutID]
		if len(turns) < 3 || turns[len(turns)-1].Content == "" || len(turns[len(turns)-1].ToolCalls) != 0 {
			t.Fatalf("%s: script %+v", tk.RolloutID, turns)
		}
		for _, turn := range turns {
			for _, tc := range turn.ToolCalls {
				tools[tc.Function.Name] = true
				apply(t, h, dir, tc)
			}
		}
		if fixed := graded(); fixed == (tk.RolloutID == ControlID) {
			t.Errorf("%s: after its script, the verify passes: %v", tk.RolloutID, fixed)
		}
	}
	if !slices.Equal(ids, RepoNames()) || len(ids) < 9 {
		t.Errorf("tasks %v, want RepoNames %v", ids, RepoNames())
	}
	if langs["python3"] < 4 || langs["sh"] < 2 || langs["go"] < 2 {
		t.Errorf("verify programs %v: want Python, shell and Go repositories", langs)
	}
	if want := map[string]bool{"bash": true}; h == HarnessOpenCode {
		if !tools["read"] || !tools["edit"] || !tools["write"] || !tools["bash"] {
			t.Errorf("OpenCode's scripts use %v: want read, edit, write and bash", tools)
		}
	} else if h == HarnessClaude {
		if !tools["Read"] || !tools["Edit"] || !tools["Write"] || !tools["Bash"] {
			t.Errorf("Claude's scripts use %v: want Read, Edit, Write and Bash", tools)
		}
	} else if !maps.Equal(tools, want) {
		t.Errorf("the scripted harness's scripts use %v: want bash alone", tools)
	}
}

// A harness the set has no script for is an error naming it.
func TestReposUnknownHarness(t *testing.T) {
	if _, _, err := Repos(RepoOptions{Dir: t.TempDir(), Harness: "aider"}); err == nil || !strings.Contains(err.Error(), `"aider"`) {
		t.Fatalf("Repos with harness aider: %v", err)
	}
}

// Write puts each task's turns beside its payload; the model server reads
// them back.
func TestWriteReadsBack(t *testing.T) {
	ts, script := Set(Options{N: 3})
	var buf bytes.Buffer
	if err := Write(&buf, ts, script); err != nil {
		t.Fatal(err)
	}
	got, err := modelserver.LoadTasks(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || len(got[ID(2)]) != len(script[ID(2)]) {
		t.Fatalf("read back %d scripts", len(got))
	}
	if err := Write(&buf, ts, modelserver.Script{}); err == nil {
		t.Fatal("Write of tasks without turns succeeded")
	}
	if _, err := os.Stat(filepath.Join("testdata", "repos", "py-calc", "calc.py")); err != nil {
		t.Fatal(err)
	}
}
