package swekind

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
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
	owner.Execer
	Sandboxes() []string
}

// forEachProvider runs fn with the dir provider and the overlay provider
// (root, overlayfs, cgroup v2).
func forEachProvider(t *testing.T, fn func(t *testing.T, p testProvider)) {
	check := func(t *testing.T, p testProvider) {
		t.Cleanup(func() {
			if ids := p.Sandboxes(); len(ids) > 0 {
				t.Errorf("sandboxes left: %v", ids)
				for _, id := range ids {
					_ = p.Stop(context.Background(), id)
				}
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

// needTools fails the test when git or python3 with pytest is missing.
func needTools(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatal("the swe kind's tests need git: apt-get install git")
	}
	if out, err := exec.Command("/usr/bin/python3", "-m", "pytest", "--version").CombinedOutput(); err != nil {
		t.Fatalf("the swe kind's tests need Debian's python3 with pytest: apt-get install python3-pytest (%v: %s)", err, out)
	}
}

// testImage is the instances' image reference.
const testImage = "/images/swe:calc__calc-1"

// imagePath is the PATH an image gives: Debian's python3, not a
// python in the host's own PATH.
const imagePath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

const (
	calcInit  = "from .ops import add, sub\n"
	calcBuggy = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a + b\n"
	calcFixed = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n"
	calcTests = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
	testPatch = `diff --git a/tests/test_ops.py b/tests/test_ops.py
--- a/tests/test_ops.py
+++ b/tests/test_ops.py
@@ -1,5 +1,9 @@
-from calc import add
+from calc import add, sub
 
 
 def test_add():
     assert add(2, 3) == 5
+
+
+def test_sub():
+    assert sub(5, 3) == 2
`
)

// git runs git in dir with a fixed identity and returns its output.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %v: %v\n%s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// calcRepo makes a git repository on the host with the buggy calc
// package and returns it and its commit.
func calcRepo(t *testing.T) (string, string) {
	t.Helper()
	repo := t.TempDir()
	for p, c := range map[string]string{"calc/__init__.py": calcInit, "calc/ops.py": calcBuggy, "tests/test_ops.py": calcTests,
		"pyproject.toml": "[project]\nname = \"calc\"\nversion = \"0.1\"\n", ".gitignore": "__pycache__/\n*.egg-info/\n"} {
		if err := os.MkdirAll(filepath.Join(repo, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(repo, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	git(t, repo, "init", "-q")
	git(t, repo, "add", "-A")
	git(t, repo, "commit", "-q", "-m", "calc")
	return repo, git(t, repo, "rev-parse", "HEAD")
}

func instance(t *testing.T, base string, mod func(*Instance)) json.RawMessage {
	t.Helper()
	in := Instance{InstanceID: "calc__calc-1", Repo: "calc/calc", BaseCommit: base, Image: testImage,
		ProblemStatement: "sub() adds.", TestPatch: testPatch,
		FailToPass: TestList{"tests/test_ops.py::test_sub"}, PassToPass: TestList{"tests/test_ops.py::test_add"}}
	if mod != nil {
		mod(&in)
	}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// session starts a sandbox as the owner would from an image whose
// WorkingDir is /testbed, puts the repository there, and sets it up.
func session(t *testing.T, k Kind, p testProvider, id, repo string, raw json.RawMessage) (*owner.Session, error) {
	t.Helper()
	ctx := t.Context()
	spec, err := k.Spec(id, events.Episode{Rollout: id}, raw)
	if err != nil {
		return nil, err
	}
	if spec.ImageRef == "" || spec.Workdir != "" {
		t.Fatalf("spec %+v: want the image's reference and no workdir", spec)
	}
	spec.ImageRef, spec.Workdir, spec.Env = "", "/testbed", []string{imagePath}
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
	copyRepo(t, p, sb, repo)
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
		t.Fatalf("exec %q: %v (exit %d, %s %s)", script, err, res.ExitCode, res.Stdout, res.Stderr)
	}
	return string(res.Stdout)
}

// images is the owner's grading sandboxes as the tests give them
// (owner.GradeSandboxes): a sandbox started on the provider from the
// provider's base, with the image's repository (repo, at the base
// commit) copied into /testbed, as a sandbox of the instance's image
// would hold it. The dir provider cannot start from an image; the
// overlay provider's base is the host's root, as the session's.
type images struct {
	testProvider
	t     *testing.T
	repo  string
	after string // run in the fresh sandbox's /testbed after the copy
	n     int
}

var _ owner.GradeSandboxes = (*images)(nil)

func (x *images) Fresh(ctx context.Context, spec provider.Spec) (*provider.Sandbox, func(), error) {
	if spec.ImageRef != testImage || spec.Workdir != "/testbed" || spec.Image != nil {
		x.t.Errorf("grading sandbox spec %+v: want image %s in /testbed", spec, testImage)
	}
	x.n++
	spec.ID, spec.ImageRef, spec.Env = fmt.Sprintf("gr%d", x.n), "", []string{imagePath}
	sb, err := x.Start(ctx, spec)
	if err != nil {
		return nil, nil, err
	}
	remove := func() {
		if err := x.Stop(context.WithoutCancel(ctx), sb.ID); err != nil {
			x.t.Errorf("stop %s: %v", sb.ID, err)
		}
	}
	copyRepo(x.t, x.testProvider, sb, x.repo)
	if x.after != "" {
		if res, err := x.Exec(ctx, sb.ID, []string{"sh", "-c", x.after}, provider.ExecOptions{Dir: filepath.Join(sb.ProcRoot, "/testbed")}); err != nil || res.ExitCode != 0 {
			remove()
			x.t.Fatalf("%s in the grading sandbox: %v %s", x.after, err, res.Stderr)
		}
	}
	return sb, remove, nil
}

// copyRepo copies the host repository into the sandbox's /testbed.
func copyRepo(t *testing.T, p testProvider, sb *provider.Sandbox, repo string) {
	t.Helper()
	tarball, err := exec.Command("tar", "-C", repo, "-c", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Exec(t.Context(), sb.ID, []string{"tar", "-x", "-f", "-"}, provider.ExecOptions{Dir: filepath.Join(sb.ProcRoot, "/testbed"), Stdin: bytes.NewReader(tarball)})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("copy the repository in: %v %s", err, res.Stderr)
	}
}

// grade grades the session with grading sandboxes of repo, checks that
// none is left, and returns the verdict.
func grade(t *testing.T, k Kind, p testProvider, s *owner.Session, repo string) Verdict {
	t.Helper()
	return gradeWith(t, k, &images{testProvider: p, t: t, repo: repo}, s)
}

func gradeWith(t *testing.T, k Kind, x *images, s *owner.Session) Verdict {
	t.Helper()
	before := x.Sandboxes()
	raw, err := k.Grade(t.Context(), x, s)
	if err != nil {
		t.Fatalf("Grade: %v", err)
	}
	if after := x.Sandboxes(); !slices.Equal(before, after) {
		t.Errorf("sandboxes before the grade %v, after %v", before, after)
	}
	var v Verdict
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("verdict %s: %v", raw, err)
	}
	return v
}

func writeOps(content string) string {
	return "cat > calc/ops.py <<'EOF'\n" + content + "EOF\n"
}

// The grade keeps the model's diff, applies the test patch over the test
// files and runs the named tests: only the fix resolves the instance; a
// rewritten test file does not count; a committed fix counts; a fix that
// breaks a PASS_TO_PASS test does not; the work tree is left as the
// model left it.
func TestGradeAsSWEBench(t *testing.T) {
	needTools(t)
	repo, base := calcRepo(t)
	forEachProvider(t, func(t *testing.T, p testProvider) {
		var k Kind
		s, err := session(t, k, p, "s1", repo, instance(t, base, nil))
		if err != nil {
			t.Fatal(err)
		}
		var d Data
		if err := json.Unmarshal(s.Data, &d); err != nil || d.BaseCommit != base || d.Workdir != "/testbed" || d.TestCmd != DefaultTestCmd ||
			d.TestPatch != testPatch || !slices.Equal(d.FailToPass, []string{"tests/test_ops.py::test_sub"}) {
			t.Fatalf("session data %s (%v)", s.Data, err)
		}

		v := grade(t, k, p, s, repo)
		if v.Reward != 0 || v.Resolved || v.PatchExists || !v.PatchSuccessfullyApplied || v.TestsStatus == nil ||
			!slices.Equal(v.TestsStatus.FailToPass.Failure, []string{"tests/test_ops.py::test_sub"}) ||
			!slices.Equal(v.TestsStatus.PassToPass.Success, []string{"tests/test_ops.py::test_add"}) {
			t.Fatalf("grade of the unchanged repository: %+v", v)
		}

		// A test file rewritten to pass is reset before the test patch.
		sh(t, p, s, "printf 'def test_sub():\\n    pass\\n' >> tests/test_ops.py")
		if v = grade(t, k, p, s, repo); v.Resolved || !v.PatchExists || !strings.Contains(v.ModelPatch, "tests/test_ops.py") ||
			len(v.TestsStatus.FailToPass.Failure) != 1 {
			t.Fatalf("grade of a rewritten test: %+v", v)
		}
		if got := sh(t, p, s, "git status --porcelain"); !strings.Contains(got, "tests/test_ops.py") {
			t.Fatalf("the grade did not leave the model's changes: %q", got)
		}
		sh(t, p, s, "git checkout -q -- tests && git reset -q")

		sh(t, p, s, writeOps(calcFixed)+"echo new > notes.txt")
		v = grade(t, k, p, s, repo)
		if v.Reward != 1 || !v.Resolved || !v.PatchSuccessfullyApplied || v.TestExitCode != 0 ||
			!strings.Contains(v.ModelPatch, "-    return a + b\n+    return a - b") || !strings.Contains(v.ModelPatch, "notes.txt") ||
			len(v.TestsStatus.FailToPass.Success) != 1 || len(v.TestsStatus.PassToPass.Success) != 1 {
			t.Fatalf("grade of the fix: %+v", v)
		}
		if got := sh(t, p, s, "cat calc/ops.py notes.txt; ls -a .git | grep stillpoint || true"); got != calcFixed+"new\n" {
			t.Fatalf("the work tree after the grade: %q", got)
		}
		if got := sh(t, p, s, "cat tests/test_ops.py"); got != calcTests {
			t.Fatalf("the grade left the test patch applied: %q", got)
		}

		// A committed fix is part of the diff against the base commit.
		sh(t, p, s, "git -c user.name=m -c user.email=m@example.com commit -qam fix")
		if v = grade(t, k, p, s, repo); !v.Resolved {
			t.Fatalf("grade of a committed fix: %+v", v)
		}

		// A fix that breaks add fails a PASS_TO_PASS test.
		sh(t, p, s, writeOps("def add(a, b):\n    return 0\n\n\ndef sub(a, b):\n    return a - b\n"))
		if v = grade(t, k, p, s, repo); v.Resolved || !slices.Equal(v.TestsStatus.PassToPass.Failure, []string{"tests/test_ops.py::test_add"}) ||
			len(v.TestsStatus.FailToPass.Success) != 1 || !strings.Contains(v.Detail, "1 of 1 PASS_TO_PASS") {
			t.Fatalf("grade of a fix that breaks add: %+v", v)
		}
	})
}

// The grade only reads the session's sandbox: its work tree and its
// index are as the model left them, and a second grade (a restore's,
// from a checkpoint taken while one ran) grades the same diff.
func TestGradeLeavesTheSessionAlone(t *testing.T) {
	needTools(t)
	repo, base := calcRepo(t)
	forEachProvider(t, func(t *testing.T, p testProvider) {
		var k Kind
		s, err := session(t, k, p, "s1", repo, instance(t, base, nil))
		if err != nil {
			t.Fatal(err)
		}
		sh(t, p, s, writeOps(calcFixed)+"git add calc/ops.py && echo new > notes.txt && echo draft >> tests/test_ops.py")
		state := "git status --porcelain=v2 --untracked-files=all; git diff; git diff --cached; git rev-parse HEAD; cat notes.txt tests/test_ops.py; ls .git"
		was := sh(t, p, s, state)
		v := grade(t, k, p, s, repo)
		if !v.Resolved || !strings.Contains(v.ModelPatch, "notes.txt") {
			t.Fatalf("grade: %+v", v)
		}
		if got := sh(t, p, s, state); got != was {
			t.Fatalf("the session's sandbox after the grade:\n%s\nwant\n%s", got, was)
		}
		if again := grade(t, k, p, s, repo); again.ModelPatch != v.ModelPatch || !again.Resolved {
			t.Fatalf("a second grade: %+v", again)
		}
	})
}

// What the sandbox's state makes impossible to grade is reward 0 with the
// reason, not an error: a patch that does not apply, a test patch that
// does not, no .git, tests past their time. A repository not at the base
// commit fails the setup.
func TestGradeThatCannotRun(t *testing.T) {
	needTools(t)
	repo, base := calcRepo(t)
	forEachProvider(t, func(t *testing.T, p testProvider) {
		var k Kind
		_, err := session(t, k, p, "wrong", repo, instance(t, strings.Repeat("ab", 20), nil))
		if !errors.Is(err, ErrSetup) || !strings.Contains(err.Error(), "not at base_commit abab") {
			t.Fatalf("setup at the wrong commit: %v", err)
		}

		s, err := session(t, k, p, "broken-test-patch", repo, instance(t, base, func(in *Instance) {
			in.TestPatch = strings.Replace(testPatch, "     assert add(2, 3) == 5", "     assert add(2, 3) == 6", 1)
		}))
		if err != nil {
			t.Fatal(err)
		}
		if v := grade(t, k, p, s, repo); v.Reward != 0 || v.TestsStatus != nil || !strings.Contains(v.Detail, "test patch does not apply") {
			t.Fatalf("grade with a test patch that does not apply: %+v", v)
		}

		s, err = session(t, k, p, "slow", repo, instance(t, base, func(in *Instance) { in.TestCmd = "sleep 30; " + DefaultTestCmd }))
		if err != nil {
			t.Fatal(err)
		}
		sh(t, p, s, writeOps(calcFixed))
		k.TestTimeout = 500 * time.Millisecond
		if v := grade(t, k, p, s, repo); v.Reward != 0 || !strings.Contains(v.Detail, "timed out") || v.TookMS > 10_000 {
			t.Fatalf("grade past its timeout: %+v", v)
		}
		k.TestTimeout = 0

		// A diff that does not apply to the image's tree (a grading
		// sandbox whose ops.py differs) is not resolved, and says why.
		x := &images{testProvider: p, t: t, repo: repo, after: "echo '# image' >> calc/ops.py"}
		if v := gradeWith(t, k, x, s); v.Reward != 0 || v.PatchSuccessfullyApplied || v.TestsStatus != nil ||
			!strings.Contains(v.Detail, "does not apply to the base commit") || !strings.Contains(v.Output, "calc/ops.py") {
			t.Fatalf("grade of a diff that does not apply: %+v", v)
		}
		// A grading sandbox whose repository is not at the base commit
		// cannot grade.
		x = &images{testProvider: p, t: t, repo: repo, after: "git -c user.name=i -c user.email=i@example.com commit -q --allow-empty -m image"}
		if v := gradeWith(t, k, x, s); v.Reward != 0 || !strings.Contains(v.Detail, "not at the base commit") {
			t.Fatalf("grade in a sandbox off the base commit: %+v", v)
		}
		// A diff over the bound is not graded.
		k.MaxDiff = 100
		if v := grade(t, k, p, s, repo); v.Reward != 0 || v.ModelPatch != "" || v.ModelPatchBytes <= 100 || !strings.Contains(v.Detail, "more than the 100 graded") {
			t.Fatalf("grade of a diff over the bound: %+v", v)
		}
		k.MaxDiff = 0

		sh(t, p, s, "rm -rf .git")
		if v := grade(t, k, p, s, repo); v.Reward != 0 || !strings.Contains(v.Detail, "no git repository") {
			t.Fatalf("grade without .git: %+v", v)
		}
	})
}

func TestParseInstance(t *testing.T) {
	row := `{"instance_id": "astropy__astropy-12907", "repo": "astropy/astropy", "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
		"problem_statement": "p", "test_patch": ` + mustJSON(testPatch) + `, "FAIL_TO_PASS": "[\"a::b\"]", "PASS_TO_PASS": "[]",
		"image": "/x:y", "created_at": "2022-03-03T15:14:54Z", "hints_text": ""}`
	in, err := ParseInstance(json.RawMessage(row))
	if err != nil || !slices.Equal(in.FailToPass, []string{"a::b"}) || len(in.PassToPass) != 0 || in.testCmd() != DefaultTestCmd {
		t.Fatalf("a dataset row: %+v, %v", in, err)
	}
	_, err = ParseInstance(json.RawMessage(`{"instance_id": "x", "base_commit": "zz", "FAIL_TO_PASS": []}`))
	for _, field := range []string{"repo", "base_commit", "image", "problem_statement", "test_patch", "FAIL_TO_PASS"} {
		if !errors.Is(err, ErrTask) || !strings.Contains(err.Error(), field+":") {
			t.Errorf("a bad instance: %v, want %s named", err, field)
		}
	}
	for _, bad := range []string{strings.Repeat("x", 4097), "/x:y\n", "/x\x00:y"} {
		r := strings.Replace(row, `"image": "/x:y"`, `"image": `+mustJSON(bad), 1)
		if _, err := ParseInstance(json.RawMessage(r)); !errors.Is(err, ErrTask) || !strings.Contains(err.Error(), "image:") {
			t.Errorf("image %.20q: %v, want it refused naming image", bad, err)
		}
	}
	if got := TestFiles(testPatch + "diff --git a/tests/data.json b/tests/data.json\n"); !slices.Equal(got, []string{"tests/data.json", "tests/test_ops.py"}) ||
		!slices.Equal(testDirectives(got), []string{"tests/test_ops.py"}) {
		t.Fatalf("TestFiles: %q", got)
	}
}

func TestParseLog(t *testing.T) {
	log := `============================= test session starts ==============================
tests/test_a.py .F                                                      [100%]
=========================== short test summary info ============================
PASSED tests/test_a.py::test_ok
PASSED tests/test_a.py::test_param[a - b]
FAILED tests/test_a.py::test_bad - AssertionError: assert 1 == 2
ERROR tests/test_b.py::test_fixture - RuntimeError: boom
SKIPPED [1] tests/test_c.py:3: no network
XFAIL tests/test_c.py::test_known - reason: later
XPASS tests/test_c.py::test_lucky
========================= 1 failed, 2 passed in 0.03s ==========================
`
	sm := ParseLog([]byte(log))
	want := map[string]string{"tests/test_a.py::test_ok": "PASSED", "tests/test_a.py::test_param[a - b]": "PASSED",
		"tests/test_a.py::test_bad": "FAILED", "tests/test_b.py::test_fixture": "ERROR",
		"tests/test_c.py::test_known": "XFAIL", "tests/test_c.py::test_lucky": "XPASS"}
	if len(sm) != len(want) {
		t.Fatalf("ParseLog: %q", sm)
	}
	for id, st := range want {
		if sm[id] != st {
			t.Errorf("ParseLog[%q] = %q, want %q (all: %q)", id, sm[id], st, sm)
		}
	}
	o := outcome([]string{"tests/test_a.py::test_ok", "tests/test_a.py::test_bad", "tests/test_c.py::test_gone"}, sm)
	if !slices.Equal(o.Success, []string{"tests/test_a.py::test_ok"}) || len(o.Failure) != 2 {
		t.Fatalf("outcome: %+v", o)
	}
	// As SWE-bench: XFAIL is a pass, XPASS neither a pass nor a failure,
	// ERROR a failure.
	o = outcome([]string{"tests/test_c.py::test_known", "tests/test_c.py::test_lucky", "tests/test_b.py::test_fixture"}, sm)
	if !slices.Equal(o.Success, []string{"tests/test_c.py::test_known"}) || !slices.Equal(o.Failure, []string{"tests/test_b.py::test_fixture"}) {
		t.Fatalf("outcome of XFAIL, XPASS, ERROR: %+v", o)
	}
}

// A FAIL_TO_PASS test marked xfail that the fix makes pass (XPASS) does
// not keep the instance from being resolved, as in SWE-bench; one that
// fails still is a failure of the test patch's other test.
func TestGradeXPass(t *testing.T) {
	needTools(t)
	repo, base := calcRepo(t)
	xfailPatch := strings.Replace(strings.Replace(testPatch, "-from calc import add\n+from calc import add, sub\n",
		"-from calc import add\n+import pytest\n+from calc import add, sub\n", 1), "@@ -1,5 +1,9 @@", "@@ -1,5 +1,11 @@", 1)
	xfailPatch = strings.Replace(xfailPatch, "+def test_sub():", "+@pytest.mark.xfail(strict=False)\n+def test_sub():", 1)
	forEachProvider(t, func(t *testing.T, p testProvider) {
		var k Kind
		s, err := session(t, k, p, "xpass", repo, instance(t, base, func(in *Instance) { in.TestPatch = xfailPatch }))
		if err != nil {
			t.Fatal(err)
		}
		sh(t, p, s, writeOps(calcFixed))
		v := grade(t, k, p, s, repo)
		if !v.Resolved || !strings.Contains(v.Output, "XPASS tests/test_ops.py::test_sub") ||
			len(v.TestsStatus.FailToPass.Success) != 0 || len(v.TestsStatus.FailToPass.Failure) != 0 {
			t.Fatalf("grade with test_sub XPASS: %+v", v)
		}
		sh(t, p, s, writeOps("def add(a, b):\n    return 0\n\n\ndef sub(a, b):\n    return a - b\n"))
		if v = grade(t, k, p, s, repo); v.Resolved || !slices.Equal(v.TestsStatus.PassToPass.Failure, []string{"tests/test_ops.py::test_add"}) {
			t.Fatalf("grade with test_sub XPASS and test_add failed: %+v", v)
		}
	})
}

func mustJSON(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// forcePass is a pytest plugin that reports every test passed.
const forcePass = `import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    rep.outcome = "passed"
    rep.longrepr = None
`

// forged runs the test patch's tests in the session's own sandbox, as a
// grade that trusted it would, and tells whether test_sub passed there
// with sub still wrong: the attack works.
func forged(t *testing.T, p testProvider, s *owner.Session, patch string) bool {
	t.Helper()
	out := sh(t, p, s, "git apply - <<'EOF'\n"+patch+"EOF\n"+
		"PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -rA -p no:cacheprovider tests/test_ops.py || true; git checkout -q -- tests/test_ops.py")
	return strings.Contains(out, "PASSED tests/test_ops.py::test_sub")
}

// An agent that cannot fix sub and forges the grade instead gets reward
// 0: the forgeries below each make test_sub pass in the agent's own
// sandbox, but only the model's diff leaves it.
func TestGradeResistsForgery(t *testing.T) {
	needTools(t)
	repo, base := calcRepo(t)
	forEachProvider(t, func(t *testing.T, p testProvider) {
		var k Kind
		check := func(t *testing.T, s *owner.Session, patch, leak string) {
			t.Helper()
			if !forged(t, p, s, patch) {
				t.Fatal("the forgery does not make test_sub pass in the agent's sandbox: the test proves nothing")
			}
			v := grade(t, k, p, s, repo)
			if v.Reward != 0 || v.Resolved || v.TestsStatus == nil ||
				!slices.Equal(v.TestsStatus.FailToPass.Failure, []string{"tests/test_ops.py::test_sub"}) {
				t.Fatalf("grade of a forgery: %+v", v)
			}
			if leak != "" && strings.Contains(v.ModelPatch, leak) {
				t.Fatalf("the model's diff carries %q:\n%s", leak, v.ModelPatch)
			}
		}

		// A conftest.py that forces every test to pass, hidden from git
		// add -A by .git/info/exclude (git clean -fd keeps it too).
		t.Run("excluded conftest", func(t *testing.T) {
			s, err := session(t, k, p, "exclude", repo, instance(t, base, nil))
			if err != nil {
				t.Fatal(err)
			}
			sh(t, p, s, "cat > tests/conftest.py <<'EOF'\n"+forcePass+"EOF\necho tests/conftest.py >> .git/info/exclude; echo new > notes.txt")
			check(t, s, testPatch, "conftest")
		})

		// The base commit replaced (git replace) by one whose test file
		// patches sub: the test files a grade in this sandbox resets to
		// the base commit would be the agent's.
		t.Run("replaced base", func(t *testing.T) {
			appendPatch := `diff --git a/tests/test_ops.py b/tests/test_ops.py
--- a/tests/test_ops.py
+++ b/tests/test_ops.py
@@ -3,3 +3,8 @@
 
 def test_add():
     assert add(2, 3) == 5
+
+
+def test_sub():
+    from calc import sub
+    assert sub(5, 3) == 2
`
			s, err := session(t, k, p, "replace", repo, instance(t, base, func(in *Instance) { in.TestPatch = appendPatch }))
			if err != nil {
				t.Fatal(err)
			}
			sh(t, p, s, `printf 'import calc\ncalc.sub = lambda a, b: a - b\n' | cat - tests/test_ops.py > t.py && mv t.py tests/test_ops.py
git add tests/test_ops.py
fake=$(git -c user.name=m -c user.email=m@example.com commit-tree -m fake "$(git write-tree)")
git replace `+base+` "$fake"
echo new > notes.txt`)
			if got := sh(t, p, s, "git show "+base+":tests/test_ops.py"); !strings.HasPrefix(got, "import calc\n") {
				t.Fatalf("the replace is not in effect: %q", got)
			}
			check(t, s, appendPatch, "")
		})

		// A module outside the repository: a .pth file in the system's
		// site-packages that loads a plugin into every pytest. The dir
		// provider isolates nothing (its sandboxes share the host's
		// files), so only a provider with a root of its own is tried.
		t.Run("site-packages", func(t *testing.T) {
			if p.Name() == "dir" {
				t.Log("the dir provider's sandboxes share the host's site-packages: nothing to plant there")
				return
			}
			s, err := session(t, k, p, "site", repo, instance(t, base, nil))
			if err != nil {
				t.Fatal(err)
			}
			site := strings.TrimSpace(sh(t, p, s, `python3 -c 'import site; print(site.getsitepackages()[0])'`))
			sh(t, p, s, "mkdir -p "+site+" && cat > "+site+"/zz_force.py <<'EOF'\n"+forcePass+"EOF\n"+
				`echo 'import os; os.environ.setdefault("PYTEST_PLUGINS", "zz_force")' > `+site+"/zz_force.pth; echo new > notes.txt")
			check(t, s, testPatch, "zz_force")
		})
	})
}
