package termquery

// Guard keeps a program from setting the clipboard of the terminal it
// writes to: a Trial's OSC 52 (and kitty's 5522, iTerm2's 1337, which
// copies too) set the operator's clipboard, and the operator's next paste
// ran the Trial's text in a shell outside it (an attacker's review, with
// tmux's set-clipboard on; kitty, foot, wezterm and others take OSC 52
// by default). An OSC acts only once its terminator arrives, so Guard
// lets such a sequence begin and puts CAN before the byte that would end
// its number: the terminal drops the sequence, and the rest of it shows
// as text. It reads the output both ways Output does (UTF-8, and 8-bit
// with C1 controls), and an OSC number too large to be read the same way
// by every terminal (one may wrap it to 52) is stopped too.
type Guard struct {
	m   [2]machine // [0] reads UTF-8, [1] reads 8-bit
	dec decoder
}

// Filter appends p to dst as the terminal is to get it, and returns dst.
func (g *Guard) Filter(dst, p []byte) []byte {
	for len(p) > 0 {
		if g.dec.n == 0 && g.m[0].st == ground && g.m[1].st == ground {
			i := 0
			for i < len(p) && printable(p[i]) {
				i++
			}
			dst, p = append(dst, p[:i]...), p[i:]
			if len(p) == 0 {
				break
			}
		}
		b := p[0]
		p = p[1:]
		if (b < '0' || b > '9') && (g.stopped(0) || g.stopped(1)) {
			dst = append(dst, can)
			g.feed(can)
		}
		dst = append(dst, b)
		g.feed(b)
	}
	return dst
}

// stopped says reading i is in the number of an OSC that Guard stops.
func (g *Guard) stopped(i int) bool {
	m := &g.m[i]
	if m.st != oscNum {
		return false
	}
	switch m.osc {
	case 52, 1337, 5522, maxParam:
		return true
	}
	return false
}

func (g *Guard) feed(b byte) {
	g.m[1].unit(rune(b))
	g.dec.feed([]byte{b}, func(r rune, bad bool) {
		if bad {
			r = 0xfffd
		}
		g.m[0].unit(r)
	})
}
