//go:build linux

package testhost

import (
	"context"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
)

// DNSPort is where the DNS canaries listen.
const DNSPort = 53

// Canaries count what reaches the test host besides its TCP and UDP
// port: DNS on port 53 (UDP and TCP, both families) and ICMP echo
// requests, for an escape suite's "blocked" to be seen at the
// receiving side.
type Canaries struct {
	h         *Host
	DNS, ICMP atomic.Int64
}

// Arrivals is every arrival: the host's own and the canaries'.
func (c *Canaries) Arrivals() int64 { return c.h.Arrivals() + c.DNS.Load() + c.ICMP.Load() }

// ListenCanaries starts the canaries on h until the test ends.
func (h *Host) ListenCanaries(t testing.TB) *Canaries {
	t.Helper()
	c := &Canaries{h: h}
	for _, a := range []netip.Addr{h.Addr4, h.Addr6} {
		ap := netip.AddrPortFrom(a, DNSPort).String()
		ln, err := h.NS.Listen(context.Background(), "tcp", ap)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		go CountAccepts(ln, &c.DNS)
		c.listenPacket(t, "udp", ap, func([]byte) bool { return true }, &c.DNS)
	}
	echo := func(b []byte) bool { return len(b) > 0 && (b[0] == 8 || b[0] == 128) } // echo requests only
	c.listenPacket(t, "ip4:icmp", h.Addr4.String(), echo, &c.ICMP)
	c.listenPacket(t, "ip6:ipv6-icmp", h.Addr6.String(), echo, &c.ICMP)
	return c
}

func (c *Canaries) listenPacket(t testing.TB, network, addr string, counts func([]byte) bool, n *atomic.Int64) {
	t.Helper()
	var pc net.PacketConn
	if err := c.h.NS.Do(func() (err error) { pc, err = net.ListenPacket(network, addr); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			m, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if counts(buf[:m]) {
				n.Add(1)
			}
		}
	}()
}
