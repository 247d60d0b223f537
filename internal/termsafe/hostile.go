package termsafe

import (
	"strings"
	"unicode/utf8"
)

// Hostile is a table of strings a Trial could get into a record, each
// holding something a terminal acts on or that disguises text: for the
// tests of whatever prints such text. A slice, not a map: a package-level
// map is built in every start of a binary that reads it.
var Hostile = []struct{ Name, Text string }{
	{"ESC CSI clear", "a\x1b[2Jb"},
	{"C1 CSI", "a\u009b31mred"},
	{"C1 OSC title", "a\u009d0;pwned\u009c"},
	{"C1 NEL", "a\u0085b"},
	{"C0 BEL and CR", "a\x07\rb"},
	{"DEL", "a\x7fb"},
	{"tab and newline", "a\tb\nc"},
	{"invalid UTF-8", "a\xffb\xc2"},
	{"UTF-8 encoded C1", "a\xc2\x9bb"},
	{"RLO", "evil\u202egnp.exe"},
	{"LRE PDF", "a\u202ab\u202c"},
	{"RLI PDI", "a\u2067b\u2069"},
	{"FSI LRI", "a\u2068b\u2066"},
	{"zero width", "a\u200bb\ufeffc"},
	{"line separator", "a\u2028b"},
}

// Safe reports whether s holds nothing String would escape: for tests.
func Safe(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsFunc(s, unsafe)
}
