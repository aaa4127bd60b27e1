package swekind

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/stillpoint/stillpoint/participants/owner"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// Verdict is the grade of a swe session, shaped as SWE-bench's report of
// an instance.
type Verdict struct {
	// Reward is 1 when the instance is resolved, else 0.
	Reward float64 `json:"reward"`
	// Resolved tells that every FAIL_TO_PASS and every PASS_TO_PASS test
	// passed with the model's patch and the test patch applied.
	Resolved   bool   `json:"resolved"`
	InstanceID string `json:"instance_id"`
	// PatchExists tells that the model changed anything.
	PatchExists bool `json:"patch_exists"`
	// PatchSuccessfullyApplied tells that the model's patch applied to
	// the base commit (an empty patch applies).
	PatchSuccessfullyApplied bool `json:"patch_successfully_applied"`
	// ModelPatch is the model's changes against the base commit (git
	// diff --binary), at most the kind's MaxPatch bytes; ModelPatchBytes
	// is its whole size and ModelPatchCut tells it was cut.
	ModelPatch      string `json:"model_patch"`
	ModelPatchBytes int    `json:"model_patch_bytes"`
	ModelPatchCut   bool   `json:"model_patch_cut,omitempty"`
	// TestsStatus is the outcome of each named test; nil when the tests
	// did not run.
	TestsStatus *TestsStatus `json:"tests_status,omitempty"`
	// Detail says why the instance is not resolved, or why the grade
	// could not run.
	Detail string `json:"detail,omitempty"`
	// TestExitCode is the test command's exit status (-1: not run).
	TestExitCode int `json:"test_exit_code"`
	// Output is the end of the test run's log (or of the failing step's).
	Output string `json:"output,omitempty"`
	// TookMS is how long the grade took.
	TookMS int64 `json:"took_ms"`
}

// TestsStatus is the outcome of the named tests, as SWE-bench reports it.
type TestsStatus struct {
	FailToPass Outcome `json:"FAIL_TO_PASS"`
	PassToPass Outcome `json:"PASS_TO_PASS"`
}

// Outcome splits tests into those that passed (PASSED or XFAIL) and the
// rest (FAILED, ERROR, SKIPPED, or absent from the log).
type Outcome struct {
	Success []string `json:"success"`
	Failure []string `json:"failure"`
}

// Test statuses of pytest's -rA short summary.
const (
	statusPassed  = "PASSED"
	statusFailed  = "FAILED"
	statusError   = "ERROR"
	statusSkipped = "SKIPPED"
	statusXFail   = "XFAIL"
	statusXPass   = "XPASS"
)

// ParseLog reads the per-test outcomes of a pytest run with -rA: each
// short summary line "STATUS node-id[ - message]" gives node-id's status
// (a later line wins; a PASSED line has no message, so its id is the
// whole rest, " - " in a parameter included). SKIPPED lines, which name a file and a line
// rather than a test, give nothing.
func ParseLog(log []byte) map[string]string {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(log))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r ")
		status, rest, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		switch status {
		case statusPassed:
		case statusFailed, statusError, statusXFail, statusXPass:
			if id, _, ok := strings.Cut(rest, " - "); ok {
				rest = id
			}
		default:
			continue
		}
		if rest = strings.TrimSpace(rest); rest != "" {
			out[rest] = status
		}
	}
	return out
}

// passed tells a status SWE-bench counts as a pass.
func passed(status string) bool { return status == statusPassed || status == statusXFail }

// outcome splits names by their status in sm.
func outcome(names []string, sm map[string]string) Outcome {
	o := Outcome{Success: []string{}, Failure: []string{}}
	for _, n := range names {
		if passed(sm[n]) {
			o.Success = append(o.Success, n)
		} else {
			o.Failure = append(o.Failure, n)
		}
	}
	return o
}

// nonTestExts are the endings of files a test patch touches that are
// not run as tests (SWE-bench's list).
var nonTestExts = []string{".json", ".png", "csv", ".txt", ".md", ".jpg", ".jpeg", ".pkl", ".yml", ".yaml", ".toml"}

// testDirectives returns the files of the test patch the test command is
// given.
func testDirectives(files []string) []string {
	var out []string
	for _, f := range files {
		keep := true
		for _, ext := range nonTestExts {
			if strings.HasSuffix(f, ext) {
				keep = false
			}
		}
		if keep {
			out = append(out, f)
		}
	}
	return out
}

// gitSh is the start of every script the grade runs: git as gitArgv, and
// the directory that holds the model's patch while a grade is under way
// (in the repository's git directory, which no diff holds).
const gitSh = `g() { git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c 'safe.directory=*' "$@"; }
command -v git >/dev/null 2>&1 || { echo "git is not in the sandbox's PATH" >&2; exit 2; }
st=$(g rev-parse --absolute-git-dir) || { echo "no git repository here" >&2; exit 2; }
st=$st/stillpoint-swe
base=$1; shift
`

// The grade's steps. keep saves the model's changes (git add -A, then
// the binary diff against the base commit) unless a grade under way saved
// them already (a restore from a checkpoint taken mid-grade), and prints
// them; apply resets the work tree to the base commit and applies them;
// tests resets the files the test patch touches to the base commit and
// applies it (stdin); run runs the test command on the test files that
// exist; restore puts the model's changes back over the base commit, so
// that a grade leaves the work tree as the model did.
const (
	keepSh = gitSh + `g cat-file -e "$base^{commit}" 2>/dev/null || { echo "the base commit $base is not in the repository" >&2; exit 3; }
if [ ! -f "$st/model.patch" ]; then
	mkdir -p "$st" && g add -A && g diff --cached --binary --full-index --no-ext-diff --no-textconv --no-color "$base" >"$st/model.patch.tmp" &&
		mv "$st/model.patch.tmp" "$st/model.patch" || exit 4
fi
exec cat "$st/model.patch"
`
	applySh = gitSh + `g checkout -q -f --detach "$base" && g clean -fdq || exit 4
[ ! -s "$st/model.patch" ] || g apply --whitespace=nowarn "$st/model.patch" || exit 10
`
	testsSh = gitSh + `for f do
	if g cat-file -e "$base:$f" 2>/dev/null; then g checkout -q "$base" -- "$f" || exit 4; else rm -rf -- "$f"; fi
done
g apply --whitespace=nowarn - || exit 11
`
	runSh = `cmd=$1; shift
for f do shift; [ -e "$f" ] && set -- "$@" "$f"; done
eval "$cmd"' "$@"'
`
	restoreSh = gitSh + `g checkout -q -f --detach "$base" && g clean -fdq && { [ ! -s "$st/model.patch" ] || g apply --whitespace=nowarn "$st/model.patch"; } && rm -rf "$st"
`
)

// testEnv keeps Python from reading bytecode compiled before the grade's
// patches (a file of the same size and second would be run stale).
var testEnv = []string{"PYTHONDONTWRITEBYTECODE=1", "PYTHONPYCACHEPREFIX=/nonexistent/stillpoint-pycache"}

// Grade implements owner.TaskKind, as the SWE-bench harness grades: it
// keeps the model's changes as a patch against the base commit, resets
// the work tree to the base commit, applies that patch and then the test
// patch (over the base commit's test files), runs the test command on
// the test patch's files and reads the log per test. The instance is
// resolved, reward 1, when every FAIL_TO_PASS and PASS_TO_PASS test
// passed. At the end the work tree holds the model's changes again. What
// the sandbox's state makes impossible (no git, no base commit, a patch
// that does not apply, tests that run out of time) is reward 0 with the
// reason; an error is only the sandbox failing to run a command.
func (k Kind) Grade(ctx context.Context, x owner.Execer, s *owner.Session) (json.RawMessage, error) {
	var d Data
	if err := json.Unmarshal(s.Data, &d); err != nil || d.Kind != dataKind || d.BaseCommit == "" {
		return nil, fmt.Errorf("%w: session %s: %.200s", ErrData, s.ID, s.Data)
	}
	t0 := time.Now()
	v := Verdict{InstanceID: d.InstanceID, TestExitCode: -1}
	done := func() (json.RawMessage, error) {
		v.TookMS = time.Since(t0).Milliseconds()
		if v.Resolved {
			v.Reward = 1
		}
		return json.Marshal(v)
	}
	dir := path.Join(s.Sandbox.ProcRoot, d.Workdir)
	sh := func(script string, args []string, opts provider.ExecOptions) (provider.ExecResult, error) {
		opts.Dir = dir
		return x.Exec(ctx, s.Sandbox.ID, append([]string{"sh", "-c", script, "swe-grade"}, args...), opts)
	}
	base := []string{d.BaseCommit}

	res, err := sh(keepSh, base, provider.ExecOptions{})
	if err != nil {
		return nil, fmt.Errorf("swekind: session %s: keep the model's patch: %w", s.ID, err)
	}
	if res.ExitCode != 0 {
		v.Detail = fmt.Sprintf("the grade cannot run: keeping the model's patch exited %d: %s", res.ExitCode, tail(provider.ExecResult{Stderr: res.Stderr}))
		return done()
	}
	patch := res.Stdout
	v.PatchExists, v.ModelPatchBytes = len(patch) > 0, len(patch)
	v.ModelPatch = string(patch)
	if max := k.maxPatch(); len(patch) > max {
		v.ModelPatch, v.ModelPatchCut = string(patch[:max]), true
	}

	res, err = sh(applySh, base, provider.ExecOptions{})
	if err != nil {
		return nil, fmt.Errorf("swekind: session %s: apply the model's patch: %w", s.ID, err)
	}
	switch res.ExitCode {
	case 0:
		v.PatchSuccessfullyApplied = true
	case 10:
		v.Detail, v.Output = "the model's patch does not apply to the base commit", tail(res)
		return k.restore(ctx, sh, base, &v, done)
	default:
		v.Detail = fmt.Sprintf("the grade cannot run: resetting to the base commit exited %d: %s", res.ExitCode, tail(res))
		return k.restore(ctx, sh, base, &v, done)
	}

	files := TestFiles(d.TestPatch)
	res, err = sh(testsSh, append(base, files...), provider.ExecOptions{Stdin: strings.NewReader(d.TestPatch)})
	if err != nil {
		return nil, fmt.Errorf("swekind: session %s: apply the test patch: %w", s.ID, err)
	}
	if res.ExitCode != 0 {
		v.Detail, v.Output = fmt.Sprintf("the test patch does not apply over the model's patch (exit %d)", res.ExitCode), tail(res)
		return k.restore(ctx, sh, base, &v, done)
	}

	timeout := k.TestTimeout
	if timeout <= 0 {
		timeout = DefaultTestTimeout
	}
	tctx, cancel := context.WithTimeout(ctx, timeout)
	res, err = x.Exec(tctx, s.Sandbox.ID, append([]string{"sh", "-c", runSh, "swe-tests", d.TestCmd}, testDirectives(files)...),
		provider.ExecOptions{Dir: dir, Env: testEnv})
	timedOut := err != nil && ctx.Err() == nil && errors.Is(tctx.Err(), context.DeadlineExceeded)
	cancel()
	if err != nil && !timedOut {
		return nil, fmt.Errorf("swekind: session %s: run the tests: %w", s.ID, err)
	}
	v.TestExitCode, v.Output = res.ExitCode, tail(res)
	sm := ParseLog(append(bytes.Clone(res.Stdout), res.Stderr...))
	v.TestsStatus = &TestsStatus{FailToPass: outcome(d.FailToPass, sm), PassToPass: outcome(d.PassToPass, sm)}
	v.Resolved = !timedOut && len(v.TestsStatus.FailToPass.Failure) == 0 && len(v.TestsStatus.PassToPass.Failure) == 0
	switch {
	case timedOut:
		v.Detail = fmt.Sprintf("the tests timed out after %s", timeout)
	case !v.Resolved:
		v.Detail = fmt.Sprintf("%d of %d FAIL_TO_PASS and %d of %d PASS_TO_PASS tests did not pass",
			len(v.TestsStatus.FailToPass.Failure), len(d.FailToPass), len(v.TestsStatus.PassToPass.Failure), len(d.PassToPass))
	}
	if !v.PatchExists && v.Resolved {
		v.Resolved, v.Detail = false, "the model changed nothing"
	}
	return k.restore(ctx, sh, base, &v, done)
}

// restore puts the model's changes back and finishes the verdict; a
// restore that fails is said in the detail.
func (k Kind) restore(ctx context.Context, sh func(string, []string, provider.ExecOptions) (provider.ExecResult, error),
	base []string, v *Verdict, done func() (json.RawMessage, error)) (json.RawMessage, error) {
	res, err := sh(restoreSh, base, provider.ExecOptions{})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("exit %d: %s", res.ExitCode, tail(res))
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		v.Detail = strings.TrimPrefix(v.Detail+"; ", "; ") + "the work tree was not put back as the model left it: " + err.Error()
	}
	return done()
}

func (k Kind) maxPatch() int {
	if k.MaxPatch <= 0 {
		return DefaultMaxPatch
	}
	return k.MaxPatch
}
