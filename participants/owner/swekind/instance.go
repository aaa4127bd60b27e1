package swekind

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/stillpoint/stillpoint/participants/owner/commandkind"
)

// Sentinel errors.
var (
	// ErrTask is wrapped by ParseInstance (and so by Spec and Setup) for
	// a payload that is not a SWE-bench instance; the message names the
	// field.
	ErrTask = errors.New("swekind: bad instance")
	// ErrSetup is wrapped by Setup when the repository in the working
	// directory is not at the instance's base commit.
	ErrSetup = errors.New("swekind: setup failed")
	// ErrData is wrapped by Grade for session data that is not what
	// Setup returns (a session of another kind, or none).
	ErrData = errors.New("swekind: bad session data")
)

// Limits of an instance; ParseInstance refuses a payload past them.
const (
	// MaxText is the longest problem statement, test patch or gold
	// patch, in bytes.
	MaxText = 4 << 20
	// MaxTests is the most tests FAIL_TO_PASS and PASS_TO_PASS name
	// together.
	MaxTests = 20000
)

// DefaultTestCmd runs the named tests when an instance gives no test_cmd:
// pytest with the short summary of every outcome (-rA), which Grade
// parses.
const DefaultTestCmd = "python3 -m pytest -rA"

// Instance is the payload of a swe task: a SWE-bench instance, as the
// dataset's rows are, with the image that holds its repository. Keys the
// kind does not know (created_at, hints_text, ...) are ignored, so a row
// of the dataset is a payload as it is.
type Instance struct {
	// InstanceID names the instance ("owner__repo-1234"). Required.
	InstanceID string `json:"instance_id"`
	// Repo is the repository's name ("owner/repo"). Required.
	Repo string `json:"repo"`
	// BaseCommit is the commit the image's repository is at, 7 to 64
	// hex digits. Required.
	BaseCommit string `json:"base_commit"`
	// ProblemStatement is the issue the model is to resolve: the prompt
	// when Prompt is empty. Required.
	ProblemStatement string `json:"problem_statement"`
	// TestPatch adds or changes the tests that check the fix; the grade
	// applies it over the model's changes. Required.
	TestPatch string `json:"test_patch"`
	// FailToPass are the tests the fix makes pass (pytest node ids, as
	// the run's log names them). At least one.
	FailToPass TestList `json:"FAIL_TO_PASS"`
	// PassToPass are the tests that passed before and must still pass.
	PassToPass TestList `json:"PASS_TO_PASS"`
	// Image is the container image whose working directory holds the
	// repository at BaseCommit (a reference of package image).
	// Required.
	Image string `json:"image"`
	// Patch is the gold patch (the known fix); the kind does not use it.
	Patch string `json:"patch,omitempty"`
	// Version is the repository's version, as the dataset gives it.
	Version string `json:"version,omitempty"`
	// TestCmd is the shell command that runs tests, the test files the
	// test patch touches appended (default DefaultTestCmd). Its log must
	// hold pytest's -rA short summary lines.
	TestCmd string `json:"test_cmd,omitempty"`
	// Task is the scripted model's script name (the agent's adapters
	// read it); Prompt what the harness is asked (default
	// ProblemStatement).
	Task   string `json:"task,omitempty"`
	Prompt string `json:"prompt,omitempty"`
}

// TestList is a list of test names. The SWE-bench dataset stores it as a
// string holding a JSON list; a JSON list is read as well.
type TestList []string

// UnmarshalJSON implements json.Unmarshaler: a JSON list of strings, or a
// string holding one ("" is the empty list).
func (l *TestList) UnmarshalJSON(b []byte) error {
	var list []string
	if err := json.Unmarshal(b, &list); err == nil {
		*l = list
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return errors.New("want a JSON list of strings, or a string holding one")
	}
	if strings.TrimSpace(s) == "" {
		*l = nil
		return nil
	}
	if err := json.Unmarshal([]byte(s), &list); err != nil {
		return fmt.Errorf("the string does not hold a JSON list of strings: %v", err)
	}
	*l = list
	return nil
}

var (
	idRE     = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,255}$`)
	commitRE = regexp.MustCompile(`^[0-9a-fA-F]{7,64}$`)
	// diffFileRE finds the paths a unified git diff touches.
	diffFileRE = regexp.MustCompile(`(?m)^diff --git a/(\S+) b/(\S+)$`)
)

// ParseInstance decodes a payload and checks it; the errors, joined, wrap
// ErrTask and name their field.
func ParseInstance(raw json.RawMessage) (Instance, error) {
	var in Instance
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&in); err != nil {
		return in, fmt.Errorf("%w: %v", ErrTask, err)
	}
	if dec.More() {
		return in, fmt.Errorf("%w: more than one JSON value", ErrTask)
	}
	return in, in.Validate()
}

// Validate checks every field of in; the errors, joined, wrap ErrTask and
// name their field.
func (in Instance) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: "+format, append([]any{ErrTask, field}, args...)...))
	}
	if !idRE.MatchString(in.InstanceID) {
		bad("instance_id", "%.80q must match %s", in.InstanceID, idRE)
	}
	if strings.TrimSpace(in.Repo) == "" {
		bad("repo", "missing")
	}
	if !commitRE.MatchString(in.BaseCommit) {
		bad("base_commit", "%.80q is not a commit id (7 to 64 hex digits)", in.BaseCommit)
	}
	switch {
	case strings.TrimSpace(in.Image) == "":
		bad("image", "missing: a swe instance names the image that holds its repository")
	case len(in.Image) > commandkind.MaxImageRef:
		bad("image", "%d bytes, more than %d", len(in.Image), commandkind.MaxImageRef)
	case strings.ContainsFunc(in.Image, func(r rune) bool { return r < ' ' || r == 0x7f }):
		bad("image", "%.80q contains NUL or a control character", in.Image)
	}
	for _, f := range []struct{ name, v string }{{"problem_statement", in.ProblemStatement}, {"test_patch", in.TestPatch}} {
		switch {
		case strings.TrimSpace(f.v) == "":
			bad(f.name, "missing")
		case len(f.v) > MaxText:
			bad(f.name, "%d bytes, more than %d", len(f.v), MaxText)
		case !utf8.ValidString(f.v) || strings.ContainsRune(f.v, 0):
			bad(f.name, "not UTF-8 text")
		}
	}
	if len(in.Patch) > MaxText {
		bad("patch", "%d bytes, more than %d", len(in.Patch), MaxText)
	}
	if in.TestPatch != "" && len(TestFiles(in.TestPatch)) == 0 {
		bad("test_patch", "touches no file (no \"diff --git a/... b/...\" line)")
	}
	if len(in.FailToPass) == 0 {
		bad("FAIL_TO_PASS", "empty: an instance names at least one test its fix makes pass")
	}
	if n := len(in.FailToPass) + len(in.PassToPass); n > MaxTests {
		bad("FAIL_TO_PASS", "%d tests with PASS_TO_PASS, more than %d", n, MaxTests)
	}
	for field, l := range map[string]TestList{"FAIL_TO_PASS": in.FailToPass, "PASS_TO_PASS": in.PassToPass} {
		for i, name := range l {
			if strings.TrimSpace(name) == "" || strings.ContainsAny(name, "\n\x00") {
				bad(fmt.Sprintf("%s[%d]", field, i), "%.80q is not a test name", name)
			}
		}
	}
	if strings.ContainsRune(in.TestCmd, 0) {
		bad("test_cmd", "contains NUL")
	}
	if in.Task != "" && !idRE.MatchString(in.Task) {
		bad("task", "%.80q must match %s", in.Task, idRE)
	}
	return errors.Join(errs...)
}

// testCmd returns the command that runs the tests.
func (in Instance) testCmd() string {
	if strings.TrimSpace(in.TestCmd) == "" {
		return DefaultTestCmd
	}
	return in.TestCmd
}

// TestFiles returns the files a patch touches (its "diff --git" lines),
// sorted, each once: the test files the grade resets and runs. A path
// that would leave the repository is left out.
func TestFiles(patch string) []string {
	var out []string
	for _, m := range diffFileRE.FindAllStringSubmatch(patch, -1) {
		for _, p := range m[1:] {
			if p == "/dev/null" || path.IsAbs(p) || p != path.Clean(p) || p == ".." || strings.HasPrefix(p, "../") {
				continue
			}
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
