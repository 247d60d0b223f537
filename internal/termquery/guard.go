package termquery

// Guard keeps a program from setting the clipboard of the terminal it
// writes to: a Trial's OSC 52 (kitty's 5522; iTerm2's 1337 and its alias
// 50, which copy too) set the operator's clipboard, and the operator's
// next paste ran the Trial's text in a shell outside it (an attacker's
// review, with tmux's set-clipboard on; kitty, foot, wezterm and others
// take OSC 52 by default).
//
// Cutting such a sequence short is not enough: kitty keeps CAN inside an
// OSC as data, and still dispatches it. So Guard holds back every byte
// that leaves a reading where an OSC may begin or go on (after ESC, in an
// OSC's number, inside a UTF-8 character), with what follows it, until
// every reading has left the introducer and the OSC's number:
// a stopped number's introducer and number are dropped, so its string
// reaches the terminal as text; any other passes unchanged. It reads the
// output both ways Output does (UTF-8, and 8-bit with C1 controls), skips
// NUL and DEL inside a number as kitty does, and stops a number too large
// to be read alike by every terminal (one may wrap it to 52). What is
// held when the output ends is an unfinished introducer: it is dropped.
type Guard struct {
	m    [2]machine // [0] reads UTF-8, [1] reads 8-bit: what was let through
	dec  decoder
	pend []byte // held back, since an introducer
	sim  [2]machine
	sdec decoder
	stop bool // a reading held back left a stopped OSC number
}

// maxHeld bounds what Guard holds back: an introducer and a number that
// long is no terminal's OSC but a stopped one (its number is saturated).
const maxHeld = 32

// Filter appends p to dst as the terminal is to get it, and returns dst.
func (g *Guard) Filter(dst, p []byte) []byte {
	for len(p) > 0 {
		if len(g.pend) == 0 && g.dec.n == 0 && g.m[0].st == ground && g.m[1].st == ground {
			i := 0
			for i < len(p) && printable(p[i]) {
				i++
			}
			dst = append(dst, p[:i]...) // text leaves every reading where it is
			if p = p[i:]; len(p) == 0 {
				break
			}
		}
		b := p[0]
		p = p[1:]
		if len(g.pend) == 0 {
			g.sim, g.sdec, g.stop = g.m, g.dec, false
		}
		g.pend = append(g.pend, b)
		g.simulate(b)
		if g.undecided() && !g.stop && len(g.pend) < maxHeld {
			continue
		}
		if !g.stop && len(g.pend) < maxHeld {
			dst = append(dst, g.pend...)
			g.m, g.dec = g.sim, g.sdec
		}
		g.pend = g.pend[:0]
	}
	return dst
}

// undecided says a reading of what is held may still be in an OSC's
// introducer or number.
func (g *Guard) undecided() bool {
	for i := range g.sim {
		if st := g.sim[i].st; st == escape || st == strEsc || st == oscNum {
			return true // ESC, or ESC in a string, may be followed by ]
		}
	}
	return g.sdec.n > 0
}

// simulate feeds b to the readings of what is held, noting a stopped OSC
// number that a reading leaves.
func (g *Guard) simulate(b byte) {
	read := func(m *machine, r rune) {
		was := m.st
		m.unit(r)
		if was == oscNum && m.st != oscNum && stoppedOSC(m.osc) {
			g.stop = true
		}
	}
	read(&g.sim[1], rune(b))
	g.sdec.feed([]byte{b}, func(r rune, bad bool) {
		if bad {
			r = 0xfffd
		}
		read(&g.sim[0], r)
	})
}

// stoppedOSC says Guard stops OSC n.
func stoppedOSC(n int) bool {
	switch n {
	case 50, 52, 1337, 5522, maxParam:
		return true
	}
	return false
}
