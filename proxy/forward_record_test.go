//go:build linux

package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/record"
)

// countingUpstream serves one request per connection: it reads the head
// and the body (to its end or the first error), waits for answer, then
// answers 200. It counts every byte it read and wrote.
type countingUpstream struct {
	in, out  atomic.Int64
	requests atomic.Int64
	answer   chan struct{}
}

type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

func (u *countingUpstream) serve(c *net.TCPConn) {
	br := bufio.NewReader(countingReader{c, &u.in})
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	u.requests.Add(1)
	_, _ = io.Copy(io.Discard, req.Body)
	<-u.answer
	n, _ := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
	u.out.Add(int64(n))
	// Whatever the proxy sends after (nothing, or a close) is read, so
	// that every byte it wrote is counted before the test compares.
	_, _ = io.Copy(io.Discard, countingReader{c, &u.in})
}

func newCountingProxy(t *testing.T) (*testProxy, *countingUpstream) {
	u := &countingUpstream{answer: make(chan struct{})}
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:80"}, upstream: u.serve})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	return tp, u
}

// eventually waits, bounded, for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// holdDNS makes name's answer (addr) wait until the returned channel is
// closed: a request held in its DNS.
func holdDNS(tp *testProxy, name, addr string) chan struct{} {
	release := make(chan struct{})
	tp.dns.handle(name+".", func(q dns.Question, _ string) (*dns.Msg, bool) {
		<-release
		m := new(dns.Msg)
		m.Answer = addrRR(q, q.Name, 60, addr)
		return m, true
	})
	return release
}

// Once a forwarded request reached its upstream, its record is allow,
// whatever the client did next, with what ended it in the detail, and
// its bytes are exactly what crossed the upstream connection, heads
// included.
func TestForwardRecordsWhatReachedTheUpstream(t *testing.T) {
	t.Run("client reset before the answer", func(t *testing.T) {
		tp, u := newCountingProxy(t)
		c, err := net.Dial("tcp", tp.addr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.WriteString(c, "POST http://api.example.com/secret?data=1 HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 6\r\n\r\nsecret")
		eventually(t, "the upstream to get the request", func() bool { return u.requests.Load() == 1 })
		_ = c.(*net.TCPConn).SetLinger(0)
		_ = c.Close() // a reset
		time.Sleep(50 * time.Millisecond)
		close(u.answer)
		ev := tp.event(t)
		if ev.Decision != record.DecisionAllow || ev.Reason != record.ReasonAllowed || !strings.Contains(ev.Detail, "reached the upstream") {
			t.Fatalf("record %+v: want allow, saying it reached the upstream", ev)
		}
		eventually(t, "the upstream's counts", func() bool { return u.in.Load() == ev.BytesUp && u.out.Load() == ev.BytesDown })
	})
	t.Run("client's malformed chunk after 1 MiB of body", func(t *testing.T) {
		tp, u := newCountingProxy(t)
		close(u.answer)
		c, err := net.Dial("tcp", tp.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, _ = io.WriteString(c, "POST http://api.example.com/up HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n")
		chunk := strings.Repeat("x", 64<<10)
		for range 16 {
			_, _ = fmt.Fprintf(c, "%x\r\n%s\r\n", len(chunk), chunk)
		}
		_, _ = io.WriteString(c, "zz not a chunk size\r\n")
		ev := tp.event(t)
		if ev.Decision != record.DecisionAllow || !strings.Contains(ev.Detail, "then bad_request: the client's request body") {
			t.Fatalf("record %+v: want allow, the client's body blamed", ev)
		}
		if ev.BytesUp < 1<<20 {
			t.Fatalf("bytes_up %d: the body that reached the upstream is missing", ev.BytesUp)
		}
		eventually(t, "the upstream's count", func() bool { return u.in.Load() == ev.BytesUp })
	})
}

// A policy change while a forwarded request is in its DNS stops it: with
// --cut, it is cancelled and counted as cut; without, it is decided
// again after the dial. Either way nothing reaches the upstream, and the
// record says policy_denied.
func TestPolicyChangeStopsAForwardedRequestInItsDNS(t *testing.T) {
	for _, cut := range []bool{true, false} {
		t.Run(fmt.Sprintf("cut=%v", cut), func(t *testing.T) {
			tp, u := newCountingProxy(t)
			close(u.answer)
			release := holdDNS(tp, "api.example.com", "93.184.216.34")
			c, err := net.Dial("tcp", tp.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, _ = io.WriteString(c, "GET http://api.example.com/after-cut?secret=1 HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
			eventually(t, "the DNS question", func() bool { return tp.dns.count("api.example.com") > 0 })
			e, _ := allow.ParseEntry("api.example.com:80")
			var gone []allow.Entry
			if cut {
				gone = []allow.Entry{e}
			}
			n, err := tp.SetAllow("t1", allow.New(), gone)
			if err != nil || (cut && n != 1) || (!cut && n != 0) {
				t.Fatalf("SetAllow: %d cut, %v", n, err)
			}
			close(release)
			ev := tp.event(t)
			if ev.Decision != record.DecisionDeny || ev.Reason != record.ReasonPolicyDenied {
				t.Fatalf("record %+v: want deny policy_denied", ev)
			}
			time.Sleep(100 * time.Millisecond)
			if got := u.requests.Load(); got != 0 {
				t.Fatalf("the upstream received %d requests after the change", got)
			}
		})
	}
}

// An allowlist change while a forwarded request is in its DNS is applied
// as it is when the request dials: an entry swapped for one that wants
// TLS refuses plain HTTP, and an entry narrowed from a wildcard is what a
// later cut names.
func TestForwardedRequestTakesTheAllowlistAfterItsDNS(t *testing.T) {
	for _, c := range []struct {
		name     string
		swap     string
		tls      bool
		cut      bool
		want     record.Reason
		wantCuts int
	}{
		{"swapped for require_tls", "api.example.com:80", true, false, record.ReasonTLSRequired, 0},
		{"narrowed, then cut", "api.example.com:80", false, true, record.ReasonPolicyDenied, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			u := &countingUpstream{answer: make(chan struct{})} // held: the request stays open
			tp := newTestProxy(t, proxyOpts{allow: []string{"*.example.com:80"}, upstream: u.serve})
			t.Cleanup(func() { close(u.answer) }) // before the upstream is waited for
			release := holdDNS(tp, "api.example.com", "93.184.216.34")
			cl, err := net.Dial("tcp", tp.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			_, _ = io.WriteString(cl, "GET http://api.example.com/x HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
			eventually(t, "the DNS question", func() bool { return tp.dns.count("api.example.com") > 0 })
			l, err := allow.Parse([]string{c.swap}, c.tls)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tp.SetAllow("t1", l, nil); err != nil {
				t.Fatal(err)
			}
			close(release)
			if c.cut {
				// The request, now under the narrowed entry, is what
				// cutting that entry ends.
				eventually(t, "the request at the upstream", func() bool { return u.requests.Load() == 1 })
				e, _ := allow.ParseEntry(c.swap)
				if n, err := tp.SetAllow("t1", allow.New(), []allow.Entry{e}); err != nil || n != c.wantCuts {
					t.Fatalf("cut %s: %d cut, %v", c.swap, n, err)
				}
				tp.event(t)
				return
			}
			if ev := tp.event(t); ev.Decision != record.DecisionDeny || ev.Reason != c.want {
				t.Fatalf("record %+v, want deny %s", ev, c.want)
			}
			time.Sleep(100 * time.Millisecond)
			if n := u.requests.Load(); n != 0 {
				t.Fatalf("the upstream received %d plain requests", n)
			}
		})
	}
}

// A refusal by a check is never recorded as allow: here net/http retries
// a GET whose reused connection the upstream closed unanswered, and the
// retry's dial meets the address guard (the name now answers with the
// metadata address).
func TestForwardRetryRefusedIsNotAllow(t *testing.T) {
	var n atomic.Int64
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:80"}, upstream: func(c *net.TCPConn) {
		br := bufio.NewReader(c)
		for {
			if _, err := http.ReadRequest(br); err != nil {
				return
			}
			if n.Add(1) > 1 {
				return // read, then closed without an answer
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
	}})
	tp.dns.set("api.example.com", 0, "93.184.216.34")
	cl, err := net.Dial("tcp", tp.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	br := bufio.NewReader(cl)
	get := "GET http://api.example.com/x HTTP/1.1\r\nHost: api.example.com\r\n\r\n"
	_, _ = io.WriteString(cl, get)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("first request: %v %v", resp, err)
	}
	_, _ = io.ReadAll(io.LimitReader(br, 2))
	if ev := tp.event(t); ev.Decision != record.DecisionAllow {
		t.Fatalf("first record %+v", ev)
	}
	tp.dns.set("api.example.com", 0, "169.254.169.254")
	_, _ = io.WriteString(cl, get)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	ev := tp.event(t)
	if resp.StatusCode == 200 || ev.Decision != record.DecisionDeny || ev.Reason != record.ReasonAddressDenied {
		t.Fatalf("retry to the metadata address: %s, record %s %s %q", resp.Status, ev.Decision, ev.Reason, ev.Detail)
	}
}

// tunnels_cut counts what a change stopped: a request an earlier change
// cut, still ending, is not counted again.
func TestTunnelsCutCountsOnlyWhatItStopped(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}})
	e, _ := allow.ParseEntry("api.example.com:443")
	stopped := 0
	ot := &openTunnel{entry: e, ruled: true, stop: func() { stopped++ }}
	tr := tp.trials["t1"]
	tr.mu.Lock()
	tr.open[ot] = struct{}{}
	tr.mu.Unlock()
	for i, want := range []int{1, 0} {
		if n, err := tp.SetAllow("t1", allow.New(), []allow.Entry{e}); err != nil || n != want {
			t.Fatalf("cut %d: %d cut, %v; want %d", i+1, n, err, want)
		}
	}
	if stopped != 1 {
		t.Fatalf("stopped %d times", stopped)
	}
}
