//go:build linux

package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/resolve"
)

// hostAddr returns one non-loopback IPv4 address of this host and the
// /24 around it, so a test can allow its class and see that the
// own-address check alone refuses it.
func hostAddr(t *testing.T) (netip.Addr, string) {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && !p.Addr().IsLoopback() {
			return p.Addr(), netip.PrefixFrom(p.Addr(), 24).Masked().String()
		}
	}
	t.Fatal("this host has no non-loopback IPv4 address to test the own-address check with")
	return netip.Addr{}, ""
}

func TestDNSAnswersGuarded(t *testing.T) {
	own, ownNet := hostAddr(t)
	names := map[string][]string{
		"loopback.example.com":  {"127.0.0.1"},
		"mixed.example.com":     {"93.184.216.34", "127.0.0.1"},
		"mixed6.example.com":    {"93.184.216.34", "2606:2800:220:1::1", "::1"},
		"mapped.example.com":    {"::ffff:127.0.0.1"},
		"compat.example.com":    {"::127.0.0.1"},
		"nat64.example.com":     {"64:ff9b::a9fe:a9fe"},
		"own.example.com":       {own.String()},
		"metadata.example.com":  {"169.254.169.254"},
		"zero.example.com":      {"0.0.0.0"},
		"private.example.com":   {"10.0.0.1"},
		"cgnat.example.com":     {"100.64.1.1"},
		"ula.example.com":       {"fd00::1"},
		"linklocal.example.com": {"fe80::1"},
		// Every IPv6 form that carries an IPv4 address a router or the
		// kernel may reach, each carrying a forbidden one, behind a good A.
		"translated.example.com": {"93.184.216.34", "::ffff:0:127.0.0.1"},
		"nat64local.example.com": {"93.184.216.34", "64:ff9b:1::a9fe:a9fe"},
		"6to4.example.com":       {"93.184.216.34", "2002:7f00:1::1"},
		"teredo.example.com":     {"93.184.216.34", "2001:0:a9fe:a9fe::1"},
		"teredoc.example.com":    {"93.184.216.34", "2001:0:5db8:d822::80ff:fffe"},
		"isatap.example.com":     {"93.184.216.34", "2606:2800:220:1:200:5efe:a9fe:a9fe"},
		"isatap0.example.com":    {"93.184.216.34", "2606:2800:220:1:0:5efe:" + own.String()},
	}
	var allow []string
	for n := range names {
		allow = append(allow, n+":443", n+":80")
	}
	allow = append(allow, "cname.example.com:443", "cname.example.com:80")
	tp := newTestProxy(t, proxyOpts{allow: allow, cidrs: []string{ownNet}})
	for n, addrs := range names {
		tp.dns.set(n, 60, addrs...)
	}
	tp.dns.handle("cname.example.com", func(q dns.Question, _ string) (*dns.Msg, bool) {
		m := new(dns.Msg)
		m.Answer = append(m.Answer, &dns.CNAME{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 60}, Target: "loopback.example.com."})
		m.Answer = append(m.Answer, addrRR(q, "loopback.example.com.", 60, "127.0.0.1")...)
		return m, true
	})
	for _, n := range append(tp.dns.names(), "cname.example.com") {
		t.Run(n, func(t *testing.T) {
			resp, _, _ := tp.connect(t, connectHead(n+":443"))
			if resp.StatusCode != 403 || record.Reason(resp.Header.Get("Trialnet-Reason")) != record.ReasonAddressDenied {
				t.Fatalf("got %d %s: %s", resp.StatusCode, resp.Header.Get("Trialnet-Reason"), resp.Header.Get("Trialnet-Detail"))
			}
			ev := tp.event(t)
			if ev.Reason != record.ReasonAddressDenied || len(ev.Resolved) == 0 || ev.Dialed.IsValid() {
				t.Fatalf("event %+v", ev)
			}
			// A forwarded request takes the same guard.
			resp, _, _ = tp.connect(t, "GET http://"+n+"/ HTTP/1.1\r\nHost: "+n+"\r\n\r\n")
			if resp.StatusCode != 403 || record.Reason(resp.Header.Get("Trialnet-Reason")) != record.ReasonAddressDenied {
				t.Fatalf("forwarded: got %d %s: %s", resp.StatusCode, resp.Header.Get("Trialnet-Reason"), resp.Header.Get("Trialnet-Detail"))
			}
			if ev := tp.event(t); ev.Reason != record.ReasonAddressDenied || ev.Dialed.IsValid() {
				t.Fatalf("forwarded: event %+v", ev)
			}
		})
	}
	if d := tp.dialer.addrs(); len(d) != 0 {
		t.Fatalf("refused names were dialed: %v", d)
	}
}

func (s *dnsServer) names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for n := range s.answers {
		out = append(out, n[:len(n)-1])
	}
	return out
}

// A name whose answer changes on every query (DNS rebinding) may only
// ever be dialed at the address that was checked.
func TestDNSRebinding(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{allow: []string{"rebind.example.com:443"}})
	var n atomic.Int64
	tp.dns.handle("rebind.example.com", func(q dns.Question, _ string) (*dns.Msg, bool) {
		m := new(dns.Msg)
		a := "93.184.216.34"
		if n.Add(1)%2 == 0 {
			a = "127.0.0.1"
		}
		m.Answer = addrRR(q, q.Name, 0, a)
		return m, true
	})
	ok := 0
	for range 10 {
		resp, c, _ := tp.connect(t, connectHead("rebind.example.com:443"))
		_ = c.Close()
		ev := tp.event(t)
		switch resp.StatusCode {
		case 200:
			ok++
			if ev.Dialed.Addr() != netip.MustParseAddr("93.184.216.34") || len(ev.Resolved) != 1 || ev.Resolved[0] != ev.Dialed.Addr() {
				t.Fatalf("dialed %v after resolving %v", ev.Dialed, ev.Resolved)
			}
		case 403:
			if ev.Reason != record.ReasonAddressDenied {
				t.Fatalf("event %+v", ev)
			}
		default:
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	for _, a := range tp.dialer.addrs() {
		if a.Addr() != netip.MustParseAddr("93.184.216.34") {
			t.Fatalf("dialed unchecked %v", a)
		}
	}
	if ok == 0 || tp.dns.count("rebind.example.com") < 10 {
		t.Fatalf("%d tunnels, %d queries: the test did not exercise both answers", ok, tp.dns.count("rebind.example.com"))
	}
}

func TestDNSFailures(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{
		allow:     []string{"nx.example.com:443", "servfail.example.com:443", "silent.example.com:443", "empty.example.com:443"},
		configure: func(c *Config) { c.DNSTimeout = 700 * time.Millisecond },
	})
	tp.dns.handle("servfail.example.com", func(dns.Question, string) (*dns.Msg, bool) {
		m := new(dns.Msg)
		m.Rcode = dns.RcodeServerFailure
		return m, true
	})
	tp.dns.handle("silent.example.com", func(dns.Question, string) (*dns.Msg, bool) { return nil, false })
	tp.dns.handle("empty.example.com", func(dns.Question, string) (*dns.Msg, bool) { return new(dns.Msg), true })
	for name, want := range map[string]struct {
		reason      record.Reason
		proxyStatus string // Proxy-Status up to details
	}{
		"nx.example.com":       {record.ReasonDNSNXDomain, `trialnet; error=dns_error; rcode="NXDOMAIN"`},
		"servfail.example.com": {record.ReasonDNSFailed, `trialnet; error=dns_error; rcode="SERVFAIL"`},
		"silent.example.com":   {record.ReasonDNSFailed, `trialnet; error=dns_timeout`},
		"empty.example.com":    {record.ReasonDNSNoAddresses, `trialnet; error=dns_error; rcode="NOERROR"`},
	} {
		resp, _, _ := tp.connect(t, connectHead(name+":443"))
		if resp.StatusCode != 502 || record.Reason(resp.Header.Get("Trialnet-Reason")) != want.reason {
			t.Errorf("%s: got %d %s (%s), want 502 %s", name, resp.StatusCode, resp.Header.Get("Trialnet-Reason"), resp.Header.Get("Trialnet-Detail"), want.reason)
		}
		if ps := resp.Header.Get("Proxy-Status"); !strings.HasPrefix(ps, want.proxyStatus+"; details=") {
			t.Errorf("%s: Proxy-Status %q, want %s; details=...", name, ps, want.proxyStatus)
		}
		tp.event(t)
	}
}

func newResolver(t *testing.T, s *dnsServer) *resolve.DNSResolver {
	t.Helper()
	r, err := resolve.NewDNSResolver([]string{s.Addr})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestResolverCNAMEs(t *testing.T) {
	s := newDNSServer(t)
	r := newResolver(t, s)
	cname := func(owner, target string) dns.RR {
		return &dns.CNAME{Hdr: dns.RR_Header{Name: dns.Fqdn(owner), Rrtype: dns.TypeCNAME, Class: dns.ClassINET, Ttl: 60}, Target: dns.Fqdn(target)}
	}
	// In-answer chain, with a stray record for another name that must be ignored.
	s.handle("a.example.com", func(q dns.Question, _ string) (*dns.Msg, bool) {
		m := new(dns.Msg)
		m.Answer = append(m.Answer, cname("a.example.com", "b.example.com"), cname("b.example.com", "c.example.com"))
		m.Answer = append(m.Answer, addrRR(q, "c.example.com.", 60, "93.184.216.34")...)
		m.Answer = append(m.Answer, addrRR(q, "stray.example.com.", 60, "127.0.0.1")...)
		return m, true
	})
	// A chain that needs a second query.
	s.handle("x.example.com", func(dns.Question, string) (*dns.Msg, bool) {
		m := new(dns.Msg)
		m.Answer = []dns.RR{cname("x.example.com", "y.example.com")}
		return m, true
	})
	s.set("y.example.com", 60, "93.184.216.35", "2606:2800:220:1::35")
	// A loop.
	s.handle("loop.example.com", func(dns.Question, string) (*dns.Msg, bool) {
		m := new(dns.Msg)
		m.Answer = []dns.RR{cname("loop.example.com", "loop.example.com")}
		return m, true
	})
	ctx := context.Background()
	ans, err := r.Resolve(ctx, "a.example.com")
	if err != nil || len(ans.Addrs) != 1 || ans.Addrs[0] != netip.MustParseAddr("93.184.216.34") || len(ans.CNAMEs) != 2 {
		t.Fatalf("a: %+v %v", ans, err)
	}
	ans, err = r.Resolve(ctx, "x.example.com")
	if err != nil || len(ans.Addrs) != 2 {
		t.Fatalf("x: %+v %v", ans, err)
	}
	if _, err = r.Resolve(ctx, "loop.example.com"); record.ReasonOf(err) != record.ReasonDNSFailed {
		t.Fatalf("loop: %v", err)
	}
}

// A truncated UDP answer is asked again over TCP.
func TestResolverTCPFallback(t *testing.T) {
	s := newDNSServer(t)
	r := newResolver(t, s)
	s.handle("big.example.com", func(q dns.Question, network string) (*dns.Msg, bool) {
		m := new(dns.Msg)
		if network == "udp" {
			m.Truncated = true
			return m, true
		}
		m.Answer = addrRR(q, q.Name, 60, "93.184.216.34")
		return m, true
	})
	ans, err := r.Resolve(context.Background(), "big.example.com")
	if err != nil || len(ans.Addrs) != 1 {
		t.Fatalf("%+v %v", ans, err)
	}
}

// Answers are cached for their TTL and asked again after it.
func TestResolverCacheTTL(t *testing.T) {
	s := newDNSServer(t)
	r := newResolver(t, s)
	s.set("ttl.example.com", 1, "93.184.216.34")
	ctx := context.Background()
	if _, err := r.Resolve(ctx, "ttl.example.com"); err != nil {
		t.Fatal(err)
	}
	ans, err := r.Resolve(ctx, "TTL.example.com")
	if err != nil || !ans.Cached || s.count("ttl.example.com") != 2 {
		t.Fatalf("second lookup: cached=%v queries=%d err=%v", ans.Cached, s.count("ttl.example.com"), err)
	}
	time.Sleep(1100 * time.Millisecond)
	if ans, _ := r.Resolve(ctx, "ttl.example.com"); ans.Cached || s.count("ttl.example.com") != 4 {
		t.Fatalf("after the TTL: cached=%v queries=%d", ans.Cached, s.count("ttl.example.com"))
	}
	// TTL 0 is never cached.
	s.set("zero.example.com", 0, "93.184.216.34")
	_, _ = r.Resolve(ctx, "zero.example.com")
	_, _ = r.Resolve(ctx, "zero.example.com")
	if s.count("zero.example.com") != 4 {
		t.Fatalf("TTL 0 answer was cached: %d queries", s.count("zero.example.com"))
	}
}

// Lookups of one name in flight are shared, but a leader that gives up
// (its Trial removed) does not fail the others: they ask again.
func TestResolverSharedLookupSurvivesLeaderCancel(t *testing.T) {
	s := newDNSServer(t)
	r := newResolver(t, s)
	s.handle("slow.example.com", func(q dns.Question, _ string) (*dns.Msg, bool) {
		time.Sleep(300 * time.Millisecond)
		m := new(dns.Msg)
		m.Answer = addrRR(q, q.Name, 60, "93.184.216.34")
		return m, true
	})
	leader, cancel := context.WithCancel(context.Background())
	go func() { _, _ = r.Resolve(leader, "slow.example.com") }()
	for deadline := time.Now().Add(5 * time.Second); s.count("slow.example.com") == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no query")
		}
	}
	done := make(chan struct{})
	var ans resolve.Answer
	var err error
	go func() { defer close(done); ans, err = r.Resolve(context.Background(), "slow.example.com") }()
	time.Sleep(50 * time.Millisecond) // the follower has joined
	cancel()
	<-done
	if err != nil || len(ans.Addrs) != 1 {
		t.Fatalf("a follower got %+v, %v after its leader gave up", ans, err)
	}
}

// blockingResolver answers nothing until release is closed; entered gets
// the name of each lookup it starts.
type blockingResolver struct {
	entered chan string
	release chan struct{}
}

func (r blockingResolver) Resolve(ctx context.Context, name string) (resolve.Answer, error) {
	r.entered <- name
	select {
	case <-r.release:
	case <-ctx.Done():
	}
	return resolve.Answer{}, errors.New("no answer")
}

// TestLookupsInFlightBounded: with maxLookups of a Trial's lookups
// waiting on the resolver, the next one asks the resolver nothing until
// one ends, and fails when its Trial ends; another Trial's are not held.
func TestLookupsInFlightBounded(t *testing.T) {
	r := blockingResolver{entered: make(chan string, maxLookups), release: make(chan struct{})}
	slots := lookupSlots{ch: make(chan struct{}, maxLookups)}
	var held sync.WaitGroup
	for i := range maxLookups {
		held.Go(func() { _, _ = slots.resolve(context.Background(), time.Minute, r, fmt.Sprintf("s%d.example.com", i)) })
	}
	for range maxLookups {
		<-r.entered
	}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := slots.resolve(gone, time.Minute, r, "one-more.example.com")
	if d := (*record.Denial)(nil); !errors.As(err, &d) || d.Reason != record.ReasonDNSFailed {
		t.Fatalf("%v; want dns_failed", err)
	}
	select {
	case n := <-r.entered:
		t.Fatalf("the resolver was asked for %s past the Trial's %d lookups in flight", n, maxLookups)
	default:
	}
	// Another Trial's lookups have slots of their own.
	other := lookupSlots{ch: make(chan struct{}, maxLookups)}
	done := make(chan error, 1)
	go func() {
		_, err := other.resolve(context.Background(), time.Minute, r, "other.example.com")
		done <- err
	}()
	if n := <-r.entered; n != "other.example.com" {
		t.Fatalf("asked for %s", n)
	}
	close(r.release)
	held.Wait()
	<-done
}

// answerResolver answers at once with err, counting its lookups.
type answerResolver struct {
	err   error
	asked *atomic.Int64
}

func (r answerResolver) Resolve(context.Context, string) (resolve.Answer, error) {
	r.asked.Add(1)
	return resolve.Answer{}, r.err
}

// TestLookupSlotHeldWhileItsQuestionsMayWait: a lookup that ended in a
// timeout keeps its slot for the hold from its start, as its questions
// may still wait at the resolver (one whose Trial ended just after it
// started sent them and returned at once); one that was answered, an
// NXDOMAIN too, gives it back at once.
func TestLookupSlotHeldWhileItsQuestionsMayWait(t *testing.T) {
	var asked atomic.Int64
	slots := lookupSlots{ch: make(chan struct{}, 2), hold: time.Hour}
	nx := answerResolver{record.Deny(record.ReasonDNSNXDomain, "no such name"), &asked}
	timedOut := answerResolver{&record.Denial{Reason: record.ReasonDNSFailed, DNS: record.DNSFailure{Timeout: true}}, &asked}
	for range 3 {
		_, _ = slots.resolve(context.Background(), time.Minute, nx, "nx.example.com")
	}
	if n := len(slots.ch); n != 0 {
		t.Fatalf("%d slots held after answered lookups", n)
	}
	for range 2 {
		_, _ = slots.resolve(context.Background(), time.Minute, timedOut, "slow.example.com")
	}
	if n := len(slots.ch); n != 2 {
		t.Fatalf("%d slots held after 2 lookups that timed out, want 2", n)
	}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := slots.resolve(gone, time.Minute, nx, "one-more.example.com"); err == nil || asked.Load() != 5 {
		t.Fatalf("%v after %d lookups: asked while two timed-out lookups held the slots", err, asked.Load())
	}
}

// TestLookupNotStartedOutOfTime: a lookup whose Trial has ended asks the
// resolver nothing, with a slot free too (select takes the free slot or
// the ended context at random): waiters whose time ran out as slots came
// free sent 305 questions at once here, in a first version.
func TestLookupNotStartedOutOfTime(t *testing.T) {
	var asked atomic.Int64
	slots := lookupSlots{ch: make(chan struct{}, maxLookups)}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for range 64 {
		_, _ = slots.resolve(gone, time.Minute, answerResolver{nil, &asked}, "late.example.com")
	}
	if n := asked.Load(); n != 0 || len(slots.ch) != 0 {
		t.Fatalf("%d lookups asked after their time was up, %d slots held", n, len(slots.ch))
	}
}

// TestTrialLookupsHeldToTheirSlots: a CONNECT whose Trial has no lookup
// slot free asks the resolver nothing while it waits, past its DNS
// timeout too, and is answered once a slot comes free, with its whole
// DNS time then: 50 names at once, each answered in 1.9 s, had 18
// refused when the wait counted against the lookup's time.
func TestTrialLookupsHeldToTheirSlots(t *testing.T) {
	const dnsTimeout = 50 * time.Millisecond
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"},
		configure: func(c *Config) { c.DNSTimeout = dnsTimeout }})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	tp.mu.Lock()
	tr := tp.trials["t1"]
	tp.mu.Unlock()
	for range maxLookups {
		tr.lookups.ch <- struct{}{}
	}
	c, err := net.Dial("tcp", tp.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, connectHead("api.example.com:443")); err != nil {
		t.Fatal(err)
	}
	// No event tells when the lookup waits: sleeping past its DNS
	// timeout makes a wait that counted against it certain to fail.
	time.Sleep(4 * dnsTimeout)
	if n := tp.dns.count("api.example.com"); n != 0 {
		t.Fatalf("%d questions asked past the Trial's %d lookup slots", n, maxLookups)
	}
	<-tr.lookups.ch
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	if ev := tp.event(t); resp.StatusCode != 200 || ev.Decision != record.DecisionAllow {
		t.Fatalf("%s %+v once a slot came free after its DNS timeout", resp.Status, ev)
	}
}

// TestLookupFromCacheTakesNoSlot: a name whose answers are all in the
// agent's cache is answered with every slot held by lookups that wait
// on the resolver: a cache read asks nothing of it.
func TestLookupFromCacheTakesNoSlot(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	resp, c, _ := tp.connect(t, connectHead("api.example.com:443"))
	_ = c.Close()
	if ev := tp.event(t); resp.StatusCode != 200 || ev.Decision != record.DecisionAllow {
		t.Fatalf("%s %+v", resp.Status, ev)
	}
	tp.mu.Lock()
	tr := tp.trials["t1"]
	tp.mu.Unlock()
	for range maxLookups {
		tr.lookups.ch <- struct{}{}
	}
	defer func() {
		for range maxLookups {
			<-tr.lookups.ch
		}
	}()
	resp, c, _ = tp.connect(t, connectHead("api.example.com:443"))
	_ = c.Close()
	if ev := tp.event(t); resp.StatusCode != 200 || ev.Decision != record.DecisionAllow {
		t.Fatalf("%s %+v for a cached name with every lookup slot held", resp.Status, ev)
	}
}
