// Package termquery follows what a program writes to a terminal and what
// the terminal sends back, so that a relay knows when every answer to the
// program's queries has come in: it writes a fence of its own (a status
// request, ESC[5n) after them and waits for the fence's answer, since a
// terminal answers in order.
//
// It errs one way only. Output is read both as a terminal in UTF-8 mode
// reads it (C1 controls as U+0080–U+009F, which xterm obeys) and as one in
// 8-bit mode does (every byte 0x80–0x9F a C1 control, even one that a
// UTF-8 reader takes for part of a character: "ě" is C4 9B, Ä and CSI to
// the other); whatever either reading may take for a query counts as one,
// and an escape sequence this package does not know as inert counts as a
// query too. A query seen where the terminal saw none costs a wait; one
// missed would let its answer through.
package termquery

import "unicode/utf8"

// Fence is what the relay writes after a program's output: mouse and
// focus reports off (a report the terminal sends later is input nobody
// asked for), then a status request, answered ESC[0n by every terminal
// of the VT100 line. No key sends an answer of that shape.
const Fence = "\x1b[?9;1000;1001;1002;1003;1004l\x1b[5n"

// Cancel ends whatever sequence a program left unfinished (CAN, obeyed in
// every state, strings included), so that the fence is read as a query.
const Cancel = "\x18"

// Output follows what a program writes to a terminal. It is not safe for
// concurrent use.
type Output struct {
	m     [2]machine // [0] reads UTF-8, [1] reads 8-bit
	dec   decoder    // for m[0]
	query bool       // a query (or a sequence not known to be inert) since Settle
}

// Write feeds p; it never fails. Printable ASCII between sequences, most
// of any output, is skipped without the parsers.
func (o *Output) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if o.Quiet() {
			i := 0
			for i < len(p) && printable(p[i]) {
				i++
			}
			p = p[i:]
		}
		j := 0
		for j < len(p) && !printable(p[j]) {
			j++
		}
		j = max(j, min(1, len(p))) // within a sequence: a byte at a time
		o.feed(p[:j])
		p = p[j:]
	}
	return n, nil
}

func printable(b byte) bool { return b >= 0x20 && b < 0x7f }

func (o *Output) feed(p []byte) {
	for _, b := range p {
		o.m[1].unit(rune(b))
	}
	o.decode(p)
	if o.m[0].query || o.m[1].query {
		o.query = true
	}
}

// decode feeds p to the UTF-8 reading; a byte that starts no valid
// character is U+FFFD, as a terminal shows it.
func (o *Output) decode(p []byte) {
	o.dec.feed(p, func(r rune, bad bool) {
		if bad {
			r = utf8.RuneError
		}
		o.m[0].unit(r)
	})
}

// Quiet reports whether both readings are between sequences and
// characters: a point where the relay may write a fence without changing
// what the program's bytes mean.
func (o *Output) Quiet() bool {
	return o.dec.n == 0 && o.m[0].st == ground && o.m[1].st == ground
}

// Pending reports whether the program may be waiting for an answer (it
// wrote a query, or left a sequence unfinished), and how many status
// requests of its own a fence's answer would follow (the larger count of
// the two readings).
func (o *Output) Pending() (query bool, status int) {
	return o.query || !o.Quiet(), max(o.m[0].status, o.m[1].status)
}

// Settle forgets the queries and status requests seen so far: the fence
// written after them was answered.
func (o *Output) Settle() {
	o.query = false
	for i := range o.m {
		o.m[i].query, o.m[i].status = false, 0
	}
}

type state uint8

const (
	ground    state = iota
	escape          // after ESC
	escInter        // ESC and intermediates
	csiParam        // CSI: private marker and parameters
	csiInter        // CSI: intermediates
	csiIgnore       // a malformed CSI, until its final byte
	oscNum          // OSC: its number
	oscString       // OSC: the rest
	str             // DCS, SOS, PM, APC: until ST
	strEsc          // ESC inside a string: ST when '\' follows
)

// C0 and C1 controls by name.
const (
	enq = 0x05
	bel = 0x07
	can = 0x18
	sub = 0x1a
	esc = 0x1b
	dcs = 0x90
	sos = 0x98
	sci = 0x9a // DECID, as xterm reads it
	csi = 0x9b
	st  = 0x9c
	osc = 0x9d
	pm  = 0x9e
	apc = 0x9f
)

// maxParam bounds a parameter's value: terminals clamp or wrap larger
// ones, so any larger one may be anything.
const maxParam = 1 << 16

// machine is one reading of the output: the VT500 parser's states (as
// vt100.net describes DEC's), enough of them to tell a query.
type machine struct {
	st     state
	marker rune // CSI private marker (< = > ?), 0: none
	inter  rune // an intermediate byte, 0: none
	nparam int  // parameters finished
	cur    int  // the parameter being read (saturates at maxParam)
	first  int  // the first parameter
	report bool // a DECSET parameter turns on mouse or focus reports
	osc    int  // the OSC number (saturates at maxParam)
	query  bool
	status int // status requests (DSR 5)
}

// unit feeds one byte (the 8-bit reading) or code point (UTF-8).
func (m *machine) unit(r rune) {
	if r >= 0xa0 && r <= 0xff && m.st != ground && m.st != str && m.st != oscString {
		r -= 0x80 // DEC's parser reads GR as GL inside a sequence, and so may a terminal
	}
	if m.st == oscNum && r != can && r != sub && (r == esc || r >= 0x80 && r <= 0x9f) {
		m.oscNumDone() // ended by ST, or cut short: its number decides
	}
	// Anywhere: CAN and SUB abort, ESC starts anew, C1 controls act.
	switch {
	case r == can || r == sub:
		m.st = ground
		return
	case r == esc:
		if m.st == oscString || m.st == str {
			m.st = strEsc
			return
		}
		m.st = escape
		return
	case r >= 0x80 && r <= 0x9f:
		m.c1(r)
		return
	}
	switch m.st {
	case ground:
		if r == enq {
			m.query = true // answerback
		}
	case escape:
		m.escape(r)
	case escInter:
		switch {
		case r < 0x20:
			m.c0(r)
		case r < 0x30:
		case r < 0x7f:
			m.escDispatch(r)
		}
	case csiParam, csiInter, csiIgnore:
		m.csi(r)
	case oscNum, oscString:
		m.oscUnit(r)
	case str:
		// A string's content: a query or not, it was counted at its start.
	case strEsc:
		// ST, or an ESC that ends the string and starts a sequence.
		m.st = escape
		if r == '\\' {
			m.st = ground
			return
		}
		m.escape(r)
	}
}

// c0 executes a C0 control met inside a sequence, as terminals do
// (ESC [ 5 LF n is a status request).
func (m *machine) c0(r rune) {
	if r == enq {
		m.query = true
	}
}

func (m *machine) c1(r rune) {
	switch r {
	case csi:
		m.startCSI()
	case osc:
		m.st, m.osc = oscNum, 0
	case dcs, sos, pm, apc:
		m.st, m.query = str, true // DECRQSS, XTGETTCAP, kitty graphics...
	case st:
		m.st = ground
	case sci:
		m.st, m.query = ground, true
	default:
		m.st = ground
	}
}

func (m *machine) startCSI() {
	m.st, m.marker, m.inter, m.nparam, m.cur, m.first, m.report = csiParam, 0, 0, 0, 0, 0, false
}

func (m *machine) escape(r rune) {
	switch {
	case r < 0x20:
		m.c0(r)
	case r < 0x30:
		m.st, m.inter = escInter, r
	case r == '[':
		m.startCSI()
	case r == ']':
		m.st, m.osc = oscNum, 0
	case r == 'P' || r == 'X' || r == '^' || r == '_':
		m.st, m.query = str, true
	case r < 0x7f:
		m.escDispatch(r)
	case r > 0x7f:
		m.st = ground
	}
}

// escDispatch ends ESC [intermediates] final. DECID (ESC Z) is a query;
// so is any sequence not known to be inert.
func (m *machine) escDispatch(r rune) {
	if m.st == escape && !inertEsc(r) || m.st == escInter && !inertEscInter(m.inter) {
		m.query = true
	}
	m.st = ground
}

// inertEsc: ESC final without intermediates that no terminal answers
// (DECSC, DECRC, keypad modes, IND, NEL, HTS, RI, SS2, SS3, RIS, the
// locking shifts, ST).
func inertEsc(r rune) bool {
	switch r {
	case '6', '7', '8', '9', '=', '>', '<', 'D', 'E', 'F', 'H', 'M', 'N', 'O', 'c', 'l', 'm', 'n', 'o', '|', '}', '~', '\\':
		return true
	}
	return false
}

// inertEscInter: character sets, line attributes, DECALN, S7C1T/S8C1T
// and conformance levels.
func inertEscInter(i rune) bool {
	switch i {
	case '(', ')', '*', '+', '-', '.', '/', '#', '%', ' ':
		return true
	}
	return false
}

func (m *machine) csi(r rune) {
	switch {
	case r < 0x20:
		m.c0(r)
	case r == 0x7f:
	case r >= 0x80:
		m.st = csiIgnore // not a CSI byte: whatever a terminal makes of it
	case m.st == csiIgnore:
		if r >= 0x40 {
			m.st, m.query = ground, true
		}
	case r >= 0x40:
		m.endParam()
		m.csiDispatch(r)
	case r >= 0x30 && m.st == csiInter:
		m.st = csiIgnore
	case r >= '<':
		if m.nparam > 0 || m.cur > 0 || m.marker != 0 {
			m.st = csiIgnore // a marker after the start
			return
		}
		m.marker = r
	case r >= '0' && r <= '9':
		m.cur = min(m.cur*10+int(r-'0'), maxParam)
	case r == ';' || r == ':':
		m.endParam()
	case r >= 0x20 && r < 0x30:
		m.st, m.inter = csiInter, r
	}
}

func (m *machine) endParam() {
	if m.nparam == 0 {
		m.first = m.cur
	}
	switch m.cur {
	case 9, 1000, 1001, 1002, 1003, 1004:
		m.report = true
	}
	m.nparam++
	m.cur = 0
}

// csiDispatch ends a CSI sequence. Cursor motion, erasing, scrolling,
// SGR, modes, margins, cursor save and restore and the cursor style are
// inert; all else may be answered (DSR, DA, DECRQM, window reports,
// XTVERSION, kitty's keyboard query, ...). A status request (DSR 5) is
// counted: its answer has the fence's shape. Any marker or intermediate
// counts, so that no terminal's leniency answers one not counted.
func (m *machine) csiDispatch(r rune) {
	m.st = ground
	if r == 'n' && (m.first == 5 || m.first == maxParam) {
		m.status++
		m.query = true
		return
	}
	switch {
	case m.marker == 0 && m.inter == 0:
		if !inertCSI(r) {
			m.query = true
		}
	case m.marker == '?' && m.inter == 0 && (r == 'h' || r == 'l'):
		// DECSET and DECRST; reports turned on are answers to come.
		if r == 'h' && m.report {
			m.query = true
		}
	case m.marker == 0 && m.inter == ' ' && r == 'q': // DECSCUSR
	case m.marker == '>' && m.inter == 0 && r == 'm': // modifyOtherKeys
	default:
		m.query = true
	}
}

func inertCSI(r rune) bool {
	switch r {
	case '@', 'A', 'B', 'C', 'D', 'E', 'F', 'G', 'H', 'I', 'J', 'K', 'L', 'M', 'P', 'S', 'T', 'X', 'Z',
		'`', 'a', 'b', 'd', 'e', 'f', 'g', 'h', 'l', 'm', 'r', 's', 'u':
		return true
	}
	return false
}

// oscUnit reads an OSC string: its number decides. Titles (0, 1, 2), the
// working directory (7), hyperlinks (8) and shell marks (133) are never
// answered; colour, clipboard and other queries are.
func (m *machine) oscUnit(r rune) {
	if r == bel {
		m.oscNumDone()
		m.st = ground
		return
	}
	if m.st == oscString || r < 0x20 || r == 0x7f {
		return // DEL and C0 inside the number are skipped, as kitty does
	}
	if r >= '0' && r <= '9' {
		m.osc = min(m.osc*10+int(r-'0'), maxParam)
		return
	}
	m.oscNumDone()
}

func (m *machine) oscNumDone() {
	if m.st != oscNum {
		return
	}
	m.st = oscString
	switch m.osc {
	case 0, 1, 2, 7, 8, 133:
	default:
		m.query = true
	}
}
