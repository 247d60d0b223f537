//go:build linux

package proxy

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/tlstest"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/wire"
)

// retryUpstream is frontedUpstream that accepts only P-256 key shares:
// crypto/tls clients send an X25519 share first, so every handshake
// goes through a HelloRetryRequest. retried counts the handshakes that
// did.
func retryUpstream(ca *testCA, received, handshakes, retried *atomic.Int64) func(*net.TCPConn) {
	cfg := &tls.Config{Certificates: ca.certs, CurvePreferences: []tls.CurveID{tls.CurveP256}}
	return func(c *net.TCPConn) {
		s := tls.Server(&countConn{Conn: c, n: received}, cfg)
		_ = s.SetDeadline(time.Now().Add(10 * time.Second))
		if s.Handshake() != nil {
			return
		}
		handshakes.Add(1)
		if s.ConnectionState().HelloRetryRequest {
			retried.Add(1)
		}
		_ = s.SetDeadline(time.Time{})
		_, _ = io.Copy(s, s)
	}
}

// readRecord reads one TLS record.
func readRecord(t *testing.T, r io.Reader) []byte {
	t.Helper()
	rec := make([]byte, 5)
	if _, err := io.ReadFull(r, rec); err != nil {
		t.Fatalf("reading a record: %v", err)
	}
	rec = append(rec, make([]byte, int(rec[3])<<8|int(rec[4]))...)
	if _, err := io.ReadFull(r, rec[5:]); err != nil {
		t.Fatalf("reading a record: %v", err)
	}
	return rec
}

// TestTLSRetryHelloNameCheck: after a real crypto/tls server's
// HelloRetryRequest, a hand-made client sends a second ClientHello that
// does not pass the checks the first passed. Each is refused as the
// first would be, with the record, and reaches nobody; an honest client
// completes its handshake through the retry.
func TestTLSRetryHelloNameCheck(t *testing.T) {
	ca := newTestCA(t, "a.test", "b.test")
	var received, handshakes, retried atomic.Int64
	// The second ClientHello must come within the TLS timeout. The cases
	// that send one get the default, which a client on a loaded machine
	// meets; "silence", which waits the timeout out, gets a proxy of its
	// own with a short one.
	newProxy := func(timeout time.Duration) *testProxy {
		p := newTestProxy(t, proxyOpts{allow: []string{"a.test:443"}, upstream: retryUpstream(ca, &received, &handshakes, &retried),
			configure: func(c *Config) { c.TLSTimeout = timeout }})
		p.dns.set("a.test", 60, "93.184.216.34")
		return p
	}
	tp, quiet := newProxy(0), newProxy(time.Second)
	first := tlstest.ClientHello(t, "a.test")
	fronted := tlstest.ClientHello(t, "b.test")
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }

	for _, c := range []struct {
		name      string
		second    []byte
		pipelined bool // sent with the first, before the HelloRetryRequest arrives
		timesOut  bool // no second ClientHello comes
		want      record.Reason
		sni       string
	}{
		{"other name", cat(tlstest.DummyCCS, fronted), false, false, record.ReasonSNIMismatch, "b.test"},
		{"other name without change_cipher_spec", fronted, false, false, record.ReasonSNIMismatch, "b.test"},
		{"other name in 1-byte records", cat(tlstest.DummyCCS, tlstest.ReRecord(fronted, 1)), false, false, record.ReasonSNIMismatch, "b.test"},
		{"other name sent before the HelloRetryRequest", cat(tlstest.DummyCCS, fronted), true, false, record.ReasonSNIMismatch, "b.test"},
		{"no name", cat(tlstest.DummyCCS, tlstest.ClientHello(t, "93.184.216.34")), false, false, record.ReasonSNIMissing, ""},
		{"alert first", cat([]byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x01, 0x5a}, fronted), false, false, record.ReasonTLSRecordBeforeHello, "a.test"},
		{"application data first", cat(tlstest.DummyCCS, []byte{0x17, 0x03, 0x03, 0x00, 0x01, 0x00}, fronted), false, false, record.ReasonTLSRecordBeforeHello, "a.test"},
		{"change_cipher_spec between fragments", cat(tlstest.ReRecord(fronted, 40)[:45], tlstest.DummyCCS, fronted), false, false, record.ReasonTLSRecordBeforeHello, "a.test"},
		{"a ServerHello instead", tlstest.ServerHelloRecord(false), false, false, record.ReasonTLSMalformed, "a.test"},
		{"silence", nil, false, true, record.ReasonTLSMalformed, "a.test"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tp := tp
			if c.timesOut {
				tp = quiet
			}
			before := received.Load()
			denied := tp.Stats0(t)[c.want]
			resp, conn, br := tp.connect(t, connectHead("a.test:443"))
			if resp.StatusCode != 200 {
				t.Fatal(resp.Status)
			}
			_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
			if c.pipelined {
				_, _ = conn.Write(cat(first, c.second))
			} else {
				_, _ = conn.Write(first)
			}
			if retry, err := wire.ParseServerHello(readRecord(t, br)[5:]); err != nil || !retry {
				t.Fatalf("the upstream's answer: retry %v, %v; want a HelloRetryRequest", retry, err)
			}
			if !c.pipelined {
				step := max(len(c.second)/5, 1) // in several segments
				for i := 0; i < len(c.second); i += step {
					_, _ = conn.Write(c.second[i:min(i+step, len(c.second))])
					time.Sleep(5 * time.Millisecond)
				}
			}
			if got, _ := io.ReadAll(br); !bytes.Equal(got, tlsAccessDenied) {
				t.Fatalf("after the HelloRetryRequest the client got %x, want only an access_denied alert", got)
			}
			ev := tp.event(t)
			if ev.Decision != record.DecisionDeny || ev.Reason != c.want || ev.SNI != c.sni {
				t.Fatalf("event %+v, want %s naming %q", ev, c.want, c.sni)
			}
			if n := received.Load() - before; n != int64(len(first)) {
				t.Fatalf("the upstream received %d bytes, want only the first ClientHello's %d", n, len(first))
			}
			if got := tp.Stats0(t)[c.want]; got != denied+1 {
				t.Fatalf("%s counted %d times, want %d", c.want, got, denied+1)
			}
		})
	}

	// Both ClientHellos in 1-byte records go on joined: the handshake
	// completes as it does with each in one record.
	for name, split := range map[string]int{"honest client through the retry": 0, "honest client through the retry, its hellos in 1-byte records": 1} {
		t.Run(name, func(t *testing.T) { honestThroughRetry(t, tp, ca, split) })
	}
	if handshakes.Load() != 2 || retried.Load() != 2 {
		t.Fatalf("%d handshakes, %d through a retry; want 2, 2", handshakes.Load(), retried.Load())
	}
}

// honestThroughRetry completes a handshake through a HelloRetryRequest
// to a.test, its ClientHellos split into records of split bytes (0: as
// crypto/tls sends them), and echoes over it.
func honestThroughRetry(t *testing.T, tp *testProxy, ca *testCA, split int) {
	t.Helper()
	resp, conn, br := tp.connect(t, connectHead("a.test:443"))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	var hc net.Conn = &bufConn{Conn: conn, r: br}
	if split > 0 {
		hc = &reRecordConn{Conn: hc, n: split, every: true}
	}
	tc := tls.Client(hc, &tls.Config{ServerName: "a.test", RootCAs: ca.pool})
	_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := tc.Handshake(); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	if !tc.ConnectionState().HelloRetryRequest {
		t.Fatal("the handshake had no HelloRetryRequest: the test tests nothing")
	}
	pingEcho(t, tc)
	_ = tc.Close()
	if ev := tp.event(t); ev.Reason != record.ReasonAllowed || ev.SNI != "a.test" || ev.Detail != "" {
		t.Fatalf("event %+v", ev)
	}
}

// Stats0 is the Trial's decisions by reason.
func (tp *testProxy) Stats0(t *testing.T) map[record.Reason]uint64 {
	t.Helper()
	s, ok := tp.Stats("t1")
	if !ok {
		t.Fatal("no Trial t1")
	}
	return s.ByReason
}

// A server that answers the second ClientHello with another
// HelloRetryRequest (TLS forbids it) would get a third ClientHello that
// nobody checked: the tunnel is cut before the client sees it, and what
// the client sent after its second ClientHello never goes upstream.
func TestTLSSecondRetryCuts(t *testing.T) {
	after := make(chan int, 1)
	tp := newTestProxy(t, proxyOpts{allow: []string{"a.test:443"}, upstream: func(c *net.TCPConn) {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, _, _, err := wire.ReadClientHello(c, nil, false); err != nil {
			return
		}
		_, _ = c.Write(tlstest.ServerHelloRecord(true))
		if _, _, _, err := wire.ReadClientHello(c, nil, true); err != nil {
			return
		}
		_, _ = c.Write(tlstest.ServerHelloRecord(true))
		n, _ := io.Copy(io.Discard, c)
		after <- int(n)
	}})
	tp.dns.set("a.test", 60, "93.184.216.34")
	resp, conn, br := tp.connect(t, connectHead("a.test:443"))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = conn.Write(tlstest.ClientHello(t, "a.test"))
	readRecord(t, br)
	// The second ClientHello with a third, fronted one right behind it.
	_, _ = conn.Write(bytes.Join([][]byte{tlstest.DummyCCS, tlstest.ClientHello(t, "a.test"), tlstest.ClientHello(t, "b.test")}, nil))
	if got, _ := io.ReadAll(br); len(got) != 0 {
		t.Fatalf("the client got %x after its second ClientHello, want nothing", got)
	}
	if n := <-after; n != 0 {
		t.Fatalf("%d bytes after the second ClientHello reached the upstream", n)
	}
	if ev := tp.event(t); !strings.Contains(ev.Detail, "second HelloRetryRequest") {
		t.Fatalf("event %+v", ev)
	}
}

// TLS 1.2 has no HelloRetryRequest; an abbreviated (resumed) handshake,
// where the server's ServerHello is followed by its change_cipher_spec
// and encrypted Finished, passes like a full one.
func TestTLS12Resumption(t *testing.T) {
	ca := newTestCA(t, "a.test")
	srv := &tls.Config{Certificates: ca.certs, MaxVersion: tls.VersionTLS12}
	tp := newTestProxy(t, proxyOpts{allow: []string{"a.test:443"}, upstream: func(c *net.TCPConn) {
		s := tls.Server(c, srv)
		_ = s.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.Copy(s, s)
	}})
	tp.dns.set("a.test", 60, "93.184.216.34")
	cfg := &tls.Config{ServerName: "a.test", RootCAs: ca.pool, MaxVersion: tls.VersionTLS12, ClientSessionCache: tls.NewLRUClientSessionCache(4)}
	for i, wantResumed := range []bool{false, true} {
		resp, conn, br := tp.connect(t, connectHead("a.test:443"))
		if resp.StatusCode != 200 {
			t.Fatal(resp.Status)
		}
		tc := tls.Client(&bufConn{Conn: conn, r: br}, cfg)
		_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := tc.Write([]byte("ping")); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		b := make([]byte, 4)
		if _, err := io.ReadFull(tc, b); err != nil || string(b) != "ping" {
			t.Fatalf("connection %d: echo %q %v", i, b, err)
		}
		if st := tc.ConnectionState(); st.DidResume != wantResumed || st.Version != tls.VersionTLS12 {
			t.Fatalf("connection %d: resumed %v, version %x", i, st.DidResume, st.Version)
		}
		_ = tc.Close()
		if ev := tp.event(t); ev.Reason != record.ReasonAllowed || ev.Detail != "" {
			t.Fatalf("connection %d: event %+v", i, ev)
		}
	}
}

// An upstream that answers the ClientHello with a fatal alert: the
// client gets the alert, and the tunnel ends without sending on
// anything the client wrote after its ClientHello.
func TestTLSAlertInsteadOfServerHello(t *testing.T) {
	after := make(chan int, 1)
	alert := []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x70} // fatal unrecognized_name
	tp := newTestProxy(t, proxyOpts{allow: []string{"a.test:443"}, upstream: func(c *net.TCPConn) {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, _, _, err := wire.ReadClientHello(c, nil, false); err != nil {
			return
		}
		_, _ = c.Write(alert)
		n, _ := io.Copy(io.Discard, c)
		after <- int(n)
	}})
	tp.dns.set("a.test", 60, "93.184.216.34")
	resp, conn, br := tp.connect(t, connectHead("a.test:443"))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = conn.Write(append(tlstest.ClientHello(t, "a.test"), tlstest.ClientHello(t, "b.test")...))
	if got, _ := io.ReadAll(br); !bytes.Equal(got, alert) {
		t.Fatalf("client got %x, want the upstream's alert", got)
	}
	if n := <-after; n != 0 {
		t.Fatalf("%d bytes after the ClientHello reached the upstream", n)
	}
	if ev := tp.event(t); ev.Decision != record.DecisionAllow || !strings.Contains(ev.Detail, "not answer the ClientHello with a ServerHello") {
		t.Fatalf("event %+v", ev)
	}
}

// An upstream that spoke before the client's ClientHello is no TLS
// server answering it, and a HelloRetryRequest could not be told from
// what it sent before: a TLS stream after it is cut, unsent.
func TestTLSAfterUpstreamSpokeCuts(t *testing.T) {
	after := make(chan int, 1)
	tp := newTestProxy(t, proxyOpts{allow: []string{"a.test:443"}, upstream: func(c *net.TCPConn) {
		_, _ = c.Write([]byte("hi"))
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		n, _ := io.Copy(io.Discard, c)
		after <- int(n)
	}})
	tp.dns.set("a.test", 60, "93.184.216.34")
	resp, conn, br := tp.connect(t, connectHead("a.test:443"))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if b := make([]byte, 2); func() error { _, err := io.ReadFull(br, b); return err }() != nil || string(b) != "hi" {
		t.Fatalf("the upstream's greeting: %q", b)
	}
	_, _ = conn.Write(tlstest.ClientHello(t, "a.test"))
	_, _ = io.ReadAll(br)
	if n := <-after; n != 0 {
		t.Fatalf("%d bytes reached the upstream", n)
	}
	if ev := tp.event(t); !strings.Contains(ev.Detail, "spoke before the ClientHello") {
		t.Fatalf("event %+v", ev)
	}
}

// An upstream that never answers the ClientHello: the client side is not
// read while its answer is awaited, so the tunnel (and the Trial's slot)
// would be held for good. It is cut after TLSTimeout, and says why.
func TestTLSSilentUpstreamIsCut(t *testing.T) {
	held := make(chan struct{})
	tp := newTestProxy(t, proxyOpts{allow: []string{"a.test:443"}, upstream: func(c *net.TCPConn) {
		if _, _, _, err := wire.ReadClientHello(c, nil, false); err != nil {
			return
		}
		select { // silent, and open, until the test's end (bounded)
		case <-held:
		case <-time.After(10 * time.Second):
		}
	}, configure: func(c *Config) { c.TLSTimeout = 300 * time.Millisecond }})
	// Registered after the proxy's: cleanups run last first, and the
	// upstream must let go before the proxy waits for it.
	t.Cleanup(func() { close(held) })
	tp.dns.set("a.test", 60, "93.184.216.34")
	resp, conn, br := tp.connect(t, connectHead("a.test:443"))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = conn.Write(tlstest.ClientHello(t, "a.test"))
	if _, err := io.ReadAll(br); err != nil {
		t.Fatalf("the tunnel was not cut: %v", err)
	}
	if ev := tp.event(t); !strings.Contains(ev.Detail, "did not answer the ClientHello within 300ms") {
		t.Fatalf("event %+v", ev)
	}
}

// TestTLSRetryHelloReachesTheFrontWhole: after a HelloRetryRequest, the
// second ClientHello, split over records behind a dummy
// change_cipher_spec, reaches the upstream as the first does: the
// change_cipher_spec as sent, then the hello in one record, which a
// front reading the name from the first record needs. An honest
// handshake through the retry completes either way, so only the bytes
// the upstream read show the join.
func TestTLSRetryHelloReachesTheFrontWhole(t *testing.T) {
	second := tlstest.ClientHello(t, "a.test")
	got := make(chan [][]byte, 1)
	upstream := func(c *net.TCPConn) {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		var recs [][]byte
		defer func() { got <- recs }()
		rec := make([]byte, 5)
		for i := 0; i < 3; i++ { // the first hello, then what follows the request
			if _, err := io.ReadFull(c, rec[:5]); err != nil {
				return
			}
			r := append(append([]byte(nil), rec...), make([]byte, int(rec[3])<<8|int(rec[4]))...)
			if _, err := io.ReadFull(c, r[5:]); err != nil {
				return
			}
			if i == 0 {
				if _, err := c.Write(tlstest.ServerHelloRecord(true)); err != nil {
					return
				}
				continue
			}
			recs = append(recs, r)
		}
	}
	tp := newTestProxy(t, proxyOpts{allow: []string{"a.test:443"}, upstream: upstream})
	tp.dns.set("a.test", 60, "93.184.216.34")
	resp, conn, br := tp.connect(t, connectHead("a.test:443"))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write(tlstest.ClientHello(t, "a.test")); err != nil {
		t.Fatal(err)
	}
	if retry, err := wire.ParseServerHello(readRecord(t, br)[5:]); err != nil || !retry {
		t.Fatalf("the upstream's answer: retry %v, %v; want a HelloRetryRequest", retry, err)
	}
	if _, err := conn.Write(append(append([]byte(nil), tlstest.DummyCCS...), tlstest.ReRecord(second, 40)...)); err != nil {
		t.Fatal(err)
	}
	recs := <-got
	if len(recs) != 2 || !bytes.Equal(recs[0], tlstest.DummyCCS) || !bytes.Equal(recs[1], second) {
		t.Fatalf("after the HelloRetryRequest the upstream read %d records %x; want the change_cipher_spec, then the second hello in one record", len(recs), recs)
	}
}
