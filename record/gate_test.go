//go:build linux

package record

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestClipField(t *testing.T) {
	if s := strings.Repeat("a", MaxRecordField); clipField(s) != s {
		t.Fatal("a field at the bound was clipped")
	}
	s := "x" + strings.Repeat("é", MaxRecordField) // 2-byte runes, off by one
	c := clipField(s)
	if !utf8.ValidString(c) || !strings.HasSuffix(c, "…[1025 bytes]") || len(c) > MaxRecordField+len("…[1025 bytes]") {
		t.Fatalf("clipped to %q", c)
	}
	ev := Event{Method: s, Target: s, Detail: s, SNI: s, Host: "h"}
	Clip(&ev)
	for _, f := range []string{ev.Method, ev.Target, ev.Detail, ev.SNI} {
		if !bytes.Equal([]byte(f), []byte(c)) {
			t.Fatalf("field clipped to %q", f)
		}
	}
}

// A name that answers with thousands of addresses makes a record of a
// bounded size: the first MaxRecordAddrs, and how many there were.
func TestClipRecordResolved(t *testing.T) {
	var addrs []netip.Addr
	for i := range 4000 {
		addrs = append(addrs, netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}))
	}
	ev := Event{Resolved: slices.Clone(addrs[:maxRecordAddrs]), Detail: "d"}
	Clip(&ev)
	if len(ev.Resolved) != maxRecordAddrs || ev.Detail != "d" {
		t.Fatalf("a record at the bound was clipped: %d addresses, %q", len(ev.Resolved), ev.Detail)
	}
	ev = Event{Resolved: addrs, Detail: strings.Repeat("x", 2*MaxRecordField), Reason: ReasonAddressDenied, Decision: DecisionDeny}
	Clip(&ev)
	if len(ev.Resolved) != maxRecordAddrs || ev.Resolved[0] != addrs[0] || !strings.HasSuffix(ev.Detail, "; resolved to 4000 addresses, the first 16 recorded") {
		t.Fatalf("clipped to %d addresses, detail %q", len(ev.Resolved), ev.Detail)
	}
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > 2048 {
		t.Fatalf("a record of %d bytes", len(b))
	}
}

// The disk a Trial can spend is bounded by the largest record and the
// largest summary it can make: every field it chooses at its clip, in
// the characters that JSON writes longest (six bytes each). docs/proxy.md's
// worst case per Trial per hour is computed from these two figures.
func TestWorstCaseRecordSizes(t *testing.T) {
	const (
		maxRecord  = 16 << 10
		maxSummary = 80 << 10
	)
	worst := strings.Repeat("<", 4*MaxRecordField) // "\u003c" in JSON
	name := strings.Repeat("a", 63) + "." + strings.Repeat("b", 63) + "." + strings.Repeat("c", 63) + "." + strings.Repeat("d", 61)
	var addrs []netip.Addr
	for i := range 4000 {
		addrs = append(addrs, netip.MustParseAddr(fmt.Sprintf("2001:db8:ffff:ffff:ffff:ffff:ffff:%x", i)))
	}
	ev := Event{Schema: EventSchema, ID: rand.Text(), Time: time.Now(), Trial: strings.Repeat("t", 64), Client: "[2001:db8::1]:65535",
		Method: worst, Target: worst, Host: name, Port: 65535, Decision: DecisionDeny, Reason: ReasonAddressDenied, Detail: worst,
		Resolved: addrs, Dialed: netip.MustParseAddrPort("[2001:db8:ffff:ffff:ffff:ffff:ffff:ffff]:65535"), SNI: worst,
		Rule: "*." + name + ":65535", Profile: strings.Repeat("p", 64), Learning: true, WouldDeny: ReasonPolicyDenied, RequireTLS: true,
		BytesUp: math.MaxInt64, BytesDown: math.MaxInt64, Duration: math.MaxInt64, DNS: math.MaxInt64, Dial: math.MaxInt64, FirstByte: math.MaxInt64}
	Clip(&ev)
	rec, err := ev.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	g := NewGate(ev.Trial, true, Bounds{Rate: 20, Burst: 200, MaxLogBytes: 1}, nil)
	g.full = true
	i := 0
	for reason := range reasons() { // every reason counted, and more refused targets than named
		if reason.Decision() == DecisionAllow {
			continue
		}
		for range 2 {
			r := ev
			r.Target, r.Reason = fmt.Sprintf("%d%s", i, ev.Target), reason
			g.suppress(&r)
			i++
		}
	}
	for i := range MaxSummaryReached {
		r := ev
		r.Decision, r.Host = DecisionAllow, fmt.Sprintf("%02d%s", i, name[2:])
		g.suppress(&r)
	}
	_, sumJSON := g.summary(true)
	if len(rec) > maxRecord || len(sumJSON) > maxSummary {
		t.Fatalf("worst record %d bytes (documented %d), worst summary %d bytes (documented %d)", len(rec), maxRecord, len(sumJSON), maxSummary)
	}
	t.Logf("worst record %d bytes, worst summary %d bytes", len(rec), len(sumJSON))
}

// The decision log's size is bounded, not only its rate: past
// MaxLogBytes, summaries take at most the reserve, then one last summary
// carries the rest, counting the reached targets it has no room to name.
// Every record is counted in exactly one written record or summary.
func TestGateBoundsTheFile(t *testing.T) {
	b := Bounds{Rate: 1, Burst: 1, MaxLogBytes: 20000}
	var written, records uint64
	var size int64
	var last *Event
	g := NewGate("t", false, b, func(ev *Event, line []byte) {
		size += int64(len(line)) + 1
		if ev.Suppressed != nil {
			records += ev.Suppressed.Records
			last = ev
		} else {
			written++
		}
	})
	const n = 20000
	now := time.Now()
	for i := range n {
		ev := &Event{Schema: EventSchema, ID: "x", Time: now, Trial: "t", Decision: DecisionAllow, Reason: ReasonAllowed,
			Method: "CONNECT", Host: fmt.Sprintf("h%05d.example.com", i), Port: 443}
		ev.Target = fmt.Sprintf("%s:%d", ev.Host, ev.Port)
		g.Record(ev, now)
		if i%500 == 0 {
			g.Flush(false) // as the timer does
		}
	}
	g.Flush(true)
	if written+records != n {
		t.Fatalf("%d records written and %d in summaries, of %d", written, records, n)
	}
	if bound := b.MaxLogBytes + b.SummaryReserve() + 80<<10; size > bound {
		t.Fatalf("%d bytes written, over %d (the limit, the reserve and one last summary)", size, bound)
	}
	if last == nil || last.Suppressed.ReachedOther == 0 || !strings.Contains(last.Detail, "counted, not named") {
		t.Fatalf("the last summary does not say what it could not name: %+v", last)
	}
	t.Logf("%d bytes for a limit of %d: %d records written, %d in summaries", size, b.MaxLogBytes, written, records)
}

// A log a previous agent filled stays full: its Trial's next record is
// only counted.
func TestGateCountsWhatTheLogHolds(t *testing.T) {
	var lines int
	g := NewGate("t", false, Bounds{Rate: 1, Burst: 1, MaxLogBytes: 1000, Written: 1000}, func(ev *Event, _ []byte) {
		if ev.Suppressed == nil {
			lines++
		}
	})
	g.Record(&Event{Schema: EventSchema, Trial: "t", Decision: DecisionAllow, Reason: ReasonAllowed, Host: "a.test", Port: 443}, time.Now())
	g.Flush(true)
	if lines != 0 {
		t.Fatalf("a record written in full to a log that was full already")
	}
}
