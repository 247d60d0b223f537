//go:build linux

package proxy

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/trialnet/trialnet/record"
)

// scriptDialer answers per address: "ok" connects to a local listener,
// "hang" blocks until cancelled, anything else fails at once.
type scriptDialer struct {
	to     string
	script map[netip.AddrPort]string
	mu     sync.Mutex
	order  []netip.AddrPort
}

func (d *scriptDialer) Dial(ctx context.Context, a netip.AddrPort) (net.Conn, error) {
	d.mu.Lock()
	d.order = append(d.order, a)
	d.mu.Unlock()
	switch d.script[a] {
	case "ok":
		var nd net.Dialer
		return nd.DialContext(ctx, "tcp", d.to)
	case "hang":
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return nil, errors.New("connection refused")
}

func TestDialAnyHappyEyeballs(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	v6a, v6b := netip.MustParseAddrPort("[2001:4860::1]:443"), netip.MustParseAddrPort("[2001:4860::2]:443")
	v4a, v4b := netip.MustParseAddrPort("93.184.216.34:443"), netip.MustParseAddrPort("93.184.216.35:443")

	// IPv6 first, families interleaved; a hanging first address does not
	// hold up the second beyond the fallback delay.
	d := &scriptDialer{to: ln.Addr().String(), script: map[netip.AddrPort]string{v6a: "hang", v4a: "ok"}}
	start := time.Now()
	c, got, err := dialAny(context.Background(), d, []netip.AddrPort{v4a, v4b, v6a, v6b}, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	if got != v4a || time.Since(start) > 2*time.Second {
		t.Fatalf("connected to %v after %v", got, time.Since(start))
	}
	if d.order[0] != v6a || d.order[1] != v4a {
		t.Fatalf("attempt order %v, want IPv6 then IPv4", d.order)
	}

	// A failure starts the next attempt at once, without the delay.
	d = &scriptDialer{to: ln.Addr().String(), script: map[netip.AddrPort]string{v6b: "ok"}}
	start = time.Now()
	c, got, err = dialAny(context.Background(), d, []netip.AddrPort{v6a, v4a, v6b}, time.Hour)
	if err != nil || got != v6b || time.Since(start) > time.Second {
		t.Fatalf("got %v %v after %v", got, err, time.Since(start))
	}
	_ = c.Close()

	// All fail: upstream_unreachable naming every address; a deadline:
	// upstream_timeout.
	d = &scriptDialer{script: map[netip.AddrPort]string{}}
	if _, _, err := dialAny(context.Background(), d, []netip.AddrPort{v6a, v4a}, time.Millisecond); record.ReasonOf(err) != record.ReasonUpstreamUnreachable {
		t.Fatalf("all refused: %v", err)
	}
	d = &scriptDialer{script: map[netip.AddrPort]string{v4a: "hang"}}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, _, err := dialAny(ctx, d, []netip.AddrPort{v4a}, time.Millisecond); record.ReasonOf(err) != record.ReasonUpstreamTimeout {
		t.Fatalf("hanging: %v", err)
	}
}
