package commandkind

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/participants/owner"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/dir"
	"github.com/stillpoint/stillpoint/participants/owner/provider/overlay"
)

func TestMain(m *testing.M) {
	leak.VerifyTestMain(m, jstest.LeakOptions()...)
}

// testProvider is what the tests ask of the local providers.
type testProvider interface {
	owner.Provider
	owner.Snapshotter
	owner.Execer
	Sandboxes() []string
	Snapshots() ([]string, error)
}

// forEachProvider runs fn with the dir provider and the overlay provider
// (root, overlayfs, cgroup v2); each fails the test if it keeps a sandbox
// or a snapshot.
func forEachProvider(t *testing.T, fn func(t *testing.T, p testProvider)) {
	check := func(t *testing.T, p testProvider) {
		t.Cleanup(func() {
			ctx := context.Background()
			if ids := p.Sandboxes(); len(ids) > 0 {
				t.Errorf("sandboxes left: %v", ids)
				for _, id := range ids {
					_ = p.Stop(ctx, id)
				}
			}
			snaps, _ := p.Snapshots()
			for _, id := range snaps {
				_ = p.DeleteSnapshot(ctx, id)
			}
		})
	}
	t.Run("dir", func(t *testing.T) {
		d, err := dir.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		check(t, d)
		fn(t, d)
	})
	t.Run("overlay", func(t *testing.T) {
		o, err := overlay.New(overlay.Config{StateDir: t.TempDir()})
		if err != nil {
			t.Fatalf("overlay provider (run as root on Linux with overlayfs and cgroup v2): %v", err)
		}
		check(t, o)
		fn(t, o)
	})
}

// writeTree writes files (path → content; a content starting "->" is a
// symbolic link to the rest) under dir.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		if target, ok := strings.CutPrefix(c, "->"); ok {
			err = os.Symlink(target, full)
		} else {
			err = os.WriteFile(full, []byte(c), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// noPyc keeps Python from reading or writing .pyc files in the sandbox: a
// fix of the same size made in the same second as a run would otherwise
// be graded from the stale bytecode of the buggy file.
var noPyc = []string{"PYTHONDONTWRITEBYTECODE=1", "PYTHONPYCACHEPREFIX=/nonexistent/pycache"}

const (
	buggyCalc = "def add(a, b):\n    return a - b\n"
	testCalc  = `import unittest

from calc import add


class TestAdd(unittest.TestCase):
    def test_add(self):
        self.assertEqual(add(2, 3), 5)


if __name__ == "__main__":
    unittest.main()
`
	// cheat is a test file the agent could write to pass anything.
	cheat = "import unittest\n\n\nclass T(unittest.TestCase):\n    def test(self):\n        pass\n"
)

// calcRepo returns a workspace directory holding the buggy calc.py and
// its test.
func calcRepo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	writeTree(t, dir, map[string]string{"calc.py": buggyCalc, "test_calc.py": testCalc})
	return dir
}

func payload(t *testing.T, tk Task) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(tk)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// session starts the task's sandbox and sets it up, as the owner would.
func session(t *testing.T, k Kind, p testProvider, id string, raw json.RawMessage) (*owner.Session, error) {
	t.Helper()
	ctx := t.Context()
	spec, err := k.Spec(id, events.Episode{Rollout: id}, raw)
	if err != nil {
		return nil, err
	}
	sb, err := p.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(context.Background(), sb.ID); err != nil {
			t.Errorf("stop %s: %v", sb.ID, err)
		}
	})
	s := &owner.Session{ID: id, Sandbox: sb, Workdir: spec.Workdir}
	data, err := k.Setup(ctx, p, s, raw)
	if err != nil {
		return nil, err
	}
	s.Data = data
	return s, nil
}

// sh runs a script in the session's working directory and returns its
// stdout.
func sh(t *testing.T, p testProvider, s *owner.Session, script string) string {
	t.Helper()
	res, err := p.Exec(t.Context(), s.Sandbox.ID, []string{"sh", "-c", script},
		provider.ExecOptions{Dir: filepath.Join(s.Sandbox.ProcRoot, s.Workdir)})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec %q: %v (exit %d, stderr %s)", script, err, res.ExitCode, res.Stderr)
	}
	return string(res.Stdout)
}

func grade(t *testing.T, k Kind, p testProvider, s *owner.Session) Verdict {
	t.Helper()
	raw, err := k.Grade(t.Context(), p, s)
	if err != nil {
		t.Fatalf("Grade: %v", err)
	}
	var v Verdict
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("verdict %s: %v", raw, err)
	}
	return v
}

// The grade runs the real tests against the files setup pinned: a test
// file the agent rewrote is written back before the verify, so only the
// fix gets reward 1. The setup's JSON lines are merged into the session
// data.
func TestGradeRunsTheTestsSetupPinned(t *testing.T) {
	forEachProvider(t, func(t *testing.T, p testProvider) {
		var k Kind
		raw := payload(t, Task{Name: "py-calc", Prompt: "fix calc.py", Workspace: Workspace{Dir: calcRepo(t)},
			Setup: []Step{
				{Command: []string{"sh", "-c", `echo preparing; echo '{"seed": 7, "a": 1}'`}},
				{Command: []string{"sh", "-c", `echo '{"seed": 8}'`}, Timeout: "30s"},
				{Command: []string{"sh", "-c", "echo not json"}},
			},
			Pin: []string{"test_calc.py"}, Env: noPyc,
			Verify: Verify{Command: []string{"python3", "-m", "unittest", "-v"}}})
		s, err := session(t, k, p, "s1", raw)
		if err != nil {
			t.Fatal(err)
		}
		var d Data
		if err := json.Unmarshal(s.Data, &d); err != nil {
			t.Fatal(err)
		}
		if string(d.Setup) != `{"a":1,"seed":8}` || len(d.Pinned) == 0 || d.Kind != "command" {
			t.Fatalf("session data %s", s.Data)
		}
		if v := grade(t, k, p, s); v.Reward != 0 || v.ExitCode == 0 || !strings.Contains(v.Output, "FAILED") {
			t.Fatalf("grade of the buggy code: %+v", v)
		}
		sh(t, p, s, "cat > test_calc.py <<'EOF'\n"+cheat+"EOF\nrm -f calc.py")
		if v := grade(t, k, p, s); v.Reward != 0 {
			t.Fatalf("grade after the agent rewrote the test: %+v", v)
		}
		if got := sh(t, p, s, "cat test_calc.py"); got != testCalc {
			t.Fatalf("the pinned test was not written back:\n%s", got)
		}
		sh(t, p, s, `printf 'def add(a, b):\n    return a + b\n' > calc.py`)
		if v := grade(t, k, p, s); v.Reward != 1 || v.ExitCode != 0 || !strings.Contains(v.Output, "OK") {
			t.Fatalf("grade of the fix: %+v", v)
		}
	})
}

// A JSON verify's reward is the number it prints; it reads the setup's
// data from STILLPOINT_SESSION_DATA. A verify that runs out of time gets 0
// and says so.
func TestJSONRewardSessionDataAndTimeout(t *testing.T) {
	forEachProvider(t, func(t *testing.T, p testProvider) {
		var k Kind
		script := `import json, os; d = json.loads(os.environ["STILLPOINT_SESSION_DATA"]); print(json.dumps({"reward": d["seed"] / 10, "env": os.environ["MODE"]}))`
		raw := payload(t, Task{Name: "json", Prompt: "p", Env: []string{"MODE=strict"},
			Setup:  []Step{{Command: []string{"sh", "-c", `echo '{"seed": 5}'`}}},
			Verify: Verify{Command: []string{"python3", "-c", script}, Reward: RewardJSON}})
		s, err := session(t, k, p, "s1", raw)
		if err != nil {
			t.Fatal(err)
		}
		if v := grade(t, k, p, s); v.Reward != 0.5 || string(v.Result) != `{"reward":0.5,"env":"strict"}` {
			t.Fatalf("json grade: %+v", v)
		}
		raw = payload(t, Task{Name: "silent", Prompt: "p", Verify: Verify{Command: []string{"true"}, Reward: RewardJSON}})
		if s, err = session(t, k, p, "s2", raw); err != nil {
			t.Fatal(err)
		}
		if v := grade(t, k, p, s); v.Reward != 0 || !strings.Contains(v.Detail, "no JSON object") {
			t.Fatalf("a json verify that prints nothing: %+v", v)
		}
		raw = payload(t, Task{Name: "slow", Prompt: "p", Verify: Verify{Command: []string{"sleep", "30"}, Timeout: "300ms"}})
		if s, err = session(t, k, p, "s3", raw); err != nil {
			t.Fatal(err)
		}
		if v := grade(t, k, p, s); v.Reward != 0 || !strings.Contains(v.Detail, "timed out") || v.TookMS >= 10_000 {
			t.Fatalf("a verify past its timeout: %+v", v)
		}
	})
}

// A tarball (gzip, with a subdirectory and a link) is extracted into the
// working directory; a git workspace is a clone checked out at the commit,
// .git included, with no remote.
func TestTarballAndGitWorkspaces(t *testing.T) {
	src := t.TempDir()
	writeTree(t, src, map[string]string{"pkg/a.txt": "A\n", "link": "->pkg/a.txt", "top.txt": "top\n"})
	tgz := filepath.Join(t.TempDir(), "ws.tar.gz")
	writeTarGz(t, src, tgz)
	gitBin, err := exec.LookPath("git")
	if err != nil {
		t.Fatal("the git workspace test needs git: apt-get install git")
	}
	repo := t.TempDir()
	git := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(gitBin, append([]string{"-C", repo, "-c", "user.name=t", "-c", "user.email=t@example.com"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git("init", "-q")
	writeTree(t, repo, map[string]string{"v.txt": "one\n"})
	git("add", "-A")
	git("commit", "-q", "-m", "one")
	first := git("rev-parse", "HEAD")
	if err := os.WriteFile(filepath.Join(repo, "v.txt"), []byte("two\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git("commit", "-q", "-am", "two")

	forEachProvider(t, func(t *testing.T, p testProvider) {
		var k Kind
		s, err := session(t, k, p, "tb", payload(t, Task{Name: "tb", Prompt: "p", Workspace: Workspace{Tarball: tgz},
			Verify: Verify{Command: []string{"true"}}}))
		if err != nil {
			t.Fatal(err)
		}
		if got := sh(t, p, s, "cat top.txt link pkg/a.txt; readlink link"); got != "top\nA\nA\npkg/a.txt\n" {
			t.Fatalf("tarball workspace: %q", got)
		}
		s, err = session(t, k, p, "git", payload(t, Task{Name: "git", Prompt: "p", Workspace: Workspace{Git: repo, Commit: first[:12]},
			Verify: Verify{Command: []string{"true"}}}))
		if err != nil {
			t.Fatal(err)
		}
		if got := sh(t, p, s, "cat v.txt; git rev-parse HEAD; git remote | wc -l"); got != "one\n"+first+"\n0\n" {
			t.Fatalf("git workspace at %s: %q", first, got)
		}
		if _, err := session(t, k, p, "nogit", payload(t, Task{Name: "g", Prompt: "p", Workspace: Workspace{Git: repo, Commit: "0123456789abc"},
			Verify: Verify{Command: []string{"true"}}})); !errors.Is(err, ErrSetup) || !strings.Contains(err.Error(), "workspace.commit") {
			t.Fatalf("a commit the repository does not have: %v", err)
		}
	})
}

func writeTarGz(t *testing.T, src, dst string) {
	t.Helper()
	f, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	gz := gzip.NewWriter(f)
	tw := tar.NewWriter(gz)
	if err := tw.WriteHeader(&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
		t.Fatal(err)
	}
	if err := tarDir(t.Context(), tw, src); err != nil {
		t.Fatal(err)
	}
	for _, c := range []interface{ Close() error }{tw, gz, f} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// A workspace that is not on the host is refused at seed; a setup command
// that fails, a pinned path that is not there and pins past MaxPin fail
// the setup, saying which; a tarball entry outside the workspace too.
func TestSetupFailures(t *testing.T) {
	ctx := t.Context()
	var k Kind
	if _, err := k.Spec("s", events.Episode{Rollout: "s"}, payload(t, Task{Name: "t", Prompt: "p", Workspace: Workspace{Dir: "/nonexistent/ws"},
		Verify: Verify{Command: []string{"true"}}})); !errors.Is(err, ErrTask) || !strings.Contains(err.Error(), "workspace.dir") {
		t.Fatalf("Spec of a missing workspace: %v", err)
	}
	evil := filepath.Join(t.TempDir(), "evil.tar")
	f, err := os.Create(evil)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	if err := tw.WriteHeader(&tar.Header{Name: "../escape.txt", Typeflag: tar.TypeReg, Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	_ = tw.Close()
	_ = f.Close()
	d, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		task Task
		kind Kind
		want error
		says string
	}{
		{Task{Setup: []Step{{Command: []string{"sh", "-c", "echo broken >&2; exit 3"}}}}, k, ErrSetup, "exited 3: broken"},
		{Task{Setup: []Step{{Command: []string{"sleep", "30"}, Timeout: "200ms"}}}, k, ErrSetup, "timed out"},
		{Task{Setup: []Step{{Command: []string{"sh", "-c", "echo '{broken'"}}}}, k, ErrSetup, "not a JSON object"},
		{Task{Pin: []string{"missing.txt"}}, k, ErrSetup, "missing.txt"},
		{Task{Workspace: Workspace{Dir: calcRepo(t)}, Pin: []string{"test_calc.py"}}, Kind{MaxPin: 100}, ErrPinTooLarge, "more than the limit of 100"},
		{Task{Workspace: Workspace{Tarball: evil}}, k, ErrSetup, `"../escape.txt": escapes the workspace`},
	}
	for i, c := range cases {
		c.task.Name, c.task.Prompt, c.task.Verify = "t", "p", Verify{Command: []string{"true"}}
		_, err := session(t, c.kind, d, fmt.Sprintf("s%d", i), payload(t, c.task))
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("setup of %+v: %v, want %v saying %q", c.task, err, c.want, c.says)
		}
	}
	if _, err := k.Setup(ctx, d, &owner.Session{ID: "s"}, nil); !errors.Is(err, ErrTask) {
		t.Errorf("setup without a task: %v", err)
	}
	if _, err := k.Grade(ctx, d, &owner.Session{ID: "s", Data: json.RawMessage(`{"check":{}}`)}); !errors.Is(err, ErrData) {
		t.Errorf("grade of another kind's session: %v", err)
	}
}

// The session data survives a checkpoint and a restore through the owner:
// the fork of a sandbox whose test the agent rewrote before the checkpoint
// grades against the pinned test again, so the rewrite earns nothing and
// the fix earns 1.
func TestSessionDataSurvivesARestore(t *testing.T) {
	forEachProvider(t, func(t *testing.T, p testProvider) {
		env := jstest.Start(t)
		ctx := t.Context()
		var k Kind
		newOwner := func(name string) *owner.Owner {
			o, err := owner.New(owner.Config{Run: "r1", Name: name, JS: env.JS, Bus: env.Bus, Provider: p, Checkpointing: true,
				LendsSandboxes: true, StateDir: t.TempDir(), TaskKind: k})
			if err != nil {
				t.Fatal(err)
			}
			return o
		}
		raw := payload(t, Task{Name: "py-calc", Prompt: "fix calc.py", Workspace: Workspace{Dir: calcRepo(t)}, Pin: []string{"test_calc.py"},
			Env: noPyc, Verify: Verify{Command: []string{"python3", "-m", "unittest"}}})
		o1 := newOwner("o1")
		s, err := o1.SeedSession(ctx, "s1", events.Episode{Rollout: "r1"}, raw)
		if err != nil {
			t.Fatal(err)
		}
		sh(t, p, s, "cat > test_calc.py <<'EOF'\n"+cheat+"EOF")
		cp := member.Checkpoint{Run: "r1", ID: "c1"}
		if rep, err := o1.Prepare(ctx, cp); err != nil || !rep.Ready {
			t.Fatalf("prepare: %+v %v", rep, err)
		}
		recs, err := membertest.Drain(o1.Export(ctx, events.Commit{PhaseHeader: events.PhaseHeader{Run: "r1", CheckpointID: "c1"}}))
		if err != nil || len(recs) != 1 {
			t.Fatalf("export: %v %v", recs, err)
		}
		if err := o1.Resume(ctx, "c1"); err != nil {
			t.Fatal(err)
		}
		if err := o1.EndSession(ctx, "s1"); err != nil {
			t.Fatal(err)
		}

		o2 := newOwner("o1")
		if _, err := o2.Install(ctx, events.Restore{PhaseHeader: events.PhaseHeader{Run: "r1", Epoch: 1}}, recs); err != nil {
			t.Fatal(err)
		}
		fork, ok := o2.Session("s1")
		if !ok {
			t.Fatal("the restored session is not there")
		}
		t.Cleanup(func() {
			if err := o2.EndSession(context.Background(), "s1"); err != nil {
				t.Errorf("end the fork: %v", err)
			}
		})
		if string(fork.Data) != string(s.Data) {
			t.Fatalf("the restored session data differs:\n%s\n%s", fork.Data, s.Data)
		}
		if v := grade(t, k, p, fork); v.Reward != 0 {
			t.Fatalf("grade of the fork with the rewritten test: %+v", v)
		}
		sh(t, p, fork, `printf 'def add(a, b):\n    return a + b\n' > calc.py`)
		if v := grade(t, k, p, fork); v.Reward != 1 {
			t.Fatalf("grade of the fork with the fix: %+v", v)
		}
	})
}
