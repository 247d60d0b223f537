//go:build linux

package proxy

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	trialspec "github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/record"
)

// floodHead is the attack's request: a 1000-byte target, refused as
// malformed before any rate limit.
var floodHead = "CONNECT " + strings.Repeat("x", 1000) + "/ HTTP/1.1\r\n\r\n"

// sendRefused sends head n times, each on its own connection, and reads
// each answer.
func (tp *testProxy) sendRefused(t *testing.T, head string, n int) {
	t.Helper()
	for range n {
		c, err := net.Dial("tcp", tp.addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, head); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		_ = c.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatalf("%q was let through", head)
		}
	}
}

// finish removes Trial t1 (which writes its last summary) and returns
// its final stats and every record it wrote, in order.
func (tp *testProxy) finish(t *testing.T) (record.TrialStats, []record.Event) {
	t.Helper()
	st, ok := tp.RemoveTrial("t1")
	if !ok {
		t.Fatal("t1 is not registered")
	}
	var recs []record.Event
	for {
		select {
		case e := <-tp.events:
			recs = append(recs, e)
		default:
			return st, recs
		}
	}
}

// replay is what a restarted agent rebuilds from the records.
func replay(recs []record.Event) record.TrialStats {
	var st record.TrialStats
	for i := range recs {
		st.Add(&recs[i])
		st.CountWritten(&recs[i])
	}
	return st
}

func sameCounts(t *testing.T, got, want record.TrialStats) {
	t.Helper()
	got.Active, want.Active = 0, 0
	if got.Allowed != want.Allowed || got.Denied != want.Denied || got.WouldDeny != want.WouldDeny || got.DNSFailures != want.DNSFailures ||
		got.BytesUp != want.BytesUp || got.BytesDown != want.BytesDown || len(got.ByReason) != len(want.ByReason) {
		t.Fatalf("counters rebuilt from the records %+v, the proxy's %+v", got, want)
	}
	for r, n := range want.ByReason {
		if got.ByReason[r] != n {
			t.Fatalf("%s: %d rebuilt from the records, %d counted", r, got.ByReason[r], n)
		}
	}
}

// A flood of malformed requests writes at most the record burst, each
// record's target clipped, and one summary that counts the rest: the
// proxy's counters and the counters rebuilt from the log both count
// every refusal. The journal gets the same bound.
func TestRecordFloodBounded(t *testing.T) {
	var journal syncWriter
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, limits: &trialspec.ProxyLimits{RecordRate: 1e-9, RecordBurst: 5},
		configure: func(c *Config) {
			c.Logger = slog.New(slog.NewTextHandler(&journal, nil))
			c.LogDecisions = true
		}})
	const n = 60
	tp.sendRefused(t, floodHead, n)
	st, recs := tp.finish(t)
	if st.Denied != n || st.ByReason[record.ReasonBadTarget] != n {
		t.Fatalf("stats %+v: every refusal must be counted", st)
	}
	if len(recs) != 6 {
		t.Fatalf("%d records, want the burst of 5 and one summary", len(recs))
	}
	for _, r := range recs[:5] {
		if r.Reason != record.ReasonBadTarget || len(r.Target) > record.MaxRecordField+20 || !strings.HasSuffix(r.Target, "…[1001 bytes]") {
			t.Fatalf("record %q %s: want bad_target with the target clipped and marked", r.Target, r.Reason)
		}
	}
	sum := recs[5]
	s := sum.Suppressed
	if sum.Decision != record.DecisionSuppressed || sum.Schema != record.SummarySchema || s == nil || s.Records != n-5 ||
		s.ByReason[record.ReasonBadTarget] != n-5 || s.Refused[recs[0].Target] != n-5 || s.LogFull || !strings.Contains(sum.Detail, "55 similar records suppressed") {
		t.Fatalf("summary %+v (%+v)", sum, s)
	}
	sameCounts(t, replay(recs), st)
	if lines := strings.Count(journal.String(), "\n"); lines != 6 {
		t.Fatalf("%d journal lines, want 6:\n%s", lines, journal.String())
	}
	if !strings.Contains(journal.String(), "msg=suppressed") || !strings.Contains(journal.String(), "suppressed.records=55 suppressed.by_reason=map[bad_target:55]") {
		t.Fatalf("the journal has no summary:\n%s", journal.String())
	}
}

// Requests refused by the CONNECT rate are records of the record rate
// too; requests it charged are not, so a flood of malformed requests
// cannot hide them.
func TestRecordRateSparesChargedRequests(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"},
		limits: &trialspec.ProxyLimits{RecordRate: 1e-9, RecordBurst: 3, ConnectRate: 1e-9, ConnectBurst: 4}})
	tp.sendRefused(t, floodHead, 10)                           // 3 written, 7 suppressed
	tp.sendRefused(t, connectHead("other.example.com:443"), 4) // charged: all 4 written
	tp.sendRefused(t, connectHead("other.example.com:443"), 6) // rate_limited: suppressed
	st, recs := tp.finish(t)
	written := map[record.Reason]int{}
	var sum *record.Suppressed
	for _, r := range recs {
		if r.Decision == record.DecisionSuppressed {
			sum = r.Suppressed
			continue
		}
		written[r.Reason]++
	}
	if written[record.ReasonBadTarget] != 3 || written[record.ReasonPolicyDenied] != 4 || written[record.ReasonRateLimited] != 0 || len(written) != 2 {
		t.Fatalf("written %v; want 3 bad_target (the burst), 4 policy_denied (charged), no rate_limited", written)
	}
	if sum == nil || sum.Records != 13 || sum.ByReason[record.ReasonBadTarget] != 7 || sum.ByReason[record.ReasonRateLimited] != 6 ||
		sum.Refused["other.example.com:443"] != 6 {
		t.Fatalf("summary %+v", sum)
	}
	sameCounts(t, replay(recs), st)
}

// A Trial whose records reach MaxLogBytes writes a summary saying so at
// once, then only summaries, charged refusals included: the file stays
// within the limit, bar summaries, and the counters stay exact.
func TestRecordLogFull(t *testing.T) {
	const limit = 4000
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, limits: &trialspec.ProxyLimits{MaxLogBytes: limit}})
	tp.sendRefused(t, floodHead, 30)
	// Refusals the CONNECT rate charged, after the log filled: counted,
	// and named in the summary.
	const after = "after-full.example.com:443"
	tp.sendRefused(t, connectHead(after), 3)
	st, recs := tp.finish(t)
	var size int
	var sums []record.Event
	for _, r := range recs {
		b, err := r.AppendJSON(nil)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case r.Decision == record.DecisionSuppressed:
			sums = append(sums, r)
		case len(sums) > 0:
			t.Fatalf("a record written in full after the log filled: %+v", r)
		default:
			size += len(b) + 1
		}
	}
	if size > limit || size < limit-1000 {
		t.Fatalf("%d bytes of records for a limit of %d", size, limit)
	}
	if len(sums) == 0 || !sums[0].Suppressed.LogFull || !strings.Contains(sums[0].Detail, "max_log_bytes") {
		t.Fatalf("no summary says the log is full: %+v", sums)
	}
	if named := sums[len(sums)-1].Suppressed.Refused[after]; named != 3 {
		t.Fatalf("the summary names %s %d times, want 3: %+v", after, named, sums[len(sums)-1].Suppressed)
	}
	if st.Denied != 33 {
		t.Fatalf("stats %+v", st)
	}
	sameCounts(t, replay(recs), st)
}

// Past MaxLogBytes, a learning Trial's requests are only counted, but
// summaries name every target reached (past MaxSummaryReached, in more
// than one summary), so the profile learned from the log allows each of
// them, under the TLS requirement that applied.
func TestRecordLogFullNamesReached(t *testing.T) {
	const hosts = record.MaxSummaryReached + 10
	tp := newTestProxy(t, proxyOpts{learn: true, limits: &trialspec.ProxyLimits{MaxLogBytes: 1500, ConnectBurst: 10 * hosts}})
	var want []string
	for i := range hosts {
		name := fmt.Sprintf("h%d.example.com", i)
		tp.dns.set(name, 60, "93.184.216.34")
		want = append(want, name+":443")
		for range 2 {
			resp, c, _ := tp.connect(t, connectHead(name+":443"))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: %s", name, resp.Status)
			}
			_ = c.Close()
		}
	}
	st, recs := tp.finish(t)
	written, sums := 0, 0
	for _, r := range recs {
		if r.Decision == record.DecisionSuppressed {
			sums++
			if n := len(r.Suppressed.Reached); n > record.MaxSummaryReached {
				t.Fatalf("a summary holds %d reached targets, more than %d", n, record.MaxSummaryReached)
			}
		} else {
			written++
		}
	}
	if sums < 2 || written > 5 {
		t.Fatalf("%d records written, %d summaries: want the log full after a few, the rest in two or more summaries", written, sums)
	}
	l := config.Learn(recs, 0)
	var got []string
	for _, le := range l.Entries {
		got = append(got, le.Entry.String())
		if le.WouldDeny != 2 || le.Allowed != 0 {
			t.Fatalf("%s learned from %d would_deny and %d allowed requests, want 2 and 0", le.Entry, le.WouldDeny, le.Allowed)
		}
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("learned %v\nwant %v", got, want)
	}
	if l.Records != 2*hosts || st.Allowed != 2*hosts {
		t.Fatalf("learned from %d decisions, %d counted; want %d", l.Records, st.Allowed, 2*hosts)
	}
	sameCounts(t, replay(recs), st)
}

// An attacker's third review hid CONNECT 203.0.113.77:22 from every
// record: junk spent the record burst, 16 IP-literal decoys took the
// summary's target names, and the real one was lumped under "(other
// targets)". An IP literal is charged to the CONNECT rate, so its record
// is always written.
func TestIPLiteralsAreNeverSuppressed(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, limits: &trialspec.ProxyLimits{RecordBurst: 5, ConnectBurst: 100}})
	tp.sendRefused(t, floodHead, 20)
	for i := range 16 {
		tp.sendRefused(t, connectHead(fmt.Sprintf("198.51.100.%d:443", i+1)), 1)
	}
	const real = "203.0.113.77:22"
	tp.sendRefused(t, connectHead(real), 1)
	_, recs := tp.finish(t)
	literals := 0
	for _, r := range recs {
		if r.Reason == record.ReasonIPLiteral && r.Decision == record.DecisionDeny {
			literals++
			if r.Target == real {
				return
			}
		}
	}
	t.Fatalf("no record names %s (%d IP-literal records written)", real, literals)
}

// While records are being suppressed, a summary is written every
// summaryEvery, not only when the Trial ends.
func TestRecordSummaryTimer(t *testing.T) {
	old := record.SummaryEvery
	record.SummaryEvery = 50 * time.Millisecond
	t.Cleanup(func() { record.SummaryEvery = old })
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, limits: &trialspec.ProxyLimits{RecordRate: 1e-9, RecordBurst: 1}})
	tp.sendRefused(t, floodHead, 4)
	if e := tp.event(t); e.Decision == record.DecisionSuppressed {
		t.Fatalf("summary before the burst's record: %+v", e)
	}
	e := tp.event(t)
	if e.Decision != record.DecisionSuppressed || e.Suppressed.Records != 3 {
		t.Fatalf("want a summary of 3 records from the timer, got %+v", e)
	}
	if _, recs := tp.finish(t); len(recs) != 0 {
		t.Fatalf("records after the last summary: %+v", recs)
	}
}
