//go:build linux

package ledger

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/trialnet/trialnet/record"
)

// A ledger ends in a region that keeps a copy of the Trial's pending
// summary (record.Keeper): the decisions this process counted, past the
// Trial's record rate or log bound, and has not yet written. Each
// counted record updates a few words of it in place; a name (a reason,
// a refused target, a reached host) is written once, before the count
// that makes it part of the copy. The region stays a hole until the
// first summary of the Trial.
//
// Layout, from the region's start (little-endian):
//
//	0    magic "TNPEND01"
//	8    live (u32): 1 while a summary is pending
//	16   records, would_deny, bytes_up, bytes_down, from, to (Unix ns),
//	     reached_other, log_full (u64 each)
//	80   reasons, refused targets, reached targets in use (u32 each)
//	128  pendingReasons of {count u64, name [reasonName]}
//	     pendingRefused of {count u64, length u32, name [targetName]}
//	     record.MaxSummaryReached of {requests u64, would_deny u64,
//	     port u16, require_tls u8, length u8, host [hostName]}
const (
	pendingMagic = "TNPEND01"

	pendingReasons = 64 // room for every record.Reason, and more
	reasonName     = 32
	reasonEntry    = 8 + reasonName

	// The targets a summary names as refused, and OtherTargets.
	pendingRefused = 17
	// A clipped target: record.MaxRecordField and its "…[N bytes]" mark.
	targetName  = record.MaxRecordField + 48
	targetEntry = 8 + 8 + targetName

	hostName     = 255 // a DNS name, an address literal
	reachedEntry = 8 + 8 + 8 + hostName + 1

	pendingCounts  = 16
	pendingInUse   = 80
	pendingEntries = 128
	refusedAt      = pendingEntries + pendingReasons*reasonEntry
	reachedAt      = refusedAt + pendingRefused*targetEntry
	pendingSize    = reachedAt + record.MaxSummaryReached*reachedEntry
)

// The eight counts at pendingCounts.
const (
	pcRecords = iota
	pcWouldDeny
	pcBytesUp
	pcBytesDown
	pcFrom
	pcTo
	pcReachedOther
	pcLogFull
)

// pendingCopy is what the process knows of its copy: where each name is.
type pendingCopy struct {
	reasons map[record.Reason]int
	refused map[string]int
	reached int // record.Suppressed.Reached's entries copied
}

// Keep copies what counting ev changed in s, the pending summary (a new
// one if fresh), into the ledger (record.Keeper). The gate calls it
// under its lock: only one call at a time.
func (l *Ledger) Keep(s *record.Suppressed, ev *record.Event, fresh bool, from, to time.Time) {
	l.mu.Lock() // against Remove's unmapping
	defer l.mu.Unlock()
	if l.mem == nil {
		return
	}
	m := l.mem[l.pendingAt:]
	if fresh {
		le.PutUint32(m[8:], 0)
		copy(m, pendingMagic)
		clear(m[pendingInUse:pendingEntries])
		l.kept = pendingCopy{reasons: map[record.Reason]int{}, refused: map[string]int{}}
	}
	c := &l.kept
	for i, v := range [...]uint64{s.Records, s.WouldDeny, uint64(s.BytesUp), uint64(s.BytesDown),
		uint64(from.UnixNano()), uint64(to.UnixNano()), s.ReachedOther, b2u(s.LogFull)} {
		le.PutUint64(m[pendingCounts+8*i:], v)
	}
	if i, ok := c.reasons[ev.Reason]; ok {
		le.PutUint64(m[pendingEntries+i*reasonEntry:], s.ByReason[ev.Reason])
	} else if i = len(c.reasons); i < pendingReasons && len(ev.Reason) <= reasonName {
		e := m[pendingEntries+i*reasonEntry:]
		clear(e[8 : 8+reasonName]) // an earlier summary's, perhaps longer
		copy(e[8:8+reasonName], ev.Reason)
		le.PutUint64(e, s.ByReason[ev.Reason])
		c.reasons[ev.Reason] = i
		le.PutUint32(m[pendingInUse:], uint32(i+1))
	}
	if ev.Decision == record.DecisionAllow {
		for ; c.reached < len(s.Reached); c.reached++ {
			r := s.Reached[c.reached]
			e := m[reachedAt+c.reached*reachedEntry:]
			le.PutUint16(e[16:], r.Port)
			e[18] = 0
			if r.RequireTLS {
				e[18] = 1
			}
			host := clipName(r.Host, hostName)
			e[19] = byte(len(host))
			copy(e[24:24+hostName], host)
			le.PutUint64(e, r.Requests) // over an earlier summary's, before the entry is in use
			le.PutUint64(e[8:], r.WouldDeny)
			le.PutUint32(m[pendingInUse+8:], uint32(c.reached+1))
		}
		for i := range c.reached {
			if r := &s.Reached[i]; r.Host == ev.Host && r.Port == ev.Port && r.RequireTLS == ev.RequireTLS {
				e := m[reachedAt+i*reachedEntry:]
				le.PutUint64(e, r.Requests)
				le.PutUint64(e[8:], r.WouldDeny)
				break
			}
		}
	} else {
		target := ev.Target
		if _, ok := s.Refused[target]; !ok {
			target = record.OtherTargets
		}
		if i, ok := c.refused[target]; ok {
			le.PutUint64(m[refusedAt+i*targetEntry:], s.Refused[target])
		} else if i = len(c.refused); i < pendingRefused {
			e := m[refusedAt+i*targetEntry:]
			name := clipName(target, targetName)
			le.PutUint32(e[8:], uint32(len(name)))
			copy(e[16:16+targetName], name)
			le.PutUint64(e, s.Refused[target])
			c.refused[target] = i
			le.PutUint32(m[pendingInUse+4:], uint32(i+1))
		}
	}
	le.PutUint32(m[8:], 1) // after the counts: a copy is read whole
}

// Drop marks the copy as no summary's: the gate took it to be written
// (record.Keeper).
func (l *Ledger) Drop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mem != nil {
		le.PutUint32(l.mem[l.pendingAt+8:], 0)
	}
}

var le = binary.LittleEndian

func b2u(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// clipName is s cut to at most n bytes, on a rune boundary.
func clipName(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// readPending is the summary that the ledger mem of process pid kept
// pending, as a record to write, or nil if there was none.
func readPending(mem []byte, pid int) *record.Event {
	if len(mem) < pendingSize || string(mem[:8]) != pendingMagic || le.Uint32(mem[8:]) != 1 {
		return nil
	}
	count := func(i int) uint64 { return le.Uint64(mem[pendingCounts+8*i:]) }
	s := &record.Suppressed{Records: count(pcRecords), WouldDeny: count(pcWouldDeny), BytesUp: int64(count(pcBytesUp)),
		BytesDown: int64(count(pcBytesDown)), ReachedOther: count(pcReachedOther), LogFull: count(pcLogFull) == 1,
		ByReason: map[record.Reason]uint64{}, Refused: map[string]uint64{}}
	for i := range min(int(le.Uint32(mem[pendingInUse:])), pendingReasons) {
		e := mem[pendingEntries+i*reasonEntry:]
		s.ByReason[record.Reason(strings.TrimRight(string(e[8:8+reasonName]), "\x00"))] += le.Uint64(e)
	}
	for i := range min(int(le.Uint32(mem[pendingInUse+4:])), pendingRefused) {
		e := mem[refusedAt+i*targetEntry:]
		s.Refused[string(e[16:16+min(int(le.Uint32(e[8:])), targetName)])] += le.Uint64(e)
	}
	for i := range min(int(le.Uint32(mem[pendingInUse+8:])), record.MaxSummaryReached) {
		e := mem[reachedAt+i*reachedEntry:]
		s.Reached = append(s.Reached, record.ReachedTarget{Host: string(e[24 : 24+min(int(e[19]), hostName)]),
			Port: le.Uint16(e[16:]), RequireTLS: e[18] == 1, Requests: le.Uint64(e), WouldDeny: le.Uint64(e[8:])})
	}
	from, to := time.Unix(0, int64(count(pcFrom))), time.Unix(0, int64(count(pcTo)))
	return &record.Event{Schema: record.SummarySchema, ID: rand.Text(), Time: from, Duration: to.Sub(from),
		Decision: record.DecisionSuppressed, Suppressed: s,
		Detail: fmt.Sprintf("%d records suppressed and counted for a summary that the agent process serving the Trial (pid %d) "+
			"had not written when it ended (killed or crashed); its ledger kept the counts, and the agent serving the Trial next wrote them", s.Records, pid)}
}
