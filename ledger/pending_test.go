//go:build linux

package ledger

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/record"
)

// The summary a gate keeps pending is in its ledger, as the gate would
// write it: a process killed before writing it leaves it to the agent
// that serves the Trial next (Lost), and one it wrote is not left there.
// Red with the gate's Keep call taken out: Lost returns no summary.
func TestLedgerKeepsThePendingSummary(t *testing.T) {
	dir := t.TempDir()
	l := testLedger(t, dir, "ps1")
	var written []record.Event
	g := record.NewGate("ps1", false, record.Bounds{Rate: 1, Burst: 1, MaxLogBytes: 1, Keep: l},
		func(ev *record.Event, _ []byte) { written = append(written, *ev) })
	start := time.Now().Add(-time.Minute).UTC()
	n := 0
	add := func(d record.Decision, r record.Reason, host string, port uint16, wouldDeny record.Reason) {
		n++
		ev := &record.Event{Schema: record.EventSchema, ID: fmt.Sprint("id-", n), Time: start.Add(time.Duration(n) * time.Millisecond),
			Duration: time.Second, Trial: "ps1", Method: "CONNECT", Target: fmt.Sprintf("%s:%d", host, port), Host: host, Port: port,
			Decision: d, Reason: r, WouldDeny: wouldDeny, BytesUp: 10, BytesDown: 20}
		record.Clip(ev)
		g.Record(ev, time.Now())
	}
	// The first record fills the log, and its summary is written at once;
	// the next 64 hosts reached fill a summary, written when the 65th
	// comes; the rest start the next, which stays pending.
	for i := range 70 {
		add(record.DecisionAllow, record.ReasonAllowed, fmt.Sprintf("h%d.test", i), 443, "")
	}
	if len(written) != 2 || len(written[1].Suppressed.Reached) != record.MaxSummaryReached {
		t.Fatalf("want two summaries written, the second with %d targets: %d written", record.MaxSummaryReached, len(written))
	}
	add(record.DecisionAllow, record.ReasonAllowed, "h69.test", 443, record.ReasonPolicyDenied)
	add(record.DecisionAllow, record.ReasonAllowed, "h69.test", 8443, "")
	for i := range 20 { // past the summary's named refusals
		add(record.DecisionDeny, record.ReasonPolicyDenied, fmt.Sprintf("r%d.test", i), 443, "")
	}
	add(record.DecisionDeny, record.ReasonPolicyDenied, "r3.test", 443, "")
	add(record.DecisionDeny, record.ReasonSNIMismatch, strings.Repeat("x", 2*record.MaxRecordField), 443, "")
	add(record.DecisionDeny, record.ReasonRateLimited, "r1.test", 443, "")

	asDead(t, dir, "ps1", 1<<22-1)
	evs, err := Lost(dir, "ps1")
	if err != nil || len(evs) != 1 || evs[0].Decision != record.DecisionSuppressed {
		t.Fatalf("Lost: %+v %v; want the pending summary alone", evs, err)
	}
	kept := evs[0]
	g.Flush(true)
	if len(written) != 3 {
		t.Fatalf("the gate wrote %d summaries, want 3", len(written))
	}
	want := written[2]
	if g, w := asJSON(t, kept.Suppressed), asJSON(t, want.Suppressed); g != w {
		t.Errorf("the ledger kept\n%s\nthe gate wrote\n%s", g, w)
	}
	if !kept.Time.Equal(want.Time) || kept.Duration != want.Duration || kept.Trial != "ps1" || kept.Schema != record.SummarySchema ||
		!strings.Contains(kept.Detail, "had not written when it ended") {
		t.Errorf("the kept summary: %+v; the gate's: %+v", kept, want)
	}

	// Written, the summary is no longer kept; the next one starts afresh.
	l2 := testLedger(t, dir, "ps2")
	written = nil
	g2 := record.NewGate("ps2", false, record.Bounds{Rate: 1, Burst: 1, MaxLogBytes: 1, Keep: l2},
		func(ev *record.Event, _ []byte) { written = append(written, *ev) })
	g = g2
	add(record.DecisionDeny, record.ReasonPolicyDenied, "a.test", 443, "")
	g2.Flush(false)
	add(record.DecisionDeny, record.ReasonBadPort, "b.test", 1, "")
	asDead(t, dir, "ps2", 1<<22-2)
	evs, err = Lost(dir, "ps2")
	if err != nil || len(evs) != 1 {
		t.Fatalf("Lost: %+v %v", evs, err)
	}
	if s := evs[0].Suppressed; s.Records != 1 || len(s.ByReason) != 1 || s.ByReason[record.ReasonBadPort] != 1 || len(s.Refused) != 1 || s.Refused["b.test:1"] != 1 {
		t.Errorf("after a written summary, the ledger kept %s; want b.test's refusal alone", asJSON(t, s))
	}
	g2.Flush(true)
	if len(written) != 2 {
		t.Fatalf("the gate wrote %d summaries, want 2", len(written))
	}
	if sum := readPending(l2.mem[l2.pendingAt:], 1); sum != nil {
		t.Errorf("the last summary written, the ledger still kept %s", asJSON(t, sum.Suppressed))
	}
}

// testLedger is a ledger of Trial id under dir, of 4 slots, removed when
// the test ends.
func testLedger(t *testing.T, dir, id string) *Ledger {
	t.Helper()
	l, err := Create(dir, id, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Remove)
	return l
}

func asJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A reached target joins the copy with its counts, not an earlier
// summary's: the copy names it only once they are written, so that a
// process killed in between leaves no stale count under its name. The
// Keep call below leaves what such a kill would (a target added to the
// summary whose counts the copy has not been told of by its own
// record); red when the entry was named before its counts were written:
// b.test kept an earlier summary's 50 requests.
func TestLedgerNamesAReachedTargetWithItsCounts(t *testing.T) {
	dir := t.TempDir()
	l := testLedger(t, dir, "pr1")
	now := time.Now()
	allowed := func(host string) *record.Event {
		return &record.Event{Time: now, Host: host, Port: 443, Target: host + ":443", Decision: record.DecisionAllow, Reason: record.ReasonAllowed}
	}
	// An earlier summary: b.test second, with 50 requests; written.
	s := &record.Suppressed{Records: 51, ByReason: map[record.Reason]uint64{record.ReasonAllowed: 51}, Refused: map[string]uint64{},
		Reached: []record.ReachedTarget{{Host: "a.test", Port: 443, Requests: 1}}}
	l.Keep(s, allowed("a.test"), true, now, now)
	s.Reached = append(s.Reached, record.ReachedTarget{Host: "b.test", Port: 443, Requests: 50})
	l.Keep(s, allowed("b.test"), false, now, now)
	l.Drop()
	// The next: a.test, then c.test added as a kill would leave it.
	s = &record.Suppressed{Records: 1, ByReason: map[record.Reason]uint64{record.ReasonAllowed: 1}, Refused: map[string]uint64{},
		Reached: []record.ReachedTarget{{Host: "a.test", Port: 443, Requests: 1}}}
	l.Keep(s, allowed("a.test"), true, now, now)
	s.Reached = append(s.Reached, record.ReachedTarget{Host: "c.test", Port: 443, Requests: 1})
	s.Records, s.ByReason[record.ReasonAllowed], s.Reached[0].Requests = 3, 3, 2
	l.Keep(s, allowed("a.test"), false, now, now)
	sum := readPending(l.mem[l.pendingAt:], 1)
	if sum == nil || len(sum.Suppressed.Reached) != 2 {
		t.Fatalf("the copy: %+v", sum)
	}
	if r := sum.Suppressed.Reached[1]; r.Host != "c.test" || r.Requests != 1 {
		t.Errorf("the copy names %s with %d requests; want c.test with 1", r.Host, r.Requests)
	}
}
