package doccheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// root is the repository's top, from this package's directory.
const root = "../.."

// module is the import path of root.
const module = "github.com/trialnet/trialnet/"

// parseDir parses the Go files in dir (relative to root): the test files
// if tests, else the others.
func parseDir(t *testing.T, dir string, tests bool) []*ast.File {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(root, dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var out []*ast.File
	for _, p := range m {
		if strings.HasSuffix(p, "_test.go") != tests {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, f)
	}
	return out
}

// isPackage reports whether dir (relative to root) holds Go files.
func isPackage(dir string) bool {
	if strings.HasPrefix(dir, "/") || strings.Contains(dir, "..") || strings.ContainsAny(dir, " *") {
		return false
	}
	m, _ := filepath.Glob(filepath.Join(root, dir, "*.go"))
	return len(m) > 0
}

var (
	backticked = regexp.MustCompile("`([^`]+)`")
	funcName   = regexp.MustCompile(`^(…)?(Test|Fuzz|Benchmark)[A-Za-z0-9_…]*\*?$|^…[A-Z][A-Za-z0-9_]*$`)
)

// Every test SECURITY.md names in a "Shown by" item is a test of the
// package named before it: a test that moved, or was renamed, would leave
// the threat table claiming what nothing shows.
func TestSecurityNamesTestsWhereTheyAre(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "SECURITY.md"))
	if err != nil {
		t.Fatal(err)
	}
	funcs := map[string][]string{}
	checked := 0
	for _, item := range shownBy(string(b)) {
		pkg := ""
		for _, m := range backticked.FindAllStringSubmatch(item, -1) {
			tok := m[1]
			if isPackage(tok) {
				pkg = tok
				continue
			}
			if !funcName.MatchString(tok) {
				continue // an escape case, a flag, a file
			}
			if pkg == "" {
				t.Errorf("SECURITY.md names %s before any package: %q", tok, item)
				continue
			}
			if _, ok := funcs[pkg]; !ok {
				funcs[pkg] = testFuncs(t, pkg)
			}
			checked++
			if !slices.ContainsFunc(funcs[pkg], func(n string) bool { return nameMatches(n, tok) }) {
				t.Errorf("SECURITY.md names %s in %s, which has no such test: %q", tok, pkg, item)
			}
		}
	}
	if checked < 50 {
		t.Fatalf("only %d test names found in SECURITY.md's \"Shown by\" items: the parser no longer reads them", checked)
	}
}

// shownBy are SECURITY.md's "Shown by:" items, each on one line.
func shownBy(doc string) []string {
	var items, cur []string
	flush := func() {
		if cur != nil {
			items = append(items, strings.Join(strings.Fields(strings.Join(cur, " ")), " "))
			cur = nil
		}
	}
	for _, l := range strings.Split(doc, "\n") {
		switch {
		case strings.HasPrefix(l, "- Shown by:"):
			flush()
			cur = []string{l}
		case cur != nil && strings.HasPrefix(l, "  "):
			cur = append(cur, l)
		default:
			flush()
		}
	}
	flush()
	return items
}

// nameMatches matches a function name against a name as SECURITY.md
// writes it: whole, a prefix with "*", a suffix after "…", or both.
func nameMatches(fn, tok string) bool {
	if rest, ok := strings.CutPrefix(tok, "…"); ok {
		if p, ok := strings.CutSuffix(rest, "*"); ok {
			return strings.Contains(fn, p)
		}
		return strings.HasSuffix(fn, rest)
	}
	if p, ok := strings.CutSuffix(tok, "*"); ok {
		return strings.HasPrefix(fn, p)
	}
	return fn == tok
}

// testFuncs are the top-level functions of the package in dir's test
// files.
func testFuncs(t *testing.T, dir string) []string {
	t.Helper()
	var names []string
	for _, f := range parseDir(t, dir, true) {
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil {
				names = append(names, fn.Name.Name)
			}
		}
	}
	return names
}

// docs/design.md's dependency graph is what the packages import: each
// package it names imports, of trialnet's packages outside internal/,
// exactly those the graph gives it, and every such package is named.
func TestDesignGraphIsTheImports(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "docs", "design.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := graphOf(t, string(b))
	pkgs := productionPackages(t)
	for _, p := range pkgs {
		want, ok := doc[p]
		if !ok {
			t.Errorf("docs/design.md's graph does not name %s", p)
			continue
		}
		got := imports(t, p)
		if !slices.Equal(got, want) {
			t.Errorf("docs/design.md: %s → %s; its imports: %s", p, strings.Join(want, ", "), strings.Join(got, ", "))
		}
	}
	for p := range doc {
		if !slices.Contains(pkgs, p) {
			t.Errorf("docs/design.md's graph names %s, which is no package outside internal/ and test/", p)
		}
	}
}

// graphOf reads the dependency graph from design.md's code block that
// follows "Dependencies point one way": lines "A, B → C, D → E" (A and B
// import C and D, which import E) and "X → (nothing of trialnet's)".
func graphOf(t *testing.T, doc string) map[string][]string {
	t.Helper()
	_, after, ok := strings.Cut(doc, "Dependencies point one way")
	if !ok {
		t.Fatal("docs/design.md has no \"Dependencies point one way\" graph")
	}
	_, block, _ := strings.Cut(after, "```\n")
	block, _, _ = strings.Cut(block, "```")
	g := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
		segs := strings.Split(line, "→")
		if len(segs) < 2 {
			t.Fatalf("docs/design.md graph line %q has no →", line)
		}
		for i := 0; i+1 < len(segs); i++ {
			var to []string
			if !strings.Contains(segs[i+1], "nothing") {
				to = splitList(segs[i+1])
			}
			for _, from := range splitList(segs[i]) {
				g[from] = append(g[from], to...)
				slices.Sort(g[from])
				g[from] = slices.Compact(g[from])
			}
		}
	}
	return g
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// productionPackages are the directories with non-test Go files, outside
// internal/ and test/.
func productionPackages(t *testing.T) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && rel != "." || rel == "internal" || rel == "test" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() && rel != "." && len(parseDir(t, rel, false)) > 0 {
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// imports are the trialnet packages outside internal/ that dir's
// non-test files import, sorted.
func imports(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	for _, f := range parseDir(t, dir, false) {
		for _, im := range f.Imports {
			p, _ := strconv.Unquote(im.Path.Value)
			if rel, ok := strings.CutPrefix(p, module); ok && !strings.HasPrefix(rel, "internal/") {
				out = append(out, rel)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// maxReadme is the README's length: past it, reference material belongs
// in docs/.
const maxReadme = 200

// The README is a first screen and a map, not the manual.
func TestReadmeStaysShort(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n > maxReadme {
		t.Fatalf("README.md is %d lines, more than %d: move reference material to docs/", n, maxReadme)
	}
}

// A test helper lives in one place: an unexported function of test files
// defined in two packages is two copies that drift apart (one rss gave
// bytes, the other KiB) or one name for two jobs. Share it from a package
// under internal/, or name each for what it does. Test, Benchmark, Fuzz
// and Example functions and TestMain are exported, so never counted.
func TestTestHelpersLiveOnce(t *testing.T) {
	where := map[string][]string{} // helper name → "dir (package)"
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if !d.IsDir() {
			return nil
		}
		if strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "testdata" {
			return filepath.SkipDir
		}
		seen := map[string]bool{} // a package's helpers, counted once
		for _, f := range parseDir(t, rel, true) {
			for _, decl := range f.Decls {
				fn, ok := decl.(*ast.FuncDecl)
				if !ok || fn.Recv != nil || fn.Name.IsExported() || fn.Name.Name == "_" {
					continue
				}
				pkg := rel + " (" + f.Name.Name + ")"
				if key := pkg + fn.Name.Name; !seen[key] {
					seen[key] = true
					where[fn.Name.Name] = append(where[fn.Name.Name], pkg)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range slices.Sorted(maps.Keys(where)) {
		if pkgs := where[name]; len(pkgs) > 1 {
			t.Errorf("test helper %s is defined in %d packages: %s", name, len(pkgs), strings.Join(pkgs, ", "))
		}
	}
}
