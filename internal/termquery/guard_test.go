package termquery

import (
	"bytes"
	"strings"
	"testing"
)

// vtOSCs is every OSC number a terminal that follows DEC's parser would
// act on in out, in either reading: one whose string a BEL or an ST
// ends (CAN and SUB cancel it).
func vtOSCs(out []byte) []int {
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

// kittyOSCs is every OSC number kitty would act on in out: after ESC ] or
// C1 OSC, every byte but BEL, NUL, DEL and ESC \ is data, CAN and SUB
// included; at BEL or ST its leading digits (five at most) are the number.
func kittyOSCs(out []byte) []int {
	var done []int
	inOSC, escaped := false, false
	var data []byte
	for _, b := range out {
		if !inOSC {
			inOSC = escaped && b == ']' || b == osc
			escaped, data = b == esc, data[:0]
			continue
		}
		switch {
		case b == 0 || b == 0x7f:
			continue
		case b == bel || b == st || escaped && b == '\\':
			if escaped {
				data = data[:len(data)-1]
			}
			n, i := 0, 0
			for ; i < len(data) && i < 5 && data[i] >= '0' && data[i] <= '9'; i++ {
				n = n*10 + int(data[i]-'0')
			}
			if i > 0 {
				done = append(done, n)
			}
			inOSC = false
		default:
			data = append(data, b)
		}
		escaped = b == esc
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

// acted says which stopped OSC a terminal of either kind would act on in
// out.
func acted(out []byte) []int {
	var got []int
	for _, n := range append(vtOSCs(out), kittyOSCs(out)...) {
		if stoppedOSC(n) || n == 52 {
			got = append(got, n)
		}
	}
	return got
}

// subsequence says out is in with bytes left out, none added.
func subsequence(out, in []byte) bool {
	for _, b := range out {
		i := bytes.IndexByte(in, b)
		if i < 0 {
			return false
		}
		in = in[i+1:]
	}
	return true
}

// A program's clipboard write never reaches the terminal as one, however
// it is spelt or split: 7-bit and 8-bit introducers, C1 as UTF-8, ST or
// BEL, leading zeros, GR digits, DEL and NUL inside the number, CAN
// (kitty keeps it as data), numbers a terminal may wrap, iTerm2's 1337
// and 50.
func TestGuardStopsClipboardWrites(t *testing.T) {
	for _, in := range []string{
		"\x1b]52;c;Y3VybCBldmlsIHwgc2gK\x07",
		"\x1b]52;c;Y3VybCBldmlsIHwgc2gK\x1b\\",
		"\x9d52;c;Y3VybA==\x9c",
		"\xc2\x9d52;c;Y3VybA==\xc2\x9c",
		"\x1b]052;c;Y3VybA==\x07",
		"\x1b]5\xb2;c;Y3VybA==\x07",
		"\x1b]52\x07",
		"\x1b]52c;Y3VybA==\x07",
		"\x1b]52\x18c;Y3VybA==\x07",
		"\x1b]5\x7f2;c;Y3VybA==\x07",
		"\x1b]\x7f52;c;Y3VybA==\x07",
		"\x1b]5\x002;c;Y3VybA==\x07",
		"\x1b]1337;Copy=:Y3VybA==\x07",
		"\x1b]50;CopyToClipboard=x\x07",
		"\x1b]5522;type=write\x1b\\",
		"\x1b]4294967348;c;Y3VybA==\x07",
		"text \x1b]52;p;Y3VybA==\x07 more \x1b]52;s;Y3VybA==\x07",
		"\x1b]0;title\x07\x1b]52;c;Y3VybA==\x07",
		"\x1b\x9d52;c;Y3VybA==\x07",
	} {
		splits(t, in, func(parts []string) {
			out := guarded(parts...)
			if got := acted(out); len(got) > 0 {
				t.Fatalf("%q in %d parts: a terminal would act on OSC %v in %q", in, len(parts), got, out)
			}
			if !subsequence(out, []byte(in)) {
				t.Fatalf("%q: the guard added bytes: %q", in, out)
			}
		})
	}
}

// A clipboard write wrapped for a terminal multiplexer's passthrough
// (tmux's DCS tmux;, its ESCs doubled), which an outer terminal would get
// unwrapped, is stopped too: the ESC inside the string ends it, in every
// reading, and begins the OSC.
func TestGuardStopsPassedThroughClipboardWrites(t *testing.T) {
	for _, in := range []string{
		"\x1bPtmux;\x1b\x1b]52;c;Y3VybA==\x07\x1b\\",
		"\x1bPtmux;\x1b\x1b]52;c;Y3VybA==\x1b\x1b\\\x1b\\",
		"\x90tmux;\x1b\x1b]52;c;eA==\x07\x9c",
	} {
		splits(t, in, func(parts []string) {
			if out := guarded(parts...); bytes.Contains(out, []byte("]52")) {
				t.Fatalf("%q in %d parts: the passthrough still carries the clipboard write: %q", in, len(parts), out)
			}
		})
	}
}

// Everything else passes unchanged: titles, hyperlinks, colours, other
// sequences, text with C1 bytes inside UTF-8 characters, a lone ESC at
// the end of one write and its sequence in the next.
func TestGuardPassesTheRest(t *testing.T) {
	for _, in := range []string{
		"plain text, ünïcödé ✓ Лето ŝ ° ± µ",
		"\x1b]0;title\x07\x1b]2;t\x1b\\",
		"\x1b]8;;https://example.com\x1b\\link\x1b]8;;\x1b\\",
		"\x1b]11;?\x07\x1b]4;1;rgb:00/00/00\x07",
		"\x1b[31mred\x1b[0m\x1b[?1049h\x1b[6n\x1bP$qm\x1b\\",
		"\x1b]5;x\x07\x1b]53;x\x07\x1b]520;x\x07\x1b]7;file://h/p\x07",
	} {
		splits(t, in, func(parts []string) {
			if out := guarded(parts...); string(out) != in {
				t.Fatalf("%q in %d parts became %q", in, len(parts), out)
			}
		})
	}
}

// Any bytes, split anywhere: no terminal of either kind acts on a
// stopped OSC, and the guard only ever leaves bytes out.
func FuzzGuard(f *testing.F) {
	for _, s := range []string{"\x1b]52;c;eA==\x07", "\x9d52;c;eA==\x9c", "\xc2\x9d52;;\x07", "\x1b]0;t\x07", "plain", "\x1b]5\xb2;\x07", "\x1b]52\x18c;eA==\x07", "\x1b]5\x7f2;c;eA==\x07"} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, b []byte, cut uint8) {
		i := int(cut) % (len(b) + 1)
		out := guarded(string(b[:i]), string(b[i:]))
		if got := acted(out); len(got) > 0 {
			t.Fatalf("%q: a terminal would act on OSC %v in %q", b, got, out)
		}
		if !subsequence(out, b) {
			t.Fatalf("%q became %q: bytes added", b, out)
		}
		if whole := guarded(string(b)); !bytes.Equal(whole, out) {
			t.Fatalf("%q: whole %q, split at %d %q", b, whole, i, out)
		}
	})
}

// Guard on the terminal's output path, against Output (which reads every
// byte there already): text in ASCII, text in UTF-8 (Cyrillic, CJK), and
// a TUI's output heavy with sequences.
func BenchmarkGuard(b *testing.B) {
	for _, c := range []struct{ name, text string }{
		{"ascii", "the quick brown fox jumps over the lazy dog, 0123456789\r\n"},
		{"utf-8", "Лето в городе: жарко. 夏天的城市很热。 ünïcödé ✓\r\n"},
		{"sequences", "\x1b[1;32mok\x1b[0m \x1b[38;2;10;20;30mx\x1b[K\x1b]0;t\x07\x1b[2;5H|\r\n"},
	} {
		in := []byte(strings.Repeat(c.text, 32<<10/len(c.text)))
		b.Run(c.name+"/output", func(b *testing.B) {
			var o Output
			b.SetBytes(int64(len(in)))
			for b.Loop() {
				_, _ = o.Write(in)
			}
		})
		b.Run(c.name+"/guard", func(b *testing.B) {
			var g Guard
			out := make([]byte, 0, len(in))
			b.SetBytes(int64(len(in)))
			for b.Loop() {
				out = g.Filter(out[:0], in)
			}
		})
	}
}
