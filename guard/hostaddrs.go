//go:build linux

package guard

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// HostAddrs is the set of addresses at which this host itself answers,
// learned with netlink and kept current: the addresses of its interfaces,
// and every route of type local in any table, so an AnyIP prefix ("ip
// route add local 198.51.100.0/24 dev lo"), which makes the host answer
// for a whole range it configured on no interface, is refused too; and
// the broadcast and anycast routes the kernel adds beside an interface's
// addresses (a subnet's broadcast address; IPv6's subnet-router anycast,
// where the host forwards), which deliver to the host itself: refused
// here as its own, where the kernel would only have failed the dial. If a
// netlink subscription breaks (for example the kernel drops events under
// load), the set is unknown until it has been listed again, and Contains
// reports an error so that the guard refuses rather than guesses.
type HostAddrs struct {
	mu     sync.RWMutex
	addrs  map[netip.Addr]struct{}
	locals map[localRoute]struct{}
	// local and wide are locals as one lookup: single addresses, and the
	// prefixes wider than one (few: 127.0.0.0/8, AnyIP ranges).
	local map[netip.Addr]struct{}
	wide  []netip.Prefix
	stale error // non-nil while the set is being re-learned
	wg    sync.WaitGroup
}

// localRoute is a route to the host itself (local, broadcast, anycast):
// its table and destination.
type localRoute struct {
	table int
	dst   netip.Prefix
}

// WatchHostAddrs learns the addresses of the network namespace ns
// (vns.None() for the caller's) and follows changes until ctx ends.
// It returns once the initial list is known.
func WatchHostAddrs(ctx context.Context, ns vns.NsHandle) (*HostAddrs, error) {
	h := &HostAddrs{}
	sub, err := h.subscribe(ns)
	if err != nil {
		return nil, fmt.Errorf("learn the host's addresses with netlink: %w", err)
	}
	h.wg.Add(1)
	go h.follow(ctx, ns, sub)
	return h, nil
}

// subscription is one pair of netlink subscriptions, addresses and
// routes, ended together by closing stop.
type subscription struct {
	addrs  chan netlink.AddrUpdate
	routes chan netlink.RouteUpdate
	stop   chan struct{}
}

// subscribe subscribes to address and route events first and lists
// second, so no change between the two is lost; replaying queued events
// over the lists converges to the kernel's state.
func (h *HostAddrs) subscribe(ns vns.NsHandle) (*subscription, error) {
	sub := &subscription{addrs: make(chan netlink.AddrUpdate, 256), routes: make(chan netlink.RouteUpdate, 256), stop: make(chan struct{})}
	aopts := netlink.AddrSubscribeOptions{ReceiveBufferSize: 1 << 20}
	ropts := netlink.RouteSubscribeOptions{ReceiveBufferSize: 1 << 20}
	if ns.IsOpen() {
		aopts.Namespace, ropts.Namespace = &ns, &ns
	}
	if err := netlink.AddrSubscribeWithOptions(sub.addrs, sub.stop, aopts); err != nil {
		close(sub.stop)
		return nil, err
	}
	if err := netlink.RouteSubscribeWithOptions(sub.routes, sub.stop, ropts); err != nil {
		// The library took no hold of routes: only addrs will close.
		close(sub.stop)
		for range sub.addrs {
		}
		return nil, err
	}
	addrs, locals, err := list(ns)
	if err != nil {
		sub.end()
		return nil, err
	}
	h.mu.Lock()
	h.addrs, h.locals, h.stale = addrs, locals, nil
	h.index()
	h.mu.Unlock()
	return sub, nil
}

// end closes both subscriptions and waits for their channels to close.
func (s *subscription) end() {
	close(s.stop)
	for range s.addrs { // the library closes each channel once its socket is closed
	}
	for range s.routes {
	}
}

// list reads the addresses and the routes to the host itself of every
// table.
func list(ns vns.NsHandle) (map[netip.Addr]struct{}, map[localRoute]struct{}, error) {
	hd := &netlink.Handle{}
	if ns.IsOpen() {
		var err error
		if hd, err = netlink.NewHandleAt(ns); err != nil {
			return nil, nil, err
		}
		defer hd.Close()
	}
	var list []netlink.Addr
	var routes []netlink.Route
	var err error
	for range 5 {
		if list, err = hd.AddrList(nil, netlink.FAMILY_ALL); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, nil, err
	}
	filter := &netlink.Route{Table: unix.RT_TABLE_UNSPEC} // every table; toLocalRoute keeps the host's own
	for range 5 {
		if routes, err = hd.RouteListFiltered(netlink.FAMILY_ALL, filter, netlink.RT_FILTER_TABLE); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("list the local routes: %w", err)
	}
	addrs := make(map[netip.Addr]struct{}, len(list))
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			addrs[ip.Unmap()] = struct{}{}
		}
	}
	locals := make(map[localRoute]struct{}, len(routes))
	for _, r := range routes {
		if lr, ok := toLocalRoute(r); ok {
			locals[lr] = struct{}{}
		}
	}
	return addrs, locals, nil
}

// toLocalRoute is r's table and destination if r delivers to the host
// itself: a route of type local, broadcast or anycast.
func toLocalRoute(r netlink.Route) (localRoute, bool) {
	if r.Type != unix.RTN_LOCAL && r.Type != unix.RTN_BROADCAST && r.Type != unix.RTN_ANYCAST || r.Dst == nil {
		return localRoute{}, false
	}
	ip, ok := netip.AddrFromSlice(r.Dst.IP)
	if !ok {
		return localRoute{}, false
	}
	ones, _ := r.Dst.Mask.Size()
	ip = ip.Unmap()
	if ip.Is4() && ones > 32 {
		ones -= 96
	}
	p, err := ip.Prefix(ones)
	if err != nil {
		return localRoute{}, false
	}
	return localRoute{table: r.Table, dst: p}, true
}

// index rebuilds local and wide from locals; h.mu is held.
func (h *HostAddrs) index() {
	h.local, h.wide = make(map[netip.Addr]struct{}, len(h.locals)), h.wide[:0]
	for lr := range h.locals {
		if lr.dst.IsSingleIP() {
			h.local[lr.dst.Addr()] = struct{}{}
		} else {
			h.wide = append(h.wide, lr.dst)
		}
	}
}

func (h *HostAddrs) follow(ctx context.Context, ns vns.NsHandle, sub *subscription) {
	defer h.wg.Done()
	for {
		select {
		case <-ctx.Done():
			sub.end()
			return
		case u, ok := <-sub.addrs:
			if ok {
				h.apply(u)
				continue
			}
		case u, ok := <-sub.routes:
			if ok {
				h.applyRoute(u)
				continue
			}
		}
		// A subscription broke: unknown until listed again.
		h.mu.Lock()
		h.stale = errors.New("the netlink subscription to addresses and routes broke; re-learning the host's addresses")
		h.mu.Unlock()
		sub.end()
		for {
			var err error
			if sub, err = h.subscribe(ns); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
}

func (h *HostAddrs) apply(u netlink.AddrUpdate) {
	ip, ok := netip.AddrFromSlice(u.LinkAddress.IP)
	if !ok {
		return
	}
	ip = ip.Unmap()
	h.mu.Lock()
	if u.NewAddr {
		h.addrs[ip] = struct{}{}
	} else {
		delete(h.addrs, ip)
	}
	h.mu.Unlock()
}

func (h *HostAddrs) applyRoute(u netlink.RouteUpdate) {
	lr, ok := toLocalRoute(u.Route)
	if !ok {
		return
	}
	h.mu.Lock()
	if u.Type == unix.RTM_NEWROUTE {
		h.locals[lr] = struct{}{}
	} else {
		delete(h.locals, lr)
	}
	h.index()
	h.mu.Unlock()
}

// Contains implements AddrSet.
func (h *HostAddrs) Contains(a netip.Addr) (bool, error) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.stale != nil {
		return false, h.stale
	}
	a = a.Unmap().WithZone("")
	if _, ok := h.addrs[a]; ok {
		return true, nil
	}
	if _, ok := h.local[a]; ok {
		return true, nil
	}
	for _, p := range h.wide {
		if p.Contains(a) {
			return true, nil
		}
	}
	return false, nil
}

// Addrs returns a snapshot of the set.
func (h *HostAddrs) Addrs() []netip.Addr {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make([]netip.Addr, 0, len(h.addrs))
	for a := range h.addrs {
		out = append(out, a)
	}
	return out
}

// Wait waits until the watcher has stopped after its context ended.
func (h *HostAddrs) Wait() { h.wg.Wait() }
