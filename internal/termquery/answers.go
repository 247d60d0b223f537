package termquery

// Answers counts the status reports (ESC[0n, ESC[3n: a fence's answer
// shape) in what a terminal sends, as ESC [, as the C1 CSI encoded in
// UTF-8 (C2 9B), or as a raw 0x9B byte that is no part of a UTF-8
// character: a terminal in 8-bit mode sends that, while a key typed on a
// UTF-8 keyboard ("ě" is C4 9B) is never read as one. Text pasted
// between bracketed-paste marks is the operator's, never an answer. It is
// not safe for concurrent use.
type Answers struct {
	st     state // ground, escape or csiParam
	params [4]byte
	np     int  // bytes in params; past len(params): not a report
	marker bool // a private marker or intermediate
	paste  bool
	dec    decoder
}

// Scan feeds p and returns how many status reports ended in it.
func (a *Answers) Scan(p []byte) int {
	n := 0
	a.dec.feed(p, func(r rune, _ bool) {
		if a.unit(r) {
			n++
		}
	})
	return n
}

func (a *Answers) unit(r rune) bool {
	switch {
	case r == esc:
		a.st = escape
		return false
	case r == csi:
		a.startCSI()
		return false
	}
	switch a.st {
	case escape:
		a.st = ground
		if r == '[' {
			a.startCSI()
		}
	case csiParam:
		switch {
		case r >= '0' && r <= '9' || r == ';':
			if a.np < len(a.params) {
				a.params[a.np] = byte(r)
			}
			a.np++
		case r >= 0x20 && r < 0x40:
			a.marker = true
		case r >= 0x40 && r < 0x7f:
			a.st = ground
			return a.dispatch(r)
		default:
			a.st = ground
		}
	}
	return false
}

func (a *Answers) startCSI() {
	a.st, a.np, a.marker = csiParam, 0, false
}

func (a *Answers) dispatch(r rune) bool {
	if a.marker || a.np > len(a.params) {
		return false
	}
	p := string(a.params[:a.np])
	switch {
	case r == '~' && p == "200":
		a.paste = true
	case r == '~' && p == "201":
		a.paste = false
	case r == 'n' && !a.paste:
		return p == "0" || p == "3"
	}
	return false
}
