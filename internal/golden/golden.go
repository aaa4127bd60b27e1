package golden

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Run reads the script file and calls do with each input line in order
// (blank lines and # comments are kept and not passed on). Each answer is
// compared with the indented lines below its input, and a difference fails
// t, naming the file and line. With update the file is rewritten with the
// answers instead.
func Run(t *testing.T, file string, update bool, do func(line string) []string) {
	t.Helper()
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out, diffs []string
	lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
	for i := 0; i < len(lines); {
		line := lines[i]
		i++
		if strings.HasPrefix(line, "  ") {
			t.Fatalf("%s:%d: an expected line with no input before it", file, i)
		}
		out = append(out, line)
		if trimmed := strings.TrimSpace(line); trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		var want []string
		for i < len(lines) && strings.HasPrefix(lines[i], "  ") {
			want = append(want, strings.TrimPrefix(lines[i], "  "))
			i++
		}
		got := do(line)
		for _, g := range got {
			out = append(out, "  "+g)
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			diffs = append(diffs, fmt.Sprintf("%s:%d: %s\n got:\n  %s\nwant:\n  %s", file, i, line,
				strings.Join(got, "\n  "), strings.Join(want, "\n  ")))
		}
	}
	if update {
		if err := os.WriteFile(file, []byte(strings.Join(out, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	for _, d := range diffs {
		t.Error(d)
	}
}

// RunAll runs every script of testdata/*.txt as a subtest named after its
// file, each with the step function newDo makes for it (a fresh core per
// script).
func RunAll(t *testing.T, update bool, newDo func(t *testing.T) func(line string) []string) {
	t.Helper()
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts in testdata/: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { Run(t, f, update, newDo(t)) })
	}
}
