//go:build linux

package agent

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Who sends a hand-over message.
const (
	byNew = "new agent" // the successor
	byOld = "old agent" // the predecessor
)

// hoVocabulary is every hand-over message kind, as it goes on the wire,
// and who sends it. An agent of an earlier build speaks these strings, so
// a kind's string never changes; a kind added to the code must be added
// here too (TestHandoverKindsListed).
var hoVocabulary = []struct {
	kind   hoKind
	wire   string
	sender string
}{
	{hoHello, "hello", byNew},
	{hoRefused, "refused", byOld},
	{hoOffer, "offer", byOld},
	{hoAdopting, "adopting", byNew},
	{hoServing, "serving", byNew},
	{hoStopped, "stopped", byOld},
	{hoRecords, "records", byOld},
	{hoOpen, "open", byOld},
	{hoAllow, "allow", byNew},
	{hoRemove, "remove", byNew},
	{hoDone, "done", byOld},
	{hoDrained, "drained", byOld},
}

// Each kind goes on the wire as the string an earlier build sends and
// expects, and comes back as itself.
func TestHandoverKindsRoundTrip(t *testing.T) {
	for _, v := range hoVocabulary {
		b, err := json.Marshal(hoMsg{Type: v.kind})
		if err != nil {
			t.Fatal(err)
		}
		if want := `{"type":` + strconv.Quote(v.wire) + `}`; string(b) != want {
			t.Errorf("kind %q goes on the wire as %s, want %s", v.kind, b, want)
		}
		var m hoMsg
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		if m.Type != v.kind {
			t.Errorf("%s reads back as kind %q, want %q", b, m.Type, v.kind)
		}
	}
}

// Every hoKind constant in the package is in hoVocabulary, once, and its
// comment begins with who sends it: the protocol's vocabulary is written
// down in one place, and stays so.
func TestHandoverKindsListed(t *testing.T) {
	listed := make(map[string]string) // wire string: sender
	for _, v := range hoVocabulary {
		if _, dup := listed[v.wire]; dup {
			t.Errorf("hoVocabulary lists %q twice", v.wire)
		}
		listed[v.wire] = v.sender
	}
	declared := hoKindConsts(t)
	for name, c := range declared {
		sender, ok := listed[c.value]
		if !ok {
			t.Errorf("%s (%q) is not in hoVocabulary: add it, with who sends it", name, c.value)
			continue
		}
		if want := name + ": " + sender + ","; !strings.HasPrefix(c.doc, want) {
			t.Errorf("%s's comment is %q; it should begin %q", name, c.doc, want)
		}
	}
	seen := make(map[string]bool)
	for _, c := range declared {
		if seen[c.value] {
			t.Errorf("two hoKind constants are %q", c.value)
		}
		seen[c.value] = true
	}
	for wire := range listed {
		if !seen[wire] {
			t.Errorf("hoVocabulary lists %q, which no hoKind constant is", wire)
		}
	}
}

type hoKindConst struct{ value, doc string }

// hoKindConsts are the constants of type hoKind the package's source
// declares, by name.
func hoKindConsts(t *testing.T) map[string]hoKindConst {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]hoKindConst)
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "hoKind" {
					continue
				}
				for i, n := range vs.Names {
					var lit *ast.BasicLit
					if i < len(vs.Values) {
						lit, _ = vs.Values[i].(*ast.BasicLit)
					}
					if lit == nil || lit.Kind != token.STRING {
						t.Fatalf("%s: %s is not a string literal", fset.Position(n.Pos()), n.Name)
					}
					v, _ := strconv.Unquote(lit.Value)
					out[n.Name] = hoKindConst{value: v, doc: strings.TrimSpace(vs.Doc.Text())}
				}
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("no hoKind constants found in the package's source")
	}
	return out
}
