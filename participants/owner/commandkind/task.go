package commandkind

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path"
	"regexp"
	"strings"
	"time"
)

// Sentinel errors.
var (
	// ErrTask is wrapped by ParseTask (and so by Spec and Setup) for a
	// payload that is not a command task; the message names the field.
	ErrTask = errors.New("commandkind: bad task")
	// ErrSetup is wrapped by Setup when the workspace cannot be copied in,
	// a setup command fails, or the pinned paths cannot be recorded.
	ErrSetup = errors.New("commandkind: setup failed")
	// ErrPinTooLarge is wrapped by Setup when the pinned paths take more
	// than the kind's MaxPin bytes.
	ErrPinTooLarge = errors.New("commandkind: pinned files too large")
	// ErrData is wrapped by Grade for session data that is not what Setup
	// returns (a session of another kind, or none).
	ErrData = errors.New("commandkind: bad session data")
)

// Limits of a task; ParseTask refuses a payload past them.
const (
	// MaxPrompt is the longest prompt, in bytes.
	MaxPrompt = 64 << 10
	// MaxSetup is the most setup commands a task runs.
	MaxSetup = 32
	// MaxPins is the most paths a task pins.
	MaxPins = 64
	// MaxEnv is the most environment entries a task sets.
	MaxEnv = 128
	// MaxArgs is the most arguments of one command, and MaxArg the
	// longest argument, in bytes.
	MaxArgs = 256
	MaxArg  = 64 << 10
	// MaxTimeout is the longest timeout of a command.
	MaxTimeout = time.Hour
	// MaxImageRef is the longest image reference, in bytes.
	MaxImageRef = 4096
)

// Defaults of a task.
const (
	// DefaultWorkdir is the working directory when the task names none
	// and has no image (with one, the image's WorkingDir, else /).
	DefaultWorkdir = "/work"
	// DefaultSetupTimeout bounds a setup command that names no timeout.
	DefaultSetupTimeout = 2 * time.Minute
	// DefaultVerifyTimeout bounds a verify that names no timeout.
	DefaultVerifyTimeout = 5 * time.Minute
)

// SessionDataEnv is the environment variable that carries the setup data
// (a JSON object, {} when the setup printed none) to the verify command.
const SessionDataEnv = "STILLPOINT_SESSION_DATA"

// The reward modes of Verify.Reward.
const (
	// RewardExit: exit status 0 is reward 1, anything else 0.
	RewardExit = "exit"
	// RewardJSON: the last non-empty line of stdout is a JSON object
	// whose "reward" number is the reward.
	RewardJSON = "json"
)

// Task is the payload of a command task. docs/TASKS.md describes every
// field.
type Task struct {
	// Name names the task: ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$. The
	// scripted harness sends it to its model as the script's name.
	// Required.
	Name string `json:"task"`
	// Prompt is what the harness is asked (the first user message).
	// Required; at most MaxPrompt bytes.
	Prompt string `json:"prompt"`
	// Workspace is copied into Workdir before the setup commands run;
	// none leaves Workdir empty.
	Workspace Workspace `json:"workspace,omitzero"`
	// Workdir is the working directory in the sandbox, absolute (default
	// DefaultWorkdir, or with an image the image's WorkingDir, else /):
	// the harness's, the setup's and the verify's.
	Workdir string `json:"workdir,omitempty"`
	// Image is the container image the sandbox's root is made of: an OCI
	// image layout directory, a docker save archive or a registry
	// reference (the owner resolves it; see provider.Spec.ImageRef).
	// None: the provider's base.
	Image string `json:"image,omitempty"`
	// Env is added (KEY=value) to the environment of the setup and verify
	// commands; not SessionDataEnv.
	Env []string `json:"env,omitempty"`
	// Setup are commands run in the sandbox, in order, after the
	// workspace is copied in.
	Setup []Step `json:"setup,omitempty"`
	// Pin are paths in Workdir (relative) whose content after the setup
	// the session data records and Grade writes back before the verify.
	Pin []string `json:"pin,omitempty"`
	// Verify is the command that grades the session. Required.
	Verify Verify `json:"verify"`
	// Harness is for the agent's adapters; the kind ignores it. It must
	// be a JSON object if present.
	Harness json.RawMessage `json:"harness,omitempty"`
}

// Workspace is where a task's files come from: exactly one of Dir,
// Tarball and Git (with Commit), or none. Paths are the owner host's,
// absolute.
type Workspace struct {
	// Dir is a directory copied in whole: files, directories and
	// symbolic links.
	Dir string `json:"dir,omitempty"`
	// Tarball is a tar archive, plain or gzip-compressed, extracted in.
	Tarball string `json:"tarball,omitempty"`
	// Git is a git repository on the host (its work tree or a bare
	// one), cloned without network and checked out at Commit (a commit
	// id, 7 to 64 hex digits), .git included, with no remote.
	Git    string `json:"git,omitempty"`
	Commit string `json:"commit,omitempty"`
}

// Step is one setup command.
type Step struct {
	// Command is the argv, run in Workdir. Required.
	Command []string `json:"command"`
	// Timeout bounds it (default DefaultSetupTimeout, at most
	// MaxTimeout); one that runs out fails the setup.
	Timeout Duration `json:"timeout,omitempty"`
}

// Verify is how a session is graded.
type Verify struct {
	// Command is the argv, run in Workdir after the pinned paths are
	// written back. Required.
	Command []string `json:"command"`
	// Reward is RewardExit (the default) or RewardJSON.
	Reward string `json:"reward,omitempty"`
	// Timeout bounds it (default DefaultVerifyTimeout, at most
	// MaxTimeout); one that runs out is reward 0.
	Timeout Duration `json:"timeout,omitempty"`
}

// Duration is a duration as the task writes it: a string that
// time.ParseDuration reads, such as "90s"; empty is the default.
type Duration string

// value returns the duration; Validate has checked that it parses.
func (d Duration) value() (time.Duration, error) {
	if d == "" {
		return 0, nil
	}
	return time.ParseDuration(string(d))
}

// or returns d, or def when d is empty.
func (d Duration) or(def time.Duration) time.Duration {
	v, err := d.value()
	if err != nil || v == 0 {
		return def
	}
	return v
}

var (
	nameRE   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	commitRE = regexp.MustCompile(`^[0-9a-f]{7,64}$`)
	envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// ParseTask decodes a payload (unknown fields refused) and checks it
// completely; the errors, joined, wrap ErrTask and name their field.
func ParseTask(raw json.RawMessage) (Task, error) {
	var t Task
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return t, fmt.Errorf("%w: %v", ErrTask, err)
	}
	if dec.More() {
		return t, fmt.Errorf("%w: more than one JSON value", ErrTask)
	}
	// An image given as "" is a mistake, not the lack of one.
	var named struct {
		Image *string `json:"image"`
	}
	if json.Unmarshal(raw, &named) == nil && named.Image != nil && *named.Image == "" {
		return t, errors.Join(fmt.Errorf("%w: image: empty", ErrTask), t.Validate())
	}
	return t, t.Validate()
}

// Validate checks every field of t; the errors, joined, wrap ErrTask and
// name their field. It does not look at the host: Spec checks that the
// workspace exists.
func (t Task) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: "+format, append([]any{ErrTask, field}, args...)...))
	}
	if !nameRE.MatchString(t.Name) {
		bad("task", "%.80q must match %s", t.Name, nameRE)
	}
	switch {
	case strings.TrimSpace(t.Prompt) == "":
		bad("prompt", "missing")
	case len(t.Prompt) > MaxPrompt:
		bad("prompt", "%d bytes, more than %d", len(t.Prompt), MaxPrompt)
	case strings.ContainsRune(t.Prompt, 0):
		bad("prompt", "contains NUL")
	}
	errs = append(errs, t.Workspace.validate()...)
	if t.Workdir != "" {
		if err := checkAbs(t.Workdir); err != nil {
			bad("workdir", "%v", err)
		}
	}
	switch {
	case len(t.Image) > MaxImageRef:
		bad("image", "%d bytes, more than %d", len(t.Image), MaxImageRef)
	case strings.ContainsFunc(t.Image, func(r rune) bool { return r < ' ' || r == 0x7f }):
		bad("image", "%.80q contains NUL or a control character", t.Image)
	}
	if len(t.Env) > MaxEnv {
		bad("env", "%d entries, more than %d", len(t.Env), MaxEnv)
	}
	for i, kv := range t.Env {
		k, _, ok := strings.Cut(kv, "=")
		switch {
		case !ok || !envKeyRE.MatchString(k):
			bad(fmt.Sprintf("env[%d]", i), "%.80q is not KEY=value", kv)
		case k == SessionDataEnv:
			bad(fmt.Sprintf("env[%d]", i), "%s is set by the kind", SessionDataEnv)
		case strings.ContainsRune(kv, 0) || len(kv) > MaxArg:
			bad(fmt.Sprintf("env[%d]", i), "contains NUL or is longer than %d bytes", MaxArg)
		}
	}
	if len(t.Setup) > MaxSetup {
		bad("setup", "%d commands, more than %d", len(t.Setup), MaxSetup)
	}
	for i, s := range t.Setup {
		field := fmt.Sprintf("setup[%d]", i)
		errs = append(errs, checkCommand(field+".command", s.Command)...)
		errs = append(errs, checkTimeout(field+".timeout", s.Timeout)...)
	}
	if len(t.Pin) > MaxPins {
		bad("pin", "%d paths, more than %d", len(t.Pin), MaxPins)
	}
	seen := map[string]int{}
	for i, p := range t.Pin {
		field := fmt.Sprintf("pin[%d]", i)
		c, err := checkRel(p)
		if err != nil {
			bad(field, "%v", err)
			continue
		}
		if j, dup := seen[c]; dup {
			bad(field, "%q is pin[%d] again", p, j)
		}
		seen[c] = i
	}
	errs = append(errs, checkCommand("verify.command", t.Verify.Command)...)
	switch t.Verify.Reward {
	case "", RewardExit, RewardJSON:
	default:
		bad("verify.reward", "%.40q: want %q or %q", t.Verify.Reward, RewardExit, RewardJSON)
	}
	errs = append(errs, checkTimeout("verify.timeout", t.Verify.Timeout)...)
	if h := bytes.TrimSpace(t.Harness); len(h) > 0 && h[0] != '{' {
		bad("harness", "must be a JSON object")
	}
	return errors.Join(errs...)
}

// workdir returns the working directory, cleaned: "" with an image and
// none named, for the owner to take the image's.
func (t Task) workdir() string {
	if t.Workdir == "" {
		if t.Image != "" {
			return ""
		}
		return DefaultWorkdir
	}
	return path.Clean(t.Workdir)
}

// pins returns the pinned paths, cleaned.
func (t Task) pins() []string {
	out := make([]string, len(t.Pin))
	for i, p := range t.Pin {
		out[i] = path.Clean(p)
	}
	return out
}

func (w Workspace) validate() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: workspace.%s: "+format, append([]any{ErrTask, field}, args...)...))
	}
	n := 0
	for _, f := range []struct{ name, p string }{{"dir", w.Dir}, {"tarball", w.Tarball}, {"git", w.Git}} {
		if f.p == "" {
			continue
		}
		n++
		if err := checkAbs(f.p); err != nil {
			bad(f.name, "%v (a path on the owner's host)", err)
		}
	}
	if n > 1 {
		bad("dir", "name one of dir, tarball and git, not %d", n)
	}
	switch {
	case w.Git != "" && !commitRE.MatchString(w.Commit):
		bad("commit", "%.80q: want a commit id, 7 to 64 lower-case hex digits", w.Commit)
	case w.Git == "" && w.Commit != "":
		bad("commit", "only with workspace.git")
	}
	return errs
}

// checkAbs accepts an absolute path without "..", NUL or a trailing
// element that is empty.
func checkAbs(p string) error {
	switch {
	case !path.IsAbs(p):
		return fmt.Errorf("%.200q is not absolute", p)
	case strings.ContainsRune(p, 0):
		return fmt.Errorf("%.200q contains NUL", p)
	case hasDotDot(p):
		return fmt.Errorf("%.200q holds ..", p)
	}
	return nil
}

// checkRel accepts a relative path inside the working directory and
// returns it cleaned: not empty, not absolute, no "..", not the directory
// itself, not starting with "-".
func checkRel(p string) (string, error) {
	switch {
	case p == "":
		return "", errors.New("empty path")
	case path.IsAbs(p):
		return "", fmt.Errorf("%.200q is absolute; pins are relative to the working directory", p)
	case strings.ContainsRune(p, 0):
		return "", fmt.Errorf("%.200q contains NUL", p)
	case hasDotDot(p):
		return "", fmt.Errorf("%.200q escapes the working directory (..)", p)
	}
	c := path.Clean(p)
	switch {
	case c == ".":
		return "", fmt.Errorf("%.200q is the working directory itself", p)
	case strings.HasPrefix(c, "-"):
		return "", fmt.Errorf("%.200q starts with -", p)
	}
	return c, nil
}

func hasDotDot(p string) bool {
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return true
		}
	}
	return false
}

func checkCommand(field string, argv []string) []error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s: "+format, append([]any{ErrTask, field}, args...)...))
	}
	switch {
	case len(argv) == 0:
		bad("missing")
		return errs
	case argv[0] == "":
		bad("empty program")
	case len(argv) > MaxArgs:
		bad("%d arguments, more than %d", len(argv), MaxArgs)
	}
	for i, a := range argv {
		if strings.ContainsRune(a, 0) || len(a) > MaxArg {
			bad("[%d] contains NUL or is longer than %d bytes", i, MaxArg)
		}
	}
	return errs
}

func checkTimeout(field string, d Duration) []error {
	v, err := d.value()
	switch {
	case err != nil:
		return []error{fmt.Errorf("%w: %s: %.40q is not a duration such as \"90s\"", ErrTask, field, string(d))}
	case v < 0:
		return []error{fmt.Errorf("%w: %s: %s is negative", ErrTask, field, v)}
	case v > MaxTimeout:
		return []error{fmt.Errorf("%w: %s: %s is longer than %s", ErrTask, field, v, MaxTimeout)}
	}
	return nil
}

// Verdict is a command task's grade, the verify result.
type Verdict struct {
	// Reward is the reward: 1 or 0 for RewardExit, the printed number for
	// RewardJSON, 0 when the verify timed out or printed no reward.
	Reward float64 `json:"reward"`
	// ExitCode is the verify command's exit status (128+n for signal n).
	ExitCode int `json:"exit_code"`
	// Result is, for RewardJSON, the JSON object the verify printed.
	Result json.RawMessage `json:"result,omitempty"`
	// Detail says why the reward is 0 when the command did not say.
	Detail string `json:"detail,omitempty"`
	// Output is the end of what the verify wrote, stdout then stderr.
	Output string `json:"output,omitempty"`
	// TookMS is how long the verify ran, pinned files written back
	// included.
	TookMS int64 `json:"took_ms"`
}

// rewardOf reads the reward of a RewardJSON verify from its stdout: the
// last non-empty line, a JSON object with a finite "reward" number.
func rewardOf(stdout []byte) (float64, json.RawMessage, error) {
	line := lastLine(stdout)
	if len(line) == 0 || line[0] != '{' {
		return 0, nil, errors.New("the verify printed no JSON object on its last line")
	}
	var v struct {
		Reward *float64 `json:"reward"`
	}
	if err := json.Unmarshal(line, &v); err != nil {
		return 0, nil, fmt.Errorf("the verify's last line is not a JSON object: %v", err)
	}
	if v.Reward == nil || math.IsNaN(*v.Reward) || math.IsInf(*v.Reward, 0) {
		return 0, nil, errors.New("the verify's JSON object has no finite \"reward\" number")
	}
	return *v.Reward, json.RawMessage(bytes.Clone(line)), nil
}

// lastLine returns the last non-empty line of b, trimmed.
func lastLine(b []byte) []byte {
	b = bytes.TrimRight(b, " \t\r\n")
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	return bytes.TrimSpace(b)
}
