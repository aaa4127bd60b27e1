package tier_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/internal/leak"
)

func TestMain(m *testing.M) { leak.VerifyTestMain(m) }

// root is the module's root, seen from this package's directory.
const root = "../.."

// TestMakefileNamesTheE2ETests keeps `make e2e` and the tests in step:
// every test outside package e2e that calls tier.E2E is matched by the
// Makefile's E2E_RUN, and every name E2E_RUN lists is such a test.
func TestMakefileNamesTheE2ETests(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^E2E_RUN\s*[?:]?=\s*'?\^?\(([^)]*)\)`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("the Makefile has no E2E_RUN = '^(TestA|TestB|...)' line")
	}
	listed := map[string]bool{}
	for _, n := range strings.Split(string(m[1]), "|") {
		listed[strings.TrimSuffix(n, "$")] = true
	}
	marked := map[string]string{} // test name -> file
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); n != "." && n != ".." && (strings.HasPrefix(n, ".") || n == "testdata" || path == filepath.Join(root, "e2e")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Body == nil {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				if c, ok := n.(*ast.CallExpr); ok {
					if s, ok := c.Fun.(*ast.SelectorExpr); ok && s.Sel.Name == "E2E" {
						if id, ok := s.X.(*ast.Ident); ok && id.Name == "tier" {
							marked[fn.Name.Name] = path
						}
					}
				}
				return true
			})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, file := range marked {
		if !listed[name] {
			t.Errorf("%s (%s) calls tier.E2E but the Makefile's E2E_RUN does not name it", name, file)
		}
	}
	for name := range listed {
		if _, ok := marked[name]; !ok {
			t.Errorf("the Makefile's E2E_RUN names %s, which is no test calling tier.E2E outside package e2e", name)
		}
	}
}

// TestMakefileNamesTheHeavyTests keeps make test-heavy and the tests in
// step: every name the Makefile's HEAVY_RUN lists is a test of package
// e2e, so that none drops out of both make test and make test-heavy.
func TestMakefileNamesTheHeavyTests(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^HEAVY_RUN\s*[?:]?=\s*'\^\(([^)]*)\)\$\$'$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("the Makefile has no HEAVY_RUN = '^(TestA|TestB|...)$$' line")
	}
	tests := map[string]bool{}
	files, err := filepath.Glob(filepath.Join(root, "e2e", "*_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range files {
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Test") {
				tests[fn.Name.Name] = true
			}
		}
	}
	for _, name := range strings.Split(string(m[1]), "|") {
		if !tests[name] {
			t.Errorf("the Makefile's HEAVY_RUN names %s, which is no test of package e2e", name)
		}
	}
}
