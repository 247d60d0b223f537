//go:build linux

// Package testhost makes a "remote" host for tests: its own network
// namespace joined to the caller's by a veth pair, with TCP and UDP
// canaries that record what actually arrives. Tests send traffic nowhere
// else.
package testhost

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trialnet/trialnet/netns"
	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Port is where the canaries listen (TCP and UDP, IPv4 and IPv6).
const Port = 8080

// Host is a test host reachable from the caller's namespace.
type Host struct {
	NS       *netns.Namespace
	Addr4    netip.Addr // the test host's IPv4 address
	Addr6    netip.Addr // the test host's IPv6 address
	Local4   netip.Addr // the caller's side of the veth
	arrivals atomic.Int64
	wg       sync.WaitGroup
}

// Arrivals counts connections accepted and datagrams received so far.
func (h *Host) Arrivals() int64 { return h.arrivals.Load() }

// WaitArrivals waits, bounded by d, until at least n arrivals were seen.
func (h *Host) WaitArrivals(n int64, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for h.arrivals.Load() < n {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// AddrPort4 is the IPv4 canary endpoint.
func (h *Host) AddrPort4() netip.AddrPort { return netip.AddrPortFrom(h.Addr4, Port) }

// AddrPort6 is the IPv6 canary endpoint.
func (h *Host) AddrPort6() netip.AddrPort { return netip.AddrPortFrom(h.Addr6, Port) }

// New creates the test host; t.Cleanup removes the namespace and the veth.
// subnet picks 198.18.<subnet>.0/24 and fd7a:7472:<subnet>::/64 so that
// several hosts can coexist.
func New(t testing.TB, subnet uint8) *Host {
	t.Helper()
	var b [3]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	h := &Host{
		Addr4:  netip.AddrFrom4([4]byte{198, 18, subnet, 2}),
		Local4: netip.AddrFrom4([4]byte{198, 18, subnet, 1}),
		Addr6:  netip.MustParseAddr(fmt.Sprintf("fd7a:7472:%x::2", subnet)),
	}
	ns, err := netns.Create(t.TempDir(), "th-"+suffix)
	if err != nil {
		t.Fatal(err)
	}
	h.NS = ns
	t.Cleanup(func() { _ = ns.Delete() })

	hostSide, peerSide := "tnh"+suffix, "tnp"+suffix
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostSide}, PeerName: peerSide}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("create veth: %v", err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(veth) })
	peer, err := netlink.LinkByName(peerSide)
	if err != nil {
		t.Fatal(err)
	}
	nsh, err := vns.GetFromPath(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	if err := netlink.LinkSetNsFd(peer, int(nsh)); err != nil {
		t.Fatalf("move veth peer: %v", err)
	}
	addAddr(t, nil, hostSide, fmt.Sprintf("198.18.%d.1/24", subnet))
	addAddr(t, nil, hostSide, fmt.Sprintf("fd7a:7472:%x::1/64", subnet))
	in, err := netlink.NewHandleAt(nsh)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	addAddr(t, in, peerSide, h.Addr4.String()+"/24")
	addAddr(t, in, peerSide, h.Addr6.String()+"/64")

	h.serve(t)
	return h
}

func addAddr(t testing.TB, hd *netlink.Handle, link, cidr string) {
	t.Helper()
	if hd == nil {
		hd = &netlink.Handle{}
	}
	l, err := hd.LinkByName(link)
	if err != nil {
		t.Fatal(err)
	}
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatal(err)
	}
	a.Flags = unix.IFA_F_NODAD // usable at once, no duplicate address detection wait
	if err := hd.AddrAdd(l, a); err != nil {
		t.Fatalf("add %s to %s: %v", cidr, link, err)
	}
	if err := hd.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
}

// serve starts the canaries inside the test host's namespace.
func (h *Host) serve(t testing.TB) {
	ctx := context.Background()
	var closers []func() error
	t.Cleanup(func() {
		for _, c := range closers {
			_ = c()
		}
		h.wg.Wait()
	})
	for _, addr := range []netip.Addr{h.Addr4, h.Addr6} {
		ap := netip.AddrPortFrom(addr, Port).String()
		ln, err := h.NS.Listen(ctx, "tcp", ap)
		if err != nil {
			t.Fatal(err)
		}
		closers = append(closers, ln.Close)
		var pc net.PacketConn
		err = h.NS.Do(func() error {
			var err error
			pc, err = net.ListenPacket("udp", ap)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		closers = append(closers, pc.Close)
		h.wg.Add(2)
		go func() {
			defer h.wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				h.arrivals.Add(1)
				_, _ = c.Write([]byte("canary\n"))
				_ = c.Close()
			}
		}()
		go func() {
			defer h.wg.Done()
			buf := make([]byte, 2048)
			for {
				if _, _, err := pc.ReadFrom(buf); err != nil {
					return
				}
				h.arrivals.Add(1)
			}
		}()
	}
}
