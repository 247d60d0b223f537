//go:build linux

package proxy

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/record"
)

// The addresses these tests stand in for pool addresses with: any
// 127.0.0.0/8 address is this host's loopback, so a listener bound to one
// sees it as a connection's local address, as a steered one does.
var (
	poolAddr    = netip.MustParseAddr("127.100.0.7") // handed out to api.example.com
	strangeAddr = netip.MustParseAddr("127.100.0.8") // never handed out
)

func testNames(a netip.Addr) (string, bool) {
	if a == poolAddr {
		return "api.example.com", true
	}
	return "", false
}

// transparentListener serves a listener on addr:0 as Trial t1's
// transparent listener and returns the address to connect to.
func transparentListener(t *testing.T, tp *testProxy, addr netip.Addr) netip.AddrPort {
	t.Helper()
	ln := listenOn(t, addr)
	done := make(chan struct{})
	go func() { defer close(done); _ = tp.ServeTransparent(ln, "t1", testNames) }()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return netip.MustParseAddrPort(ln.Addr().String())
}

func listenOn(t *testing.T, addr netip.Addr) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// newTransparentProxy makes a proxy whose Trial allows api.example.com on
// the port of a transparent listener on poolAddr, and returns that
// listener's address.
func newTransparentProxy(t *testing.T, o proxyOpts) (*testProxy, netip.AddrPort) {
	t.Helper()
	// The port is the listener's: take one, free it, and listen there.
	probe := listenOn(t, poolAddr)
	port := netip.MustParseAddrPort(probe.Addr().String()).Port()
	_ = probe.Close()
	if o.allow == nil {
		o.allow = []string{"api.example.com:" + strconv.Itoa(int(port))}
	}
	tp := newTestProxy(t, o)
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	ln, err := net.Listen("tcp", netip.AddrPortFrom(poolAddr, port).String())
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = tp.ServeTransparent(ln, "t1", testNames) }()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return tp, netip.AddrPortFrom(poolAddr, port)
}

func dialTransparent(t *testing.T, to netip.AddrPort) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", to.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return c
}

// wantReset connects to to and fails unless the connection is reset:
// how a transparent client learns of a refusal (so soon, at times, that
// connect itself reports it).
func wantReset(t *testing.T, to netip.AddrPort) {
	t.Helper()
	c, err := net.Dial("tcp", to.String())
	if err == nil {
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		var b []byte
		b, err = io.ReadAll(c)
		if len(b) > 0 {
			t.Fatalf("read %q from a refused connection", b)
		}
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("%v; want the connection reset", err)
	}
}

func wantTransparentDeny(t *testing.T, ev record.Event, reason record.Reason) {
	t.Helper()
	if ev.Decision != record.DecisionDeny || ev.Reason != reason || !ev.Transparent {
		t.Fatalf("record %+v; want a transparent %s", ev, reason)
	}
}

func TestTransparentTLS(t *testing.T) {
	var received atomic.Int64
	tp, to := newTransparentProxy(t, proxyOpts{upstream: tlsUpstream(t, &received)})

	t.Run("the name's SNI", func(t *testing.T) {
		tc := tls.Client(dialTransparent(t, to), &tls.Config{ServerName: "api.example.com", InsecureSkipVerify: true})
		if err := tc.Handshake(); err != nil {
			t.Fatal(err)
		}
		pingEcho(t, tc)
		_ = tc.Close()
		ev := tp.event(t)
		if ev.Decision != record.DecisionAllow || !ev.Transparent || ev.Host != "api.example.com" || ev.Port != to.Port() ||
			ev.SNI != "api.example.com" || ev.Rule == "" || ev.Dialed != netip.AddrPortFrom(netip.MustParseAddr("93.184.216.34"), to.Port()) {
			t.Fatalf("record %+v", ev)
		}
	})
	t.Run("another name's SNI (fronting)", func(t *testing.T) {
		before := received.Load()
		tc := tls.Client(dialTransparent(t, to), &tls.Config{ServerName: "other.example.com", InsecureSkipVerify: true})
		if err := tc.Handshake(); err == nil {
			t.Fatal("a ClientHello naming another host went through")
		}
		wantTransparentDeny(t, tp.event(t), record.ReasonSNIMismatch)
		if n := received.Load() - before; n != 0 {
			t.Fatalf("the upstream received %d bytes of a refused ClientHello", n)
		}
	})
}

// TLS after a PostgreSQL SSLRequest to a pool address is held to the
// name the address stands for, as TLS at the start is.
func TestTransparentTLSAfterSSLRequest(t *testing.T) {
	snis := make(chan string, 4)
	tp, to := newTransparentProxy(t, proxyOpts{upstream: pgFront(t, false, snis)})
	for _, c := range []struct {
		sni  string
		want record.Reason
	}{{"api.example.com", record.ReasonAllowed}, {"other.example.com", record.ReasonSNIMismatch}} {
		conn := dialTransparent(t, to)
		if _, err := conn.Write(sslRequest); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 1)
		if _, err := io.ReadFull(conn, b); err != nil || b[0] != 'S' {
			t.Fatalf("the front's answer: %q %v", b, err)
		}
		err := tls.Client(conn, &tls.Config{ServerName: c.sni, InsecureSkipVerify: true}).Handshake()
		if (err == nil) != (c.want == record.ReasonAllowed) {
			t.Fatalf("SNI %s: handshake %v", c.sni, err)
		}
		_ = conn.Close()
		if ev := tp.event(t); ev.Reason != c.want || !ev.Transparent {
			t.Fatalf("SNI %s: record %+v, want %s", c.sni, ev, c.want)
		}
	}
	if got := <-snis; got != "api.example.com" || len(snis) > 0 {
		t.Fatalf("the front was asked for %q and %d more names; want api.example.com alone", got, len(snis))
	}
}

func TestTransparentRefusals(t *testing.T) {
	tp, to := newTransparentProxy(t, proxyOpts{})

	t.Run("a port the allowlist does not name", func(t *testing.T) {
		other := transparentListener(t, tp, poolAddr)
		wantReset(t, other)
		ev := tp.event(t)
		wantTransparentDeny(t, ev, record.ReasonPolicyDenied)
		if ev.Host != "api.example.com" || ev.Port != other.Port() {
			t.Fatalf("record %+v names another target", ev)
		}
	})
	t.Run("an address never handed out", func(t *testing.T) {
		wantReset(t, transparentListener(t, tp, strangeAddr))
		wantTransparentDeny(t, tp.event(t), record.ReasonUnknownAddress)
	})
	if n := len(tp.dialer.addrs()); n != 0 {
		t.Fatalf("%d dials for refused connections", n)
	}
	if st, _ := tp.Stats("t1"); st.ByReason[record.ReasonUnknownAddress] != 1 || st.ByReason[record.ReasonPolicyDenied] != 1 {
		t.Fatalf("refusals not counted: %+v", st.ByReason)
	}
	// And what is allowed still passes: the echo upstream.
	c := dialTransparent(t, to)
	if _, err := io.WriteString(c, "hello"); err != nil {
		t.Fatal(err)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	if b, err := io.ReadAll(c); err != nil || string(b) != "hello" {
		t.Fatalf("echo %q %v", b, err)
	}
}

// TestTransparentServerSpeaksFirst: a server that speaks before its client
// (SMTP, MySQL) is dialed without waiting for the client.
func TestTransparentServerSpeaksFirst(t *testing.T) {
	tp, to := newTransparentProxy(t, proxyOpts{upstream: func(c *net.TCPConn) {
		_, _ = io.WriteString(c, "220 ready\r\n")
		echo(c)
	}})
	c := dialTransparent(t, to)
	br := bufio.NewReader(c)
	if l, err := br.ReadString('\n'); err != nil || l != "220 ready\r\n" {
		t.Fatalf("banner %q %v", l, err)
	}
	// The client's bytes after the banner are checked, then relayed.
	if _, err := io.WriteString(c, "EHLO x\r\n"); err != nil {
		t.Fatal(err)
	}
	if l, err := br.ReadString('\n'); err != nil || l != "EHLO x\r\n" {
		t.Fatalf("echo %q %v", l, err)
	}
	_ = c.Close()
	if ev := tp.event(t); ev.Decision != record.DecisionAllow || !ev.Transparent {
		t.Fatalf("record %+v", ev)
	}
}

func TestTransparentHTTP(t *testing.T) {
	var hosts atomic.Pointer[string]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Host
		hosts.Store(&h)
		_, _ = io.WriteString(w, "hi from "+r.URL.Path)
	}))
	t.Cleanup(srv.Close)
	tp, to := newTransparentProxy(t, proxyOpts{upstreamAddr: srv.Listener.Addr().String()})
	get := func(host string) *http.Response {
		c := dialTransparent(t, to)
		if _, err := io.WriteString(c, "GET /x HTTP/1.1\r\nHost: "+host+"\r\nConnection: close\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = resp.Body.Close() })
		return resp
	}
	t.Run("the name's Host", func(t *testing.T) {
		resp := get("api.example.com")
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(b) != "hi from /x" {
			t.Fatalf("%s %q", resp.Status, b)
		}
		want := "api.example.com:" + strconv.Itoa(int(to.Port()))
		if h := hosts.Load(); h == nil || *h != want {
			t.Fatalf("the upstream saw Host %v, want %s", h, want)
		}
		ev := tp.event(t)
		if ev.Decision != record.DecisionAllow || !ev.Transparent || ev.Method != "GET" || ev.Host != "api.example.com" || ev.Target != "/x" {
			t.Fatalf("record %+v", ev)
		}
		if n := len(tp.dialer.addrs()); n != 2 {
			// One dial when the connection was judged, closed unused once
			// its first bytes were HTTP; one for the request.
			t.Fatalf("%d dials, want 2", n)
		}
	})
	t.Run("another Host", func(t *testing.T) {
		hosts.Store(nil)
		resp := get("other.example.com")
		if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Trialnet-Reason") != string(record.ReasonHostMismatch) {
			t.Fatalf("%s %v", resp.Status, resp.Header)
		}
		if hosts.Load() != nil {
			t.Fatal("a request naming another host reached the upstream")
		}
		wantTransparentDeny(t, tp.event(t), record.ReasonHostMismatch)
	})
}

// TestTransparentHTTPHostCheckNotSteppedAround: plain HTTP naming
// another host, sent to an allowed name's address in shapes a lenient
// server takes as a request (a request line in pieces with a pause past
// header_timeout, a blank line first, a method outside RFC 9110's,
// lowercase, a tab), is judged by the forwarder and refused: it never
// reaches the upstream, the echo server that would send it back.
func TestTransparentHTTPHostCheckNotSteppedAround(t *testing.T) {
	const headerTimeout = 100 * time.Millisecond
	// What the upstream is sent is the witness, not what the client reads
	// back: a refusal names the Host it refused, and on a loaded machine a
	// request's rest can come before the header timeout is seen, when the
	// refusal is host_mismatch. The upstream echoes as before.
	var sent privtest.SyncBuffer
	tp, to := newTransparentProxy(t, proxyOpts{
		configure: func(c *Config) { c.HeaderTimeout = headerTimeout },
		upstream: func(c *net.TCPConn) {
			_, _ = io.Copy(c, io.TeeReader(c, &sent))
			_ = c.CloseWrite()
		},
	})
	const rest = " /x HTTP/1.1\r\nHost: other.example.com\r\n\r\n"
	for _, c := range []struct {
		name  string
		parts []string // sent with a pause past header_timeout between them
	}{
		{"a method in pieces", []string{"GE", "T" + rest}},
		{"a blank line first", []string{"\r\nGET" + rest}},
		{"an extension method", []string{"PROPFIND" + rest}},
		{"a lowercase method", []string{"get" + rest}},
		{"a tab after the method", []string{"GET\t/x HTTP/1.1\r\nHost: other.example.com\r\n\r\n"}},
		{"CONNECT", []string{"CONNECT other.example.com:80 HTTP/1.1\r\nHost: other.example.com:80\r\n\r\n"}},
		// No version: HTTP/0.9, which a front that still takes it routes by
		// an absolute target (nginx), or with a bare CR as its line end.
		{"HTTP/0.9 with an absolute target", []string{"GET http://other.example.com/x\r\n"}},
		{"HTTP/0.9 with an absolute target, uppercase", []string{"GET HTTP://other.example.com/x\n"}},
		{"a bare CR before the version", []string{"GET http://other.example.com/x\rHost: a\r\n\r\n"}},
		{"HTTP/0.9 with an https target", []string{"GET  https://other.example.com/x\r\n"}},
		{"HTTP/0.9 with another scheme", []string{"GET x://other.example.com/x\r\n"}},
		// Node's parser takes RTSP's version as HTTP's and routes by Host.
		{"an RTSP version", []string{"OPTIONS * RTSP/1.0\r\nHost: other.example.com\r\n\r\n"}},
		{"Icecast's version", []string{"SOURCE * ICE/1.0\r\nHost: other.example.com\r\n\r\n"}},
		{"HTTP/0.9 with an asterisk target", []string{"GET *\r\nHost: other.example.com\r\n\r\n"}},
		// Go's net/http serves h2c's first line, with fields after it in
		// place of the preface's rest, as a request routed by Host.
		{"h2c's first line, then fields", []string{"PRI * HTTP/2.0\r\nHost: other.example.com\r\n\r\n"}},
		// A front that takes a PROXY protocol header from its client
		// reads the request after it.
		{"a PROXY protocol v1 header first", []string{"PROXY TCP4 10.0.0.1 10.0.0.2 1 80\r\nGET" + rest}},
		{"a PROXY protocol v2 header first", []string{"\r\n\r\n\x00\r\nQUIT\n\x20\x00\x00\x00GET" + rest}},
		// Python's http.server splits its request line on any whitespace
		// str.split knows, leading whitespace included.
		{"a vertical tab first", []string{"\x0bGET" + rest}},
		{"a form feed after the method", []string{"GET\x0c/x\x1fHTTP/1.1\r\nHost: other.example.com\r\n\r\n"}},
		{"a Latin-1 no-break space first", []string{"\xa0GET" + rest}},
		{"a bare CR after the method", []string{"GET\r/x\rHTTP/1.1\r\nHost: other.example.com\r\n\r\n"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := len(sent.String())
			conn := dialTransparent(t, to)
			for i, part := range c.parts {
				if i > 0 {
					time.Sleep(3 * headerTimeout)
				}
				_, _ = io.WriteString(conn, part)
			}
			_ = conn.(*net.TCPConn).CloseWrite()
			b, _ := io.ReadAll(conn) // a reset ends it too
			if up := sent.String()[before:]; strings.Contains(up, "other.example.com") {
				t.Fatalf("the upstream got the request naming another host: it was sent %q; the client read %q", up, b)
			}
			// It names the name the address stands for, however early the
			// request failed.
			if ev := tp.event(t); ev.Decision != record.DecisionDeny || !ev.Transparent || ev.Host != "api.example.com" || ev.Port != to.Port() {
				t.Fatalf("record %+v; want a transparent refusal naming api.example.com:%d", ev, to.Port())
			}
		})
	}
}

// TestTransparentCut: deny --cut ends an open transparent tunnel.
func TestTransparentCut(t *testing.T) {
	tp, to := newTransparentProxy(t, proxyOpts{})
	c := dialTransparent(t, to)
	if _, err := io.WriteString(c, "a\n"); err != nil { // no HTTP: tunnelled
		t.Fatal(err)
	}
	b := make([]byte, 2)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatal(err)
	}
	list, _ := tp.Allow("t1")
	n, err := tp.SetAllow("t1", allow.New(), list.Entries())
	if err != nil || n != 1 {
		t.Fatalf("cut %d tunnels, %v; want 1", n, err)
	}
	if _, err := io.ReadAll(c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatal(err)
	}
	ev := tp.event(t)
	if !ev.Transparent || ev.Detail == "" {
		t.Fatalf("record %+v does not say the tunnel was cut", ev)
	}
}

// TestTransparentLearning: a learning Trial lets a name off its list
// through, saying the list would have refused it.
func TestTransparentLearning(t *testing.T) {
	tp, to := newTransparentProxy(t, proxyOpts{allow: []string{}, learn: true})
	c := dialTransparent(t, to)
	_, _ = io.WriteString(c, "x")
	_ = c.(*net.TCPConn).CloseWrite()
	if b, err := io.ReadAll(c); err != nil || string(b) != "x" {
		t.Fatalf("echo %q %v", b, err)
	}
	if ev := tp.event(t); ev.Decision != record.DecisionAllow || ev.WouldDeny != record.ReasonPolicyDenied || !ev.Transparent {
		t.Fatalf("record %+v", ev)
	}
}
