//go:build linux

package proxy

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/trialnet/trialnet/record"
	trialspec "github.com/trialnet/trialnet/trial"
	uproxy "github.com/trialnet/trialnet/upstream"
	"github.com/trialnet/trialnet/wire"
)

// connect opens the upstream side of an allowed request (its name
// already judged against the allowlist): a host service by its port; or
// the name resolved, every address checked and a checked one dialed,
// directly or through the upstream proxy; or, when the upstream proxy
// resolves names, the name handed to it.
func (p *Proxy) connect(trialCtx context.Context, t *trial, req *wire.Request, ev *record.Event) (net.Conn, error) {
	if req.Host == trialspec.HostServiceName {
		return p.connectHostService(trialCtx, t, req, ev)
	}
	set := t.set
	up := set.upstream
	if up != nil && up.DirectName(req.Host) {
		up = nil
	}
	// A name that only learning lets through was chosen by no one: handed
	// to an upstream proxy that resolves it, it would reach wherever that
	// proxy reaches (its network's private hosts, a metadata address),
	// past the guard learning keeps. It is resolved and checked here, and
	// the proxy asked for a checked address, as with resolve: local.
	learned := up != nil && !up.ResolvesLocally() && t.learnedOnly(req)
	byName := up != nil && !up.ResolvesLocally() && !learned
	if byName && !up.HasDirectCIDRs() {
		return p.dialUpstream(trialCtx, up, req.HostPort(), ev)
	}
	targets, err := p.resolveChecked(trialCtx, t.lookups, set, req, ev)
	if learned && err != nil {
		var d *record.Denial
		if errors.As(err, &d) {
			d.Detail += "; a name off the allowlist, let through only by learning, is resolved and checked here although the upstream proxy resolves listed names (add it to the allowlist to have the upstream proxy resolve it)"
		}
		return nil, err
	}
	switch {
	case up == nil:
	case byName && (err != nil || !allDirect(up, targets)):
		// Looked up only for the direct CIDRs, and not all in them: the
		// upstream proxy resolves the name, as it would without them.
		ev.SetResolved(nil)
		return p.dialUpstream(trialCtx, up, req.HostPort(), ev)
	case err == nil:
		return p.dialChecked(trialCtx, hopDialer{direct: set.dialer, up: up}, targets, ev)
	}
	if err != nil {
		return nil, err
	}
	return p.dialChecked(trialCtx, set.dialer, targets, ev)
}

// learnedOnly reports whether req is let through by learning alone: the
// Trial learns and no entry of its allowlist, as it is now, names it.
func (t *trial) learnedOnly(req *wire.Request) bool {
	_, ruled := t.allow.Load().Match(req.Host, req.Port)
	return t.learn && !ruled
}

// allDirect reports whether every target is in one of up's direct CIDRs.
func allDirect(up *uproxy.Proxy, targets []netip.AddrPort) bool {
	for _, a := range targets {
		if !up.DirectAddr(a.Addr()) {
			return false
		}
	}
	return len(targets) > 0
}

// dialUpstream asks the upstream proxy for a tunnel to target, a name it
// resolves itself: the guard sees no address of the destination.
func (p *Proxy) dialUpstream(trialCtx context.Context, up *uproxy.Proxy, target string, ev *record.Event) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(trialCtx, p.cfg.DialTimeout)
	defer cancel()
	t0 := time.Now()
	c, err := up.Dial(ctx, target)
	ev.Dial = time.Since(t0)
	if err != nil {
		return nil, err
	}
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		ev.Dialed = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	}
	ev.Detail = "through the upstream proxy " + up.Address() + ", which resolved the name"
	return c, nil
}

// hopDialer dials checked addresses through the upstream proxy, asking it
// for the address itself (never the name), or directly for those in its
// direct CIDRs.
type hopDialer struct {
	direct Dialer
	up     *uproxy.Proxy
}

// Dial implements Dialer.
func (h hopDialer) Dial(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
	if h.up.DirectAddr(addr.Addr()) {
		return h.direct.Dial(ctx, addr)
	}
	return h.up.Dial(ctx, addr.String())
}

// connectHostService dials the one host service the Trial has on the
// port asked for, at exactly its address and port; there is no DNS, no
// upstream proxy, and no other address or port of the host.
func (p *Proxy) connectHostService(trialCtx context.Context, t *trial, req *wire.Request, ev *record.Event) (net.Conn, error) {
	ap, ok := t.hosts[req.Port]
	if !ok {
		return nil, record.Deny(record.ReasonAddressDenied, "%s:%d: this Trial has no host service on port %d (a profile's host_services names the ports it may reach)", trialspec.HostServiceName, req.Port, req.Port)
	}
	if err := t.set.guard.CheckHostService(ap.Addr()); err != nil {
		return nil, err
	}
	d := net.Dialer{Control: func(_, address string, _ syscall.RawConn) error {
		// The dialer is handed ap and nothing else; this holds it to that.
		if got, err := netip.ParseAddrPort(address); err != nil || got != ap {
			return record.Deny(record.ReasonAddressDenied, "refusing to dial %q for the host service %s", address, ap)
		}
		return nil
	}}
	ctx, cancel := context.WithTimeout(trialCtx, p.cfg.DialTimeout)
	defer cancel()
	t0 := time.Now()
	network := "tcp4"
	if ap.Addr().Is6() {
		network = "tcp6"
	}
	c, err := d.DialContext(ctx, network, ap.String())
	ev.Dial = time.Since(t0)
	if err != nil {
		return nil, dialError(ctx, []error{err})
	}
	ev.Dialed = ap
	return c, nil
}
