//go:build linux

package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/resolve"
	trialspec "github.com/trialnet/trialnet/trial"
	uproxy "github.com/trialnet/trialnet/upstream"
)

// newLoopbackCorpProxy is a corpProxy on 127.0.0.1: the upstream proxy's
// own address is the operator's, never held to the guard, so a test
// that needs no test host can run one there.
func newLoopbackCorpProxy(t *testing.T) *corpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cp := &corpProxy{addr: netip.MustParseAddrPort(ln.Addr().String()), ln: ln}
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

// A learning Trial behind an upstream proxy that resolves names: a name
// only learning lets through is chosen by no one, so the upstream proxy
// is never handed it to resolve (it would reach wherever the proxy
// reaches: its network's private hosts, a metadata address). It is
// resolved and checked here, and the proxy asked for the checked
// address, as with resolve: local; a listed name still goes by name.
func TestUpstreamProxyLearnedNamesAreChecked(t *testing.T) {
	corp := newLoopbackCorpProxy(t)
	ds := newDNSServer(t)
	ds.set("meta.example.test", 60, "169.254.169.254")
	ds.set("inside.example.test", 60, "10.1.2.3")
	ds.set("public.example.test", 60, "93.184.216.34")
	up, err := uproxy.Load(uproxy.Config{Address: corp.addr.String()})
	if err != nil {
		t.Fatal(err)
	}
	up.Timeout = 2 * time.Second
	res, _ := resolve.NewDNSResolver([]string{ds.Addr})
	events := make(chan record.Event, 64)
	p, err := New(Config{ProxySettings: config.ProxySettings{Resolver: res, Upstream: up},
		OnEvent: func(e *record.Event, _ []byte) { events <- *e }})
	if err != nil {
		t.Fatal(err)
	}
	al, _ := allow.Parse([]string{"api.example.test:443"}, false)
	if err := p.AddTrial(TrialPolicy{Spec: trialspec.Spec{ID: "t", Learning: true}, Allow: al}); err != nil {
		t.Fatal(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Serve(ln, "t") }()
	t.Cleanup(func() { _ = p.Close(); <-done })
	w := &upstreamWorld{tp: &testProxy{Proxy: p, addr: ln.Addr().String(), events: events}, corp: corp}

	// Listed: the upstream proxy resolves it, as configured.
	if code, why, line := w.tunnel(t, "api.example.test:443"); code != 200 || line != "upstream-proxy:api.example.test:443" {
		t.Fatalf("listed name: %d %s, tunnel said %q", code, why, line)
	}
	w.tp.event(t)
	for _, name := range []string{"meta.example.test:80", "inside.example.test:443"} {
		code, why, _ := w.tunnel(t, name)
		ev := w.tp.event(t)
		if code != 403 || !strings.HasPrefix(why, "address_denied") || ev.Reason != record.ReasonAddressDenied {
			t.Errorf("learned %s: %d %q (record %s); want address_denied", name, code, why, ev.Reason)
		}
	}
	// A forwarded plain-HTTP request takes the same way.
	c, err := net.Dial("tcp", w.tp.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, _ = io.WriteString(c, "GET http://meta.example.test/latest/meta-data/ HTTP/1.1\r\nHost: meta.example.test\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if ev := w.tp.event(t); resp.StatusCode != 403 || ev.Reason != record.ReasonAddressDenied {
		t.Errorf("learned forwarded request to metadata: %d, record %s (%s); want address_denied", resp.StatusCode, ev.Reason, ev.Detail)
	}
	// Learned and resolving to a public address: the proxy is asked for
	// that address, never the name.
	if code, why, line := w.tunnel(t, "public.example.test:443"); code != 200 || line != "upstream-proxy:93.184.216.34:443" {
		t.Errorf("learned public name: %d %s, tunnel said %q; want the upstream asked for the checked address", code, why, line)
	}
	if ev := w.tp.event(t); ev.WouldDeny != record.ReasonPolicyDenied {
		t.Errorf("learned public name: would_deny %q", ev.WouldDeny)
	}
	// Learned and resolving nowhere here: refused, saying why.
	code, why, _ := w.tunnel(t, "nowhere.example.test:443")
	w.tp.event(t)
	if code == 200 || !strings.Contains(why, "learning") {
		t.Errorf("learned name that does not resolve here: %d %q; want a DNS refusal that says learning checks it here", code, why)
	}
	for _, a := range corp.asked() {
		if a.target != "api.example.test:443" && a.target != "93.184.216.34:443" {
			t.Errorf("the upstream proxy was asked for %s", a.target)
		}
	}
}
