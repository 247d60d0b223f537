//go:build linux

package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
)

// HostAddrs is the set of addresses configured on this host's interfaces,
// learned with netlink and kept current as addresses come and go. If the
// netlink subscription breaks (for example the kernel drops events under
// load), the set is unknown until it has been listed again, and Contains
// reports an error so that the guard refuses rather than guesses.
type HostAddrs struct {
	mu    sync.RWMutex
	addrs map[netip.Addr]struct{}
	stale error // non-nil while the set is being re-learned
	wg    sync.WaitGroup
}

// WatchHostAddrs learns the addresses of the network namespace ns
// (vns.None() for the caller's) and follows changes until ctx ends.
// It returns once the initial list is known.
func WatchHostAddrs(ctx context.Context, ns vns.NsHandle) (*HostAddrs, error) {
	h := &HostAddrs{}
	ch, stop, err := h.subscribe(ns)
	if err != nil {
		return nil, fmt.Errorf("learn the host's addresses with netlink: %w", err)
	}
	h.wg.Add(1)
	go h.follow(ctx, ns, ch, stop)
	return h, nil
}

// subscribe subscribes to address events first and lists second, so no
// change between the two is lost; replaying queued events over the list
// converges to the kernel's state.
func (h *HostAddrs) subscribe(ns vns.NsHandle) (<-chan netlink.AddrUpdate, chan struct{}, error) {
	ch := make(chan netlink.AddrUpdate, 256)
	stop := make(chan struct{})
	opts := netlink.AddrSubscribeOptions{ReceiveBufferSize: 1 << 20}
	if ns.IsOpen() {
		opts.Namespace = &ns
	}
	if err := netlink.AddrSubscribeWithOptions(ch, stop, opts); err != nil {
		close(stop)
		return nil, nil, err
	}
	addrs, err := listAddrs(ns)
	if err != nil {
		close(stop)
		return nil, nil, err
	}
	h.mu.Lock()
	h.addrs, h.stale = addrs, nil
	h.mu.Unlock()
	return ch, stop, nil
}

func listAddrs(ns vns.NsHandle) (map[netip.Addr]struct{}, error) {
	hd := &netlink.Handle{}
	if ns.IsOpen() {
		var err error
		if hd, err = netlink.NewHandleAt(ns); err != nil {
			return nil, err
		}
		defer hd.Close()
	}
	var list []netlink.Addr
	var err error
	for range 5 {
		if list, err = hd.AddrList(nil, netlink.FAMILY_ALL); !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	out := make(map[netip.Addr]struct{}, len(list))
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out[ip.Unmap()] = struct{}{}
		}
	}
	return out, nil
}

func (h *HostAddrs) follow(ctx context.Context, ns vns.NsHandle, ch <-chan netlink.AddrUpdate, stop chan struct{}) {
	defer h.wg.Done()
	for {
		select {
		case <-ctx.Done():
			close(stop)
			for range ch { // the library closes ch once its socket is closed
			}
			return
		case u, ok := <-ch:
			if ok {
				h.apply(u)
				continue
			}
		}
		// The subscription broke: unknown until listed again.
		h.mu.Lock()
		h.stale = errors.New("the netlink address subscription broke; re-learning the host's addresses")
		h.mu.Unlock()
		close(stop)
		for {
			var err error
			if ch, stop, err = h.subscribe(ns); err == nil {
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

// Contains implements AddrSet.
func (h *HostAddrs) Contains(a netip.Addr) (bool, error) {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.stale != nil {
		return false, h.stale
	}
	_, ok := h.addrs[a.Unmap().WithZone("")]
	return ok, nil
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
