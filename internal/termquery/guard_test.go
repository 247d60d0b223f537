package termquery

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

// completedOSCs is every OSC number a terminal would act on in out, in
// either reading: an OSC whose string a BEL or an ST ends.
func completedOSCs(out []byte) []int {
	var done []int
	read := func(m *machine, r rune, inOSC *bool) {
		before := m.st
		m.unit(r)
		switch {
		case m.st == oscNum && before != oscNum:
			*inOSC = true
		case m.st == str:
			*inOSC = false
		}
		ended := (before == oscNum || before == oscString) && (r == bel || r == st) ||
			before == strEsc && r == '\\'
		if ended && *inOSC && m.st == ground {
			done = append(done, m.osc)
		}
	}
	var m8, m0 machine
	var in8, in0 bool
	var dec decoder
	for _, b := range out {
		read(&m8, rune(b), &in8)
		dec.feed([]byte{b}, func(r rune, bad bool) {
			if bad {
				r = 0xfffd
			}
			read(&m0, r, &in0)
		})
	}
	return done
}

func guarded(parts ...string) []byte {
	var g Guard
	var out []byte
	for _, p := range parts {
		out = g.Filter(out, []byte(p))
	}
	return out
}

func stoppedOSC(n int) bool { return n == 52 || n == 1337 || n == 5522 || n >= maxParam }

// A program's clipboard write never reaches the terminal whole, however
// it is spelt or split: 7-bit and 8-bit introducers, C1 as UTF-8, ST or
// BEL, leading zeros, GR digits, numbers a terminal may wrap.
func TestGuardStopsClipboardWrites(t *testing.T) {
	for _, in := range []string{
		"\x1b]52;c;Y3VybCBldmlsIHwgc2gK\x07",
		"\x1b]52;c;Y3VybCBldmlsIHwgc2gK\x1b\\",
		"\x9d52;c;Y3VybA==\x9c",
		"\xc2\x9d52;c;Y3VybA==\xc2\x9c",
		"\x1b]052;c;Y3VybA==\x07",
		"\x1b]5\xb2;c;Y3VybA==\x07",
		"\x1b]52\x07",
		"\x1b]1337;Copy=:Y3VybA==\x07",
		"\x1b]5522;type=write\x1b\\",
		"\x1b]4294967348;c;Y3VybA==\x07",
		"text \x1b]52;p;Y3VybA==\x07 more \x1b]52;s;Y3VybA==\x07",
		"\x1b]0;title\x07\x1b]52;c;Y3VybA==\x07",
	} {
		splits(t, in, func(parts []string) {
			out := guarded(parts...)
			if got := slices.DeleteFunc(completedOSCs(out), func(n int) bool { return !stoppedOSC(n) }); len(got) > 0 {
				t.Fatalf("%q in %d parts: the terminal would act on OSC %v in %q", in, len(parts), got, out)
			}
			if got := bytes.ReplaceAll(out, []byte{can}, nil); string(got) != strings.ReplaceAll(in, "\x18", "") {
				t.Fatalf("%q: the guard changed more than it stopped: %q", in, out)
			}
		})
	}
}

// Everything else passes unchanged: titles, hyperlinks, colours, other
// sequences, text with C1 bytes inside UTF-8 characters.
func TestGuardPassesTheRest(t *testing.T) {
	for _, in := range []string{
		"plain text, ünïcödé ✓ Лето ŝ",
		"\x1b]0;title\x07\x1b]2;t\x1b\\",
		"\x1b]8;;https://example.com\x1b\\link\x1b]8;;\x1b\\",
		"\x1b]11;?\x07\x1b]4;1;rgb:00/00/00\x07",
		"\x1b[31mred\x1b[0m\x1b[?1049h\x1b[6n\x1bP$qm\x1b\\",
		"\x1b]5;x\x07\x1b]53;x\x07\x1b]520;x\x07",
	} {
		splits(t, in, func(parts []string) {
			if out := guarded(parts...); string(out) != in {
				t.Fatalf("%q in %d parts became %q", in, len(parts), out)
			}
		})
	}
}

// Any bytes, split anywhere: the terminal never acts on a stopped OSC,
// and the guard only ever adds CAN.
func FuzzGuard(f *testing.F) {
	for _, s := range []string{"\x1b]52;c;eA==\x07", "\x9d52;c;eA==\x9c", "\xc2\x9d52;;\x07", "\x1b]0;t\x07", "plain", "\x1b]5\xb2;\x07"} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, b []byte, cut uint8) {
		i := int(cut) % (len(b) + 1)
		out := guarded(string(b[:i]), string(b[i:]))
		for _, n := range completedOSCs(out) {
			if stoppedOSC(n) {
				t.Fatalf("%q: the terminal would act on OSC %d in %q", b, n, out)
			}
		}
		if got := bytes.ReplaceAll(out, []byte{can}, nil); !bytes.Equal(got, bytes.ReplaceAll(b, []byte{can}, nil)) {
			t.Fatalf("%q became %q: more than CAN added", b, out)
		}
	})
}
