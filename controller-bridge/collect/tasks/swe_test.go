package tasks

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/controller-bridge/collect/tasks/sweimage"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/owner"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/dir"
	"github.com/stillpoint/stillpoint/participants/owner/swekind"
)

// needPytest fails the test when Debian's python3 has no pytest: the
// images have it, and the grading here runs the same tests.
func needPytest(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("/usr/bin/python3", "-m", "pytest", "--version").CombinedOutput(); err != nil {
		t.Fatalf("the SWE set's tests run pytest with Debian's python3: apt-get install python3-pytest (%v: %s)", err, out)
	}
}

// sweSession starts a dir sandbox as the owner would from the instance's
// image (the repository at /testbed, the image's PATH), and sets it up.
func sweSession(t *testing.T, p *dir.Provider, in swekind.Instance, repo string) *owner.Session {
	t.Helper()
	ctx := t.Context()
	raw, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var k swekind.Kind
	spec, err := k.Spec(in.InstanceID, events.Episode{Rollout: in.InstanceID}, raw)
	if err != nil {
		t.Fatal(err)
	}
	spec.ImageRef, spec.Workdir, spec.Env = "", sweimage.Workdir, []string{"PATH=" + sweimage.ImagePath}
	sb, err := p.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(context.Background(), sb.ID); err != nil {
			t.Errorf("stop %s: %v", sb.ID, err)
		}
	})
	s := &owner.Session{ID: in.InstanceID, Sandbox: sb, Workdir: spec.Workdir}
	tarball, err := exec.Command("tar", "-C", repo, "-c", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	sweSh(t, p, s, "tar -x -f -", tarball)
	if s.Data, err = k.Setup(ctx, p, s, raw); err != nil {
		t.Fatal(err)
	}
	return s
}

func sweSh(t *testing.T, p *dir.Provider, s *owner.Session, script string, stdin []byte) string {
	t.Helper()
	res, err := p.Exec(t.Context(), s.Sandbox.ID, []string{"sh", "-c", script},
		provider.ExecOptions{Dir: filepath.Join(s.Sandbox.ProcRoot, s.Workdir), Stdin: bytes.NewReader(stdin)})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec %q: %v (exit %d, %s %s)", script, err, res.ExitCode, res.Stdout, res.Stderr)
	}
	return string(res.Stdout)
}

// repoImage is the owner's grading sandboxes as this test gives them
// (owner.GradeSandboxes): a dir sandbox with the instance's repository
// copied to the image's workdir, as a sandbox of its image would hold it.
type repoImage struct {
	*dir.Provider
	t    *testing.T
	repo string
	n    int
}

func (x *repoImage) Fresh(ctx context.Context, spec provider.Spec) (*provider.Sandbox, func(), error) {
	x.n++
	spec.ID, spec.ImageRef, spec.Env = fmt.Sprintf("gr%d", x.n), "", []string{"PATH=" + sweimage.ImagePath}
	sb, err := x.Start(ctx, spec)
	if err != nil {
		return nil, nil, err
	}
	remove := func() {
		if err := x.Stop(context.WithoutCancel(ctx), sb.ID); err != nil {
			x.t.Errorf("stop %s: %v", sb.ID, err)
		}
	}
	tarball, err := exec.Command("tar", "-C", x.repo, "-c", ".").Output()
	if err == nil {
		var res provider.ExecResult
		res, err = x.Exec(ctx, sb.ID, []string{"tar", "-x", "-f", "-"}, provider.ExecOptions{Dir: filepath.Join(sb.ProcRoot, spec.Workdir), Stdin: bytes.NewReader(tarball)})
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("tar exited %d: %s", res.ExitCode, res.Stderr)
		}
	}
	if err != nil {
		remove()
		return nil, nil, err
	}
	return sb, remove, nil
}

func sweGrade(t *testing.T, p *dir.Provider, s *owner.Session, repo string) swekind.Verdict {
	t.Helper()
	raw, err := swekind.Kind{}.Grade(t.Context(), &repoImage{Provider: p, t: t, repo: repo}, s)
	if err != nil {
		t.Fatal(err)
	}
	var v swekind.Verdict
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// Every instance of the SWE set, graded for real on this host: as it
// comes it is not resolved (every FAIL_TO_PASS test fails, every
// PASS_TO_PASS test passes); the gold patch resolves it, and so does the
// fix the model script's shell command makes.
func TestSWEInstancesGoldResolves(t *testing.T) {
	needPytest(t)
	repos := t.TempDir()
	ins, err := WriteSWERepos(repos)
	if err != nil {
		t.Fatal(err)
	}
	if len(ins) < 5 || !slices.Equal(SWENames(), func() (ids []string) {
		for _, in := range ins {
			ids = append(ids, in.InstanceID)
		}
		return ids
	}()) {
		t.Fatalf("instances %d, names %v", len(ins), SWENames())
	}
	p, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range ins {
		t.Run(in.InstanceID, func(t *testing.T) {
			in.Image = "/unused:" + in.InstanceID
			if err := in.Validate(); err != nil {
				t.Fatal(err)
			}
			if got := swekind.TestFiles(in.TestPatch); len(got) != 1 || !strings.HasPrefix(got[0], "tests/") {
				t.Fatalf("test patch files %v", got)
			}
			repo := filepath.Join(repos, in.InstanceID)
			s := sweSession(t, p, in, repo)
			v := sweGrade(t, p, s, repo)
			if v.Resolved || v.Reward != 0 || v.TestsStatus == nil || len(v.TestsStatus.FailToPass.Success) != 0 ||
				len(v.TestsStatus.PassToPass.Failure) != 0 || len(v.TestsStatus.PassToPass.Success) != len(in.PassToPass) {
				t.Fatalf("grade with no patch: %+v", v)
			}
			sweSh(t, p, s, "git apply -", []byte(in.Patch))
			v = sweGrade(t, p, s, repo)
			if !v.Resolved || v.Reward != 1 || withoutIndex(v.ModelPatch) != withoutIndex(in.Patch) ||
				len(v.TestsStatus.FailToPass.Success) != len(in.FailToPass) || len(v.TestsStatus.PassToPass.Success) != len(in.PassToPass) {
				t.Fatalf("grade of the gold patch: %+v", v)
			}
			sweSh(t, p, s, "git checkout -q -f HEAD && "+sweFixCmd(sweByID(in.InstanceID)), nil)
			if v = sweGrade(t, p, s, repo); !v.Resolved || withoutIndex(v.ModelPatch) != withoutIndex(in.Patch) {
				t.Fatalf("grade of the script's fix: %+v", v)
			}
		})
	}
}

// The set written whole: the base (built once into the cache, debootstrap
// on a cold one), one OCI layout with an image per instance, the tasks'
// image fields naming them, and each harness's script.
func TestSWESet(t *testing.T) {
	tier.Long(t)
	dirOut := t.TempDir()
	ts, script, err := SWE(t.Context(), SWEOptions{Dir: dirOut, ToolSeconds: 2, Harness: HarnessOpenCode, Progress: testLog{t}})
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != len(SWENames()) || len(script) != len(ts) {
		t.Fatalf("%d tasks, %d scripts", len(ts), len(script))
	}
	for _, tk := range ts {
		in, err := swekind.ParseInstance(tk.Task)
		if err != nil {
			t.Fatal(err)
		}
		if in.Image != filepath.Join(dirOut, "oci")+":"+tk.RolloutID || in.Task != tk.RolloutID || in.Prompt != in.ProblemStatement {
			t.Fatalf("task %s: %+v", tk.RolloutID, in)
		}
		turns := script[tk.RolloutID]
		if len(turns) != 5 || turns[0].ToolCalls[0].Function.Name != "read" || turns[2].ToolCalls[0].Function.Name != "edit" ||
			!strings.Contains(turns[1].ToolCalls[0].Function.Arguments, "sleep 2;") {
			t.Fatalf("script of %s: %+v", tk.RolloutID, turns)
		}
	}
	if _, script, err = SWE(t.Context(), SWEOptions{Dir: dirOut}); err != nil || script[ts[0].RolloutID][2].ToolCalls[0].Function.Name != "bash" {
		t.Fatalf("the scripted harness's set again: %v", err)
	}
}

// withoutIndex drops a diff's index lines (the grade's diff names blobs
// by their full ids).
func withoutIndex(diff string) string {
	var out []string
	for _, l := range strings.Split(diff, "\n") {
		if !strings.HasPrefix(l, "index ") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

type testLog struct{ t *testing.T }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Logf("%s", bytes.TrimSpace(p))
	return len(p), nil
}
