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
	clipRecord(&ev)
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
	ev := Event{Resolved: slices.Clone(addrs[:MaxRecordAddrs]), Detail: "d"}
	clipRecord(&ev)
	if len(ev.Resolved) != MaxRecordAddrs || ev.Detail != "d" {
		t.Fatalf("a record at the bound was clipped: %d addresses, %q", len(ev.Resolved), ev.Detail)
	}
	ev = Event{Resolved: addrs, Detail: strings.Repeat("x", 2*MaxRecordField), Reason: ReasonAddressDenied, Decision: DecisionDeny}
	clipRecord(&ev)
	if len(ev.Resolved) != MaxRecordAddrs || ev.Resolved[0] != addrs[0] || !strings.HasSuffix(ev.Detail, "; resolved to 4000 addresses, the first 16 recorded") {
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
	clipRecord(&ev)
	rec, err := ev.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	g := NewGate(ev.Trial, true, Bounds{Rate: 20, Burst: 200, MaxLogBytes: 1}, nil)
	g.full = true
	i := 0
	for reason := range reasons { // every reason counted, and more refused targets than named
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
	_, sumJSON := g.summary()
	if len(rec) > maxRecord || len(sumJSON) > maxSummary {
		t.Fatalf("worst record %d bytes (documented %d), worst summary %d bytes (documented %d)", len(rec), maxRecord, len(sumJSON), maxSummary)
	}
	t.Logf("worst record %d bytes, worst summary %d bytes", len(rec), len(sumJSON))
}
