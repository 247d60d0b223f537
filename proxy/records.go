//go:build linux

package proxy

import (
	"crypto/rand"
	"fmt"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// MaxRecordField bounds, in bytes, each field of a record that a Trial
// chose or that quotes what it chose (method, target, detail, SNI): room
// for any CONNECT target (a 253-byte name and a port) and for ordinary
// URLs. A longer value is cut and marked (see clipField).
const MaxRecordField = 512

// MaxRecordAddrs bounds the addresses a record lists as resolved: a name
// that answers with thousands (cheap for whoever runs its DNS) made 64 KB
// records. When there were more, the detail says how many.
const MaxRecordAddrs = 16

// summaryEvery is how often, at most, a Trial's suppressed records are
// summarised while they are being suppressed; a variable for tests.
var summaryEvery = 10 * time.Second

// recordGate bounds what one Trial writes to the decision log and the
// journal, whatever it sends: records of requests the CONNECT rate did not
// charge pass the record rate, and every record counts against the
// Trial's log bytes. A record refused either way is still counted in the
// Trial's stats (emit counts first), and in the next summary record.
type recordGate struct {
	rate     bucket
	limits   Limits
	learn    bool
	trial    string
	mu       sync.Mutex
	written  int64  // bytes of records written (JSON lines)
	full     bool   // written reached MaxLogBytes: uncharged records only counted from here
	line     []byte // a record's JSON, to size it
	pending  *Suppressed
	from, to time.Time // the suppressed records' first start and last end
	timer    *time.Timer

	// flushMu orders summaries: the timer's, the one written when the
	// log fills, and the last one, written when the Trial is removed
	// (after which closed keeps the timer from writing any).
	flushMu sync.Mutex
	closed  bool
}

func newRecordGate(id string, learn bool, lim Limits) *recordGate {
	return &recordGate{trial: id, learn: learn, limits: lim, rate: newBucket(lim.RecordRate, lim.RecordBurst)}
}

// gateVerdict is what the gate does with a record.
type gateVerdict uint8

const (
	recordWrite    gateVerdict = iota
	recordSuppress             // counted for the next summary
	recordLogFull              // counted, and the log just filled: summarise now
)

// admit decides whether ev is written, counting it for the next summary
// if not; a suppressed record arms the summary timer (fn).
//
// A record the CONNECT rate charged is always written: that rate bounds
// it, and what it names (a host reached, a name refused, an SNI swapped)
// is what an audit is for. Were it suppressible, a Trial could first fill
// its log, or its summary's few target names, with junk, and then act
// unnamed. Only uncharged records meet the record rate and MaxLogBytes.
func (g *recordGate) admit(ev *Event, now time.Time, fn func()) gateVerdict {
	g.mu.Lock()
	defer g.mu.Unlock()
	charged := ev.Reason.info().charged
	if !charged && (g.full || !g.rate.take(now)) {
		g.suppress(ev, fn)
		return recordSuppress
	}
	var err error
	if g.line, err = ev.AppendJSON(g.line[:0]); err != nil {
		return recordWrite // the writer reports it
	}
	if n := int64(len(g.line)) + 1; charged || g.written+n <= g.limits.MaxLogBytes {
		g.written += n
		return recordWrite
	}
	g.full = true
	g.suppress(ev, fn)
	return recordLogFull
}

// suppress counts ev in the pending summary; g.mu is held.
func (g *recordGate) suppress(ev *Event, fn func()) {
	s := g.pending
	if s == nil {
		s = &Suppressed{ByReason: map[Reason]uint64{}, Refused: map[string]uint64{}}
		g.pending, g.from, g.to = s, ev.Time, ev.Time
		if g.timer == nil {
			g.timer = time.AfterFunc(summaryEvery, fn)
		}
	}
	s.Records++
	s.ByReason[ev.Reason]++
	if ev.Decision == DecisionAllow {
		if ev.WouldDeny != "" {
			s.WouldDeny++
		}
	} else {
		target := ev.Target
		if _, ok := s.Refused[target]; !ok && len(s.Refused) >= MaxSummaryTargets {
			target = OtherTargets
		}
		s.Refused[target]++
	}
	s.BytesUp += ev.BytesUp
	s.BytesDown += ev.BytesDown
	if ev.Time.Before(g.from) {
		g.from = ev.Time
	}
	if end := ev.Time.Add(ev.Duration); end.After(g.to) {
		g.to = end
	}
}

// summary takes the pending counts as a summary record, nil if there are
// none.
func (g *recordGate) summary() *Event {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.timer != nil {
		g.timer.Stop()
		g.timer = nil
	}
	s := g.pending
	if s == nil {
		return nil
	}
	g.pending = nil
	s.LogFull = g.full
	detail := fmt.Sprintf("%d similar records suppressed: refused before admission, over the Trial's record rate (%g/s, burst %d)",
		s.Records, g.limits.RecordRate, g.limits.RecordBurst)
	if s.LogFull {
		detail = fmt.Sprintf("%d records suppressed: the Trial's decision records reached their limit of %d bytes (max_log_bytes); from here on its refusals before admission are only counted, in summaries (records the CONNECT rate bounds are still written)", s.Records, g.limits.MaxLogBytes)
	}
	ev := &Event{Schema: SummarySchema, ID: rand.Text(), Time: g.from, Duration: g.to.Sub(g.from), Trial: g.trial,
		Decision: DecisionSuppressed, Learning: g.learn, Detail: detail, Suppressed: s}
	if !s.LogFull {
		// Summaries count against the limit too, but are never refused.
		if line, err := ev.AppendJSON(g.line[:0]); err == nil {
			g.line = line
			g.written += int64(len(line)) + 1
		}
	}
	return ev
}

// flushSummary writes the Trial's pending summary, if any. last is the
// one written when the Trial is removed: no summary follows it.
func (p *Proxy) flushSummary(t *trial, last bool) {
	g := t.records
	g.flushMu.Lock()
	defer g.flushMu.Unlock()
	if g.closed {
		return
	}
	g.closed = last
	if ev := g.summary(); ev != nil {
		p.write(ev)
	}
}

// clipRecord bounds the fields of ev that a Trial chose.
func clipRecord(ev *Event) {
	for _, f := range []*string{&ev.Method, &ev.Target, &ev.Detail, &ev.SNI} {
		*f = clipField(*f)
	}
	if n := len(ev.Resolved); n > MaxRecordAddrs {
		ev.Resolved = ev.Resolved[:MaxRecordAddrs:MaxRecordAddrs]
		note := fmt.Sprintf("resolved to %d addresses, the first %d recorded", n, MaxRecordAddrs)
		if ev.Detail != "" {
			note = ev.Detail + "; " + note
		}
		ev.Detail = note
	}
}

// clipField cuts s to MaxRecordField bytes, on a rune boundary, and
// marks the cut with the length it had: "…[1008 bytes]".
func clipField(s string) string {
	if len(s) <= MaxRecordField {
		return s
	}
	n := MaxRecordField
	for n > MaxRecordField-utf8.UTFMax && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…[" + strconv.Itoa(len(s)) + " bytes]"
}
