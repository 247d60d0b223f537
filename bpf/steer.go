//go:build linux

package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"syscall"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Steer is one network namespace's sk_lookup program (steer.bpf.c): every
// TCP connection made in the namespace to an address of pool, on any
// port, is accepted by one listener, whose accepted sockets keep the
// address and port the client dialled as their local address. Each
// namespace has its own program, map and listener.
//
// AttachSteer's link is not pinned: Close, or the end of the process that
// attached it, detaches it, and connections to the pool are then refused
// (nothing listens on those addresses). OpenSteer's is pinned, and
// outlives its process.
type Steer struct {
	objs steerObjects // zero when adopted from pins
	m    *ebpf.Map    // steer_map: objs.SteerMap, or the pinned one
	link link.Link
	pin  string // OpenSteer's; "" for AttachSteer
}

// OpenSteer is AttachSteer with the link and its map pinned at pin+"_link"
// and pin+"_map" (Loader.SteerPin names them for a Trial), so that the
// pool stays steered while no agent runs: to the listener the map holds
// (a keeper's copy of it keeps it there), or, with none, refused. Pins an
// earlier process left for the same namespace are adopted: ln replaces
// the listener in the pinned map, and the link is never detached, so no
// connection to the pool is refused meanwhile. Pins of another namespace
// (a namespace that is gone) are replaced.
func OpenSteer(pin, netnsPath string, pool netip.Prefix, ln syscall.Conn) (*Steer, error) {
	return openSteer(pin, netnsPath, ln, func() (*Steer, error) { return LoadSteer(pool) })
}

// OpenLoadedSteer is OpenSteer with loaded, a LoadSteer's, in place of a
// load of its own (a load is most of an attach: the verifier, the map).
// loaded is taken in every case: attached and pinned, or closed.
func OpenLoadedSteer(pin, netnsPath string, loaded *Steer, ln syscall.Conn) (*Steer, error) {
	used := false
	s, err := openSteer(pin, netnsPath, ln, func() (*Steer, error) {
		used = true
		return loaded, nil
	})
	if !used {
		_ = loaded.Close()
	}
	return s, err
}

func openSteer(pin, netnsPath string, ln syscall.Conn, load func() (*Steer, error)) (*Steer, error) {
	s, err := adoptSteer(pin, netnsPath, ln)
	if s != nil || err != nil {
		return s, err
	}
	if s, err = load(); err != nil {
		return nil, err
	}
	if err := s.attach(netnsPath, ln); err != nil {
		return nil, err
	}
	p, err := s.PinAt(pin)
	if err != nil {
		_ = s.Close()
		return nil, err
	}
	return p, nil
}

// PinAt pins an AttachSteer's link and map at pin as OpenSteer does, for
// steering attached before its Trial had a name (a prepared shell), and
// returns the pinned Steer, s's descriptors released. On error nothing is
// pinned and s is as it was.
func (s *Steer) PinAt(pin string) (*Steer, error) {
	if err := s.link.Pin(pin + "_link"); err != nil {
		return nil, fmt.Errorf("pin the steer program's link at %s_link: %w", pin, err)
	}
	if err := s.m.Pin(pin + "_map"); err != nil {
		_ = s.link.Unpin()
		return nil, fmt.Errorf("pin the steer program's map at %s_map: %w", pin, err)
	}
	s.pin = pin
	return s.release(), nil
}

// release closes a pinned Steer's descriptors: the pins hold what
// steers (the link, through it the program and its BTF, and the map,
// through it the listener), and nothing in this process uses them again.
// An agent holds none of them per Trial, 4 descriptors fewer against its
// limit (1,000 Trials, docs/measured.md).
func (s *Steer) release() *Steer {
	_ = s.Close()
	return &Steer{pin: s.pin}
}

// adoptSteer opens the pins at pin when they steer the namespace at
// netnsPath and puts ln in their map; nil, nil when there are none to
// adopt (any of another namespace are removed).
func adoptSteer(pin, netnsPath string, ln syscall.Conn) (*Steer, error) {
	lk, err := link.LoadPinnedLink(pin+"_link", nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, RemoveSteerPins(pin) // a map without its link steers nothing
	}
	if err != nil {
		return nil, fmt.Errorf("open the pinned steer link %s_link: %w", pin, err)
	}
	s := &Steer{link: lk, pin: pin}
	var st unix.Stat_t
	info, err := lk.Info()
	if err == nil {
		err = unix.Stat(netnsPath, &st)
	}
	if err != nil || info.NetNs() == nil || uint64(info.NetNs().NetnsInode) != st.Ino {
		_ = s.Close()
		return nil, errors.Join(err, RemoveSteerPins(pin))
	}
	if s.m, err = ebpf.LoadPinnedMap(pin+"_map", nil); err == nil {
		err = putListener(s.m, ln)
	}
	if err != nil {
		// The stale link is detached now: a program attached after it
		// would otherwise run second, behind one whose map holds an old
		// listener or none. Closing alone detaches it only once the
		// kernel's deferred release of the link has run, which a new
		// Trial's steering, attached at once, can beat.
		_ = lk.Detach()
		_ = s.Close()
		return nil, errors.Join(fmt.Errorf("adopt the pinned steer map %s_map: %w", pin, err), RemoveSteerPins(pin))
	}
	return s.release(), nil
}

// RemoveSteerPins detaches the link pinned at pin and removes the pins
// OpenSteer made there, if any. For a Trial being removed. Detached here,
// not when the pin's hold ends: the kernel releases a link whose last
// hold was a pin later, in a work queue, and no process holds it.
func RemoveSteerPins(pin string) error {
	var errs []error
	if lk, err := link.LoadPinnedLink(pin+"_link", nil); err == nil {
		errs = append(errs, lk.Detach(), lk.Close())
	}
	for _, p := range []string{pin + "_link", pin + "_map"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Unpin detaches an OpenSteer's steering and removes its pins.
func (s *Steer) Unpin() error {
	if s.pin == "" {
		return nil
	}
	return RemoveSteerPins(s.pin)
}

// AttachSteer loads the program for pool, an IPv4 range inside
// 127.0.0.0/8 that leaves out 127.0.0.1 (loopback's own address, where
// local services and the proxy endpoint listen) and 127.0.0.53 (the DNS
// stub's, whose TCP would be steered away), puts ln in its map, and
// attaches it to the network namespace mounted at netnsPath. ln must be a
// listening TCP socket (not MPTCP) that can take IPv4 connections, in
// that namespace: the kernel hands the SYN to a listener of another
// namespace too, which never answers it. On error nothing is left
// attached.
func AttachSteer(netnsPath string, pool netip.Prefix, ln syscall.Conn) (*Steer, error) {
	s, err := LoadSteer(pool)
	if err != nil {
		return nil, err
	}
	if err := s.attach(netnsPath, ln); err != nil {
		return nil, err
	}
	return s, nil
}

// LoadSteer loads the program for pool (AttachSteer says which pools
// may be steered), attached nowhere, its map empty: OpenLoadedSteer
// attaches it. An agent loads one ahead for a container it will adopt,
// whose namespace it cannot know before.
func LoadSteer(pool netip.Prefix) (*Steer, error) {
	if err := CheckPool(pool); err != nil {
		return nil, fmt.Errorf("steer %w", err)
	}
	spec, err := steerSpec()
	if err != nil {
		return nil, fmt.Errorf("load the steer program's spec: %w", err)
	}
	// Both in network order, as ctx->local_ip4 is: the bytes as they are,
	// read in host order.
	net4, mask := pool.Addr().As4(), maskOf(pool.Bits())
	if err := spec.Variables[steerVarPoolNet].Set(binary.NativeEndian.Uint32(net4[:])); err != nil {
		return nil, fmt.Errorf("set pool_net: %w", err)
	}
	if err := spec.Variables[steerVarPoolMask].Set(binary.NativeEndian.Uint32(mask[:])); err != nil {
		return nil, fmt.Errorf("set pool_mask: %w", err)
	}
	s := &Steer{}
	if err := spec.LoadAndAssign(&s.objs, nil); err != nil {
		return nil, fmt.Errorf("load the steer program (sk_lookup, Linux 5.9+): %w", err)
	}
	s.m = s.objs.SteerMap
	return s, nil
}

// attach puts ln in a loaded s's map and attaches its program to the
// network namespace mounted at netnsPath; on error s is closed.
func (s *Steer) attach(netnsPath string, ln syscall.Conn) (err error) {
	defer func() {
		if err != nil {
			_ = s.Close()
		}
	}()
	if err := putListener(s.m, ln); err != nil {
		return err
	}
	ns, err := os.Open(netnsPath)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", netnsPath, err)
	}
	defer ns.Close()
	s.link, err = link.AttachNetNs(int(ns.Fd()), s.objs.TrialnetSteer)
	if err != nil {
		return fmt.Errorf("attach sk_lookup to netns %s: %w", netnsPath, err)
	}
	return nil
}

// steerParsed is the steer program's spec, parsed from the embedded ELF
// once per process: each Trial loads a copy with its own pool.
var steerParsed = sync.OnceValues(func() (*ebpf.CollectionSpec, error) {
	spec, err := loadSteer()
	if err != nil {
		return nil, err
	}
	// A sockmap takes no BTF for its key and value: the kernel refuses
	// the create, and the library retries without. The refused map's
	// teardown (sock_map_free) waits out an RCU grace period, 20 ms and
	// more on a busy machine, on every Trial's way to its first command.
	m, ok := spec.Maps["steer_map"]
	if !ok {
		return nil, errors.New("no steer_map in the steer program")
	}
	m.Key, m.Value = nil, nil
	return spec, nil
})

// steerSpec is a copy of steerParsed's spec, for one Trial to set its pool in.
func steerSpec() (*ebpf.CollectionSpec, error) {
	spec, err := steerParsed()
	if err != nil {
		return nil, err
	}
	return spec.Copy(), nil
}

// StubAddr is where a transparent Trial's DNS stub listens, UDP and TCP:
// systemd-resolved's stub address, which strict mode allows such a Trial
// (Policy.Pool) and steer.bpf.c leaves alone.
const StubAddr = "127.0.0.53:53"

// CheckPool refuses a name pool that is not a masked IPv4 range inside
// 127.0.0.0/8 clear of 127.0.0.1 (loopback's own address, where local
// services and the proxy endpoint listen) and the stub's 127.0.0.53.
func CheckPool(pool netip.Prefix) error {
	loopback := netip.MustParsePrefix("127.0.0.0/8")
	stub := netip.MustParseAddrPort(StubAddr).Addr()
	if !pool.IsValid() || !pool.Addr().Is4() || pool != pool.Masked() || pool.Bits() < loopback.Bits() ||
		!loopback.Contains(pool.Addr()) || pool.Contains(netip.MustParseAddr("127.0.0.1")) || pool.Contains(stub) {
		return fmt.Errorf("pool %s: want a masked IPv4 range inside 127.0.0.0/8 that leaves out 127.0.0.1 and 127.0.0.53 (such as 127.100.0.0/16)", pool)
	}
	return nil
}

// putListener checks that ln listens for TCP and puts it in m.
func putListener(m *ebpf.Map, ln syscall.Conn) error {
	rc, err := ln.SyscallConn()
	if err != nil {
		return fmt.Errorf("steer listener: %w", err)
	}
	var uerr error
	err = rc.Control(func(fd uintptr) {
		if uerr = checkListener(int(fd)); uerr != nil {
			return
		}
		if err := m.Update(uint32(0), uint64(fd), ebpf.UpdateAny); err != nil {
			uerr = fmt.Errorf("put the listener in steer_map: %w", err)
		}
	})
	return errors.Join(err, uerr)
}

// checkListener says why fd cannot take the connections the program
// hands it, if it cannot: the kernel would refuse each one (bpf_sk_assign
// fails, and the program drops), so every pool connection would be
// refused with nothing to say why.
func checkListener(fd int) error {
	proto, err1 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	listening, err2 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
	family, err3 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err := errors.Join(err1, err2, err3); err != nil {
		return fmt.Errorf("steer listener: %w", err)
	}
	switch {
	case proto == unix.IPPROTO_MPTCP:
		// Go listens with MPTCP by default (1.24+); a sockmap holds
		// plain TCP sockets only.
		return errors.New("steer listener: an MPTCP socket; listen with net.ListenConfig's SetMultipathTCP(false)")
	case proto != unix.IPPROTO_TCP || listening != 1:
		return fmt.Errorf("steer listener: not a listening TCP socket (protocol %d)", proto)
	case family == unix.AF_INET6:
		v6only, err := unix.GetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY)
		if err != nil {
			return fmt.Errorf("steer listener: %w", err)
		}
		if v6only != 0 {
			return errors.New("steer listener: IPv6-only, but the pool is IPv4; listen on tcp4, or on tcp [::] without IPV6_V6ONLY")
		}
	}
	return nil
}

// maskOf is a prefix length's mask, as bytes in network order.
func maskOf(bits int) [4]byte {
	m := ^uint32(0) << (32 - bits)
	return [4]byte{byte(m >> 24), byte(m >> 16), byte(m >> 8), byte(m)}
}

// Close detaches an AttachSteer's program and frees it, its map and the
// map's hold on the listener; an OpenSteer's holds nothing (its pins
// steer on until Unpin).
func (s *Steer) Close() error {
	var errs []error
	if s.link != nil {
		errs = append(errs, s.link.Close())
	}
	if s.m != nil && s.m != s.objs.SteerMap {
		errs = append(errs, s.m.Close())
	}
	errs = append(errs, s.objs.Close())
	return errors.Join(errs...)
}
