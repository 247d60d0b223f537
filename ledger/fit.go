//go:build linux

package ledger

import (
	"errors"
	"sort"
	"strconv"
	"unicode/utf8"

	"github.com/trialnet/trialnet/record"
)

// ledgerTrimmed is the detail of a record that did not fit its slot
// whole. The detail itself is not needed there: the reader writes one of
// its own, and says the record was trimmed.
const ledgerTrimmed = "trimmed to fit its ledger slot"

// slotLine is ev's record as a ledger slot keeps it, at most limit bytes
// of JSON. A record that does not fit whole is trimmed, never dropped: a
// Trial chooses what its strings hold, and escaping makes them up to six
// times longer (a 1 KiB plain-HTTP target of '<' is 6 KiB of JSON). Its
// addresses go, its detail becomes ledgerTrimmed, and its longest strings
// are cut to one length, the longest at which the record fits (a quarter
// of it for those that do not name the request: all but its target, rule
// and host); so a string shorter than that stays whole, and every cut
// one keeps a prefix. Start, decision and numbers are kept whole.
func slotLine(ev *record.Event, limit int) ([]byte, error) {
	line, err := ev.AppendJSON(nil)
	if err != nil || len(line) <= limit {
		return line, err // an error: a start time past year 9999
	}
	short := *ev
	short.Resolved, short.PolicyChange, short.Suppressed, short.Detail = nil, nil, nil, ledgerTrimmed
	// What names the request first: the others are cut to a quarter of
	// the length these are.
	const named = 3
	fields := []*string{&short.Target, &short.Rule, &short.Host, &short.Method, &short.SNI, &short.Client, &short.Profile,
		&short.Trial, &short.ID, (*string)(&short.Reason), (*string)(&short.WouldDeny)}
	cuts := make([]fieldCut, len(fields))
	hi := 0
	for i, f := range fields {
		cuts[i] = newFieldCut(*f)
		hi = max(hi, 4*cuts[i].escaped())
	}
	at := func(n int) ([]byte, error) {
		for i, f := range fields {
			if i < named {
				*f = cuts[i].to(n)
			} else {
				*f = cuts[i].to(n / 4)
			}
		}
		line, err = short.AppendJSON(line[:0])
		return line, err
	}
	// The record's length grows with n: the largest n that fits.
	lo := 0
	if b, err := at(lo); err != nil || len(b) > limit {
		return nil, errors.Join(err, errors.New("a ledger record does not fit its slot even with every string cut"))
	}
	for lo < hi {
		mid := (lo + hi + 1) / 2
		b, err := at(mid)
		if err != nil {
			return nil, err
		}
		if len(b) <= limit {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return at(lo)
}

// fieldCut is a string with, at each character boundary, the length of
// the prefix before it as JSON escapes it.
type fieldCut struct {
	s    string
	ends []int // byte offsets of the boundaries, 0 first
	esc  []int // escaped length of s[:ends[i]]
}

func newFieldCut(s string) fieldCut {
	c := fieldCut{s: s, ends: []int{0}, esc: []int{0}}
	for i := 0; i < len(s); {
		_, n := utf8.DecodeRuneInString(s[i:]) // an invalid byte is one character: \ufffd
		i += n
		c.ends = append(c.ends, i)
		c.esc = append(c.esc, c.esc[len(c.esc)-1]+escapedLen(s[i-n:i]))
	}
	return c
}

func (c fieldCut) escaped() int { return c.esc[len(c.esc)-1] }

// to is the string at most n bytes long as JSON, and at most
// record.MaxRecordField bytes if cut, so that the log's own clip
// (record.Clip) leaves it as it is. A cut string ends in the mark the
// log's clip gives one, with the length the string had: "…[1040 bytes]";
// where not even the mark fits, it is empty.
func (c fieldCut) to(n int) string {
	if c.escaped() <= n {
		return c.s
	}
	mark := "…[" + strconv.Itoa(len(c.s)) + " bytes]" // escapes to itself
	room := min(n, record.MaxRecordField) - len(mark)
	if room < 0 {
		return ""
	}
	k := sort.SearchInts(c.esc, room+1) - 1 // the longest prefix that fits room
	return c.s[:c.ends[k]] + mark
}

// escapedLen is the length of one character (as utf8 decodes it) of a
// string that encoding/json writes, which escapes HTML's specials too.
func escapedLen(ch string) int {
	r, n := utf8.DecodeRuneInString(ch)
	switch {
	case r == utf8.RuneError && n == 1:
		return len(`\ufffd`)
	case r == '"' || r == '\\' || r == '\b' || r == '\f' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < 0x20 || r == '<' || r == '>' || r == '&' || r == '\u2028' || r == '\u2029':
		return len(`\u003c`)
	}
	return n
}
