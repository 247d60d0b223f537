//go:build linux

package bpf

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/netns"
	"golang.org/x/sys/unix"
)

var steerPool = netip.MustParsePrefix("127.100.0.0/16")

// dialIn connects to addr from inside ns and returns the connection's
// local address, or the dial's error.
func dialIn(t *testing.T, ns *netns.Namespace, addr string) (netip.AddrPort, error) {
	t.Helper()
	var local netip.AddrPort
	err := ns.Do(func() error {
		c, err := net.DialTimeout("tcp4", addr, 10*time.Second)
		if err != nil {
			return err
		}
		local = c.LocalAddr().(*net.TCPAddr).AddrPort()
		t.Cleanup(func() { _ = c.Close() })
		return nil
	})
	return local, err
}

// dialMapped connects an AF_INET6 socket to ip4 v4-mapped, as a client
// does with what getaddrinfo gives AF_INET6 and AI_V4MAPPED (Go's own
// dialer would open an AF_INET socket for it); the socket is closed when
// the test ends.
func dialMapped(t *testing.T, ip4 string, port int) error {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	t.Cleanup(func() { _ = unix.Close(fd) })
	return unix.Connect(fd, &unix.SockaddrInet6{Port: port, Addr: netip.MustParseAddr("::ffff:" + ip4).As16()})
}

// acceptSteered accepts one connection on ln, bounded in time.
func acceptSteered(t *testing.T, ln *net.TCPListener) net.Conn {
	t.Helper()
	_ = ln.SetDeadline(time.Now().Add(10 * time.Second))
	c, err := ln.Accept()
	if err != nil {
		t.Fatalf("accept on %s: %v", ln.Addr(), err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestPrivilegedSkLookup attaches the steer program to a fresh network
// namespace and shows that a connection to a pool address, on any port,
// lands in the one listener with the address dialled as its local address,
// even where a socket of the namespace's own listens on that address; that
// addresses outside the pool are left alone; and that without the listener,
// or after Close, the pool is refused, never handed to that other socket.
func TestPrivilegedSkLookup(t *testing.T) {
	privtest.Require(t)
	privtest.RequireKernel(t, features.HaveProgramType(ebpf.SkLookup)) // as Probe says
	ns, err := netns.Create(t.TempDir(), "steer")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Delete() })
	ctx := context.Background()
	// netns.Listen's listeners are plain TCP: sk_lookup cannot hand a
	// connection to an MPTCP one.
	l, err := ns.Listen(ctx, "tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := l.(*net.TCPListener)
	t.Cleanup(func() { _ = ln.Close() })
	// A socket the Trial could bind on a pool address, hoping to be
	// handed connections meant for the agent.
	o, err := ns.Listen(ctx, "tcp4", "127.100.0.9:80")
	if err != nil {
		t.Fatal(err)
	}
	own := o.(*net.TCPListener)
	t.Cleanup(func() { _ = own.Close() })

	s, err := AttachSteer(ns.Path, steerPool, ln)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })

	// The pool's first and last addresses, which no name is given, are
	// steered too: the agent refuses them, not a socket of the Trial's.
	for _, to := range []string{"127.100.0.1:80", "127.100.0.1:443", "127.100.0.2:22", "127.100.255.254:5432", "127.100.0.9:80", "127.100.0.3:1", "127.100.0.0:80", "127.100.255.255:80"} {
		client, err := dialIn(t, ns, to)
		if err != nil {
			t.Fatalf("dial %s: %v", to, err)
		}
		c := acceptSteered(t, ln)
		if got := c.LocalAddr().(*net.TCPAddr).AddrPort(); got.String() != to {
			t.Errorf("connection to %s accepted with local address %s", to, got)
		}
		if got := c.RemoteAddr().(*net.TCPAddr).AddrPort(); got != client {
			t.Errorf("connection to %s: accepted from %s, client is %s", to, got, client)
		}
	}
	// An IPv6 socket dialling a pool address v4-mapped (what getaddrinfo
	// gives AF_INET6 with AI_V4MAPPED) sends IPv4: steered alike.
	if err := ns.Do(func() error { return dialMapped(t, "127.100.0.7", 8080) }); err != nil {
		t.Fatalf("dial a v4-mapped pool address from an IPv6 socket: %v", err)
	}
	if got := acceptSteered(t, ln).LocalAddr().String(); got != "127.100.0.7:8080" {
		t.Errorf("v4-mapped connection accepted with local address %s, want 127.100.0.7:8080", got)
	}
	if n := pending(t, own); n != 0 {
		t.Fatalf("the namespace's own listener on a pool address got %d connections", n)
	}

	// UDP is not steered: with no socket of the namespace's on the
	// address, a datagram is refused (ICMP port unreachable).
	err = ns.Do(func() error {
		u, err := net.Dial("udp4", "127.100.0.1:53")
		if err != nil {
			return err
		}
		defer u.Close()
		_ = u.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := u.Write([]byte("x")); err != nil {
			return err
		}
		_, err = u.Read(make([]byte, 1))
		return err
	})
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("UDP to a pool address: %v, want connection refused", err)
	}
	// Outside the pool, the kernel's own lookup decides: nothing listens
	// on these, and the listener's own address is reached as itself.
	for _, to := range []string{"127.0.0.2:80", "127.101.0.1:80", "127.99.255.255:80"} {
		if _, err := dialIn(t, ns, to); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("dial %s outside the pool: %v, want connection refused", to, err)
		}
	}
	if _, err := dialIn(t, ns, ln.Addr().String()); err != nil {
		t.Fatalf("dial the listener's own address: %v", err)
	}
	if got := acceptSteered(t, ln).LocalAddr().String(); got != ln.Addr().String() {
		t.Errorf("the listener's own address accepted as %s", got)
	}

	// With the listener gone (the kernel takes it out of the map), the
	// pool is refused rather than handed to the namespace's own socket.
	_ = ln.Close()
	if _, err := dialIn(t, ns, "127.100.0.9:80"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial a pool address with no listener: %v, want connection refused", err)
	}
	if n := pending(t, own); n != 0 {
		t.Fatalf("with no listener, the namespace's own socket got %d connections", n)
	}

	// Detached, a pool address is an ordinary loopback address again.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := dialIn(t, ns, "127.100.0.9:80"); err != nil {
		t.Fatalf("after Close, dial the namespace's own listener: %v", err)
	}
	if n := pending(t, own); n != 1 {
		t.Fatalf("after Close, the namespace's own listener got %d connections, want 1", n)
	}
}

// pending counts the connections waiting on ln without blocking.
func pending(t *testing.T, ln *net.TCPListener) int {
	t.Helper()
	n := 0
	for {
		_ = ln.SetDeadline(time.Now().Add(50 * time.Millisecond))
		c, err := ln.Accept()
		if err != nil {
			return n
		}
		_ = c.Close()
		n++
	}
}

func TestSteerRefusesAPoolItCannotMean(t *testing.T) {
	for _, p := range []string{"10.0.0.0/16", "127.0.0.0/8", "127.0.0.0/24", "127.100.0.1/16", "::1/128", "0.0.0.0/0", "127.0.0.32/27", "127.0.0.53/32"} {
		if _, err := AttachSteer("/nonexistent", netip.MustParsePrefix(p), nil); err == nil {
			t.Errorf("AttachSteer accepted pool %s", p)
		}
	}
}

// The listener must take the IPv4 connections it is given: an IPv6-only
// one would have every pool connection refused, so AttachSteer says so
// instead. A dual-stack one takes them.
func TestPrivilegedSteerListenerFamily(t *testing.T) {
	privtest.Require(t)
	privtest.RequireKernel(t, features.HaveProgramType(ebpf.SkLookup))
	ns, err := netns.Create(t.TempDir(), "steerfam")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Delete() })
	listen := func(network, addr string) *net.TCPListener {
		t.Helper()
		var ln *net.TCPListener
		err := ns.Do(func() error {
			var lc net.ListenConfig
			lc.SetMultipathTCP(false)
			l, err := lc.Listen(context.Background(), network, addr)
			if err == nil {
				ln = l.(*net.TCPListener)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		return ln
	}

	v6only := listen("tcp6", "[::1]:0")
	if s, err := AttachSteer(ns.Path, steerPool, v6only); err == nil {
		_ = s.Close()
		t.Fatal("AttachSteer took an IPv6-only listener, which no pool connection can reach")
	} else if !strings.Contains(err.Error(), "IPv4") {
		t.Fatalf("AttachSteer with an IPv6-only listener: %v, want an error naming IPv4", err)
	}

	dual := listen("tcp", "[::]:0")
	s, err := AttachSteer(ns.Path, steerPool, dual)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if _, err := dialIn(t, ns, "127.100.0.1:443"); err != nil {
		t.Fatal(err)
	}
	got := acceptSteered(t, dual).LocalAddr().(*net.TCPAddr).AddrPort()
	if netip.AddrPortFrom(got.Addr().Unmap(), got.Port()).String() != "127.100.0.1:443" {
		t.Errorf("dual-stack listener accepted a pool connection as %s", got)
	}
}

// TestPrivilegedSteerPinned: a pinned Steer steers with no descriptor of
// its process open (the pins hold it: an agent's restart, and an agent
// of 1,000 Trials, need none), and a later OpenSteer adopts it, with a
// new listener, never detaching; Unpin ends it.
func TestPrivilegedSteerPinned(t *testing.T) {
	pin, ns := pinnedSteerWorld(t, "steerpin")
	listen := func() *net.TCPListener { return plainListener(t, ns) }
	first := listen()
	before := bpfFDs(t)
	if _, err := OpenSteer(pin, ns.Path, steerPool, first, nil); err != nil {
		t.Fatal(err)
	}
	if held := bpfFDs(t) - before; held != 0 {
		t.Errorf("a pinned Steer holds %d eBPF descriptors, want none", held)
	}
	id := pinnedLinkID(t, pin)
	if _, err := dialIn(t, ns, "127.100.0.1:443"); err != nil {
		t.Fatalf("pinned, with no descriptor held: %v", err)
	}
	_ = acceptSteered(t, first).Close()

	second := listen()
	s, err := OpenSteer(pin, ns.Path, steerPool, second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if held := bpfFDs(t) - before; held != 0 {
		t.Errorf("an adopted Steer holds %d eBPF descriptors, want none", held)
	}
	if again := pinnedLinkID(t, pin); again != id {
		t.Fatalf("adopted link %d, want the pinned link %d", again, id)
	}
	if _, err := dialIn(t, ns, "127.100.0.2:22"); err != nil {
		t.Fatal(err)
	}
	_ = acceptSteered(t, second).Close()
	if n := pending(t, first); n != 0 {
		t.Fatalf("the replaced listener got %d connections", n)
	}

	if err := errors.Join(s.Unpin(), s.Close()); err != nil {
		t.Fatal(err)
	}
	if _, err := dialIn(t, ns, "127.100.0.3:22"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("unpinned and closed, a pool connection: %v; want refused", err)
	}
}

// A program loaded ahead for another pool is never attached: with no
// pins to adopt, OpenSteer frees it and attaches one for its own pool,
// whose connections reach the listener.
func TestPrivilegedSteerLoadedForAnotherPoolUnused(t *testing.T) {
	pin, ns := pinnedSteerWorld(t, "steerother")
	ln := plainListener(t, ns)
	other, err := LoadSteer(netip.MustParsePrefix("127.200.0.0/16"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := OpenSteer(pin, ns.Path, steerPool, ln, other)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = errors.Join(s.Unpin(), s.Close()) })
	if fd := other.objs.TrialnetSteer.FD(); fd >= 0 {
		t.Errorf("the program loaded for another pool is still open (fd %d)", fd)
	}
	if _, err := dialIn(t, ns, "127.100.0.1:443"); err != nil {
		t.Fatalf("a connection to the pool, steered by what OpenSteer attached: %v", err)
	}
	_ = acceptSteered(t, ln).Close()
}

// A pinned steering that cannot be adopted (its map pin replaced by one it
// cannot use) is removed, not left attached in front of the steering the
// agent attaches instead: the pool's connections reach the new listener.
func TestPrivilegedSteerAdoptFailureLeavesOneProgram(t *testing.T) {
	pin, ns := pinnedSteerWorld(t, "steerbad")
	first, second := plainListener(t, ns), plainListener(t, ns)
	s, err := OpenSteer(pin, ns.Path, steerPool, first, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil { // pinned, it steers on to first
		t.Fatal(err)
	}
	wrong, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	if err := os.Remove(pin + "_map"); err != nil {
		t.Fatal(err)
	}
	if err := wrong.Pin(pin + "_map"); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenSteer(pin, ns.Path, steerPool, second, nil); err == nil {
		t.Fatal("a steer map pin of another type was adopted")
	}
	s, err = AttachSteer(ns.Path, steerPool, second) // as the agent does then
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	if _, err := dialIn(t, ns, "127.100.0.4:443"); err != nil {
		t.Fatal(err)
	}
	if n := pending(t, first); n != 0 {
		t.Fatalf("the stale pinned steering, still attached in front, took %d connections to the old listener", n)
	}
	_ = acceptSteered(t, second).Close()
}

// bpfFDs counts this process's eBPF descriptors (programs, maps, links,
// BTF).
func bpfFDs(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range fds {
		if to, _ := os.Readlink("/proc/self/fd/" + f.Name()); strings.HasPrefix(to, "anon_inode:bpf") || to == "anon_inode:btf" {
			n++
		}
	}
	return n
}

// pinnedLinkID is the id of the link pinned at pin+"_link".
func pinnedLinkID(t *testing.T, pin string) link.ID {
	t.Helper()
	lk, err := link.LoadPinnedLink(pin+"_link", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	info, err := lk.Info()
	if err != nil {
		t.Fatal(err)
	}
	return info.ID
}

// pinnedSteerWorld is a fresh namespace and a pin path for its steering,
// both removed after t.
func pinnedSteerWorld(t *testing.T, name string) (string, *netns.Namespace) {
	t.Helper()
	privtest.Require(t)
	privtest.RequireKernel(t, features.HaveProgramType(ebpf.SkLookup))
	if err := ensurePinDir(DefaultPinDir); err != nil {
		t.Fatal(err)
	}
	pin := DefaultPinDir + "/steer_test_" + strings.ReplaceAll(t.Name(), "/", "_")
	t.Cleanup(func() { _ = RemoveSteerPins(pin) })
	ns, err := netns.Create(t.TempDir(), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Delete() })
	return pin, ns
}

// plainListener listens on 127.0.0.1 in ns with plain TCP (a sockmap
// holds no MPTCP socket), closed after t.
func plainListener(t *testing.T, ns *netns.Namespace) *net.TCPListener {
	t.Helper()
	var ln *net.TCPListener
	if err := ns.Do(func() error {
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		l, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
		if err == nil {
			ln = l.(*net.TCPListener)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// TestPrivilegedLoadedSteerPinned: a program loaded ahead, before its
// namespace is known (an agent's for a container it will adopt, an
// embedded agent's for its Trial), is the one OpenSteer attaches and
// pins, and steers, holding no descriptor after; where pins of the
// namespace are there to adopt, it is closed unused.
func TestPrivilegedLoadedSteerPinned(t *testing.T) {
	pin, ns := pinnedSteerWorld(t, "steerload")
	before := bpfFDs(t)
	loaded, err := LoadSteer(steerPool)
	if err != nil {
		t.Fatal(err)
	}
	info, err := loaded.objs.TrialnetSteer.Info()
	if err != nil {
		t.Fatal(err)
	}
	want, _ := info.ID()
	first := plainListener(t, ns)
	if _, err := OpenSteer(pin, ns.Path, steerPool, first, loaded); err != nil {
		t.Fatal(err)
	}
	if held := bpfFDs(t) - before; held != 0 {
		t.Errorf("a Steer loaded ahead and pinned holds %d eBPF descriptors, want none", held)
	}
	lk, err := link.LoadPinnedLink(pin+"_link", nil)
	if err != nil {
		t.Fatal(err)
	}
	li, err := lk.Info()
	_ = lk.Close()
	if err != nil {
		t.Fatal(err)
	}
	if li.Program != want {
		t.Errorf("the pinned link runs program %d, not %d loaded ahead", li.Program, want)
	}
	id := pinnedLinkID(t, pin)
	if _, err := dialIn(t, ns, "127.100.0.1:443"); err != nil {
		t.Fatalf("loaded ahead, then attached: %v", err)
	}
	_ = acceptSteered(t, first).Close()

	unused, err := LoadSteer(steerPool)
	if err != nil {
		t.Fatal(err)
	}
	second := plainListener(t, ns)
	s, err := OpenSteer(pin, ns.Path, steerPool, second, unused)
	if err != nil {
		t.Fatal(err)
	}
	if again := pinnedLinkID(t, pin); again != id {
		t.Fatalf("link %d, want the pinned link %d adopted", again, id)
	}
	if held := bpfFDs(t) - before; held != 0 {
		t.Errorf("the program loaded ahead and not used left %d eBPF descriptors open, want none", held)
	}
	if _, err := dialIn(t, ns, "127.100.0.2:22"); err != nil {
		t.Fatal(err)
	}
	_ = acceptSteered(t, second).Close()
	if err := errors.Join(s.Unpin(), s.Close()); err != nil {
		t.Fatal(err)
	}
}
