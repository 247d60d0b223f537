//go:build linux

package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	trialspec "github.com/trialnet/trialnet/trial"

	"github.com/miekg/dns"
	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/guard"
	"github.com/trialnet/trialnet/internal/counts"
	"github.com/trialnet/trialnet/internal/testhost"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/resolve"
)

// dnsServer is an in-process DNS server on 127.0.0.1 (UDP and TCP) that
// answers from a table and counts the questions it was asked.
type dnsServer struct {
	Addr string

	mu      sync.Mutex
	answers map[string]func(q dns.Question, network string) (*dns.Msg, bool) // by lower-case fqdn
	queries map[string]int                                                   // by lower-case fqdn
	total   int
}

func newDNSServer(t testing.TB) *dnsServer {
	t.Helper()
	s := &dnsServer{answers: map[string]func(dns.Question, string) (*dns.Msg, bool){}, queries: map[string]int{}}
	addr, stop, err := testhost.ServeDNSHandler(dns.HandlerFunc(s.serve))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	s.Addr = addr
	return s
}

func (s *dnsServer) serve(w dns.ResponseWriter, r *dns.Msg) {
	q := r.Question[0]
	name := strings.ToLower(q.Name)
	s.mu.Lock()
	s.queries[name]++
	s.total++
	f := s.answers[name]
	s.mu.Unlock()
	m := new(dns.Msg)
	m.SetReply(r)
	if f == nil {
		m.SetRcode(r, dns.RcodeNameError)
		_ = w.WriteMsg(m)
		return
	}
	ans, ok := f(q, w.RemoteAddr().Network())
	if !ok {
		return // no answer at all: the client times out
	}
	rcode, tc := ans.Rcode, ans.Truncated
	ans.SetReply(r)
	ans.Rcode, ans.Truncated = rcode, tc
	_ = w.WriteMsg(ans)
}

// set makes name answer A/AAAA with addrs (TTL ttl).
func (s *dnsServer) set(name string, ttl uint32, addrs ...string) {
	s.handle(name, func(q dns.Question, _ string) (*dns.Msg, bool) {
		m := new(dns.Msg)
		for _, a := range addrs {
			m.Answer = append(m.Answer, addrRR(q, q.Name, ttl, a)...)
		}
		if len(m.Answer) == 0 { // NODATA, negatively cacheable (RFC 2308)
			m.Ns = []dns.RR{&dns.SOA{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: ttl},
				Ns: "ns.example.com.", Mbox: "root.example.com.", Minttl: ttl}}
		}
		return m, true
	})
}

func addrRR(q dns.Question, owner string, ttl uint32, a string) []dns.RR {
	ip := netip.MustParseAddr(a)
	hdr := dns.RR_Header{Name: owner, Class: dns.ClassINET, Ttl: ttl}
	switch {
	case q.Qtype == dns.TypeA && ip.Is4():
		hdr.Rrtype = dns.TypeA
		return []dns.RR{&dns.A{Hdr: hdr, A: ip.AsSlice()}}
	case q.Qtype == dns.TypeAAAA && ip.Is6():
		hdr.Rrtype = dns.TypeAAAA
		return []dns.RR{&dns.AAAA{Hdr: hdr, AAAA: ip.AsSlice()}}
	}
	return nil
}

func (s *dnsServer) handle(name string, f func(q dns.Question, network string) (*dns.Msg, bool)) {
	s.mu.Lock()
	s.answers[dns.Fqdn(strings.ToLower(name))] = f
	s.mu.Unlock()
}

func (s *dnsServer) count(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queries[dns.Fqdn(strings.ToLower(name))]
}

func (s *dnsServer) totalQueries() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// mapDialer stands in for the network: every checked address it is asked
// for is connected to one local upstream instead. It records what it was
// asked to dial. The guard in front of it is the production guard.
type mapDialer struct {
	to     string
	mu     sync.Mutex
	dialed []netip.AddrPort
}

func (d *mapDialer) Dial(ctx context.Context, a netip.AddrPort) (net.Conn, error) {
	d.mu.Lock()
	d.dialed = append(d.dialed, a)
	d.mu.Unlock()
	var nd net.Dialer
	return nd.DialContext(ctx, "tcp", d.to)
}

func (d *mapDialer) addrs() []netip.AddrPort {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]netip.AddrPort(nil), d.dialed...)
}

// upstream is a local TCP server standing in for a provider.
type upstream struct {
	ln net.Listener
	wg sync.WaitGroup
}

// newUpstream serves every accepted connection with serve.
func newUpstream(t testing.TB, serve func(c *net.TCPConn)) *upstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{ln: ln}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.wg.Add(1)
			go func() {
				defer u.wg.Done()
				defer c.Close()
				serve(c.(*net.TCPConn))
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); u.wg.Wait() })
	return u
}

func echo(c *net.TCPConn) {
	_, _ = io.Copy(c, c)
	_ = c.CloseWrite()
}

type testProxy struct {
	*Proxy
	addr   string
	dns    *dnsServer
	dialer *mapDialer
	events chan record.Event
}

type proxyOpts struct {
	allow     []string
	tls       bool
	learn     bool
	cidrs     []string
	limits    *trialspec.ProxyLimits
	upstream  func(*net.TCPConn)
	configure func(*Config)
	// upstreamAddr, if set, is where every checked address is dialed
	// instead of the upstream function's listener (an httptest server).
	upstreamAddr string
	// counts and slot are the Trial's TrialPolicy.Counts and Slot.
	counts *counts.Region
	slot   int
}

// newTestProxy starts a Proxy for Trial "t1" on 127.0.0.1:0, resolving
// with the production resolver against an in-process DNS server and
// dialing through mapDialer to a local upstream.
func newTestProxy(t testing.TB, o proxyOpts) *testProxy {
	t.Helper()
	if o.upstream == nil {
		o.upstream = echo
	}
	up := newUpstream(t, o.upstream)
	ds := newDNSServer(t)
	res, err := resolve.NewDNSResolver([]string{ds.Addr})
	if err != nil {
		t.Fatal(err)
	}
	var cidrs []netip.Prefix
	for _, c := range o.cidrs {
		p, err := guard.CheckAllowCIDR(c)
		if err != nil {
			t.Fatal(err)
		}
		cidrs = append(cidrs, p)
	}
	to := up.ln.Addr().String()
	if o.upstreamAddr != "" {
		to = o.upstreamAddr
	}
	tp := &testProxy{dns: ds, dialer: &mapDialer{to: to}, events: make(chan record.Event, 1024)}
	cfg := Config{
		ProxySettings: config.ProxySettings{Resolver: res, AllowCIDRs: cidrs}, Dialer: tp.dialer,
		OnEvent: func(e *record.Event, _ []byte) { tp.events <- *e },
	}
	if o.configure != nil {
		o.configure(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tp.Proxy = p
	allow, err := allow.Parse(o.allow, o.tls)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AddTrial(TrialPolicy{Spec: trialspec.Spec{ID: "t1", Learning: o.learn, Limits: proxyHalf(o.limits)}, Allow: allow, Counts: o.counts, Slot: o.slot}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tp.addr = ln.Addr().String()
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Serve(ln, "t1") }()
	t.Cleanup(func() { _ = p.Close(); <-done })
	return tp
}

// event waits for the next decision event.
func (tp *testProxy) event(t testing.TB) record.Event {
	t.Helper()
	select {
	case e := <-tp.events:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no decision event within 10s")
		return record.Event{}
	}
}

// connect sends a raw request head and returns the response and the
// connection (with its reader) for tunnelling.
func (tp *testProxy) connect(t testing.TB, head string) (*http.Response, net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", tp.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("read response to %q: %v", head, err)
	}
	_ = c.SetDeadline(time.Time{})
	return resp, c, br
}

func connectHead(target string) string {
	return "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n\r\n"
}

// addTrial registers another Trial on the same proxy, served on its own
// listener, and returns a testProxy for it sharing DNS and events.
func (tp *testProxy) addTrial(t testing.TB, id string, entries ...string) *testProxy {
	t.Helper()
	al, err := allow.Parse(entries, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := tp.AddTrial(TrialPolicy{Spec: trialspec.Spec{ID: id}, Allow: al}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = tp.Serve(ln, id) }()
	return &testProxy{Proxy: tp.Proxy, addr: ln.Addr().String(), dns: tp.dns, dialer: tp.dialer, events: tp.events}
}

// proxyHalf is a Trial's limits of which only the proxy's half is given
// (nil: none, the proxy's defaults).
func proxyHalf(l *trialspec.ProxyLimits) *trialspec.Limits {
	if l == nil {
		return nil
	}
	return &trialspec.Limits{ProxyLimits: *l}
}

// pingEcho sends "ping" through c and wants it back from an echoing
// upstream.
func pingEcho(t testing.TB, c io.ReadWriter) {
	t.Helper()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
		t.Fatalf("echo %q %v", b, err)
	}
}
