package termsafe

import (
	"encoding/json"
	"testing"
)

func TestString(t *testing.T) {
	want := map[string]string{
		"ESC CSI clear":    `a\x1b[2Jb`,
		"C1 CSI":           `a\u009b31mred`,
		"C1 OSC title":     `a\u009d0;pwned\u009c`,
		"C1 NEL":           `a\u0085b`,
		"C0 BEL and CR":    `a\a\rb`,
		"DEL":              `a\x7fb`,
		"tab and newline":  `a\tb\nc`,
		"invalid UTF-8":    `a\xffb\xc2`,
		"UTF-8 encoded C1": `a\u009bb`,
		"RLO":              `evil\u202egnp.exe`,
		"LRE PDF":          `a\u202ab\u202c`,
		"RLI PDI":          `a\u2067b\u2069`,
		"FSI LRI":          `a\u2068b\u2066`,
		"zero width":       `a\u200bb\ufeffc`,
		"line separator":   `a\u2028b`,
	}
	for _, h := range Hostile {
		name, s := h.Name, h.Text
		got := String(s)
		if got != want[name] {
			t.Errorf("%s: String(%q) = %q, want %q", name, s, got, want[name])
		}
		if !Safe(got) {
			t.Errorf("%s: %q is not safe", name, got)
		}
	}
	for _, s := range []string{"", "api.example.com:443", "bücher.example ✓ 日本", `back\slash "q"`} {
		if got := String(s); got != s {
			t.Errorf("printable %q became %q", s, got)
		}
	}
}

func TestJSON(t *testing.T) {
	for _, h := range Hostile {
		name, s := h.Name, h.Text
		in, err := json.Marshal(map[string]string{"k": s})
		if err != nil {
			t.Fatal(err)
		}
		out := JSON(in)
		var back map[string]string
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatalf("%s: %s is not JSON: %v", name, out, err)
		}
		var orig map[string]string
		_ = json.Unmarshal(in, &orig)
		if back["k"] != orig["k"] {
			t.Errorf("%s: %s decodes to %q, not %q", name, out, back["k"], orig["k"])
		}
		if !Safe(string(out)) {
			t.Errorf("%s: %s is not safe", name, out)
		}
	}
	astral := []byte(`{"k":"` + "\U000E0001" + `x"}`) // a tag character: not printable
	if got := string(JSON(astral)); got != `{"k":"\udb40\udc01x"}` {
		t.Errorf("astral: %s", got)
	}
	if plain := []byte(`{"k":"ü ✓"}`); string(JSON(plain)) != string(plain) {
		t.Error("printable non-ASCII was escaped")
	}
}
