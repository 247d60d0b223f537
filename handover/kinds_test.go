//go:build linux

package handover

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

// Who sends a message.
const (
	byNew = "new agent" // the successor
	byOld = "old agent" // the predecessor
)

// vocabulary is every message, as it goes on the wire with each field
// set, and who sends it. An agent of an earlier build writes and reads
// exactly these objects (one struct for every kind, each field omitted
// when empty), so none may change; a kind added must be added here too
// (TestKindsListed).
var vocabulary = []struct {
	msg    Message
	wire   string
	sender string
}{
	{Hello{Version: 1, PID: 7, Paths: map[string]string{"socket": "/s"}, Shares: true},
		`{"type":"hello","version":1,"pid":7,"paths":{"socket":"/s"},"shares":true}`, byNew},
	{Refused{Version: 1, PID: 7, Error: "why"}, `{"type":"refused","version":1,"pid":7,"error":"why"}`, byOld},
	{Offer{Version: 1, PID: 7, Names: []string{"metrics"}, More: true, Offsets: map[string]int64{"t": 1},
		Slots: map[string]int{"counts": 1}, Open: map[string]int64{"t": 2}},
		`{"type":"offer","version":1,"pid":7,"names":["metrics"],"more":true,"offsets":{"t":1},"slots":{"counts":1},"open":{"t":2}}`, byOld},
	{Adopting{}, `{"type":"adopting"}`, byNew},
	{Serving{PID: 7}, `{"type":"serving","pid":7}`, byNew},
	{Stopped{Open: map[string]int64{"t": 2}}, `{"type":"stopped","open":{"t":2}}`, byOld},
	{Records{Trial: "t", Lines: []json.RawMessage{json.RawMessage(`{"a":1}`)}}, `{"type":"records","trial":"t","lines":[{"a":1}]}`, byOld},
	{Open{Open: map[string]int64{"t": 2}}, `{"type":"open","open":{"t":2}}`, byOld},
	{Allow{Trial: "t", Seq: 3, Allow: json.RawMessage(`[{"entry":"a.example:443"}]`), Cut: []string{"b.example:443"}},
		`{"type":"allow","trial":"t","seq":3,"allow":[{"entry":"a.example:443"}],"cut":["b.example:443"]}`, byNew},
	{Remove{Trial: "t", Seq: 3}, `{"type":"remove","trial":"t","seq":3}`, byNew},
	{Done{Error: "no", Seq: 3, N: 2}, `{"type":"done","error":"no","seq":3,"n":2}`, byOld},
	{Drained{}, `{"type":"drained"}`, byOld},
}

// Each message goes on the wire as an earlier build writes it, and reads
// back as itself; an empty one is its type alone.
func TestMessagesWire(t *testing.T) {
	for _, v := range vocabulary {
		b, err := json.Marshal(Envelope{v.msg})
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != v.wire {
			t.Errorf("%T goes on the wire as\n%s\nwant\n%s", v.msg, b, v.wire)
		}
		var e Envelope
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatal(err)
		}
		again, _ := json.Marshal(e)
		if e.Kind() != v.msg.Kind() || string(again) != v.wire {
			t.Errorf("%s reads back as %#v", b, e.Msg)
		}
		empty := v.msg.Kind()
		if b, _ := json.Marshal(Envelope{zero(v.msg)}); string(b) != `{"type":`+strconv.Quote(string(empty))+`}` {
			t.Errorf("an empty %T is %s", v.msg, b)
		}
	}
	var e Envelope
	if err := json.Unmarshal([]byte(`{"type":"later","x":1}`), &e); err != nil || e.Msg != (Unknown{"later"}) {
		t.Errorf("a kind of a later build reads as %#v, %v; want Unknown", e.Msg, err)
	}
}

// zero is an empty message of m's kind.
func zero(m Message) Message {
	z, err := decoders[m.Kind()]([]byte("{}"))
	if err != nil {
		panic(err)
	}
	return z
}

// Every Kind constant is in vocabulary, once, with a decoder, and its
// comment begins with who sends it: the vocabulary is written down in
// one place, and stays so.
func TestKindsListed(t *testing.T) {
	listed := make(map[Kind]string)
	for _, v := range vocabulary {
		if _, dup := listed[v.msg.Kind()]; dup {
			t.Errorf("vocabulary lists %q twice", v.msg.Kind())
		}
		listed[v.msg.Kind()] = v.sender
	}
	declared := kindConsts(t)
	for name, c := range declared {
		sender, ok := listed[Kind(c.value)]
		if !ok {
			t.Errorf("%s (%q) is not in vocabulary: add it, with who sends it", name, c.value)
			continue
		}
		if want := name + ": " + sender + ","; !strings.HasPrefix(c.doc, want) {
			t.Errorf("%s's comment is %q; it should begin %q", name, c.doc, want)
		}
		if decoders[Kind(c.value)] == nil {
			t.Errorf("%s has no decoder", name)
		}
	}
	if len(declared) != len(listed) || len(decoders) != len(listed) {
		t.Errorf("%d Kind constants, %d listed, %d decoders", len(declared), len(listed), len(decoders))
	}
}

type kindConst struct{ value, doc string }

// kindConsts are the constants of type Kind the package declares.
func kindConsts(t *testing.T) map[string]kindConst {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]kindConst)
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
				if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Kind" {
					continue
				}
				for i, n := range vs.Names {
					lit, _ := vs.Values[i].(*ast.BasicLit)
					if lit == nil || lit.Kind != token.STRING {
						t.Fatalf("%s: %s is not a string literal", fset.Position(n.Pos()), n.Name)
					}
					v, _ := strconv.Unquote(lit.Value)
					out[n.Name] = kindConst{value: v, doc: strings.TrimSpace(vs.Doc.Text())}
				}
			}
		}
	}
	if len(out) == 0 {
		t.Fatal("no Kind constants found")
	}
	return out
}

// Exactly the transitions in the table are taken; every other step, from
// every state to every state, is refused and leaves the state as it was.
func TestStateTransitions(t *testing.T) {
	for from := State(0); from < nStates; from++ {
		for to := State(0); to < nStates; to++ {
			m := &machine{s: from, changed: make(chan struct{})}
			err := m.to(to)
			want := false
			for _, s := range transitions[from] {
				want = want || s == to
			}
			switch {
			case want && err != nil:
				t.Errorf("%s → %s is in the table, and refused: %v", from, to, err)
			case !want && err == nil:
				t.Errorf("%s → %s is not in the table, and was taken", from, to)
			case !want && m.state() != from:
				t.Errorf("%s → %s was refused and left the state %s", from, to, m.state())
			}
		}
	}
	for from := State(0); from < nStates; from++ {
		m := &machine{s: from, changed: make(chan struct{})}
		switch got := m.end(); {
		case from.Ended() && got != from:
			t.Errorf("ending a hand-over already at its end %s made it %s", from, got)
		case !from.Ended() && from < StateStopped && got != StateFailed:
			t.Errorf("ending a hand-over at %s (before stopped) made it %s, want failed", from, got)
		case from == StateStopped && got != StateLost:
			t.Errorf("ending a hand-over at stopped made it %s, want lost", got)
		}
	}
}
