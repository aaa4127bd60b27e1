package swekind

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strconv"
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

// Outcome splits tests as SWE-bench's grading does: those that passed
// (PASSED or XFAIL) and those that failed (FAILED, ERROR, or absent from
// the log). A test of another status (XPASS) is in neither.
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

// passed tells a status SWE-bench counts as a pass (its test_passed).
func passed(status string) bool { return status == statusPassed || status == statusXFail }

// failed tells a status SWE-bench counts as a failure (its test_failed):
// "" is a test absent from the log.
func failed(status string) bool {
	return status == "" || status == statusFailed || status == statusError
}

// outcome splits names by their status in sm; a name of a status that
// is neither a pass nor a failure (XPASS) is in neither list, as in
// SWE-bench's report, and does not keep the instance from being resolved.
func outcome(names []string, sm map[string]string) Outcome {
	o := Outcome{Success: []string{}, Failure: []string{}}
	for _, n := range names {
		switch st := sm[n]; {
		case passed(st):
			o.Success = append(o.Success, n)
		case failed(st):
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

// gitSh is the start of every script the grade runs: git as gitArgv
// with neither the user's nor the system's excludes and attributes files,
// checked to be there with a repository.
const gitSh = `g() { git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.excludesFile=/dev/null -c core.attributesFile=/dev/null -c 'safe.directory=*' "$@"; }
command -v git >/dev/null 2>&1 || { echo "git is not in the sandbox's PATH" >&2; exit 2; }
g rev-parse --absolute-git-dir >/dev/null 2>&1 || { echo "no git repository here" >&2; exit 2; }
base=$1; shift
`

// gitEnv is the environment of git in the grade's commands: no replace
// objects (nor grafts), no system or global config.
var gitEnv = []string{"GIT_NO_REPLACE_OBJECTS=1", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_ATTR_NOSYSTEM=1"}

// The grade's steps. diff runs in the session's sandbox: it takes the
// model's changes as a binary diff against the base commit (git add -A
// into a copy of the index, so the sandbox is left as it was), prints
// its size alone (exit 5) when it is over the bound ($1), else the diff;
// git's own messages are bounded too. The others run in the grade's
// fresh sandbox: apply checks that its repository is at the base commit
// and applies the model's diff (stdin; exit 10 when it does not apply);
// tests resets the files the test patch touches to the base commit and
// applies it (stdin; exit 11); run runs the test command on the test
// files that exist.
const (
	diffSh = gitSh + `max=$1
g cat-file -e "$base^{commit}" 2>/dev/null || { echo "the base commit $base is not in the repository" >&2; exit 3; }
t=$(mktemp -d) || exit 4
trap 'rm -rf "$t"' EXIT
ix=$(g rev-parse --git-path index) && { [ ! -f "$ix" ] || cp "$ix" "$t/index"; } || exit 4
GIT_INDEX_FILE=$t/index g add -A 2>"$t/err" &&
	GIT_INDEX_FILE=$t/index g diff --cached --binary --full-index --no-ext-diff --no-textconv --no-color --no-relative \
		--src-prefix=a/ --dst-prefix=b/ "$base" >"$t/patch" 2>>"$t/err" || { tail -c 4096 "$t/err" >&2; exit 4; }
n=$(wc -c <"$t/patch")
[ "$n" -le "$max" ] || { echo "$n"; exit 5; }
cat "$t/patch"
`
	applySh = gitSh + `[ "$(g rev-parse -q --verify 'HEAD^{commit}')" = "$base" ] || { echo "the repository is not at the base commit $base" >&2; exit 3; }
[ "$1" = none ] || g apply --whitespace=nowarn - || exit 10
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
)

// testEnv keeps Python from reading bytecode compiled before the grade's
// patches (a file of the same size and second would be run stale).
var testEnv = []string{"PYTHONDONTWRITEBYTECODE=1", "PYTHONPYCACHEPREFIX=/nonexistent/stillpoint-pycache"}

// Grade implements owner.TaskKind, as the SWE-bench harness grades: from
// the session's sandbox, which the agent controlled, it takes only the
// model's changes, as a diff against the base commit; it grades that
// diff in a fresh sandbox of the instance's image (x must be an
// owner.GradeSandboxes): it applies the diff, then the test patch over
// the base commit's test files, runs the test command on the test
// patch's files and reads the log per test. The instance is resolved,
// reward 1, when no FAIL_TO_PASS or PASS_TO_PASS test failed (Outcome).
// The fresh sandbox is removed however the grade ends; the session's
// sandbox is left as the model left it. What makes grading impossible
// (no git, no base commit, a diff too large or that does not apply, tests
// that run out of time) is reward 0 with the reason; an error is only a
// sandbox failing to start or to run a command.
func (k Kind) Grade(ctx context.Context, x owner.Execer, s *owner.Session) (json.RawMessage, error) {
	var d Data
	if err := json.Unmarshal(s.Data, &d); err != nil || d.Kind != dataKind || d.BaseCommit == "" {
		return nil, fmt.Errorf("%w: session %s: %.200s", ErrData, s.ID, s.Data)
	}
	if d.Image == "" {
		return nil, fmt.Errorf("%w: session %s: the session data names no image to grade in", ErrData, s.ID)
	}
	sbx, ok := x.(owner.GradeSandboxes)
	if !ok {
		return nil, fmt.Errorf("swekind: session %s: the owner gives the grade no sandbox of its own (owner.GradeSandboxes)", s.ID)
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

	// The model's diff: all that is taken from the session's sandbox.
	dctx, cancel := context.WithTimeout(ctx, DefaultDiffTimeout)
	res, err := x.Exec(dctx, s.Sandbox.ID, []string{"sh", "-c", diffSh, "swe-diff", d.BaseCommit, strconv.Itoa(k.maxDiff())},
		provider.ExecOptions{Dir: path.Join(s.Sandbox.ProcRoot, d.Workdir), Env: gitEnv})
	timedOut := err != nil && ctx.Err() == nil && errors.Is(dctx.Err(), context.DeadlineExceeded)
	cancel()
	switch {
	case timedOut:
		v.Detail = fmt.Sprintf("the grade cannot run: taking the model's diff timed out after %s", DefaultDiffTimeout)
		return done()
	case err != nil:
		return nil, fmt.Errorf("swekind: session %s: take the model's diff: %w", s.ID, err)
	case res.ExitCode == 5:
		n, _ := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
		v.PatchExists, v.ModelPatchBytes, v.ModelPatchCut = true, n, n > 0
		v.Detail = fmt.Sprintf("the model's diff is %d bytes, more than the %d graded", n, k.maxDiff())
		return done()
	case res.ExitCode != 0:
		v.Detail = fmt.Sprintf("the grade cannot run: taking the model's diff exited %d: %s", res.ExitCode, tail(provider.ExecResult{Stderr: res.Stderr}))
		return done()
	}
	patch := res.Stdout
	v.PatchExists, v.ModelPatchBytes = len(patch) > 0, len(patch)
	v.ModelPatch = string(patch)
	if max := k.maxPatch(); len(patch) > max {
		v.ModelPatch, v.ModelPatchCut = string(patch[:max]), true
	}

	// The grade's own sandbox, of the instance's image.
	fresh, remove, err := sbx.Fresh(ctx, provider.Spec{ImageRef: d.Image, Workdir: d.Workdir})
	if err != nil {
		return nil, fmt.Errorf("swekind: session %s: %w", s.ID, err)
	}
	defer remove()
	dir := path.Join(fresh.ProcRoot, d.Workdir)
	sh := func(ctx context.Context, script string, args []string, opts provider.ExecOptions) (provider.ExecResult, error) {
		opts.Dir = dir
		return x.Exec(ctx, fresh.ID, append([]string{"sh", "-c", script, "swe-grade"}, args...), opts)
	}

	has := "patch"
	if len(patch) == 0 {
		has = "none"
	}
	res, err = sh(ctx, applySh, []string{d.BaseCommit, has}, provider.ExecOptions{Env: gitEnv, Stdin: bytes.NewReader(patch)})
	if err != nil {
		return nil, fmt.Errorf("swekind: session %s: apply the model's diff: %w", s.ID, err)
	}
	switch res.ExitCode {
	case 0:
		v.PatchSuccessfullyApplied = true
	case 10:
		v.Detail, v.Output = "the model's diff does not apply to the base commit", tail(res)
		return done()
	default:
		v.Detail = fmt.Sprintf("the grade cannot run: the grading sandbox's repository (exit %d): %s", res.ExitCode, tail(res))
		return done()
	}

	files := TestFiles(d.TestPatch)
	res, err = sh(ctx, testsSh, append([]string{d.BaseCommit}, files...), provider.ExecOptions{Env: gitEnv, Stdin: strings.NewReader(d.TestPatch)})
	if err != nil {
		return nil, fmt.Errorf("swekind: session %s: apply the test patch: %w", s.ID, err)
	}
	if res.ExitCode != 0 {
		v.Detail, v.Output = fmt.Sprintf("the test patch does not apply over the model's diff (exit %d)", res.ExitCode), tail(res)
		return done()
	}

	timeout := k.TestTimeout
	if timeout <= 0 {
		timeout = DefaultTestTimeout
	}
	tctx, cancel := context.WithTimeout(ctx, timeout)
	res, err = sh(tctx, runSh, append([]string{d.TestCmd}, testDirectives(files)...), provider.ExecOptions{Env: testEnv})
	timedOut = err != nil && ctx.Err() == nil && errors.Is(tctx.Err(), context.DeadlineExceeded)
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
		v.Detail = fmt.Sprintf("%d of %d FAIL_TO_PASS and %d of %d PASS_TO_PASS tests failed",
			len(v.TestsStatus.FailToPass.Failure), len(d.FailToPass), len(v.TestsStatus.PassToPass.Failure), len(d.PassToPass))
	}
	if !v.PatchExists && v.Resolved {
		v.Resolved, v.Detail = false, "the model changed nothing"
	}
	return done()
}

func (k Kind) maxPatch() int {
	if k.MaxPatch <= 0 {
		return DefaultMaxPatch
	}
	return k.MaxPatch
}

func (k Kind) maxDiff() int {
	if k.MaxDiff <= 0 {
		return DefaultMaxDiff
	}
	return k.MaxDiff
}
