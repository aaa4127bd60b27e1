package tasks

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/controller-bridge/collect/tasks/sweimage"
	"github.com/stillpoint/stillpoint/participants/owner/swekind"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

// sweFiles are the SWE-style set's repositories as plain files: under
// testdata/swe/<instance>, repo/ is the repository at its base commit and
// tests/ the test files as the test patch leaves them.
//
//go:embed all:testdata/swe
var sweFiles embed.FS

// sweInstance is one instance of the SWE-style set: its issue, its tests
// and its known fix.
type sweInstance struct {
	id, repo, version, problem string
	failToPass, passToPass     []string
	// src is the file the fix edits, old and new the edit (old occurs
	// once in src).
	src, old, new string
	// repro shows the bug from the shell.
	repro string
}

// sweSet is the set: five small Python libraries with a bug each.
var sweSet = []sweInstance{
	{id: "textwrapx__textwrapx-12", repo: "textwrapx/textwrapx", version: "0.3",
		problem:    "shorten() returns text longer than the width it is given.\n\n`shorten(\"The quick brown fox jumps over the lazy dog\", 12)` returns `'The quick br...'` (15 characters). The docstring says the result, placeholder included, is at most `width` characters; I expected `'The quick...'`. The same happens with a custom placeholder.",
		failToPass: []string{"tests/test_core.py::test_shorten_respects_width", "tests/test_core.py::test_shorten_custom_placeholder"},
		passToPass: []string{"tests/test_core.py::test_shorten_keeps_short_text", "tests/test_core.py::test_shorten_collapses_space",
			"tests/test_core.py::test_shorten_refuses_tiny_width", "tests/test_core.py::test_wrap_words", "tests/test_core.py::test_wrap_long_word"},
		src: "textwrapx/core.py", old: "    return text[:width] + placeholder\n", new: "    return text[: width - len(placeholder)].rstrip() + placeholder\n",
		repro: `python3 -c 'from textwrapx import shorten; print(repr(shorten("The quick brown fox jumps over the lazy dog", 12)))'`},
	{id: "semverlite__semverlite-31", repo: "semverlite/semverlite", version: "1.2",
		problem:    "Versions with multi-digit parts compare wrongly.\n\n`parse(\"1.10.0\") > parse(\"1.9.0\")` is False, and sorting [\"1.10.0\", \"1.2.0\", \"1.9.1\"] puts 1.10.0 first. It looks like the parts are compared as strings.",
		failToPass: []string{"tests/test_version.py::test_compare_multi_digit", "tests/test_version.py::test_sorting"},
		passToPass: []string{"tests/test_version.py::test_parse_and_str", "tests/test_version.py::test_invalid", "tests/test_version.py::test_compare_single_digits",
			"tests/test_version.py::test_prerelease_first", "tests/test_version.py::test_equal_with_leading_zero_free_parts"},
		src: "semverlite/version.py", old: "    major, minor, patch = m.group(1, 2, 3)\n", new: "    major, minor, patch = (int(part) for part in m.group(1, 2, 3))\n",
		repro: `python3 -c 'from semverlite import parse; print(parse("1.10.0") > parse("1.9.0"))'`},
	{id: "inifile__inifile-8", repo: "inifile/inifile", version: "0.5",
		problem:    "Inline comments end up in values.\n\nWith\n\n    [db]\n    host = localhost  ; dev only\n\n`loads(text)[\"db\"][\"host\"]` is `'localhost  ; dev only'`, not `'localhost'` as the README shows. A `#` or `;` after whitespace should start a comment; one inside a value (`color = #ff0000`) should not.",
		failToPass: []string{"tests/test_parser.py::test_inline_comments_dropped"},
		passToPass: []string{"tests/test_parser.py::test_sections_and_keys", "tests/test_parser.py::test_full_line_comments",
			"tests/test_parser.py::test_bad_line", "tests/test_parser.py::test_hash_inside_value_kept"},
		src: "inifile/parser.py", old: "        key, _, value = line.partition(\"=\")\n",
		new:   "        key, _, value = line.partition(\"=\")\n        value = re.split(r\"\\s+[#;]\", value.strip(), maxsplit=1)[0]\n",
		repro: `python3 -c 'from inifile import loads; print(loads("[db]\nhost = localhost  ; dev only\n"))'`},
	{id: "moneyfmt__moneyfmt-5", repo: "moneyfmt/moneyfmt", version: "2.0",
		problem:    "Negative amounts put the minus sign after the currency symbol.\n\n`format_money(-1234.5)` gives `'$-1,234.50'`; the docstring promises `'-$1,234.50'`.",
		failToPass: []string{"tests/test_format.py::test_negative_amount", "tests/test_format.py::test_negative_other_currency"},
		passToPass: []string{"tests/test_format.py::test_positive", "tests/test_format.py::test_currency_and_decimals", "tests/test_format.py::test_negative_decimals_refused"},
		src:        "moneyfmt/format.py", old: "    return symbol + f\"{amount:,.{decimals}f}\"\n",
		new:   "    sign = \"-\" if amount < 0 else \"\"\n    return sign + symbol + f\"{abs(amount):,.{decimals}f}\"\n",
		repro: `python3 -c 'from moneyfmt import format_money; print(format_money(-1234.5))'`},
	{id: "slugkit__slugkit-19", repo: "slugkit/slugkit", version: "0.9",
		problem:    "unique_slug() returns a taken slug.\n\n`unique_slug(\"Post\", {\"post\", \"post-2\", \"post-3\"})` returns `'post-3'`, which is taken. It should return the first free number from 2 on, `'post-4'`.",
		failToPass: []string{"tests/test_slug.py::test_unique_slug_many_taken", "tests/test_slug.py::test_unique_slug_gap"},
		passToPass: []string{"tests/test_slug.py::test_slugify", "tests/test_slug.py::test_unique_slug_free", "tests/test_slug.py::test_unique_slug_one_taken"},
		src:        "slugkit/slug.py", old: "    if candidate in taken:\n", new: "    while candidate in taken:\n",
		repro: `python3 -c 'from slugkit import unique_slug; print(unique_slug("Post", {"post", "post-2", "post-3"}))'`},
}

// SWENames returns the instance ids of the SWE-style set, sorted.
func SWENames() []string {
	var out []string
	for _, si := range sweSet {
		out = append(out, si.id)
	}
	return slices.Sorted(slices.Values(out))
}

// sweTree returns the files under testdata/swe/<id>/<sub>: path →
// content.
func sweTree(id, sub string) (map[string][]byte, error) {
	root := path.Join("testdata/swe", id, sub)
	out := map[string][]byte{}
	err := fs.WalkDir(sweFiles, root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := sweFiles.ReadFile(p)
		out[strings.TrimPrefix(p, root+"/")] = b
		return err
	})
	if err == nil && len(out) == 0 {
		err = fmt.Errorf("no files under %s", root)
	}
	return out, err
}

// sweGit runs git in dir with a fixed identity and dates, so that commit
// ids are the same on every host, and returns its stdout.
func sweGit(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", append([]string{"-C", dir, "-c", "user.name=Stillpoint", "-c", "user.email=tasks@stillpoint.invalid",
		"-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false", "-c", "core.autocrlf=false"}, args...)...)
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_DATE=2024-01-01T00:00:00Z", "GIT_COMMITTER_DATE=2024-01-01T00:00:00Z",
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return string(out), nil
}

// write writes the instance's repository at dir as a git repository at
// its base commit (one commit) and returns the instance, its test patch
// and gold patch made by git from the files, with no image.
func (si sweInstance) write(dir string) (swekind.Instance, error) {
	in := swekind.Instance{InstanceID: si.id, Repo: si.repo, Version: si.version, ProblemStatement: si.problem,
		FailToPass: si.failToPass, PassToPass: si.passToPass, Task: si.id, Prompt: si.problem}
	base, err := sweTree(si.id, "repo")
	if err != nil {
		return in, err
	}
	tests, err := sweTree(si.id, "tests")
	if err != nil {
		return in, err
	}
	modes := map[string]fs.FileMode{}
	for p := range base {
		modes[p] = 0o644
	}
	if err := writeTree(dir, base, modes); err != nil {
		return in, err
	}
	steps := [][]string{{"init", "-q"}, {"add", "-A"}, {"commit", "-q", "-m", "Initial commit of " + si.repo}}
	for _, s := range steps {
		if _, err := sweGit(dir, s...); err != nil {
			return in, err
		}
	}
	head, err := sweGit(dir, "rev-parse", "HEAD")
	if err != nil {
		return in, err
	}
	in.BaseCommit = strings.TrimSpace(head)
	// The test patch: the test files as it leaves them, against the base.
	for p, b := range tests {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755); err != nil {
			return in, err
		}
		if err := os.WriteFile(filepath.Join(dir, p), b, 0o644); err != nil {
			return in, err
		}
	}
	if _, err := sweGit(dir, "add", "-A"); err != nil {
		return in, err
	}
	if in.TestPatch, err = sweGit(dir, "diff", "--cached", "--no-color", "--no-ext-diff"); err != nil {
		return in, err
	}
	if _, err := sweGit(dir, "reset", "-q", "--hard", in.BaseCommit); err != nil {
		return in, err
	}
	// The gold patch: the fix, against the base.
	src := filepath.Join(dir, si.src)
	b, err := os.ReadFile(src)
	if err != nil {
		return in, err
	}
	if n := strings.Count(string(b), si.old); n != 1 {
		return in, fmt.Errorf("%s: the fix's old text occurs %d times, want once", si.src, n)
	}
	if err := os.WriteFile(src, []byte(strings.Replace(string(b), si.old, si.new, 1)), 0o644); err != nil {
		return in, err
	}
	if in.Patch, err = sweGit(dir, "diff", "--no-color", "--no-ext-diff"); err != nil {
		return in, err
	}
	if _, err := sweGit(dir, "reset", "-q", "--hard", in.BaseCommit); err != nil {
		return in, err
	}
	if in.TestPatch == "" || in.Patch == "" {
		return in, fmt.Errorf("instance %s: an empty test patch or gold patch", si.id)
	}
	return in, nil
}

// WriteSWERepos writes every repository of the SWE-style set as a git
// repository at dir/<instance id> (what was there is replaced), at its
// base commit, and returns the instances in the order of SWENames, with
// their test patches and gold patches and no image. It needs git on the
// host.
func WriteSWERepos(dir string) ([]swekind.Instance, error) {
	if _, err := exec.LookPath("git"); err != nil {
		return nil, fmt.Errorf("tasks: the SWE set needs git in PATH (apt-get install git)")
	}
	var out []swekind.Instance
	for _, si := range sweSet {
		in, err := si.write(filepath.Join(dir, si.id))
		if err != nil {
			return nil, fmt.Errorf("tasks: SWE instance %s: %w", si.id, err)
		}
		out = append(out, in)
	}
	slices.SortFunc(out, func(a, b swekind.Instance) int { return strings.Compare(a.InstanceID, b.InstanceID) })
	return out, nil
}

// SWEOptions shape the SWE-style set.
type SWEOptions struct {
	// Dir is where the set's images go (absolute): the OCI image layout
	// Dir/oci, one image per instance, and the repositories they were
	// made of, Dir/repos. Required.
	Dir string
	// Cache is the cache of the images' base (default
	// sweimage.DefaultCache); it is built there the first time, with
	// debootstrap.
	Cache string
	// Progress receives the progress lines of a base build; nil discards
	// them.
	Progress io.Writer
	// ToolSeconds is how long the test run of each script sleeps first
	// (a checkpoint then catches it mid-tool); default 0.
	ToolSeconds float64
	// Harness is whose tools the script calls, as RepoOptions.Harness.
	Harness string
}

// SWE writes the SWE-style set's images and returns its tasks, of the swe
// kind (participants/owner/swekind: SWE-bench instances whose image field
// is "<Dir/oci>:<instance id>"), and the model script that solves them:
// each looks at the file with the bug, shows the bug and runs the tests
// (sleeping ToolSeconds first), applies the known fix, runs them again
// and answers. The first call builds the images' base (debootstrap, a
// minute or two); later ones reuse it.
func SWE(ctx context.Context, o SWEOptions) ([]collect.Task, modelserver.Script, error) {
	if !filepath.IsAbs(o.Dir) {
		return nil, nil, fmt.Errorf("tasks: SWEOptions.Dir %q: must be absolute", o.Dir)
	}
	tools, err := toolsFor(o.Harness)
	if err != nil {
		return nil, nil, fmt.Errorf("tasks: SWEOptions.Harness: %w", err)
	}
	ins, err := WriteSWERepos(filepath.Join(o.Dir, "repos"))
	if err != nil {
		return nil, nil, err
	}
	base, err := sweimage.EnsureBase(ctx, o.Cache, o.Progress)
	if err != nil {
		return nil, nil, err
	}
	var specs []sweimage.Spec
	for _, in := range ins {
		specs = append(specs, sweimage.Spec{Name: in.InstanceID, Repo: filepath.Join(o.Dir, "repos", in.InstanceID)})
	}
	refs, err := sweimage.Write(ctx, base, filepath.Join(o.Dir, "oci"), specs)
	if err != nil {
		return nil, nil, err
	}
	script := modelserver.Script{}
	var out []collect.Task
	for _, in := range ins {
		in.Image = refs[in.InstanceID]
		payload, err := json.Marshal(in)
		if err != nil {
			return nil, nil, err
		}
		if _, err := swekind.ParseInstance(payload); err != nil {
			return nil, nil, fmt.Errorf("tasks: %s: %w", in.InstanceID, err)
		}
		script[in.InstanceID] = sweTurns(sweByID(in.InstanceID), tools, o.ToolSeconds)
		out = append(out, collect.Task{RolloutID: in.InstanceID, Task: payload})
	}
	return out, script, nil
}

func sweByID(id string) sweInstance {
	i := slices.IndexFunc(sweSet, func(si sweInstance) bool { return si.id == id })
	return sweSet[i]
}

// toolsFor returns the toolset of a harness (RepoOptions.Harness).
func toolsFor(harness string) (toolset, error) {
	switch harness {
	case "", HarnessScripted:
		return scriptedTools{}, nil
	case HarnessOpenCode:
		return openCodeTools{}, nil
	case HarnessClaude:
		return claudeTools{}, nil
	case HarnessCodex:
		return codexTools{}, nil
	}
	return nil, fmt.Errorf("%q: want one of %s", harness, strings.Join(Harnesses, ", "))
}

// sweTestCmd runs the repository's tests as the scripts do: pytest,
// quiet, with no bytecode written (a fix of the same size made in the
// second of a run would be run from stale bytecode).
const sweTestCmd = "PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -q -p no:cacheprovider 2>&1 | tail -15"

// sweTurns is the model script of an instance.
func sweTurns(si sweInstance, tools toolset, toolSeconds float64) []modelserver.Turn {
	testFile := si.failToPass[0][:strings.Index(si.failToPass[0], "::")]
	r := repo{name: si.id, src: si.src, look: "cat " + si.src + " " + testFile + " && git log --oneline",
		edit: [2]string{si.old, si.new}, fix: sweFixCmd(si)}
	first := si.repro + "; " + sweTestCmd
	if toolSeconds > 0 {
		first = fmt.Sprintf("sleep %g; %s", toolSeconds, first)
	}
	return []modelserver.Turn{
		{Content: "Reading the code.", ToolCalls: []modelserver.ToolCall{tools.look(r)}},
		{Content: "Reproducing the bug and running the tests.", ToolCalls: []modelserver.ToolCall{tools.bash("test1", first)}},
		{Content: "Applying the fix.", ToolCalls: []modelserver.ToolCall{tools.fix(r)}},
		{Content: "Checking the fix.", ToolCalls: []modelserver.ToolCall{tools.bash("test2", si.repro+"; "+sweTestCmd)}},
		{Content: "fixed " + si.id},
	}
}

// sweFixCmd is the fix as a shell command: python3 replaces the old text
// with the new in the file, failing if the old text is not there once.
func sweFixCmd(si sweInstance) string {
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	return fmt.Sprintf(`python3 - <<'EOF'
import pathlib
p = pathlib.Path(%s)
s, old, new = p.read_text(), %s, %s
assert s.count(old) == 1, "the text to replace is not in the file once"
p.write_text(s.replace(old, new))
EOF
git diff`, q(si.src), q(si.old), q(si.new))
}
