//go:build linux

package proxy

import (
	"context"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	trialspec "github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/guard"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testhost"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/netns"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/resolve"
	"github.com/vishvananda/netlink"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The host-address set follows addresses as they are added and removed.
// It watches a namespace of the test's own, so the host is not touched.
func TestPrivilegedHostAddrsFollowChanges(t *testing.T) {
	_, h, nh, lo := namespaceOfItsOwn(t, "proxyaddrs")
	watch := watchHostAddrs(t, h)
	if ok, _ := watch.Contains(netip.MustParseAddr("127.0.0.1")); !ok {
		t.Fatalf("initial list misses lo's 127.0.0.1: %v", watch.Addrs())
	}
	g := guard.New(nil, watch)
	for _, s := range []string{"93.184.216.77/32", "2a00:1450::77/128"} {
		a, _ := netlink.ParseAddr(s)
		a.Flags = unix.IFA_F_NODAD
		ip := netip.MustParsePrefix(s).Addr()
		if g.Check(ip) != nil {
			t.Fatalf("%s refused before it was added", ip)
		}
		if err := nh.AddrAdd(lo, a); err != nil {
			t.Fatal(err)
		}
		testkit.WaitFor(t, ip.String()+" to appear", 5*time.Second, func() bool { ok, _ := watch.Contains(ip); return ok })
		if err := g.Check(ip); record.ReasonOf(err) != record.ReasonAddressDenied {
			t.Fatalf("%s is now this host's own, got %v", ip, err)
		}
		if err := nh.AddrDel(lo, a); err != nil {
			t.Fatal(err)
		}
		testkit.WaitFor(t, ip.String()+" to disappear", 5*time.Second, func() bool { ok, _ := watch.Contains(ip); return !ok })
	}
}

// namespaceOfItsOwn makes a network namespace for the test (removed at
// cleanup), and returns it, a handle on it, a netlink handle in it and
// its loopback link.
func namespaceOfItsOwn(t *testing.T, name string) (*netns.Namespace, vns.NsHandle, *netlink.Handle, netlink.Link) {
	t.Helper()
	privtest.Require(t)
	ns, err := netns.Create(t.TempDir(), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Delete() })
	h, err := vns.GetFromPath(ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nh.Close)
	lo, err := nh.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	return ns, h, nh, lo
}

// The production dialer's Control hook refuses a guarded address even
// when the caller skipped the check: nothing arrives at the listener.
func TestNetDialerControlRechecks(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- struct{}{}
			_ = c.Close()
		}
	}()
	d := newNetDialer(guard.New(nil, nil))
	ap := netip.MustParseAddrPort(ln.Addr().String())
	for _, a := range []netip.AddrPort{ap, netip.AddrPortFrom(netip.MustParseAddr("::ffff:127.0.0.1"), ap.Port())} {
		c, err := d.Dial(context.Background(), a)
		if err == nil {
			_ = c.Close()
			t.Fatalf("dialed %s", a)
		}
		if record.ReasonOf(err) != record.ReasonAddressDenied {
			t.Fatalf("%s: %v, want address_denied", a, err)
		}
	}
	select {
	case <-accepted:
		t.Fatal("a connection arrived at the refused address")
	case <-time.After(100 * time.Millisecond):
	}
}

// Without an injected dialer or host set, a Proxy dials for real (here a
// test host in its own namespace, allowed by CIDR) through the guarded
// production dialer.
func TestPrivilegedProductionDial(t *testing.T) {
	privtest.Require(t)
	th := testhost.NewT(t, 210)
	ds := newDNSServer(t)
	ds.set("host.example.com", 60, th.Addr4.String(), th.Addr6.String())
	res, _ := resolve.NewDNSResolver([]string{ds.Addr})
	p, err := New(Config{ProxySettings: config.ProxySettings{Resolver: res, AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15"), netip.MustParsePrefix("fd7a:7472::/32")}}})
	if err != nil {
		t.Fatal(err)
	}
	allow, _ := allow.Parse([]string{"host.example.com:8080"}, false)
	if err := p.AddTrial(TrialPolicy{Spec: trialspec.Spec{ID: "t"}, Allow: allow}); err != nil {
		t.Fatal(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go func() { _ = p.Serve(ln, "t") }()
	t.Cleanup(func() { _ = p.Close() })
	tp := &testProxy{Proxy: p, addr: ln.Addr().String()}
	resp, _, _ := tp.connect(t, connectHead("host.example.com:8080"))
	if resp.StatusCode != 200 {
		t.Fatalf("%s: %s", resp.Status, resp.Header.Get("Trialnet-Detail"))
	}
	if !th.WaitArrivals(1, 5*time.Second) {
		t.Fatal("the test host saw no connection")
	}
}

// A route of type local makes the host answer for a whole prefix that no
// interface carries (AnyIP): a listener on 0.0.0.0 accepts connections
// to any address in it. The set holds every such route, in any table,
// listed before the watch began or added after, and lets it go when the
// route goes.
func TestPrivilegedHostAddrsLocalRoutes(t *testing.T) {
	ns, h, nh, lo := namespaceOfItsOwn(t, "proxylocal")
	local := func(cidr string, table int) *netlink.Route {
		_, dst, err := net.ParseCIDR(cidr)
		if err != nil {
			t.Fatal(err)
		}
		return &netlink.Route{LinkIndex: lo.Attrs().Index, Dst: dst, Type: unix.RTN_LOCAL, Table: table, Scope: unix.RT_SCOPE_HOST}
	}
	before := local("198.51.100.0/24", 100) // listed, not followed: in a table of its own
	if err := nh.RouteAdd(before); err != nil {
		t.Fatal(err)
	}
	watch := watchHostAddrs(t, h)
	if ok, _ := watch.Contains(netip.MustParseAddr("198.51.100.200")); !ok {
		t.Fatal("a local route in table 100, there before the watch, is not in the set")
	}
	g := guard.New(nil, watch)
	for _, c := range []struct{ cidr, addr string }{{"93.184.216.0/24", "93.184.216.9"}, {"2a00:1450:4001::/64", "2a00:1450:4001::9"}} {
		ip := netip.MustParseAddr(c.addr)
		if err := g.Check(ip); err != nil {
			t.Fatalf("%s refused before its local route was added: %v", ip, err)
		}
		r := local(c.cidr, unix.RT_TABLE_LOCAL)
		if err := nh.RouteAdd(r); err != nil {
			t.Fatal(err)
		}
		if ip.Is4() {
			reachesHost(t, ns, ip)
		}
		testkit.WaitFor(t, ip.String()+" to appear", 5*time.Second, func() bool { ok, _ := watch.Contains(ip); return ok })
		if err := g.Check(ip); record.ReasonOf(err) != record.ReasonAddressDenied {
			t.Fatalf("%s is under a local route now, got %v", ip, err)
		}
		if err := nh.RouteDel(r); err != nil {
			t.Fatal(err)
		}
		testkit.WaitFor(t, ip.String()+" to disappear", 5*time.Second, func() bool { ok, _ := watch.Contains(ip); return !ok })
	}
}

// reachesHost shows why a local route matters: inside ns, a listener on
// the unspecified address accepts a connection to ip.
func reachesHost(t *testing.T, ns *netns.Namespace, ip netip.Addr) {
	t.Helper()
	err := ns.Do(func() error {
		ln, err := net.Listen("tcp4", "0.0.0.0:0")
		if err != nil {
			return err
		}
		defer ln.Close()
		port := ln.Addr().(*net.TCPAddr).Port
		c, err := net.DialTimeout("tcp", netip.AddrPortFrom(ip, uint16(port)).String(), 2*time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
	if err != nil {
		t.Fatalf("a connection to %s inside the namespace: %v; want it accepted by a listener on 0.0.0.0", ip, err)
	}
}

// The broadcast and anycast routes the kernel adds beside an interface's
// addresses deliver to the host too: a subnet's broadcast address, and,
// where the host forwards IPv6, the subnet-router anycast address. They
// are in the set, so the guard refuses them as the host's own (an
// attacker's review found them judged public, though the kernel then
// failed the dial).
func TestPrivilegedHostAddrsBroadcastAndAnycast(t *testing.T) {
	ns, h, nh, _ := namespaceOfItsOwn(t, "proxybcast")
	if err := ns.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0)
	}); err != nil {
		t.Fatal(err)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "bc0"}, PeerName: "bc1"}
	if err := nh.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	watch := watchHostAddrs(t, h)
	g := guard.New(nil, watch)
	broadcast, anycast := netip.MustParseAddr("93.184.216.255"), netip.MustParseAddr("2a00:1450:4001::")
	for _, ip := range []netip.Addr{broadcast, anycast} {
		if err := g.Check(ip); err != nil {
			t.Fatalf("%s refused before any address was added: %v", ip, err)
		}
	}
	for _, cidr := range []string{"93.184.216.1/24", "2a00:1450:4001::1/64"} {
		a, err := netlink.ParseAddr(cidr)
		if err != nil {
			t.Fatal(err)
		}
		a.Flags = unix.IFA_F_NODAD
		if err := nh.AddrAdd(veth, a); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"bc0", "bc1"} {
		l, err := nh.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := nh.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	for _, ip := range []netip.Addr{broadcast, anycast} {
		testkit.WaitFor(t, ip.String()+" to appear", 5*time.Second, func() bool { ok, _ := watch.Contains(ip); return ok })
		if err := g.Check(ip); record.ReasonOf(err) != record.ReasonAddressDenied {
			t.Errorf("%s delivers to the host now, got %v", ip, err)
		}
	}
}

// watchHostAddrs follows the addresses of the namespace h until the test
// ends.
func watchHostAddrs(t *testing.T, h vns.NsHandle) *guard.HostAddrs {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	watch, err := guard.WatchHostAddrs(ctx, h)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); watch.Wait() })
	return watch
}
