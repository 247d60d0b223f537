//go:build linux

package proxy

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	trialspec "github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/record"
)

// ledger is an upstream test server that accounts for every byte: what
// it read from and wrote to the proxy, over every connection, and how
// many requests began to reach it. It answers each request with answer
// (raw bytes: a response, a malformed one, nothing), after reading the
// body, unless the request is cut short first.
type ledger struct {
	in, out atomic.Int64
	reached atomic.Int64 // requests of which at least one byte arrived
	active  atomic.Int64 // connections being served
	answer  []byte
	keep    bool          // answer is one whole response: the connection may carry another
	hold    chan struct{} // closed: answer; held open while a test changes policy
}

func (l *ledger) serve(c *net.TCPConn) {
	defer l.active.Add(-1)
	br := bufio.NewReader(countingReader{c, &l.in})
	drain := func() { _, _ = io.Copy(io.Discard, br) }
	for {
		if _, err := br.Peek(1); err != nil {
			return
		}
		l.reached.Add(1) // a byte of a request is here
		req, err := http.ReadRequest(br)
		if err != nil {
			drain()
			return
		}
		_, bodyErr := io.Copy(io.Discard, req.Body)
		<-l.hold
		n, _ := c.Write(l.answer)
		l.out.Add(int64(n))
		if bodyErr != nil || req.Close || !l.keep {
			_ = c.CloseWrite()
			drain()
			return
		}
	}
}

// exchange is one client connection's part in an integrity run.
type exchange struct {
	send  []byte        // written by the client, in one go
	reset time.Duration // if > 0: the client resets its connection this long after sending
}

// checkIntegrity holds the record to what crossed the wire: every byte
// the upstream read is in exactly one allow record's bytes_up, no allow
// record claims more than the upstream sent down, every request that
// reached the upstream has an allow record, and no deny record claims a
// byte.
//
// whole says the proxy read everything the upstream wrote (whole answers,
// nothing cut): then bytes_down is exactly that.
func checkIntegrity(t *testing.T, recs []record.Event, l *ledger, whole bool) {
	t.Helper()
	var up, down, allows int64
	tunnel := false
	for _, r := range recs {
		switch r.Decision {
		case record.DecisionAllow:
			allows++
			tunnel = tunnel || r.Method == "CONNECT"
			up += r.BytesUp
			down += r.BytesDown
		case record.DecisionSuppressed:
			t.Fatalf("a summary in a run under every bound: %+v", r)
		default:
			if r.BytesUp != 0 || r.BytesDown != 0 {
				t.Fatalf("a %s record claims bytes: %+v", r.Reason, r)
			}
		}
	}
	// The upstream may still be reading what the proxy wrote before it
	// closed: wait, bounded, for it to catch up.
	for end := time.Now().Add(5 * time.Second); l.in.Load() < up && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
	if in := l.in.Load(); up != in {
		t.Fatalf("the upstream read %d bytes, the allow records say %d\n%s", in, up, dump(recs))
	}
	if out := l.out.Load(); down > out || (whole && down != out) {
		t.Fatalf("bytes_down %d: the upstream wrote %d (every byte read by the proxy: %v)\n%s", down, out, whole, dump(recs))
	}
	// A CONNECT tunnel is one record whatever requests cross it (its
	// bytes are relayed, not read as HTTP): then only its bytes count.
	if reached := l.reached.Load(); allows < reached && !tunnel {
		t.Fatalf("%d requests reached the upstream, %d allow records\n%s", reached, allows, dump(recs))
	}
}

func dump(recs []record.Event) string {
	var b strings.Builder
	for _, r := range recs {
		fmt.Fprintf(&b, "  %s %s %s %q up=%d down=%d\n", r.Decision, r.Reason, r.Method, r.Detail, r.BytesUp, r.BytesDown)
	}
	return b.String()
}

// runExchanges sends each exchange on its own connection through a proxy
// allowing api.example.com:80 to l, runs change (if any) while they are
// in flight, and returns every record.
func runExchanges(t *testing.T, l *ledger, exs []exchange, change func(tp *testProxy)) []record.Event {
	t.Helper()
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:80"}, upstream: func(c *net.TCPConn) { l.active.Add(1); l.serve(c) },
		limits: &trialspec.ProxyLimits{ConnectBurst: 1 << 20, RecordBurst: 1 << 20}})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	var wg sync.WaitGroup
	for _, ex := range exs {
		c, err := net.Dial("tcp", tp.addr)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _ = io.Copy(io.Discard, c)
			}()
			_, _ = c.Write(ex.send)
			if ex.reset > 0 {
				time.Sleep(ex.reset)
				_ = c.(*net.TCPConn).SetLinger(0)
				_ = c.Close()
			} else {
				_ = c.(*net.TCPConn).CloseWrite()
			}
			<-done
		}()
	}
	if change != nil {
		change(tp)
	}
	close(l.hold)
	wg.Wait()
	_, recs := tp.finish(t)
	// The Trial's upstream connections are closed: the upstream reads
	// to their end, and then its counts are final.
	eventually(t, "the upstream's connections to end", func() bool { return l.active.Load() == 0 })
	return recs
}

// The record-integrity property: random mixes of complete requests,
// client resets, malformed and truncated bodies, answers good and bad,
// and policy changes (with and without a cut) in flight. In every mix,
// each byte the upstream read is in exactly one allow record, and no
// request the upstream saw is recorded as refused.
func TestRecordIntegrityProperty(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	answers := [][]byte{
		[]byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"),
		[]byte("HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\ncut short"),
		[]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
		[]byte("not http at all\r\n\r\n"),
		[]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\n"),
		nil, // closed unanswered
	}
	requests := []string{
		"GET http://api.example.com/a HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
		"POST http://api.example.com/b HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 11\r\n\r\nhello world",
		"POST http://api.example.com/c HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 100\r\n\r\ntruncated",
		"POST http://api.example.com/d HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"POST http://api.example.com/e HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n",
		"GET http://api.example.com/f HTTP/1.1\r\nHost: api.example.com\r\n\r\nGET http://other.example.com/ HTTP/1.1\r\nHost: other.example.com\r\n\r\n",
		"GET http://api.example.com/g HTTP/1.1\r\nHost: api.example.com\r\n\r\nGET http://api.example.com/h HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
		"GET http://other.example.com/ HTTP/1.1\r\nHost: other.example.com\r\n\r\n",
		"PUT http://api.example.com/i HTTP/1.1\r\nHost: api.example.com\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
	}
	for run := range 40 {
		t.Run(fmt.Sprint(run), func(t *testing.T) {
			a := rng.IntN(len(answers))
			l := &ledger{answer: answers[a], keep: a == 0 || a == 2, hold: make(chan struct{})}
			whole := a == 0 || a == 2
			var exs []exchange
			for range 1 + rng.IntN(4) {
				r := rng.IntN(len(requests))
				ex := exchange{send: []byte(requests[r])}
				if r == 2 || r == 4 { // a body cut short or malformed: the proxy gives up before the answer
					whole = false
				}
				if rng.IntN(3) == 0 {
					ex.reset = time.Duration(1+rng.IntN(20)) * time.Millisecond
					whole = false
				}
				exs = append(exs, ex)
			}
			var change func(*testProxy)
			switch rng.IntN(3) {
			case 1, 2:
				cut := rng.IntN(2) == 0
				whole = whole && !cut
				change = func(tp *testProxy) {
					time.Sleep(time.Duration(rng.IntN(10)) * time.Millisecond)
					var gone []allow.Entry
					if cut {
						e, _ := allow.ParseEntry("api.example.com:80")
						gone = []allow.Entry{e}
					}
					if _, err := tp.SetAllow("t1", allow.New(), gone); err != nil {
						t.Error(err)
					}
				}
			}
			checkIntegrity(t, runExchanges(t, l, exs, change), l, whole)
		})
	}
}

// The forwarder's request path, fuzzed: whatever a client sends (heads,
// bodies, several requests, CONNECTs), to a well-behaved upstream, the
// proxy does not fail and its records account for every byte the
// upstream read, with an allow record for every request it saw.
func FuzzForwardRequest(f *testing.F) {
	f.Add([]byte("GET http://api.example.com/a HTTP/1.1\r\nHost: api.example.com\r\n\r\n"))
	f.Add([]byte("POST http://api.example.com/b HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n"))
	f.Add([]byte("POST http://api.example.com/c HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 100\r\n\r\nshort"))
	f.Add([]byte("GET http://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\nGET http://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\nConnection: close\r\n\r\n"))
	f.Add([]byte("CONNECT api.example.com:80 HTTP/1.1\r\nHost: api.example.com:80\r\n\r\nGET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n"))
	f.Add([]byte("PUT http://api.example.com/e HTTP/1.1\r\nHost: api.example.com\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc"))
	f.Fuzz(func(t *testing.T, send []byte) {
		l := &ledger{answer: []byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"), keep: true, hold: make(chan struct{})}
		checkIntegrity(t, runExchanges(t, l, []exchange{{send: send}}, nil), l, false)
	})
}

// The forwarder's response path, fuzzed: whatever an upstream answers to
// a forwarded request, the proxy does not fail, and its record is allow
// with exactly the bytes that crossed.
func FuzzForwardResponse(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n"))
	f.Add([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: Upgrade\r\n\r\nafter"))
	f.Add([]byte("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"))
	f.Add([]byte("HTTP/1.0 200 OK\r\n\r\nto the close"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"))
	f.Add([]byte("not http\r\n\r\n"))
	f.Fuzz(func(t *testing.T, answer []byte) {
		l := &ledger{answer: answer, hold: make(chan struct{})}
		send := []byte("POST http://api.example.com/r HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 5\r\n\r\nhello")
		recs := runExchanges(t, l, []exchange{{send: send}}, nil)
		checkIntegrity(t, recs, l, false)
		if len(recs) != 1 || recs[0].Decision != record.DecisionAllow {
			t.Fatalf("records for a request the upstream read: want one allow\n%s", dump(recs))
		}
	})
}
