package docs_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// module is the module path that the house's imports start with.
const module = "github.com/stillpoint/stillpoint/"

// floors are the house's floors, lowest first, each a list of path
// prefixes (ARCHITECTURE.md, "Floors"): a package may import its own floor
// and those below, never one above. The longest prefix that matches a
// package names its floor.
var floors = [][]string{
	{"events", "internal"},
	{"jetstream"},
	{"sandboxd"},
	{"participants"},
	{"controller-bridge"},
	{"cmd", "e2e", "docs"},
}

// upAllowed are the imports that run up the house on purpose: the sandbox
// daemon is a member, so participants/member is the floor it shares.
var upAllowed = map[[2]string]bool{
	{"sandboxd/daemon", "participants/member"}: true,
}

// floorOf returns the floor of a package, named by its path in the module,
// and false when no floor holds it.
func floorOf(pkg string) (int, bool) {
	best, floor := -1, 0
	for i, prefixes := range floors {
		for _, p := range prefixes {
			if (pkg == p || strings.HasPrefix(pkg, p+"/")) && len(p) > best {
				best, floor = len(p), i
			}
		}
	}
	return floor, best >= 0
}

// imports returns, for every package of the module (its directory from the
// root), the module's packages its non-test files import.
func imports(t *testing.T) map[string][]string {
	t.Helper()
	fset := token.NewFileSet()
	out := map[string][]string{}
	for dir, files := range goDirs(t) {
		pkg := rel(dir)
		for _, path := range files {
			f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatalf("parse %s: %v", path, err)
			}
			for _, spec := range f.Imports {
				imp, err := strconv.Unquote(spec.Path.Value)
				if err != nil {
					t.Fatalf("%s: import %s: %v", path, spec.Path.Value, err)
				}
				if rest, ok := strings.CutPrefix(imp, module); ok && !slices.Contains(out[pkg], rest) {
					out[pkg] = append(out[pkg], rest)
				}
			}
		}
		if _, ok := out[pkg]; !ok {
			out[pkg] = nil
		}
	}
	return out
}

// houseProblems returns each import of imps that breaks the house: one
// that runs up a floor (but upAllowed), one from outside e2e/ into it, and
// a package no floor holds.
func houseProblems(imps map[string][]string) []string {
	var problems []string
	for pkg, deps := range imps {
		from, ok := floorOf(pkg)
		if !ok {
			problems = append(problems, pkg+": on no floor of the house")
			continue
		}
		for _, dep := range deps {
			to, ok := floorOf(dep)
			switch {
			case !ok:
				problems = append(problems, pkg+" imports "+dep+", on no floor of the house")
			case to > from && !upAllowed[[2]string{pkg, dep}]:
				problems = append(problems, pkg+" imports "+dep+", a floor above it")
			case inE2E(dep) && !inE2E(pkg):
				problems = append(problems, pkg+" imports "+dep+": production code never imports the tests' support")
			}
		}
	}
	slices.Sort(problems)
	return problems
}

func inE2E(pkg string) bool { return pkg == "e2e" || strings.HasPrefix(pkg, "e2e/") }

// TestImportsRunDownTheHouse: no package's non-test files import a floor
// above their own, and no production package imports e2e/.
func TestImportsRunDownTheHouse(t *testing.T) {
	imps := imports(t)
	if len(imps) < 20 {
		t.Fatalf("found %d packages: the walk found nothing to check", len(imps))
	}
	for _, p := range houseProblems(imps) {
		t.Error(p)
	}
}

// TestHouseProblemsFinds: the rule finds an upward import, an import of
// e2e/ from production code and a package on no floor, and lets pass the
// allowed one and imports down or across.
func TestHouseProblemsFinds(t *testing.T) {
	got := houseProblems(map[string][]string{
		"internal/x":              {"jetstream", "internal/poll", "events"},
		"cmd/stillpoint":          {"e2e/tasks", "controller-bridge"},
		"sandboxd/daemon":         {"participants/member"},
		"sandboxd":                {"participants/member"},
		"participants/agent":      {"sandboxd/sandboxapi", "participants/member"},
		"e2e":                     {"e2e/tasks", "cmd/stillpoint"},
		"elsewhere":               nil,
		"controller-bridge/inner": {"elsewhere/x"},
	})
	want := []string{
		"cmd/stillpoint imports e2e/tasks: production code never imports the tests' support",
		"controller-bridge/inner imports elsewhere/x, on no floor of the house",
		"elsewhere: on no floor of the house",
		"internal/x imports jetstream, a floor above it",
		"sandboxd imports participants/member, a floor above it",
	}
	if !slices.Equal(got, want) {
		t.Errorf("houseProblems:\n got %q\nwant %q", got, want)
	}
}

// liveOnly is the name that only events and the live layer may use, so
// that the silence rule lives in one place: how long a member's alive
// subject goes unanswered before the member is taken for gone. Spelt in
// two halves so that this file does not name it.
const liveOnly = "Alive" + "Unanswered"

// TestSilenceRuleLivesInOnePlace: the silence rule's duration (liveOnly)
// is named only in events, which defines it, and jetstream/live, which
// applies it (tests included: a test of the rule belongs with the rule).
func TestSilenceRuleLivesInOnePlace(t *testing.T) {
	found := 0
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if skipDir(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if !strings.Contains(string(b), liveOnly) {
			return nil
		}
		found++
		if dir := rel(filepath.Dir(path)); dir != "events" && dir != "jetstream/live" {
			t.Errorf("%s names %s: only events and jetstream/live apply the silence rule", rel(path), liveOnly)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found == 0 {
		t.Errorf("no file names %s: the check found nothing to check", liveOnly)
	}
}
