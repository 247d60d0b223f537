//go:build linux

package proxy

import (
	"bufio"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/record"
	trialspec "github.com/trialnet/trialnet/trial"
)

// named is a listener on this host's addr:port that greets with its
// name, or nil when addr:port cannot be bound here (no IPv6 loopback).
func named(t *testing.T, addr netip.Addr, port uint16, name string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", netip.AddrPortFrom(addr, port).String())
	if err != nil {
		return nil
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(name + "\n"))
			_ = c.Close()
		}
	}()
	return ln
}

// A host service is reached by host.trialnet.internal on its port, at
// exactly its address; every other way to the host's services is
// refused: the name on another port (even one on the allowlist, with a
// service listening), names that resolve to the host (a rebinding of
// any allowed name), IP literals in every spelling, and the service's
// port on the host's other addresses.
func TestHostServiceOnlyItsAddressAndPort(t *testing.T) {
	svc := named(t, netip.MustParseAddr("127.0.0.1"), 0, "the-service")
	port := uint16(svc.Addr().(*net.TCPAddr).Port)
	other := named(t, netip.MustParseAddr("127.0.0.1"), 0, "another-port")
	otherPort := uint16(other.Addr().(*net.TCPAddr).Port)
	// The same port on the host's other loopback addresses.
	named(t, netip.MustParseAddr("127.0.0.2"), port, "another-address")
	named(t, netip.MustParseAddr("::1"), port, "ipv6-loopback")

	tp := newTestProxy(t, proxyOpts{allow: []string{"unused.example.test:1"}})
	host := func(p uint16) string { return trialspec.HostServiceName + ":" + strconv.Itoa(int(p)) }
	entries := []string{host(port), host(otherPort), "rebind.example.test:" + strconv.Itoa(int(port)), "mapped.example.test:" + strconv.Itoa(int(port))}
	al, err := allow.Parse(entries, false)
	if err != nil {
		t.Fatal(err)
	}
	spec := trialspec.Spec{ID: "h", HostServices: []trialspec.HostService{{Port: port, Address: netip.MustParseAddr("127.0.0.1")}}}
	if err := tp.AddTrial(TrialPolicy{Spec: spec, Allow: al}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = tp.Serve(ln, "h") }()
	h := &testProxy{Proxy: tp.Proxy, addr: ln.Addr().String(), dns: tp.dns, events: tp.events}
	tp.dns.set("rebind.example.test", 60, "127.0.0.1")
	tp.dns.set("mapped.example.test", 60, "::ffff:127.0.0.1")

	greet := func(target string) (int, string, string) {
		resp, c, br := h.connect(t, connectHead(target))
		if resp.StatusCode != http.StatusOK {
			return resp.StatusCode, resp.Header.Get("Trialnet-Reason"), resp.Header.Get("Trialnet-Detail")
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		line, _ := bufio.NewReader(br).ReadString('\n')
		_ = c.Close()
		return 200, "", strings.TrimSpace(line)
	}
	if code, why, line := greet(host(port)); code != 200 || line != "the-service" {
		t.Fatalf("the host service: %d %s %q", code, why, line)
	}
	if ev := h.event(t); ev.Dialed != netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port) || len(ev.Resolved) != 0 {
		t.Errorf("record: dialed %s, resolved %v", ev.Dialed, ev.Resolved)
	}
	p := strconv.Itoa(int(port))
	for _, c := range []struct{ target, reason string }{
		{host(otherPort), "address_denied"}, // on the allowlist, with a listener: no service there
		{"HOST.trialnet.internal.:" + p, "address_denied"},
		{"rebind.example.test:" + p, "address_denied"},
		{"mapped.example.test:" + p, "address_denied"},
		{"127.0.0.1:" + p, "ip_literal"},
		{"127.0.0.2:" + p, "ip_literal"},
		{"[::1]:" + p, "ip_literal"},
		{"[::ffff:127.0.0.1]:" + p, "ip_literal"},
		{"2130706433:" + p, "ip_literal"},
		{"localhost:" + p, "policy_denied"},
		{"host.trialnet.internal:" + strconv.Itoa(int(port)+1), "policy_denied"},
	} {
		code, why, line := greet(c.target)
		if c.target == "HOST.trialnet.internal.:"+p && code == 200 && line == "the-service" {
			h.event(t)
			continue // the same name, normalised: the service itself is fine
		}
		if code == 200 || why != c.reason {
			t.Errorf("CONNECT %s: %d %s, reached %q; want %s", c.target, code, why, line, c.reason)
		}
		if ev := h.event(t); ev.Decision != record.DecisionDeny {
			t.Errorf("CONNECT %s recorded %s", c.target, ev.Decision)
		}
	}
	if n := tp.dns.count(trialspec.HostServiceName); n != 0 {
		t.Errorf("DNS was asked %d times for %s: a rebinding could answer", n, trialspec.HostServiceName)
	}
	// Trial "t1" (newTestProxy's) has no host service: the name leads
	// nowhere for it, whatever its allowlist.
	if err := tp.SetAllowStrings(t, "t1", host(port)); err != nil {
		t.Fatal(err)
	}
	if resp, _, _ := tp.connect(t, connectHead(host(port))); resp.StatusCode == 200 || resp.Header.Get("Trialnet-Reason") != "address_denied" {
		t.Errorf("a Trial without the host service: %s %s", resp.Status, resp.Header.Get("Trialnet-Detail"))
	}
}

// SetAllowStrings replaces Trial id's allowlist with entries.
func (tp *testProxy) SetAllowStrings(t *testing.T, id string, entries ...string) error {
	t.Helper()
	al, err := allow.Parse(entries, false)
	if err != nil {
		return err
	}
	_, err = tp.SetAllow(id, al, nil)
	return err
}
