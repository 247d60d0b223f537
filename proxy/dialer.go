package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/trialnet/trialnet/guard"
	"github.com/trialnet/trialnet/record"
)

// Dialer opens a TCP connection to one checked address. It is never
// handed a name.
type Dialer interface {
	Dial(ctx context.Context, addr netip.AddrPort) (net.Conn, error)
}

// keepalive settings for the upstream side of a tunnel: a dead peer is
// noticed in about 2.5 minutes, while an idle but healthy tunnel (a long
// model call) is never cut. The client side has its own (internal/tcplisten).
var keepalive = net.KeepAliveConfig{Enable: true, Idle: 60 * time.Second, Interval: 10 * time.Second, Count: 9}

// netDialer is the production Dialer. Its Control hook checks the address
// again with the guard right before connect(2), so even a caller that
// skipped the check cannot reach a refused address through it.
type netDialer struct {
	d net.Dialer
}

// newNetDialer returns a dialer whose sockets are re-checked by g.
func newNetDialer(g *guard.Guard) *netDialer {
	return &netDialer{d: net.Dialer{
		KeepAliveConfig: keepalive,
		Control: func(network, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return record.Deny(record.ReasonAddressDenied, "refusing to dial %q: not an address", address)
			}
			return g.Check(ap.Addr())
		},
	}}
}

// Dial implements Dialer.
func (n *netDialer) Dial(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
	addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	network := "tcp4"
	if addr.Addr().Is6() {
		network = "tcp6"
	}
	return n.d.DialContext(ctx, network, addr.String())
}

// defaultFallbackDelay is how long happy eyeballs waits on one address
// before also trying the next (RFC 8305 recommends 250 ms).
const defaultFallbackDelay = 250 * time.Millisecond

// dialAny connects to the first of addrs that answers, RFC 8305 style:
// families interleaved (IPv6 first), a new attempt every fallback delay
// or as soon as the previous one fails, the first success wins and every
// other connection is closed.
func dialAny(ctx context.Context, d Dialer, addrs []netip.AddrPort, fallback time.Duration) (net.Conn, netip.AddrPort, error) {
	if len(addrs) == 1 { // nothing to race: dial on this goroutine
		c, err := d.Dial(ctx, addrs[0])
		if err != nil {
			return nil, netip.AddrPort{}, dialError(ctx, []error{fmt.Errorf("%s: %w", addrs[0], err)})
		}
		return c, addrs[0], nil
	}
	addrs = interleave(addrs)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		c   net.Conn
		a   netip.AddrPort
		err error
	}
	results := make(chan result, len(addrs))
	next, pending := 0, 0
	var errs []error
	start := func() {
		a := addrs[next]
		next++
		pending++
		go func() {
			c, err := d.Dial(ctx, a)
			results <- result{c, a, err}
		}()
	}
	start()
	timer := time.NewTimer(fallback)
	defer timer.Stop()
	for pending > 0 {
		select {
		case r := <-results:
			pending--
			if r.err == nil {
				cancel()
				go func(n int) { // close the losers that still connect
					for range n {
						if l := <-results; l.c != nil {
							_ = l.c.Close()
						}
					}
				}(pending)
				return r.c, r.a, nil
			}
			errs = append(errs, fmt.Errorf("%s: %w", r.a, r.err))
			if next < len(addrs) {
				start()
				timer.Reset(fallback)
			}
		case <-timer.C:
			if next < len(addrs) {
				start()
				timer.Reset(fallback)
			}
		}
	}
	return nil, netip.AddrPort{}, dialError(ctx, errs)
}

func dialError(ctx context.Context, errs []error) error {
	err := errors.Join(errs...)
	if d := (*record.Denial)(nil); errors.As(err, &d) {
		return d // the Control hook refused: that is the reason, not "unreachable"
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return &record.Denial{Reason: record.ReasonUpstreamTimeout, Detail: "no address answered in time: " + err.Error(), Err: err}
	}
	return &record.Denial{Reason: record.ReasonUpstreamUnreachable, Detail: err.Error(), Err: err}
}

// interleave orders addresses IPv6, IPv4, IPv6, ... keeping each family's
// own order.
func interleave(addrs []netip.AddrPort) []netip.AddrPort {
	var v6, v4 []netip.AddrPort
	for _, a := range addrs {
		if a.Addr().Is4() {
			v4 = append(v4, a)
		} else {
			v6 = append(v6, a)
		}
	}
	out := make([]netip.AddrPort, 0, len(addrs))
	for i := 0; i < len(v6) || i < len(v4); i++ {
		if i < len(v6) {
			out = append(out, v6[i])
		}
		if i < len(v4) {
			out = append(out, v4[i])
		}
	}
	return out
}
