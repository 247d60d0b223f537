// Package termsafe makes text that came from a Trial (a target, an SNI,
// a detail quoting either, anything read from a decision log) safe to
// print on an operator's terminal: nothing in it can move the cursor,
// retitle the window, write to the clipboard or reorder what is shown.
package termsafe

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// unsafe is the class escaped: every rune Go does not call printable
// (strconv.IsPrint: letters, marks, numbers, punctuation, symbols and
// the ASCII space). That is the C0 controls and DEL, the C1 controls
// (U+0080–U+009F: CSI, OSC, ...), the format characters, among them the
// bidi embeddings, overrides and isolates (U+202A–U+202E, U+2066–U+2069)
// and the zero-width ones, line and paragraph separators, spaces other
// than ' ', and unassigned and private-use code points.
func unsafe(r rune) bool { return !strconv.IsPrint(r) }

// String returns s with every unsafe rune escaped as Go escapes it
// (\x1b, \t, \u009b, \u202e) and every byte that is not UTF-8 as \xNN.
// Printable text, of any script, passes as it is; so does a backslash:
// the text is for reading, its exact bytes are in the JSON output.
func String(s string) string {
	i := 0
	for i < len(s) && s[i] >= 0x20 && s[i] < 0x7f {
		i++
	}
	if i == len(s) {
		return s // printable ASCII, the usual case
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	b.WriteString(s[:i])
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			b.WriteString(`\x`)
			b.WriteString(strconv.FormatUint(uint64(s[i])|0x100, 16)[1:])
		case unsafe(r):
			q := strconv.QuoteRune(r) // '\u009b'
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// JSON escapes, in JSON text (as encoding/json writes it: valid UTF-8),
// DEL and every unsafe rune outside ASCII as \uXXXX. Such a rune can only
// be inside a string, where the escape means the same rune: the JSON
// decodes to exactly the same values. encoding/json escapes the other
// ASCII controls itself (and whitespace between tokens is not escaped).
func JSON(b []byte) []byte {
	i := 0
	for i < len(b) && b[i] < 0x7f {
		i++
	}
	if i == len(b) {
		return b
	}
	out := make([]byte, 0, len(b)+16)
	out = append(out, b[:i]...)
	for i < len(b) {
		r, n := utf8.DecodeRune(b[i:])
		if r >= 0x7f && unsafe(r) {
			out = appendU(out, r)
		} else {
			out = append(out, b[i:i+n]...)
		}
		i += n
	}
	return out
}

// appendU appends r as a JSON \u escape (a surrogate pair past the BMP).
func appendU(b []byte, r rune) []byte {
	if r > 0xffff {
		r -= 0x10000
		b = appendU(b, 0xd800+(r>>10))
		return appendU(b, 0xdc00+(r&0x3ff))
	}
	const hex = "0123456789abcdef"
	return append(b, '\\', 'u', hex[r>>12&0xf], hex[r>>8&0xf], hex[r>>4&0xf], hex[r&0xf])
}
