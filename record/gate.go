//go:build linux

package record

import (
	"crypto/rand"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/trialnet/trialnet/internal/ratelimit"
)

// MaxRecordField bounds, in bytes, each field of a record that a Trial
// chose or that quotes what it chose (method, target, detail, SNI): room
// for any CONNECT target (a 253-byte name and a port) and for ordinary
// URLs. A longer value is cut and marked (see clipField).
const MaxRecordField = 512

// maxRecordAddrs bounds the addresses a record lists as resolved: a name
// that answers with thousands (cheap for whoever runs its DNS) made 64 KB
// records. When there were more, the detail says how many.
const maxRecordAddrs = 16

// SummaryEvery is how often, at most, a Trial's suppressed records are
// summarised while they are being suppressed; a variable for tests.
var SummaryEvery = 10 * time.Second

// Bounds are what a Gate lets one Trial write.
type Bounds struct {
	// Rate and Burst bound the records of requests the CONNECT rate did
	// not charge (see Reason.charged).
	Rate  float64
	Burst int
	// MaxLogBytes bounds the bytes of records written, as JSON lines.
	// Summaries may take SummaryReserve more; past that, only the last
	// summary, written when the Trial is removed, is.
	MaxLogBytes int64
	// Written is what the log holds already (a restarted agent's), which
	// counts against MaxLogBytes.
	Written int64
	// Keep, if set, keeps a copy of the pending summary (see Keeper).
	Keep Keeper
	// LogBytes and RateWord, if set, are the words the gate keeps the
	// bytes written and its record rate in: memory that another process
	// writing the same log may map too (internal/counts), and the two then
	// keep to one budget and one rate. LogBytes is raised to Written if
	// it holds less. nil: words of the gate's own.
	LogBytes, RateWord *atomic.Int64
}

// A Keeper keeps a copy of a gate's pending summary outside the process
// (ledger.Ledger: a file mapped shared on a tmpfs), where the agent that
// serves the Trial next finds it if this process is killed before the
// summary is written: the decisions counted only there would otherwise
// be in no record, no counter and no receipt. It is called with the
// gate's lock held, once per counted record, so it must be cheap and
// never block.
type Keeper interface {
	// Keep is told that ev was counted in s, the pending summary (a new
	// one if fresh), whose records started at from and ended at to.
	Keep(s *Suppressed, ev *Event, fresh bool, from, to time.Time)
	// Drop is told that the pending summary was taken to be written.
	Drop()
}

// SummaryReserve is the room past MaxLogBytes that summaries of a full
// log may take, so that the file's size is bounded, not only its rate:
// an eighth of MaxLogBytes, at least 1 MiB (a dozen worst-case
// summaries). Once it is spent, a Trial's records are counted in one
// summary that grows no larger (see Suppressed.ReachedOther), written
// when the Trial is removed.
func (b Bounds) SummaryReserve() int64 { return max(b.MaxLogBytes/8, 1<<20) }

// Sink takes a written record and its JSON line (no newline), which is
// valid only during the call, or nil if the record could not be encoded:
// every record is encoded once, by the gate that sizes it.
type Sink func(ev *Event, line []byte)

// Gate bounds what one Trial writes to the decision log and the
// journal, whatever it sends: records of requests the CONNECT rate did not
// charge pass the record rate, and no record is written past the Trial's
// log bytes. A record refused either way is counted in a summary record.
type Gate struct {
	rate     *ratelimit.Bucket
	bounds   Bounds
	learn    bool
	trial    string
	sink     Sink
	mu       sync.Mutex
	written  *atomic.Int64 // bytes of records written (JSON lines), summaries included, by every process sharing it
	full     bool          // written reached MaxLogBytes: records only counted in summaries from here
	spent    bool          // summaries used the reserve too: only the last one is written
	line     []byte        // the record being written, encoded once
	pending  *Suppressed
	reached  map[reachedKey]int // index in pending.Reached
	from, to time.Time          // the suppressed records' first start and last end
	timer    *time.Timer

	// flushMu orders what the gate writes: records, the timer's summary,
	// the one written when the log fills, and the last one, written when
	// the Trial is removed (after which closed keeps any from being
	// written).
	flushMu sync.Mutex
	closed  bool
}

type reachedKey struct {
	host string
	port uint16
	tls  bool
}

func NewGate(id string, learn bool, b Bounds, sink Sink) *Gate {
	if b.LogBytes == nil {
		b.LogBytes = new(atomic.Int64)
	}
	if b.RateWord == nil {
		b.RateWord = new(atomic.Int64)
	}
	// Raised to what the log holds, never lowered: a process sharing the
	// word may have counted more already.
	for w := b.LogBytes.Load(); w < b.Written && !b.LogBytes.CompareAndSwap(w, b.Written); w = b.LogBytes.Load() {
	}
	w := b.LogBytes.Load()
	return &Gate{trial: id, learn: learn, bounds: b, rate: ratelimit.NewShared(b.Rate, b.Burst, b.RateWord), sink: sink,
		written: b.LogBytes, full: w >= b.MaxLogBytes, spent: w >= b.MaxLogBytes+b.SummaryReserve()}
}

// charge adds n bytes to those written if they stay within limit, and
// reports whether it did; another process may add to them meanwhile.
func (g *Gate) charge(n, limit int64) bool {
	for {
		w := g.written.Load()
		if w+n > limit {
			return false
		}
		if g.written.CompareAndSwap(w, w+n) {
			return true
		}
	}
}

// gateVerdict is what the gate does with a record.
type gateVerdict uint8

const (
	recordWrite    gateVerdict = iota
	recordSuppress             // counted for the next summary
	recordFlush                // counted, and the summary is due now: the log just filled, or its reached targets
)

// Record writes ev, clipped already (Clip), to the sink unless the
// Trial's bounds suppress it; a suppressed record is counted for a
// summary, which is written when due.
func (g *Gate) Record(ev *Event, now time.Time) {
	g.flushMu.Lock()
	defer g.flushMu.Unlock()
	if g.closed {
		return
	}
	v, done, doneLine := g.admit(ev, now)
	switch {
	case v == recordWrite:
		g.sink(ev, g.line)
	case done != nil:
		g.sink(done, doneLine)
	case v == recordFlush:
		g.flushLocked(false)
	}
}

// Flush writes the pending summary, if any. last is the one written when
// the Trial is removed: nothing is written after it.
func (g *Gate) Flush(last bool) {
	g.flushMu.Lock()
	defer g.flushMu.Unlock()
	g.flushLocked(last)
}

func (g *Gate) flushLocked(last bool) {
	if g.closed {
		return
	}
	g.closed = last
	if ev, line := g.summary(last); ev != nil {
		g.sink(ev, line)
	}
}

// admit decides whether ev is written (its line then in g.line),
// counting it for a summary if not. A summary whose reached targets are
// full is returned, with its line, to be written before ev's next summary.
//
// Until the log is full, a record the CONNECT rate charged is always
// written: that rate bounds it, and what it names (a host reached, a name
// refused, an SNI swapped) is what an audit is for. Were it suppressible
// by rate, a Trial could first spend the record rate, or its summary's
// few target names, on junk, and then act unnamed. Once the log is full,
// every record is only counted; but a summary names every target reached.
func (g *Gate) admit(ev *Event, now time.Time) (gateVerdict, *Event, []byte) {
	g.mu.Lock()
	defer g.mu.Unlock()
	charged := ev.Reason.Charged()
	if g.full || (!charged && !g.rate.Take(now)) {
		return g.suppress(ev)
	}
	var err error
	if g.line, err = ev.AppendJSON(g.line[:0]); err != nil {
		g.line = nil
		return recordWrite, nil, nil // the sink reports the missing line
	}
	if g.charge(int64(len(g.line))+1, g.bounds.MaxLogBytes) {
		return recordWrite, nil, nil
	}
	g.full = true
	_, sum, line := g.suppress(ev)
	return recordFlush, sum, line
}

// suppress counts ev in the pending summary; g.mu is held. When ev
// reached a target that the pending summary has no room for, that
// summary is returned, done, and ev starts the next.
func (g *Gate) suppress(ev *Event) (gateVerdict, *Event, []byte) {
	var done *Event
	var doneLine []byte
	k := reachedKey{ev.Host, ev.Port, ev.RequireTLS}
	if ev.Decision == DecisionAllow && g.pending != nil && len(g.pending.Reached) >= MaxSummaryReached && !g.spent {
		if _, ok := g.reached[k]; !ok {
			done, doneLine = g.summaryLocked(false)
		}
	}
	s := g.pending
	fresh := s == nil
	if fresh {
		s = &Suppressed{ByReason: map[Reason]uint64{}, Refused: map[string]uint64{}}
		g.pending, g.reached, g.from, g.to = s, map[reachedKey]int{}, ev.Time, ev.Time
		if g.timer == nil {
			g.timer = time.AfterFunc(SummaryEvery, func() { g.Flush(false) })
		}
	}
	s.Records++
	s.ByReason[ev.Reason]++
	if ev.Decision == DecisionAllow {
		if ev.WouldDeny != "" {
			s.WouldDeny++
		}
		i, ok := g.reached[k]
		if !ok && len(s.Reached) >= MaxSummaryReached { // only once the reserve is spent
			s.ReachedOther++
		} else {
			if !ok {
				i = len(s.Reached)
				g.reached[k] = i
				s.Reached = append(s.Reached, ReachedTarget{Host: ev.Host, Port: ev.Port, RequireTLS: ev.RequireTLS})
			}
			s.Reached[i].Requests++
			if ev.WouldDeny != "" {
				s.Reached[i].WouldDeny++
			}
		}
	} else {
		target := ev.Target
		if _, ok := s.Refused[target]; !ok && len(s.Refused) >= maxSummaryTargets {
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
	if g.bounds.Keep != nil {
		s.LogFull = g.full
		g.bounds.Keep.Keep(s, ev, fresh, g.from, g.to)
	}
	if done != nil {
		return recordFlush, done, doneLine
	}
	return recordSuppress, nil, nil
}

// summary takes the pending counts as a summary record and its line, nil
// if there are none (or, unless last, if the reserve is spent).
func (g *Gate) summary(last bool) (*Event, []byte) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.timer != nil {
		g.timer.Stop()
		g.timer = nil
	}
	return g.summaryLocked(last)
}

// summaryLocked is summary with g.mu held; the timer, if armed, stays so
// for the next. Summaries count against the log's bytes, and are written
// past its limit, within the reserve: at most one per SummaryEvery and
// one per MaxSummaryReached targets reached. A summary that would not
// fit the reserve stays pending, to be counted on, unless it is the last.
func (g *Gate) summaryLocked(last bool) (*Event, []byte) {
	s := g.pending
	if s == nil || (g.spent && !last) {
		return nil, nil
	}
	s.LogFull = g.full
	detail := fmt.Sprintf("%d similar records suppressed: refused before admission, over the Trial's record rate (%g/s, burst %d)",
		s.Records, g.bounds.Rate, g.bounds.Burst)
	if s.LogFull {
		detail = fmt.Sprintf("%d records suppressed: the Trial's decision records reached their limit of %d bytes (max_log_bytes); "+
			"from here on its decisions are only counted, in summaries, which name every target reached and the first %d refused",
			s.Records, g.bounds.MaxLogBytes, maxSummaryTargets)
	}
	if s.ReachedOther > 0 {
		detail += fmt.Sprintf("; the summaries' own room past the limit (%d bytes) is spent too: %d requests to targets past the first %d are counted, not named",
			g.bounds.SummaryReserve(), s.ReachedOther, MaxSummaryReached)
	}
	ev := &Event{Schema: SummarySchema, ID: rand.Text(), Time: g.from, Duration: g.to.Sub(g.from), Trial: g.trial,
		Decision: DecisionSuppressed, Learning: g.learn, Detail: detail, Suppressed: s}
	line, err := ev.AppendJSON(nil) // a summary is rare, and may be written after the next record
	if err != nil {
		line = nil
	}
	switch n := int64(len(line)) + 1; {
	case !last && g.full && !g.charge(n, g.bounds.MaxLogBytes+g.bounds.SummaryReserve()):
		g.spent = true // kept pending: the last summary carries it
		return nil, nil
	case last || !g.full:
		g.written.Add(n)
	}
	g.pending, g.reached = nil, nil
	if g.bounds.Keep != nil {
		// Before the write: a process killed between the two loses the
		// summary, as before Keeper, rather than have it written twice.
		g.bounds.Keep.Drop()
	}
	return ev, line
}

// Restore writes ev, a summary that another process serving this Trial
// kept pending (a Keeper's copy) and ended without writing, past the
// log's bounds as the last summary is: there is at most one per process.
func (g *Gate) Restore(ev *Event) {
	g.flushMu.Lock()
	defer g.flushMu.Unlock()
	if g.closed {
		return
	}
	ev.Learning = g.learn
	line, err := ev.AppendJSON(nil)
	if err != nil {
		line = nil
	} else {
		g.written.Add(int64(len(line)) + 1)
	}
	g.sink(ev, line)
}

// Clip bounds the fields of ev that a Trial chose, once, before it is
// counted or recorded.
func Clip(ev *Event) {
	for _, f := range []*string{&ev.Method, &ev.Target, &ev.Detail, &ev.SNI} {
		*f = clipField(*f)
	}
	if note := ResolvedNote(ev); note != "" {
		m := min(len(ev.Resolved), maxRecordAddrs)
		ev.Resolved, ev.resolvedAll = ev.Resolved[:m:m], 0
		if ev.Detail != "" {
			note = ev.Detail + "; " + note
		}
		ev.Detail = note
	}
}

// ResolvedNote is what Clip adds to ev's detail when ev's name resolved
// to more addresses than the record lists, or "".
func ResolvedNote(ev *Event) string {
	if n := max(len(ev.Resolved), ev.resolvedAll); n > maxRecordAddrs {
		return fmt.Sprintf("resolved to %d addresses, the first %d recorded", n, maxRecordAddrs)
	}
	return ""
}

// IsResolvedNote reports whether s is a note ResolvedNote gives.
func IsResolvedNote(s string) bool {
	var n, m int
	_, err := fmt.Sscanf(s, "resolved to %d addresses, the first %d recorded", &n, &m)
	return err == nil && n > maxRecordAddrs && m == maxRecordAddrs &&
		s == fmt.Sprintf("resolved to %d addresses, the first %d recorded", n, m)
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
