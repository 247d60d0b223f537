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
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
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
	closers  []func() error
	veth     netlink.Link
	nsDir    string
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

// New creates the test host; Close removes its namespace and veth.
// subnet picks 198.18.<subnet>.0/24 and fd7a:7472:<subnet>::/64 so that
// several hosts can coexist. Packages' tests run at the same time, so each
// package has subnets of its own (within one, tests run one after another):
// sandbox 61-64, escape 171-174, proxybench 180, clients 190, demo 200,
// proxy 210, cmd/trialnet 211, agent 221-239, systembench 240, load 241, containers 242.
func New(subnet uint8) (_ *Host, err error) {
	var b [3]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	h := &Host{
		Addr4:  netip.AddrFrom4([4]byte{198, 18, subnet, 2}),
		Local4: netip.AddrFrom4([4]byte{198, 18, subnet, 1}),
		Addr6:  netip.MustParseAddr(fmt.Sprintf("fd7a:7472:%x::2", subnet)),
	}
	defer func() {
		if err != nil {
			h.Close()
		}
	}()
	h.nsDir, err = os.MkdirTemp("", "trialnet-testhost-")
	if err != nil {
		return nil, err
	}
	if h.NS, err = netns.Create(h.nsDir, "th-"+suffix); err != nil {
		return nil, err
	}
	hostSide, peerSide := "tnh"+suffix, "tnp"+suffix
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hostSide}, PeerName: peerSide}
	if err := netlink.LinkAdd(veth); err != nil {
		return nil, fmt.Errorf("create veth: %w", err)
	}
	h.veth = veth
	peer, err := netlink.LinkByName(peerSide)
	if err != nil {
		return nil, err
	}
	nsh, err := vns.GetFromPath(h.NS.Path)
	if err != nil {
		return nil, err
	}
	defer nsh.Close()
	if err := netlink.LinkSetNsFd(peer, int(nsh)); err != nil {
		return nil, fmt.Errorf("move veth peer: %w", err)
	}
	in, err := netlink.NewHandleAt(nsh)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	for _, a := range []struct {
		hd         *netlink.Handle
		link, cidr string
	}{
		{&netlink.Handle{}, hostSide, h.Local4.String() + "/24"},
		{&netlink.Handle{}, hostSide, fmt.Sprintf("fd7a:7472:%x::1/64", subnet)},
		{in, peerSide, h.Addr4.String() + "/24"},
		{in, peerSide, h.Addr6.String() + "/64"},
	} {
		if err := addAddr(a.hd, a.link, a.cidr); err != nil {
			return nil, err
		}
	}
	return h, h.serve()
}

// NewT is New for a test, with t.Cleanup removing everything.
func NewT(t testing.TB, subnet uint8) *Host {
	t.Helper()
	h, err := New(subnet)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// Close stops the canaries and removes the veth and the namespace.
func (h *Host) Close() {
	for _, c := range h.closers {
		_ = c()
	}
	h.closers = nil
	h.wg.Wait()
	if h.veth != nil {
		// By name: the struct given to LinkAdd carries no index. Deleting
		// one end removes the pair even while sockets keep the test
		// host's namespace alive.
		if l, err := netlink.LinkByName(h.veth.Attrs().Name); err == nil {
			_ = netlink.LinkDel(l)
		}
	}
	if h.NS != nil {
		_ = h.NS.Delete()
	}
	if h.nsDir != "" {
		_ = os.Remove(h.nsDir)
	}
}

func addAddr(hd *netlink.Handle, link, cidr string) error {
	l, err := hd.LinkByName(link)
	if err != nil {
		return err
	}
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		return err
	}
	a.Flags = unix.IFA_F_NODAD // usable at once, no duplicate address detection wait
	if err := hd.AddrAdd(l, a); err != nil {
		return fmt.Errorf("add %s to %s: %w", cidr, link, err)
	}
	return hd.LinkSetUp(l)
}

// serve starts the canaries inside the test host's namespace.
func (h *Host) serve() error {
	ctx := context.Background()
	for _, addr := range []netip.Addr{h.Addr4, h.Addr6} {
		ap := netip.AddrPortFrom(addr, Port).String()
		ln, err := h.NS.Listen(ctx, "tcp", ap)
		if err != nil {
			return err
		}
		h.closers = append(h.closers, ln.Close)
		var pc net.PacketConn
		err = h.NS.Do(func() error {
			var err error
			pc, err = net.ListenPacket("udp", ap)
			return err
		})
		if err != nil {
			return err
		}
		h.closers = append(h.closers, pc.Close)
		h.wg.Add(2)
		go func() {
			defer h.wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				h.arrivals.Add(1)
				_, _ = c.Write([]byte("canary: you reached the test host\n"))
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
	return nil
}

// CountAccepts accepts on ln until it is closed, counting each
// connection in n (if not nil) and closing it at once.
func CountAccepts(ln net.Listener, n *atomic.Int64) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		if n != nil {
			n.Add(1)
		}
		_ = c.Close()
	}
}

// Echo accepts on ln until it is closed, and sends every connection back
// what it reads, half-closing when its client does.
func Echo(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
		}()
	}
}

// Received counts what reached the test host's namespace from anywhere:
// TCP connections it accepted (PassiveOpens, any port, listener or not
// counted once a handshake completes) and UDP datagrams it received,
// delivered or not (InDatagrams, NoPorts, InErrors), from the kernel's
// own counters for the namespace. A difference of zero between two calls
// means nothing new arrived, whatever the port.
func (h *Host) Received() (uint64, error) {
	var snmp []byte
	if err := h.NS.Do(func() (err error) { snmp, err = os.ReadFile("/proc/thread-self/net/snmp"); return }); err != nil {
		return 0, err
	}
	want := map[string][]string{"Tcp:": {"PassiveOpens"}, "Udp:": {"InDatagrams", "NoPorts", "InErrors"}}
	var sum uint64
	lines := strings.Split(string(snmp), "\n")
	for i := 0; i+1 < len(lines); i += 2 {
		names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(names) == 0 || len(names) != len(values) || names[0] != values[0] {
			return 0, fmt.Errorf("/proc/net/snmp: unexpected lines %q, %q", lines[i], lines[i+1])
		}
		for j, n := range names {
			if slices.Contains(want[names[0]], n) {
				v, err := strconv.ParseUint(values[j], 10, 64)
				if err != nil {
					return 0, fmt.Errorf("/proc/net/snmp %s%s: %w", names[0], n, err)
				}
				sum += v
			}
		}
	}
	return sum, nil
}
