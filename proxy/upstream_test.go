//go:build linux

package proxy

import (
	"bufio"
	"context"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testhost"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/resolve"
	trialspec "github.com/trialnet/trialnet/trial"
	uproxy "github.com/trialnet/trialnet/upstream"
)

// corpProxy is the second proxy: an HTTP CONNECT proxy on a test host
// that records every CONNECT it is asked (target and credential) and
// answers as told: 200 and then an echo prefixed with what it was asked,
// or a status of its own, or nothing, or an endless head.
type corpProxy struct {
	addr netip.AddrPort
	ln   net.Listener
	mu   sync.Mutex
	asks []corpAsk
	mode string // "" (tunnel), "quiet" (no banner), "407", "silent", "flood"
	// tunnelled counts the bytes that came through its tunnels.
	tunnelled atomic.Int64
}

type corpAsk struct{ target, auth string }

func newCorpProxy(t *testing.T, th *testhost.Host) *corpProxy {
	t.Helper()
	cp := &corpProxy{addr: netip.AddrPortFrom(th.Addr4, 3128)}
	ln, err := th.NS.Listen(context.Background(), "tcp", cp.addr.String())
	if err != nil {
		t.Fatal(err)
	}
	cp.ln = ln
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { defer c.Close(); cp.serve(c) })
		}
	})
	return cp
}

func (cp *corpProxy) serve(c net.Conn) {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	cp.mu.Lock()
	cp.asks = append(cp.asks, corpAsk{req.Host, req.Header.Get("Proxy-Authorization")})
	mode := cp.mode
	cp.mu.Unlock()
	switch mode {
	case "407":
		_, _ = io.WriteString(c, "HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
		return
	case "silent":
		_, _ = io.Copy(io.Discard, br)
		return
	case "flood":
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\n")
		for range 2000 {
			if _, err := io.WriteString(c, "X-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n"); err != nil {
				return
			}
		}
		return
	}
	banner := "upstream-proxy:" + req.Host + "\n"
	if mode == "quiet" { // the client speaks first, as TLS does
		banner = ""
	}
	_, _ = io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"+banner)
	_, _ = io.Copy(c, &countConn{Conn: readerConn{c, br}, n: &cp.tunnelled})
}

// readerConn reads from r, what a bufio.Reader holds of the connection.
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c readerConn) Read(b []byte) (int, error) { return c.r.Read(b) }

func (cp *corpProxy) asked() []corpAsk {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return append([]corpAsk(nil), cp.asks...)
}

func (cp *corpProxy) set(mode string) {
	cp.mu.Lock()
	cp.mode = mode
	cp.mu.Unlock()
}

// upstreamWorld is a proxy for Trial "t" with an upstream proxy on a test
// host, DNS from an in-process server, and the production dialer.
type upstreamWorld struct {
	tp     *testProxy
	th     *testhost.Host
	corp   *corpProxy
	dns    *dnsServer
	lines  chan string
	secret string
}

func newUpstreamWorld(t *testing.T, up uproxy.Config, entries ...string) *upstreamWorld {
	t.Helper()
	privtest.Require(t)
	w := &upstreamWorld{th: testhost.NewT(t, 210), dns: newDNSServer(t), lines: make(chan string, 64), secret: "s3cret-pw"}
	w.corp = newCorpProxy(t, w.th)
	cred := filepath.Join(t.TempDir(), "cred")
	if err := os.WriteFile(cred, []byte("trial-user:"+w.secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	up.Address, up.CredentialsFile = w.corp.addr.String(), cred
	u, err := uproxy.Load(up)
	if err != nil {
		t.Fatal(err)
	}
	u.Timeout = 2 * time.Second
	res, _ := resolve.NewDNSResolver([]string{w.dns.Addr})
	events := make(chan record.Event, 64)
	p, err := New(Config{
		ProxySettings: config.ProxySettings{Resolver: res, Upstream: u,
			AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("fd7a:7472::/32")}},
		OnEvent: func(e *record.Event, line []byte) { events <- *e; w.lines <- string(line) },
	})
	if err != nil {
		t.Fatal(err)
	}
	al, err := allow.Parse(entries, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AddTrial(TrialPolicy{Spec: trialspec.Spec{ID: "t"}, Allow: al}); err != nil {
		t.Fatal(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Serve(ln, "t") }()
	t.Cleanup(func() { _ = p.Close(); <-done })
	w.tp = &testProxy{Proxy: p, addr: ln.Addr().String(), events: events}
	return w
}

// tunnel CONNECTs to target and returns the status, the reason, and the
// first line the tunnel brings back.
func (w *upstreamWorld) tunnel(t *testing.T, target string) (int, string, string) {
	t.Helper()
	resp, c, br := w.tp.connect(t, connectHead(target))
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, resp.Header.Get("Trialnet-Reason") + ": " + resp.Header.Get("Trialnet-Detail"), ""
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, _ := br.ReadString('\n')
	_ = c.Close()
	return resp.StatusCode, "", strings.TrimSpace(line)
}

// noSecret fails if the credential, plain or encoded, is in any record
// written so far.
func (w *upstreamWorld) noSecret(t *testing.T) {
	t.Helper()
	enc := base64.StdEncoding.EncodeToString([]byte("trial-user:" + w.secret))
	for {
		select {
		case l := <-w.lines:
			if strings.Contains(l, w.secret) || strings.Contains(l, enc) {
				t.Errorf("a record carries the upstream credential: %s", l)
			}
		default:
			return
		}
	}
}

// The upstream proxy is asked for the name (it resolves it), with the
// credential; a name off the allowlist never reaches it; exceptions by
// name and by CIDR are dialled directly and never reach it.
func TestPrivilegedUpstreamProxyByName(t *testing.T) {
	w := newUpstreamWorld(t, uproxy.Config{Direct: []string{"direct.example.test", "fd7a:7472::/32"}},
		"api.example.test:443", "direct.example.test:8080", "cidr.example.test:8080")
	w.dns.set("direct.example.test", 60, w.th.Addr4.String())
	w.dns.set("cidr.example.test", 60, w.th.Addr6.String())

	if code, why, line := w.tunnel(t, "api.example.test:443"); code != 200 || line != "upstream-proxy:api.example.test:443" {
		t.Fatalf("allowed name: %d %s, tunnel said %q", code, why, line)
	}
	ev := w.tp.event(t)
	if ev.Dialed != w.corp.addr || len(ev.Resolved) != 0 || !strings.Contains(ev.Detail, "upstream proxy") {
		t.Errorf("record: dialed %s resolved %v detail %q; want the upstream proxy %s", ev.Dialed, ev.Resolved, ev.Detail, w.corp.addr)
	}
	want := "Basic " + base64.StdEncoding.EncodeToString([]byte("trial-user:"+w.secret))
	if a := w.corp.asked(); len(a) != 1 || a[0].target != "api.example.test:443" || a[0].auth != want {
		t.Fatalf("the upstream proxy was asked %+v, want one CONNECT api.example.test:443 with the credential", a)
	}

	if code, why, _ := w.tunnel(t, "evil.example.test:443"); code != 403 || !strings.HasPrefix(why, "policy_denied") {
		t.Errorf("a name off the allowlist: %d %s", code, why)
	}
	w.tp.event(t)
	for name, ap := range map[string]netip.AddrPort{"direct.example.test:8080": w.th.AddrPort4(), "cidr.example.test:8080": w.th.AddrPort6()} {
		before := w.th.Arrivals()
		if code, why, line := w.tunnel(t, name); code != 200 || !strings.HasPrefix(line, "canary") {
			t.Errorf("%s: %d %s, tunnel said %q; want the test host's canary, dialled directly", name, code, why, line)
		}
		if ev := w.tp.event(t); ev.Dialed != ap {
			t.Errorf("%s dialed %s, want %s", name, ev.Dialed, ap)
		}
		if !w.th.WaitArrivals(before+1, 5*time.Second) {
			t.Errorf("%s: the test host saw no direct connection", name)
		}
	}
	if a := w.corp.asked(); len(a) != 1 {
		t.Errorf("the upstream proxy was asked %+v; only api.example.test should have reached it", a)
	}
	w.noSecret(t)
}

// The TLS name check still runs before anything reaches the upstream
// proxy's tunnel: a ClientHello for another name is refused, and the
// upstream proxy receives not one byte of it.
func TestPrivilegedUpstreamProxySNIChecked(t *testing.T) {
	w := newUpstreamWorld(t, uproxy.Config{}, "api.example.test:443")
	w.corp.set("quiet")
	_, err := tlsClientThrough(t, w.tp, "api.example.test:443", "other.example.test")
	if err == nil {
		t.Fatal("a ClientHello for another name made a TLS session")
	}
	if ev := w.tp.event(t); ev.Reason != record.ReasonSNIMismatch {
		t.Fatalf("reason %s (%s), want sni_mismatch", ev.Reason, ev.Detail)
	}
	if n := w.corp.tunnelled.Load(); n != 0 {
		t.Fatalf("the upstream proxy's tunnel received %d bytes of the refused ClientHello", n)
	}
	if a := w.corp.asked(); len(a) != 1 || a[0].target != "api.example.test:443" {
		t.Fatalf("the upstream proxy was asked %+v", a)
	}
}

// With resolve: local the agent resolves, the guard checks every answer,
// and the upstream proxy is asked for the checked address, never the
// name: a name resolving to a refused address never reaches it. With the
// upstream resolving, the same name is handed over as it is: the guard
// has no address to check, as docs/upstream.md says.
func TestPrivilegedUpstreamProxyResolveLocal(t *testing.T) {
	for _, mode := range []string{uproxy.ResolveLocal, uproxy.ResolveUpstream} {
		t.Run(mode, func(t *testing.T) {
			w := newUpstreamWorld(t, uproxy.Config{Resolve: mode}, "api.example.test:443", "inside.example.test:443")
			w.dns.set("api.example.test", 60, "198.18.99.7")
			w.dns.set("inside.example.test", 60, "127.0.0.1")
			code, why, line := w.tunnel(t, "api.example.test:443")
			wantTarget := map[string]string{uproxy.ResolveLocal: "198.18.99.7:443", uproxy.ResolveUpstream: "api.example.test:443"}[mode]
			if code != 200 || line != "upstream-proxy:"+wantTarget {
				t.Fatalf("%d %s, tunnel said %q; want the upstream asked for %s", code, why, line, wantTarget)
			}
			w.tp.event(t)
			if n := w.dns.count("api.example.test"); (n == 0) != (mode == uproxy.ResolveUpstream) {
				t.Errorf("DNS was asked %d times for the name", n)
			}
			code, why, _ = w.tunnel(t, "inside.example.test:443")
			w.tp.event(t)
			asked := w.corp.asked()
			switch mode {
			case uproxy.ResolveLocal:
				if code != 403 || !strings.HasPrefix(why, "address_denied") || len(asked) != 1 {
					t.Errorf("a name resolving to loopback: %d %s; the upstream was asked %+v", code, why, asked)
				}
			case uproxy.ResolveUpstream:
				if code != 200 || len(asked) != 2 || asked[1].target != "inside.example.test:443" {
					t.Errorf("by name, the upstream is asked for the name whatever it resolves to here: %d %s, asked %+v", code, why, asked)
				}
			}
			w.noSecret(t)
		})
	}
}

// A failure says which hop failed: the upstream proxy's refusal (407),
// its silence past the handshake bound, an answer head past its bound,
// and the upstream proxy unreachable; none carries the credential.
func TestPrivilegedUpstreamProxyFailures(t *testing.T) {
	w := newUpstreamWorld(t, uproxy.Config{}, "api.example.test:443")
	for _, c := range []struct{ mode, reason string }{
		{"407", "upstream_proxy_refused"},
		{"silent", "upstream_timeout"},
		{"flood", "upstream_bad_response"},
	} {
		w.corp.set(c.mode)
		code, why, _ := w.tunnel(t, "api.example.test:443")
		w.tp.event(t)
		if code == 200 || !strings.HasPrefix(why, c.reason+": ") || !strings.Contains(why, "upstream proxy "+w.corp.addr.String()) {
			t.Errorf("%s: %d %q; want %s naming the upstream proxy", c.mode, code, why, c.reason)
		}
		if strings.Contains(why, w.secret) || strings.Contains(why, base64.StdEncoding.EncodeToString([]byte("trial-user:"+w.secret))) {
			t.Errorf("%s: the refusal carries the credential: %s", c.mode, why)
		}
	}
	_ = w.corp.ln.Close() // the test host stays; nothing listens on the upstream proxy's port
	code, why, _ := w.tunnel(t, "api.example.test:443")
	w.tp.event(t)
	if code == 200 || !strings.Contains(why, "connecting to the upstream proxy "+w.corp.addr.String()) {
		t.Errorf("unreachable upstream proxy: %d %q", code, why)
	}
	w.noSecret(t)
}
