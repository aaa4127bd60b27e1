package docs_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// root is the repository's root, seen from this package's directory.
const root = ".."

// skipDir tells the directories no package of the module lives in.
func skipDir(name string) bool {
	return name != "." && name != ".." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor" || name == "bin")
}

// goDirs returns every directory of the module that holds Go files, and
// for each the non-test files, as paths from root.
func goDirs(t *testing.T) map[string][]string {
	t.Helper()
	dirs := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if skipDir(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			dir := filepath.Dir(path)
			dirs[dir] = append(dirs[dir], path)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	return dirs
}

func parse(t *testing.T, fset *token.FileSet, path string) *ast.File {
	t.Helper()
	f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	return f
}

// rel names a path from the repository root.
func rel(path string) string {
	r, err := filepath.Rel(root, path)
	if err != nil {
		return path
	}
	return filepath.ToSlash(r)
}

// TestEveryPackageHasDocGo: the package comment of every package is in its
// doc.go, and only there; it starts "Package <name> " ("Command <dir> "
// for a main package).
func TestEveryPackageHasDocGo(t *testing.T) {
	fset := token.NewFileSet()
	for dir, files := range goDirs(t) {
		var docFile *ast.File
		for _, path := range files {
			f := parse(t, fset, path)
			if filepath.Base(path) == "doc.go" {
				docFile = f
				continue
			}
			if f.Doc != nil {
				t.Errorf("%s: a package comment outside doc.go (move it there)", rel(path))
			}
		}
		if docFile == nil {
			t.Errorf("%s: no doc.go", rel(dir))
			continue
		}
		want := "Package " + docFile.Name.Name + " "
		if docFile.Name.Name == "main" {
			want = "Command " + filepath.Base(dir) + " "
		}
		if docFile.Doc == nil || !strings.HasPrefix(docFile.Doc.Text(), want) {
			t.Errorf("%s/doc.go: the package comment must start %q", rel(dir), want)
		}
	}
}

// TestExportedNamesHaveDocComments: every exported name of every package
// (outside _test.go files) has a doc comment that starts with the name. A
// type's may start with an article ("A Name ..."). A parenthesized const
// or var group with a comment of its own covers the names in it; a method
// of an unexported type needs none.
func TestExportedNamesHaveDocComments(t *testing.T) {
	fset := token.NewFileSet()
	for _, files := range goDirs(t) {
		for _, path := range files {
			f := parse(t, fset, path)
			for _, problem := range undocumented(f) {
				t.Errorf("%s:%d: %s", rel(path), fset.Position(problem.pos).Line, problem.msg)
			}
		}
	}
}

// TestUndocumentedFinds checks the checker on a file with one of each
// mistake, and on one with none.
func TestUndocumentedFinds(t *testing.T) {
	const bad = `package p

func Bare() {}

// does something.
func Lower() {}

type T struct{}

// M is a method.
func (T) M() {}

func (T) N() {}

type u struct{}

func (u) Hidden() {}

var ErrX = errors.New("p: x")

// The sentinels.
var (
	ErrY = errors.New("p: y")
)

const (
	// C is documented.
	C = 1
	D = 2
)
`
	const good = `package p

// Bare does nothing.
func Bare() {}

// A T is a thing.
type T struct{}

// M is a method.
func (*T) M() {}

// ErrX is returned when x.
var ErrX = errors.New("p: x")
`
	parseSrc := func(src string) *ast.File {
		f, err := parser.ParseFile(token.NewFileSet(), "p.go", src, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	var got []string
	for _, p := range undocumented(parseSrc(bad)) {
		got = append(got, p.msg)
	}
	want := []string{
		"exported func Bare has no doc comment",
		"the doc comment of func Lower must start with \"Lower\"",
		"exported type T has no doc comment",
		"exported method T.N has no doc comment",
		"exported var ErrX has no doc comment (nor its group)",
		"exported const D has no doc comment (nor its group)",
	}
	if !slices.Equal(got, want) {
		t.Errorf("undocumented found\n%q\nwant\n%q", got, want)
	}
	if ps := undocumented(parseSrc(good)); len(ps) != 0 {
		t.Errorf("undocumented found %v in a file with every doc comment", ps)
	}
}

type problem struct {
	pos token.Pos
	msg string
}

func undocumented(f *ast.File) []problem {
	var out []problem
	// check checks the doc comment of name, shown in messages as what shown.
	check := func(pos token.Pos, what, shown, name string, doc *ast.CommentGroup, articles bool) {
		if doc == nil {
			out = append(out, problem{pos, fmt.Sprintf("exported %s %s has no doc comment", what, shown)})
			return
		}
		text := doc.Text()
		if articles {
			for _, a := range []string{"A ", "An ", "The "} {
				text = strings.TrimPrefix(text, a)
			}
		}
		if !startsWithName(text, name) {
			out = append(out, problem{pos, fmt.Sprintf("the doc comment of %s %s must start with %q", what, shown, name)})
		}
	}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			what, shown := "func", d.Name.Name
			if d.Recv != nil {
				recv := receiverType(d.Recv.List[0].Type)
				if !ast.IsExported(recv) {
					continue
				}
				what, shown = "method", recv+"."+d.Name.Name
			}
			check(d.Name.Pos(), what, shown, d.Name.Name, d.Doc, false)
		case *ast.GenDecl:
			grouped := d.Lparen.IsValid()
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if !s.Name.IsExported() {
						continue
					}
					doc := s.Doc
					if doc == nil && !grouped {
						doc = d.Doc
					}
					check(s.Name.Pos(), "type", s.Name.Name, s.Name.Name, doc, true)
				case *ast.ValueSpec:
					if grouped && d.Doc != nil {
						continue
					}
					var first *ast.Ident
					for _, n := range s.Names {
						if n.IsExported() {
							first = n
							break
						}
					}
					if first == nil {
						continue
					}
					doc := s.Doc
					if doc == nil && !grouped {
						doc = d.Doc
					}
					what := strings.ToLower(d.Tok.String())
					if doc != nil && !slices.ContainsFunc(s.Names, func(n *ast.Ident) bool { return startsWithName(doc.Text(), n.Name) }) {
						out = append(out, problem{first.Pos(), fmt.Sprintf("the doc comment of %s %s must start with its name", what, first.Name)})
						continue
					}
					if doc == nil {
						out = append(out, problem{first.Pos(), fmt.Sprintf("exported %s %s has no doc comment (nor its group)", what, first.Name)})
					}
				}
			}
		}
	}
	return out
}

// startsWithName reports whether text starts with the word name.
func startsWithName(text, name string) bool {
	rest, ok := strings.CutPrefix(text, name)
	if !ok {
		return false
	}
	r := []rune(rest + " ")[0]
	return !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '_'
}

// receiverType returns the name of a receiver's type: T for T, *T, T[P]
// and *T[P].
func receiverType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// declared returns the names a Go file declares at top level: functions
// and types as Name, methods as T.M (value receiver) or (*T).M (pointer
// receiver), consts and vars as Name.
func declared(t *testing.T, path string) map[string]bool {
	t.Helper()
	f := parse(t, token.NewFileSet(), path)
	names := map[string]bool{}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				names[d.Name.Name] = true
				continue
			}
			typ := d.Recv.List[0].Type
			recv := receiverType(typ)
			if _, ptr := typ.(*ast.StarExpr); ptr {
				names["(*"+recv+")."+d.Name.Name] = true
			} else {
				names[recv+"."+d.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					names[s.Name.Name] = true
				case *ast.ValueSpec:
					for _, n := range s.Names {
						names[n.Name] = true
					}
				}
			}
		}
	}
	return names
}

var (
	// codeSpan finds code spans, and the ends of a file's context: a ";"
	// or the end of a sentence.
	codeSpan = regexp.MustCompile("`([^`]+)`|;|\\. ")
	goFile   = regexp.MustCompile(`^[A-Za-z0-9_./-]+\.go$`)
	goName   = regexp.MustCompile(`^(\(\*[A-Za-z_][A-Za-z0-9_]*\)\.|[A-Za-z_][A-Za-z0-9_]*\.)?[A-Za-z_][A-Za-z0-9_]*$`)
)

// cell is a table cell or a paragraph of ARCHITECTURE.md, with the line it
// starts on.
type cell struct {
	line int
	text string
}

// cells splits a page into table cells and paragraphs.
func cells(t *testing.T, page string) []cell {
	t.Helper()
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	var out []cell
	var para *cell
	for i, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "|"):
			para = nil
			for _, c := range strings.Split(trimmed, "|") {
				out = append(out, cell{i + 1, c})
			}
		case trimmed == "" || strings.HasPrefix(trimmed, "#"):
			para = nil
		case para == nil:
			out = append(out, cell{i + 1, line})
			para = &out[len(out)-1]
		default:
			para.text += " " + line
		}
	}
	return out
}

// TestArchitectureNamesExist: every `path/file.go` ARCHITECTURE.md names
// exists, and every name in a code span after it (in the same table cell
// or paragraph, up to the next file, a ";" or the end of the sentence) is
// declared in that file: `Func`, `Type`, `T.Method` or `(*T).Method`.
func TestArchitectureNamesExist(t *testing.T) {
	const page = "ARCHITECTURE.md"
	decls := map[string]map[string]bool{}
	files, names := 0, 0
	for _, c := range cells(t, page) {
		current := ""
		for _, m := range codeSpan.FindAllStringSubmatch(c.text, -1) {
			span := m[1]
			switch {
			case m[0] == ";" || m[0] == ". ":
				current = ""
			case goFile.MatchString(span):
				files++
				current = ""
				path := filepath.Join(root, filepath.FromSlash(span))
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s:%d: `%s` does not exist", page, c.line, span)
					continue
				}
				if decls[span] == nil {
					decls[span] = declared(t, path)
				}
				current = span
			case current != "" && goName.MatchString(span):
				names++
				if !decls[current][span] {
					t.Errorf("%s:%d: `%s` is not declared in %s", page, c.line, span, current)
				}
			}
		}
	}
	if files == 0 || names == 0 {
		t.Errorf("%s names %d files and %d functions: the check found nothing to check", page, files, names)
	}
	t.Logf("%s: %d file references, %d names checked", page, files, names)
}

// TestArchitectureCellsAreShort: no table cell of ARCHITECTURE.md holds
// more than 300 characters, so that the page stays one a newcomer maps in
// ten minutes: a cell says what a part is and why, and the detail is in
// the topic doc it links.
func TestArchitectureCellsAreShort(t *testing.T) {
	const page, most = "ARCHITECTURE.md", 300
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	var header []string
	cellCount, longest := 0, 0
	for i, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if !strings.HasPrefix(trimmed, "|") {
			header = nil
			continue
		}
		row := strings.Split(strings.Trim(trimmed, "|"), "|")
		for j := range row {
			row[j] = strings.TrimSpace(row[j])
		}
		if header == nil {
			header = row
			continue
		}
		if strings.Trim(strings.Join(row, ""), "-: ") == "" {
			continue // the line under the header
		}
		for j, c := range row {
			n := utf8.RuneCountInString(c)
			cellCount++
			longest = max(longest, n)
			if n <= most {
				continue
			}
			column := fmt.Sprint(j + 1)
			if j < len(header) {
				column = header[j]
			}
			t.Errorf("%s:%d: row %q, column %q: %d characters, more than %d (say what it is and why; the detail goes to the topic doc)", page, i+1, row[0], column, n, most)
		}
	}
	if cellCount == 0 {
		t.Errorf("%s: no table cell found: the check found nothing to check", page)
	}
	t.Logf("%s: %d table cells, the longest %d characters", page, cellCount, longest)
}

var (
	heading = regexp.MustCompile(`^## ([0-9]+)\. (.*)$`)
	// sectionRef is a § reference: §N, a range §N–§M, or a dotted §N.M
	// (refused: neither page has numbered subsections). A label may
	// follow: §N, Label or §N Label or §N, "Label".
	sectionRef = regexp.MustCompile(`§ ?([0-9]+)((?:\.[0-9]+)*)(?:[–-]§?([0-9]+))?(?:,? "?([A-Z][A-Za-z0-9 ]*))?`)
	boldLabel  = regexp.MustCompile(`\*\*([^*]+)\*\*`)
	colonLabel = regexp.MustCompile(`^([A-Z][A-Za-z ]+):$`)
	// listGap is what stands between two references of one list.
	listGap = regexp.MustCompile(`^[ ,;]*(?:and |or )?$`)
	// historyBefore ends the text before a § reference to an entry of
	// PROTOCOL-HISTORY.md, the protocol's change log: "PROTOCOL-HISTORY ",
	// "PROTOCOL-HISTORY.md " or a link to it. A bare § names a section of
	// PROTOCOL.md.
	historyBefore = regexp.MustCompile(`PROTOCOL-HISTORY(?:\.md)?(?:\]\([^)]*\))? $`)
)

// historyPrefix is how the docs and the code name an entry of the change
// log.
const historyPrefix = "PROTOCOL-HISTORY "

// A page is a doc whose numbered sections § references name: PROTOCOL.md
// or PROTOCOL-HISTORY.md. Its sections hold the labels of their rules.
type page struct {
	name     string
	sections map[int][]string
}

// readPage returns a page's section numbers in order and, for each, the
// labels its rules go by: its heading's title, bold phrases and "Label:"
// lines.
func readPage(t *testing.T, name string) (page, []int) {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	p := page{name: name, sections: map[int][]string{}}
	var order []int
	cur := 0
	for line := range strings.SplitSeq(string(b), "\n") {
		if m := heading.FindStringSubmatch(line); m != nil {
			cur, _ = strconv.Atoi(m[1])
			p.sections[cur] = []string{strings.Trim(m[2], "`")}
			order = append(order, cur)
			continue
		}
		if cur == 0 {
			continue
		}
		for _, m := range boldLabel.FindAllStringSubmatch(line, -1) {
			p.sections[cur] = append(p.sections[cur], strings.TrimRight(m[1], ".:"))
		}
		if m := colonLabel.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			p.sections[cur] = append(p.sections[cur], m[1])
		}
	}
	return p, order
}

// TestSectionReferencesExist: every § of the code and of the docs names a
// section of PROTOCOL.md (a bare § is kept for its sections) or, written
// after "PROTOCOL-HISTORY " (or "PROTOCOL-HISTORY.md ", or a link to it),
// an entry of PROTOCOL-HISTORY.md; a label after it ("§5, Lease", "§6,
// \"Sandbox owner\"") names a rule of that section. The change log's
// entries are numbered 1, 2, 3 … in order, as references name them by
// number.
func TestSectionReferencesExist(t *testing.T) {
	protocol, sections := readPage(t, "PROTOCOL.md")
	if len(sections) < 7 {
		t.Fatalf("PROTOCOL.md has %d numbered sections, want at least 7", len(sections))
	}
	history, entries := readPage(t, "PROTOCOL-HISTORY.md")
	if len(entries) == 0 {
		t.Fatal("PROTOCOL-HISTORY.md has no numbered entries")
	}
	for i, n := range entries {
		if n != i+1 {
			t.Fatalf("PROTOCOL-HISTORY.md: entry %d is numbered %d: entries are numbered 1, 2, 3 … in order, and never renumbered", i+1, n)
		}
	}
	refs := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if skipDir(d.Name()) {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".md", ".py", ".txt":
		default:
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			n, problems := checkRefs(line, protocol, history)
			refs += n
			for _, p := range problems {
				t.Errorf("%s:%d: %s", rel(path), i+1, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d § references checked", refs)
}

// checkRefs checks the § references of one line against protocol and
// history, and returns how many it found and what is wrong with them.
func checkRefs(line string, protocol, history page) (int, []string) {
	var problems []string
	matches := sectionRef.FindAllStringSubmatchIndex(line, -1)
	prevEnd, prevHistory := 0, false
	for _, ix := range matches {
		group := func(g int) string {
			if ix[2*g] < 0 {
				return ""
			}
			return line[ix[2*g]:ix[2*g+1]]
		}
		ref := strings.TrimSpace(group(0))
		p, other := protocol, history
		isHistory := historyBefore.MatchString(line[:ix[0]])
		if isHistory {
			p, other = history, protocol
			ref = historyPrefix + ref
		}
		wrong := func(format string, args ...any) {
			problems = append(problems, ref+": "+fmt.Sprintf(format, args...))
		}
		if !isHistory && prevHistory && listGap.MatchString(line[prevEnd:ix[0]]) {
			wrong("a bare § after a PROTOCOL-HISTORY reference names a section of PROTOCOL.md (write %q before each entry of the change log, or name PROTOCOL first)", historyPrefix)
		}
		prevEnd, prevHistory = ix[1], isHistory
		n, _ := strconv.Atoi(group(1))
		labels, ok := p.sections[n]
		if !ok {
			hint := ""
			if len(other.sections) > 0 && !isHistory {
				hint = fmt.Sprintf(" (an entry of the change log? name it %s§N)", historyPrefix)
			}
			wrong("%s has no section %d%s", p.name, n, hint)
			continue
		}
		if group(2) != "" {
			wrong("%s has no numbered subsections (name the rule: §%d, Label)", p.name, n)
		}
		if to := group(3); to != "" {
			if m, _ := strconv.Atoi(to); !hasSection(p.sections, m) {
				wrong("%s has no section %d", p.name, m)
			}
		}
		if label := strings.TrimSpace(group(4)); label != "" && !knownLabel(labels, label) {
			wrong("section %d of %s has no rule %q (its rules: %q)", n, p.name, label, labels)
		}
	}
	return len(matches), problems
}

// TestCheckRefsFinds checks the checker on lines with one mistake each,
// and on lines with none. The lines spell § as \u00a7, so that the walk
// of the repository does not take them for references.
func TestCheckRefsFinds(t *testing.T) {
	protocol := page{"PROTOCOL.md", map[int][]string{3: {"Bus layout", "Consumers"}, 5: {"Phases", "Lease"}}}
	history := page{"PROTOCOL-HISTORY.md", map[int][]string{1: {"One"}, 2: {"Two"}, 7: {"Seven"}}}
	for _, tc := range []struct {
		line string
		want string // the start of the one problem, "" for none
	}{
		{"PROTOCOL \u00a73, Consumers", ""},
		{"(\u00a75, Lease; PROTOCOL-HISTORY \u00a77)", ""},
		{"PROTOCOL \u00a75; PROTOCOL-HISTORY \u00a71\u2013\u00a72", ""},
		{"PROTOCOL-HISTORY \u00a72, Two", ""},
		{"PROTOCOL-HISTORY.md \u00a72 and [PROTOCOL-HISTORY.md](PROTOCOL-HISTORY.md) \u00a77", ""},
		{"PROTOCOL \u00a77", "\u00a77: PROTOCOL.md has no section 7 (an entry of the change log? name it PROTOCOL-HISTORY \u00a7N)"},
		{"PROTOCOL-HISTORY \u00a73", "PROTOCOL-HISTORY \u00a73: PROTOCOL-HISTORY.md has no section 3"},
		{"PROTOCOL-HISTORY \u00a71\u2013\u00a74", "PROTOCOL-HISTORY \u00a71\u2013\u00a74: PROTOCOL-HISTORY.md has no section 4"},
		{"PROTOCOL-HISTORY \u00a71, \u00a75", "\u00a75: a bare \u00a7 after a PROTOCOL-HISTORY reference"},
		{"\u00a73.2", "\u00a73.2: PROTOCOL.md has no numbered subsections"},
		{"\u00a75, Fencing", "\u00a75, Fencing: section 5 of PROTOCOL.md has no rule"},
	} {
		_, problems := checkRefs(tc.line, protocol, history)
		switch {
		case tc.want == "" && len(problems) != 0:
			t.Errorf("%q: found %q, want nothing", tc.line, problems)
		case tc.want != "" && (len(problems) != 1 || !strings.HasPrefix(problems[0], tc.want)):
			t.Errorf("%q: found %q, want one problem starting %q", tc.line, problems, tc.want)
		}
	}
}

func hasSection(sections map[int][]string, n int) bool {
	_, ok := sections[n]
	return ok
}

// knownLabel reports whether label (as much of it as the pattern took:
// it may stop at a hyphen, or run on into the sentence) and one of a
// section's labels start alike: one is a prefix of the other.
func knownLabel(labels []string, label string) bool {
	for _, l := range labels {
		if strings.HasPrefix(l, label) || strings.HasPrefix(label, l) {
			return true
		}
	}
	return false
}
