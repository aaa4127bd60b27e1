package tier_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/internal/tier"
)

func TestMain(m *testing.M) { leak.VerifyTestMain(m) }

// root is the module's root, seen from this package's directory.
const root = "../.."

// fakeTB records what a mark did to a test: run it, skip it or fail it.
type fakeTB struct {
	testing.TB
	outcome string
}

// stop ends the marked "test" where testing.T's Skip and Fatal would.
type stop struct{}

// The methods the marks call; any other would panic on the nil TB.
func (f *fakeTB) Helper()               {}
func (f *fakeTB) Skip(...any)           { f.outcome = "skip"; panic(stop{}) }
func (f *fakeTB) Fatalf(string, ...any) { f.outcome = "fail"; panic(stop{}) }

// outcome runs mark on a fake test: "run", "skip" or "fail".
func outcome(mark func(testing.TB)) string {
	f := &fakeTB{outcome: "run"}
	func() {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(stop); !ok {
					panic(r)
				}
			}
		}()
		mark(f)
	}()
	return f.outcome
}

// TestTiers: which marked tests each value of STILLPOINT_TIER runs, and
// that -short skips them all.
func TestTiers(t *testing.T) {
	marks := []struct {
		name string
		mark func(testing.TB)
	}{{"E2E", tier.E2E}, {"Heavy", tier.Heavy}, {"Long", tier.Long}, {"Soak", tier.Soak}}
	want := map[string]string{ // STILLPOINT_TIER -> outcome of E2E, Heavy, Long, Soak
		"":      "run skip run skip",
		"heavy": "skip run skip skip",
		"all":   "run run run skip",
		"soak":  "skip skip skip run",
		"light": "fail fail fail fail",
	}
	for v, w := range want {
		t.Setenv(tier.Var, v)
		var got []string
		for _, m := range marks {
			got = append(got, outcome(m.mark))
		}
		if testing.Short() && v != "light" {
			w = "skip skip skip skip"
		}
		if g := strings.Join(got, " "); g != w {
			t.Errorf("%s=%q: E2E, Heavy, Long, Soak %s, want %s", tier.Var, v, g, w)
		}
	}
}

// mark is a call of a tier mark in a test file.
type mark struct {
	name  string // E2E, Heavy, Long or Soak
	file  string
	line  int
	col   int
	fn    string // the top-level function it is in
	test  bool   // that function is a Test function
	first bool   // the call is the first statement of that function's body
}

// marks returns every call tier.X(...) of the _test.go files under dir
// (not descending into hidden directories, testdata or, unless deep,
// subdirectories).
func marks(t *testing.T, dir string, deep bool) []mark {
	t.Helper()
	var out []mark
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			n := d.Name()
			if path != dir && (!deep || strings.HasPrefix(n, ".") || n == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				c, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				s, ok := c.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if id, ok := s.X.(*ast.Ident); !ok || id.Name != "tier" {
					return true
				}
				if s.Sel.Name != "E2E" && s.Sel.Name != "Heavy" && s.Sel.Name != "Long" && s.Sel.Name != "Soak" {
					return true
				}
				pos := fset.Position(c.Pos())
				first := false
				if len(fn.Body.List) > 0 {
					if es, ok := fn.Body.List[0].(*ast.ExprStmt); ok && es.X == c {
						first = true
					}
				}
				out = append(out, mark{name: s.Sel.Name, file: path, line: pos.Line, col: pos.Column,
					fn: fn.Name.Name, test: isTest(fn), first: first})
				return true
			})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// isTest reports whether fn is a Test function as go test finds them:
// func TestXxx(t *testing.T), Xxx not beginning with a lower-case letter.
func isTest(fn *ast.FuncDecl) bool {
	if fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Name.Name == "TestMain" {
		return false
	}
	if r, _ := utf8.DecodeRuneInString(fn.Name.Name[len("Test"):]); unicode.IsLower(r) {
		return false
	}
	p := fn.Type.Params.List
	if len(p) != 1 || len(p[0].Names) > 1 {
		return false
	}
	star, ok := p[0].Type.(*ast.StarExpr)
	if !ok {
		return false
	}
	sel, ok := star.X.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "T"
}

func (m mark) String() string {
	return fmt.Sprintf("%s:%d: tier.%s in %s", m.file, m.line, m.name, m.fn)
}

// TestEveryTestOfPackageE2EBeginsWithItsTier keeps make test-heavy to the
// heavy tests: it runs package e2e with STILLPOINT_TIER=heavy, where only
// tests marked Heavy run and those marked E2E skip, so every test of the
// package must begin with one of the two marks (an unmarked one would run
// in make test-heavy too), and neither mark may come later in a test.
func TestEveryTestOfPackageE2EBeginsWithItsTier(t *testing.T) {
	dir := filepath.Join(root, "e2e")
	begins := map[string]bool{} // test function -> it begins with E2E or Heavy
	for _, m := range marks(t, dir, false) {
		if m.name == "Long" {
			t.Errorf("%s: package e2e's tests are end-to-end (tier.E2E), heavy (tier.Heavy) or soak (tier.Soak)", m)
			continue
		}
		if !m.test || !m.first {
			t.Errorf("%s: tier.%s must be the first statement of a Test function (make test-heavy runs package e2e by it)", m, m.name)
			continue
		}
		begins[m.fn] = true
	}
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, path := range files {
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && isTest(fn) {
				n++
				if !begins[fn.Name.Name] {
					t.Errorf("%s: %s does not begin with tier.E2E(t), tier.Heavy(t) or tier.Soak(t): make test-heavy (STILLPOINT_TIER=heavy) would run it", path, fn.Name.Name)
				}
			}
		}
	}
	if n == 0 {
		t.Fatalf("no Test function in %s", dir)
	}
}

// TestTheE2EAndHeavyMarksAreWhereTheMakefileFindsThem: a heavy test is a
// test of package e2e (the one package make test-heavy runs); an
// end-to-end test outside the e2e tree calls tier.E2E(t) as the first
// statement of its Test function, on a line of its own at the body's
// indentation, which is how make e2e finds it in the source (a mark
// inside a helper or a subtest it would miss).
func TestTheE2EAndHeavyMarksAreWhereTheMakefileFindsThem(t *testing.T) {
	e2e := filepath.Join(root, "e2e")
	found := 0
	for _, m := range marks(t, root, true) {
		inTree := m.file == e2e || strings.HasPrefix(m.file, e2e+string(filepath.Separator))
		switch {
		case (m.name == "Heavy" || m.name == "Soak") && filepath.Dir(m.file) != e2e:
			t.Errorf("%s: a %s test must be a test of package e2e, the one make test-heavy and make test-soak run", m, strings.ToLower(m.name))
		case m.name == "E2E" && !inTree:
			if !m.test || !m.first || m.col != 2 {
				t.Errorf("%s: outside the e2e tree, tier.E2E(t) must be the first statement of a Test function, on a line of its own: make e2e finds the end-to-end tests so", m)
				continue
			}
			found++
		}
	}
	if found == 0 {
		t.Error("no end-to-end test outside the e2e tree: make e2e's second command would run nothing")
	}
}

// TestTheMakefileNamesNoTest: the tiers are the tests' marks and places,
// not lists of names in the Makefile that can fall out of step with them.
func TestTheMakefileNamesNoTest(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	for i, line := range strings.Split(string(mk), "\n") {
		if regexp.MustCompile(`Test[A-Z]`).MatchString(line) {
			t.Errorf("Makefile:%d names a test: %s", i+1, line)
		}
	}
}
