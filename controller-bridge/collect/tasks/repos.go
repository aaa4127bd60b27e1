package tasks

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/participants/owner/commandkind"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

// repoFiles are the repositories of the set, as plain files: each a small
// project with a failing test. (Under testdata, so that the go command
// does not build the Go ones as packages of this module; their go.mod is
// written by Repos, as a go.mod here would make them modules go:embed
// cannot carry.)
//
//go:embed all:testdata/repos
var repoFiles embed.FS

// ControlID is the rollout id of the control task: py-calc again, with a
// model script that looks and runs the tests but fixes nothing, so its
// reward is 0.
const ControlID = "py-calc-control"

// RepoOptions shape the repository set.
type RepoOptions struct {
	// Dir is where Repos writes the repositories (absolute, on the
	// owner's host): a directory per repository, a tarball for one, a git
	// repository for another. What Repos wrote there before is replaced.
	// Required.
	Dir string
	// ToolSeconds is how long the first test run of each task sleeps
	// before it runs the tests (a checkpoint then catches it mid-tool);
	// default 0.
	ToolSeconds float64
	// VerifySeconds is how long each verify sleeps before it runs the
	// tests (a checkpoint then catches a grade in flight); default 0.
	VerifySeconds float64
	// NoControl leaves the control task out.
	NoControl bool
	// Harness is the harness the model script is for: HarnessScripted
	// (the default: every call is the scripted harness's bash tool) or
	// HarnessOpenCode (OpenCode's own tools: the code is looked at with
	// read, the fix made with edit or write where it is a plain edit or a
	// whole file, the tests run with bash), HarnessClaude (Claude Code's
	// Read, Edit, Write and Bash, likewise) or HarnessCodex (Codex's one
	// tool, exec_command, for everything).
	Harness string
}

// The harnesses a repository set's script is for (RepoOptions.Harness).
const (
	HarnessScripted = "scripted"
	HarnessOpenCode = "opencode"
	HarnessClaude   = "claude"
	HarnessCodex    = "codex"
)

// Harnesses are the harnesses whose tools a repository task's script may
// call (RepoOptions.Harness).
var Harnesses = []string{HarnessScripted, HarnessOpenCode, HarnessClaude, HarnessCodex}

// repo is one repository of the set and how its task is solved.
type repo struct {
	name   string
	lang   string // python, shell, go
	from   string // dir, tarball, git
	prompt string
	look   string // the first tool call: read the code
	src    string // the file that holds the bug (OpenCode's read looks at it)
	fix    string // the tool call that fixes it
	// edit, when set, is the fix as OpenCode's edit tool makes it (old,
	// new in src); a fix that writes a whole file (cat > F <<'EOF') is
	// OpenCode's write tool.
	edit [2]string
	// tests runs the tests in a tool call; verify and reward grade it.
	tests  string
	verify []string
	reward string
	pin    []string
	setup  [][]string
}

// repos is the set: python's unittest, shell scripts and Go, each with a
// failing test and its known fix.
var repos = []repo{
	{name: "py-calc", src: "calc.py", lang: "python", from: "dir",
		prompt: "The tests in test_calc.py fail: add() gives the wrong sum. Fix calc.py so that `python3 -m unittest` passes; do not change the tests.",
		look:   "cat calc.py test_calc.py",
		fix:    "sed -i 's/return a - b/return a + b/' calc.py && grep -n 'return a' calc.py",
		edit:   [2]string{"return a - b", "return a + b"},
		tests:  "python3 -m unittest -v", verify: []string{"python3", "-m", "unittest", "-v"}, pin: []string{"test_calc.py"}},
	{name: "py-slug", src: "slug.py", lang: "python", from: "dir",
		prompt: "slugify() in slug.py keeps capitals, punctuation and empty words. Fix it so that the tests in test_slug.py pass.",
		look:   "cat slug.py test_slug.py",
		fix: `cat > slug.py <<'EOF'
"""URL slugs of titles."""

import re


def slugify(title):
    """Turn a title into a URL slug: lower-case letters and digits, words
    joined by single hyphens, nothing else."""
    return "-".join(re.findall(r"[a-z0-9]+", title.lower()))
EOF`,
		tests: "python3 -m unittest -v", verify: []string{"python3", "-m", "unittest", "-v"}, pin: []string{"test_slug.py"}},
	{name: "py-roman", src: "roman.py", lang: "python", from: "dir",
		prompt: "to_roman() in roman.py writes 4 as IIII. Make it use the subtractive pairs (IV, IX, XL, XC, CD, CM) so that the tests pass.",
		look:   "cat roman.py test_roman.py",
		fix: `python3 - <<'EOF'
import re
src = open("roman.py").read()
table = '[(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"), (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]'
open("roman.py", "w").write(re.sub(r"NUMERALS = \[.*\]", "NUMERALS = " + table, src))
EOF
grep -n NUMERALS roman.py`,
		tests: "python3 -m unittest -v", verify: []string{"python3", "-m", "unittest", "-v"}, pin: []string{"test_roman.py"}},
	{name: "py-stack", src: "stack.py", lang: "python", from: "tarball",
		prompt: "Stack in stack.py pops and peeks the wrong end. Fix it so that the tests in test_stack.py pass.",
		look:   "cat stack.py test_stack.py",
		fix:    `sed -i 's/self.items.pop(0)/self.items.pop()/; s/self.items\[0\]/self.items[-1]/' stack.py && grep -n 'items' stack.py`,
		tests:  "python3 -m unittest -v", verify: []string{"python3", "-m", "unittest", "-v"}, pin: []string{"test_stack.py"}},
	{name: "py-wordfreq", src: "wordfreq.py", lang: "python", from: "dir",
		prompt: "count_words() in wordfreq.py splits on single spaces and keeps case and punctuation. Fix it: a word is a run of letters a to z, counted case-insensitively.",
		look:   "cat wordfreq.py test_wordfreq.py",
		fix: `cat > wordfreq.py <<'EOF'
"""Word frequencies."""

import re
from collections import Counter


def count_words(text):
    """Count the words of text, case-insensitively: a word is a run of
    letters a to z; spaces and punctuation are not part of any word."""
    return Counter(re.findall(r"[a-z]+", text.lower()))
EOF`,
		tests: "python3 -m unittest -v", verify: []string{"python3", ".grader/grade.py"}, reward: commandkind.RewardJSON,
		// The hidden case goes into the session data, and its maker
		// leaves the workspace.
		setup: [][]string{{"sh", "-c", "python3 .grader/case.py && rm .grader/case.py"}},
		pin:   []string{".grader", "test_wordfreq.py"}},
	{name: "sh-greet", src: "greet.sh", lang: "shell", from: "dir",
		prompt: "greet.sh prints \"Hello, !\" when it is given no name. Make it greet the world then, so that `sh test.sh` passes.",
		look:   "cat greet.sh test.sh",
		fix:    `sed -i 's/^name=\$1$/name=${1:-world}/' greet.sh && cat greet.sh`,
		edit:   [2]string{"name=$1\n", "name=${1:-world}\n"},
		tests:  "sh test.sh", verify: []string{"sh", "test.sh"}, pin: []string{"test.sh"}},
	{name: "sh-count", src: "count.sh", lang: "shell", from: "git",
		prompt: "count.sh counts every line, blank ones too. Make it count only the lines that hold something other than spaces and tabs, so that `sh test.sh` passes.",
		look:   "cat count.sh test.sh && git log --oneline",
		fix:    `sed -i "s/grep -c '' /grep -c '[^[:space:]]' /" count.sh && cat count.sh`,
		tests:  "sh test.sh", verify: []string{"sh", "test.sh"}, pin: []string{"test.sh", "fixtures"}},
	{name: "go-reverse", src: "reverse.go", lang: "go", from: "dir",
		prompt: "String in reverse.go reverses bytes, which breaks every character that is not ASCII. Make it reverse characters (runes), so that `go test` passes.",
		look:   "cat reverse.go reverse_test.go",
		fix: `cat > reverse.go <<'EOF'
// Package reverse reverses strings.
package reverse

// String returns s with its characters in reverse order.
func String(s string) string {
	r := []rune(s)
	for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
		r[i], r[j] = r[j], r[i]
	}
	return string(r)
}
EOF`,
		tests: "go test -count=1 -v ./...", verify: []string{"go", "test", "-count=1", "-v", "./..."}, pin: []string{"reverse_test.go", "go.mod"}},
	{name: "go-fizzbuzz", src: "fizzbuzz.go", lang: "go", from: "dir",
		prompt: "Say in fizzbuzz.go answers Fizz for 15. Fix it so that `go test` passes.",
		look:   "cat fizzbuzz.go fizzbuzz_test.go",
		fix: `cat > fizzbuzz.go <<'EOF'
// Package fizzbuzz says the numbers of the game.
package fizzbuzz

import "strconv"

// Say returns what is said for n: Fizz for a multiple of 3, Buzz for a
// multiple of 5, FizzBuzz for a multiple of both, else the number.
func Say(n int) string {
	switch {
	case n%15 == 0:
		return "FizzBuzz"
	case n%3 == 0:
		return "Fizz"
	case n%5 == 0:
		return "Buzz"
	}
	return strconv.Itoa(n)
}
EOF`,
		tests: "go test -count=1 -v ./...", verify: []string{"go", "test", "-count=1", "-v", "./..."}, pin: []string{"fizzbuzz_test.go", "go.mod"}},
}

// RepoNames returns the rollout ids of the repository set with its
// control task, sorted.
func RepoNames() []string {
	var out []string
	for _, r := range repos {
		out = append(out, r.name)
	}
	return slices.Sorted(slices.Values(append(out, ControlID)))
}

// pythonEnv keeps Python from reading the .pyc files a run of the tests
// left: a fix of the same size made within the second of that run would
// otherwise be graded from the buggy file's bytecode.
var pythonEnv = []string{"PYTHONDONTWRITEBYTECODE=1", "PYTHONPYCACHEPREFIX=/nonexistent/stillpoint-pycache"}

// sandboxPath is the PATH of the overlay provider's sandboxes.
const sandboxPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// goEnv returns the environment of the Go tasks' commands: this host's go
// command first in PATH (the overlay sandboxes see the host's root), its
// build cache, and nothing from the network.
func goEnv() ([]string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return nil, errors.New("tasks: the Go repositories need the go command in PATH (install Go: https://go.dev/dl)")
	}
	out, err := exec.Command(goBin, "env", "GOROOT", "GOCACHE").Output()
	if err != nil {
		return nil, fmt.Errorf("tasks: go env: %w", err)
	}
	lines := strings.Fields(string(out))
	if len(lines) != 2 {
		return nil, fmt.Errorf("tasks: go env GOROOT GOCACHE printed %q", out)
	}
	return []string{"PATH=" + filepath.Join(lines[0], "bin") + ":" + sandboxPath, "GOCACHE=" + lines[1],
		"GOTOOLCHAIN=local", "GOPROXY=off", "GOFLAGS=-mod=mod", "GOENV=off", "GOWORK=off"}, nil
}

// warmed holds, by Go repository, the build of its tests into this host's
// cache: once per process, every caller waiting for the one build.
var warmed sync.Map // repository name → func() error (sync.OnceValue)

// warmGoCache builds the tests of the Go repository in dir, running none,
// into this host's build cache, which the overlay sandboxes read (their
// writes stay in the sandbox): with a cold cache a sandbox's first `go
// test` compiles the standard library's testing packages, a minute of CPU
// in each rollout, and the same in every sandbox again.
func warmGoCache(dir string, env []string) error {
	build, _ := warmed.LoadOrStore(filepath.Base(dir), sync.OnceValue(func() error {
		cmd := exec.Command("go", "test", "-count=1", "-run", "^$", "./...")
		cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go test of the unchanged repository does not build: %w\n%s", err, out)
		}
		return nil
	}))
	return build.(func() error)()
}

// Repos writes the repository set into o.Dir and returns its tasks, of the
// command kind (participants/owner/commandkind), and the model script
// that solves them for the scripted harness: each task looks at the code,
// runs the tests, applies the known fix with a tool call, runs the tests
// again and answers; the control task (ControlID) answers without the
// fix. Every verify runs the repository's own tests. One repository comes
// as a gzip tarball, one as a git repository checked out at its first
// commit (the second one removes the tests), the rest as directories. It
// needs python3, sh, git and go on the host; an error says which is
// missing.
func Repos(o RepoOptions) ([]collect.Task, modelserver.Script, error) {
	if !filepath.IsAbs(o.Dir) {
		return nil, nil, fmt.Errorf("tasks: RepoOptions.Dir %q: must be absolute", o.Dir)
	}
	for _, tool := range []string{"python3", "sh", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, nil, fmt.Errorf("tasks: the repository set needs %s in PATH (apt-get install %s)", tool, map[string]string{"python3": "python3", "sh": "dash", "git": "git"}[tool])
		}
	}
	genv, err := goEnv()
	if err != nil {
		return nil, nil, err
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, nil, err
	}
	tools, err := toolsFor(o.Harness)
	if err != nil {
		return nil, nil, fmt.Errorf("tasks: RepoOptions.Harness %w", err)
	}
	script := modelserver.Script{}
	var out []collect.Task
	for _, r := range repos {
		ws, err := r.write(o.Dir)
		if err != nil {
			return nil, nil, fmt.Errorf("tasks: repository %s: %w", r.name, err)
		}
		if r.lang == "go" {
			if err := warmGoCache(ws.Dir, genv); err != nil {
				return nil, nil, fmt.Errorf("tasks: repository %s: %w", r.name, err)
			}
		}
		t := commandkind.Task{Name: r.name, Prompt: r.prompt, Workspace: ws, Pin: r.pin,
			Verify: commandkind.Verify{Command: r.verify, Reward: r.reward}}
		tests, verify := r.tests, t.Verify.Command
		switch r.lang {
		case "python":
			t.Env = pythonEnv
			tests = strings.Join(pythonEnv, " ") + " " + tests
		case "go":
			t.Env = genv
			tests = "export " + strings.Join(genv, " ") + "; " + tests
			t.Setup = append(t.Setup, commandkind.Step{Command: []string{"sh", "-c", `printf '{"go": "%s"}\n' "$(go env GOVERSION)"`}})
		}
		for _, s := range r.setup {
			t.Setup = append(t.Setup, commandkind.Step{Command: s})
		}
		if o.VerifySeconds > 0 {
			t.Verify.Command = append([]string{"sh", "-c", fmt.Sprintf(`sleep %g && exec "$@"`, o.VerifySeconds), "verify"}, verify...)
			t.Verify.Timeout = commandkind.Duration((time.Duration(o.VerifySeconds*float64(time.Second)) + commandkind.DefaultVerifyTimeout).String())
		}
		first := tests + " 2>&1 | tail -20"
		if o.ToolSeconds > 0 {
			first = fmt.Sprintf("sleep %g; %s", o.ToolSeconds, first)
		}
		turns := []modelserver.Turn{
			{Content: "Reading the code.", ToolCalls: []modelserver.ToolCall{tools.look(r)}},
			{Content: "Running the tests.", ToolCalls: []modelserver.ToolCall{tools.bash("test1", first)}},
		}
		ids := []string{r.name}
		if r.name == "py-calc" && !o.NoControl {
			ids = append(ids, ControlID)
		}
		for _, id := range ids {
			tk := t
			tk.Name = id
			tturns := slices.Clone(turns)
			if id == ControlID {
				tturns = append(tturns, modelserver.Turn{Content: "I could not find the bug in " + r.name + "."})
			} else {
				tturns = append(tturns,
					modelserver.Turn{Content: "Applying the fix.", ToolCalls: []modelserver.ToolCall{tools.fix(r)}},
					modelserver.Turn{Content: "Running the tests again.", ToolCalls: []modelserver.ToolCall{tools.bash("test2", tests+" 2>&1 | tail -20")}},
					modelserver.Turn{Content: "fixed " + id})
			}
			payload, err := json.Marshal(tk)
			if err != nil {
				return nil, nil, err
			}
			if _, err := commandkind.ParseTask(payload); err != nil {
				return nil, nil, fmt.Errorf("tasks: %s: %w", id, err)
			}
			script[id] = tturns
			out = append(out, collect.Task{RolloutID: id, Task: payload})
		}
	}
	slices.SortFunc(out, func(a, b collect.Task) int { return strings.Compare(a.RolloutID, b.RolloutID) })
	return out, script, nil
}

// toolset makes a repository task's tool calls for one harness.
type toolset interface {
	look(r repo) modelserver.ToolCall
	fix(r repo) modelserver.ToolCall
	bash(id, cmd string) modelserver.ToolCall
}

// scriptedTools are the scripted harness's: bash for everything.
type scriptedTools struct{}

func (scriptedTools) look(r repo) modelserver.ToolCall         { return call("look", r.look) }
func (scriptedTools) fix(r repo) modelserver.ToolCall          { return call("fix", r.fix) }
func (scriptedTools) bash(id, cmd string) modelserver.ToolCall { return call(id, cmd) }

// openCodeTools are OpenCode's own: read, edit, write and bash.
type openCodeTools struct{}

func (openCodeTools) look(r repo) modelserver.ToolCall { return modelserver.ReadCall("look", r.src) }

func (openCodeTools) fix(r repo) modelserver.ToolCall {
	if r.edit != [2]string{} {
		return modelserver.EditCall("fix", r.src, r.edit[0], r.edit[1])
	}
	if file, content, ok := heredoc(r.fix); ok {
		return modelserver.WriteCall("fix", file, content)
	}
	return modelserver.BashCall("fix", r.fix)
}

func (openCodeTools) bash(id, cmd string) modelserver.ToolCall { return modelserver.BashCall(id, cmd) }

// codexTools are Codex's one tool, exec_command, waiting the most Codex
// allows (yield_time_ms) before it returns with the command still running.
type codexTools struct{}

func (codexTools) look(r repo) modelserver.ToolCall { return codexExec("look", r.look) }
func (codexTools) fix(r repo) modelserver.ToolCall  { return codexExec("fix", r.fix) }
func (codexTools) bash(id, cmd string) modelserver.ToolCall {
	return codexExec(id, cmd)
}

func codexExec(id, cmd string) modelserver.ToolCall {
	return modelserver.Call(id, "exec_command", map[string]any{"cmd": cmd, "yield_time_ms": 30000})
}

// claudeTools are Claude Code's own: Read, Edit, Write and Bash. Claude
// edits or overwrites only a file the session has read (the one looked
// at), and refuses a command that starts with a long sleep.
type claudeTools struct{}

func (claudeTools) look(r repo) modelserver.ToolCall {
	return modelserver.ClaudeReadCall("look", r.src)
}

func (claudeTools) fix(r repo) modelserver.ToolCall {
	if r.edit != [2]string{} {
		return modelserver.ClaudeEditCall("fix", r.src, r.edit[0], r.edit[1])
	}
	if file, content, ok := heredoc(r.fix); ok && file == r.src {
		return modelserver.ClaudeWriteCall("fix", file, content)
	}
	return modelserver.ClaudeBashCall("fix", r.fix)
}

func (claudeTools) bash(id, cmd string) modelserver.ToolCall {
	if strings.HasPrefix(cmd, "sleep ") {
		cmd = "cd . && " + cmd
	}
	return modelserver.ClaudeBashCall(id, cmd)
}

// heredoc splits a fix of the form "cat > FILE <<'EOF'\n...\nEOF" into the
// file and its content.
func heredoc(fix string) (file, content string, ok bool) {
	head, rest, ok := strings.Cut(fix, "\n")
	if !ok || !strings.HasPrefix(head, "cat > ") || !strings.HasSuffix(head, " <<'EOF'") || !strings.HasSuffix(rest, "\nEOF") {
		return "", "", false
	}
	file = strings.TrimSuffix(strings.TrimPrefix(head, "cat > "), " <<'EOF'")
	return file, strings.TrimSuffix(rest, "EOF"), true
}

// files returns the repository's files: path (slash-separated, relative)
// → content and mode; a Go repository gets its go.mod.
func (r repo) files() (map[string][]byte, map[string]fs.FileMode, error) {
	root := path.Join("testdata/repos", r.name)
	data, modes := map[string][]byte{}, map[string]fs.FileMode{}
	err := fs.WalkDir(repoFiles, root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := repoFiles.ReadFile(p)
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(p, root+"/")
		data[rel], modes[rel] = b, 0o644
		if strings.HasSuffix(rel, ".sh") {
			modes[rel] = 0o755
		}
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	if len(data) == 0 {
		return nil, nil, fmt.Errorf("no files under %s", root)
	}
	if r.lang == "go" {
		data["go.mod"], modes["go.mod"] = []byte("module example.com/"+r.name+"\n\ngo 1.22\n"), 0o644
	}
	return data, modes, nil
}

// write writes the repository under dir in its form and returns the
// workspace that names it.
func (r repo) write(dir string) (commandkind.Workspace, error) {
	data, modes, err := r.files()
	if err != nil {
		return commandkind.Workspace{}, err
	}
	switch r.from {
	case "tarball":
		p := filepath.Join(dir, r.name+".tar.gz")
		return commandkind.Workspace{Tarball: p}, writeTarball(p, data, modes)
	case "git":
		p := filepath.Join(dir, r.name)
		commit, err := writeGit(p, data, modes)
		return commandkind.Workspace{Git: p, Commit: commit}, err
	}
	p := filepath.Join(dir, r.name)
	return commandkind.Workspace{Dir: p}, writeTree(p, data, modes)
}

// writeTree replaces dir with the files.
func writeTree(dir string, data map[string][]byte, modes map[string]fs.FileMode) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	for rel, b := range data {
		p := filepath.Join(dir, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, b, modes[rel]); err != nil {
			return err
		}
	}
	return nil
}

// writeTarball writes the files as a gzip-compressed tarball at p.
func writeTarball(p string, data map[string][]byte, modes map[string]fs.FileMode) error {
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	mtime := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	dirs := map[string]bool{}
	for _, rel := range slices.Sorted(maps.Keys(data)) {
		for d := path.Dir(rel); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime}); err != nil {
				return err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Name: rel, Typeflag: tar.TypeReg, Mode: int64(modes[rel]), Size: int64(len(data[rel])), ModTime: mtime}); err != nil {
			return err
		}
		if _, err := tw.Write(data[rel]); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := gz.Close(); err != nil {
		return err
	}
	return os.WriteFile(p, buf.Bytes(), 0o644)
}

// writeGit makes dir a git repository with two commits, the files and
// then the tests removed, and returns the first commit's id. Names and
// dates are fixed, so the ids are the same on every host.
func writeGit(dir string, data map[string][]byte, modes map[string]fs.FileMode) (string, error) {
	if err := writeTree(dir, data, modes); err != nil {
		return "", err
	}
	git := func(args ...string) (string, error) {
		cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=Stillpoint", "-c", "user.email=tasks@stillpoint.invalid",
			"-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false", "-c", "core.autocrlf=false"}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_DATE=2024-01-01T00:00:00Z", "GIT_COMMITTER_DATE=2024-01-01T00:00:00Z", "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
		out, err := cmd.CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
		return strings.TrimSpace(string(out)), nil
	}
	steps := [][]string{{"init", "-q"}, {"add", "-A"}, {"commit", "-q", "-m", "count.sh and its tests"}}
	for _, s := range steps {
		if _, err := git(s...); err != nil {
			return "", err
		}
	}
	first, err := git("rev-parse", "HEAD")
	if err != nil {
		return "", err
	}
	for _, s := range [][]string{{"rm", "-q", "test.sh"}, {"commit", "-q", "-m", "the tests move elsewhere"}} {
		if _, err := git(s...); err != nil {
			return "", err
		}
	}
	return first, nil
}
