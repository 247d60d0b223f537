package termquery

import (
	"strings"
	"testing"
)

// splits feeds s whole, in two parts at every point, and byte by byte,
// and calls check after each.
func splits(t *testing.T, s string, feed func(parts []string)) {
	t.Helper()
	feed([]string{s})
	for i := 1; i < len(s); i++ {
		feed([]string{s[:i], s[i:]})
	}
	feed(strings.Split(s, ""))
	bytewise := make([]string, len(s))
	for i := range len(s) {
		bytewise[i] = s[i : i+1]
	}
	feed(bytewise)
}

func TestOutput(t *testing.T) {
	for _, c := range []struct {
		name   string
		in     string
		query  bool
		status int
		quiet  bool
	}{
		{"text", "plain text, ünïcödé ✓", false, 0, true},
		{"colours", "\x1b[31mred\x1b[0m \x1b[38;2;1;2;3mx\x1b[38:5:1m", false, 0, true},
		{"screen", "\x1b[2J\x1b[H\x1b[?25l\x1b[?1049h\x1b[1;24r\x1b7\x1b8\x1b(B\x1b[2 q\x1b[>4;1m\x1b=", false, 0, true},
		{"mouse off", "\x1b[?1000l\x1b[?1006l", false, 0, true},
		{"Cyrillic (0x9b inside UTF-8)", "Лето", false, 0, true}, // 8-bit: Ð, CSI, Ð (GR read as P: DCH)
		{"cursor position", "\x1b[6n", true, 0, true},
		{"a forged status report", "\x1b[0n", true, 0, true},
		{"status", "\x1b[5n", true, 1, true},
		{"status 8-bit", "\x9b5n", true, 1, true},
		{"status C1 in UTF-8", "\xc2\x9b5n", true, 1, true},
		{"status after a UTF-8 lead byte", "\xc4\x9b5n", true, 1, true},
		{"status with C0 inside", "\x1b[5\nn", true, 1, true},
		{"status leading zero", "\x1b[005n", true, 1, true},
		{"status private marker", "\x1b[?5n", true, 1, true},
		{"status more parameters", "\x1b[5;1n", true, 1, true},
		{"status huge parameter", "\x1b[4294967301n", true, 1, true},
		{"status GR digit", "\x1b[\xb5n", true, 1, true},
		{"two status requests", "\x1b[5n\x1b[5n", true, 2, true},
		{"status cancelled", "\x1b[5\x18n", false, 0, true},
		{"OSC colour query", "\x1b]11;?\x07", true, 0, true},
		{"OSC colour query 8-bit", "\x9d11;?\x9c", true, 0, true},
		{"OSC clipboard query", "\x1b]52;c;?\x1b\\", true, 0, true},
		{"OSC title", "\x1b]0;what?\x07\x1b]2;x\x1b\\", false, 0, true},
		{"OSC hyperlink", "\x1b]8;;http://h/?q=1\x1b\\link\x1b]8;;\x1b\\", false, 0, true},
		{"OSC cut short by a CSI", "\x1b]0;x\x1b[5n", true, 1, true},
		{"DCS query", "\x1bP$qm\x1b\\", true, 0, true},
		{"DCS 8-bit", "\x90$qm\x9c", true, 0, true},
		{"status inside a DCS", "\x1bPq\x1b[5n", true, 1, true},
		{"APC", "\x1b_Gi=1;AAAA\x1b\\", true, 0, true},
		{"DECID", "\x1bZ", true, 0, true},
		{"DECID 8-bit", "\x9a", true, 0, true},
		{"ENQ", "\x05", true, 0, true},
		{"DA1", "\x1b[c", true, 0, true},
		{"DA2", "\x1b[>c", true, 0, true},
		{"DECRQM", "\x1b[?2026$p", true, 0, true},
		{"kitty keyboard query", "\x1b[?u", true, 0, true},
		{"mouse on", "\x1b[?1000h", true, 0, true},
		{"focus on", "\x1b[?25;1004h", true, 0, true},
		{"unknown escape", "\x1b!", true, 0, false},
		{"unfinished CSI", "\x1b[", true, 0, false},
		{"unfinished DCS", "\x1bP", true, 0, false},
		{"unfinished OSC title", "\x1b]0;ti", true, 0, false},
		{"unfinished character", "\xe2\x82", true, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			splits(t, c.in, func(parts []string) {
				var o Output
				for _, p := range parts {
					_, _ = o.Write([]byte(p))
				}
				q, n := o.Pending()
				if q != c.query || n != c.status || o.Quiet() != c.quiet {
					t.Fatalf("%q in %d parts: pending %v, %d status, quiet %v; want %v, %d, %v",
						c.in, len(parts), q, n, o.Quiet(), c.query, c.status, c.quiet)
				}
			})
		})
	}
}

func TestOutputSettle(t *testing.T) {
	var o Output
	_, _ = o.Write([]byte("\x1b[5n\x1b[6n"))
	o.Settle()
	if q, n := o.Pending(); q || n != 0 {
		t.Fatalf("after Settle: %v %d", q, n)
	}
	_, _ = o.Write([]byte("\x1b[c"))
	if q, _ := o.Pending(); !q {
		t.Fatal("a query after Settle is not pending")
	}
}

func TestAnswers(t *testing.T) {
	for _, c := range []struct {
		name string
		in   string
		want int
	}{
		{"status", "\x1b[0n", 1},
		{"malfunction", "\x1b[3n", 1},
		{"8-bit", "\x9b0n", 1},
		{"C1 in UTF-8", "\xc2\x9b0n", 1},
		{"after a byte that is no UTF-8", "\xff\x9b0n", 1},
		{"two, and other answers", "\x1b[2;1R\x1b[0n\x1b[?62;22c\x1b]11;rgb:0/0/0\x1b\\\x1b[0n", 2},
		{"cursor position", "\x1b[2;1R", 0},
		{"typed ě0n", "\xc4\x9b0n", 0},
		{"typed text", "hello 0n [0n", 0},
		{"private marker", "\x1b[?0n", 0},
		{"other parameter", "\x1b[10n\x1b[0;0n", 0},
		{"pasted", "\x1b[200~\x1b[0n\x1b[201~", 0},
		{"after a paste", "\x1b[200~x\x1b[201~\x1b[0n", 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			splits(t, c.in, func(parts []string) {
				var a Answers
				n := 0
				for _, p := range parts {
					n += a.Scan([]byte(p))
				}
				if n != c.want {
					t.Fatalf("%q in %d parts: %d status reports, want %d", c.in, len(parts), n, c.want)
				}
			})
		})
	}
}

// The fence is a status request to the reading of Output, and ends
// quiet; the fence's answer is one report.
func TestFence(t *testing.T) {
	var o Output
	_, _ = o.Write([]byte(Cancel + Fence))
	if _, n := o.Pending(); n != 1 || !o.Quiet() {
		t.Fatalf("the fence reads as %d status requests, quiet %v", n, o.Quiet())
	}
	var a Answers
	if n := a.Scan([]byte("\x1b[0n")); n != 1 {
		t.Fatal("the fence's answer is not a report")
	}
}

func BenchmarkOutput(b *testing.B) {
	chunk := []byte(strings.Repeat("\x1b[32mok\x1b[0m build step ünïcödé done\r\n", 512))
	b.SetBytes(int64(len(chunk)))
	var o Output
	for b.Loop() {
		_, _ = o.Write(chunk)
	}
}
