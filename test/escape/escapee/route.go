//go:build linux

package main

import (
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The attempts here aim at a destination the Trial's connect and sendmsg
// hooks allow (a loopback address), and ask the kernel to send the packet
// somewhere else first: a source route (IPv4's LSRR option, IPv6's
// segment routing header) names the canary as the first hop, and the
// kernel routes to the first hop, not to the address the hooks judged.

// routedDial connects by TCP to allowed with set applied to the socket
// first, and writes once: it escaped if the kernel completed the
// connection.
func routedDial(network string, allowed netip.AddrPort, set func(fd int) error) error {
	var serr error
	d := net.Dialer{Timeout: 2 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		if err := rc.Control(func(fd uintptr) { serr = set(int(fd)) }); err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial(network, allowed.String())
	if serr != nil {
		return fmt.Errorf("setsockopt: %w", serr)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write([]byte("escaped\n"))
	return err
}

// lsrr is IPv4's loose source route option through hop to dst, padded
// with a NOP to a multiple of four bytes.
func lsrr(hop, dst netip.Addr) string {
	h, d := hop.As4(), dst.As4()
	return string([]byte{0x83, 11, 4, h[0], h[1], h[2], h[3], d[0], d[1], d[2], d[3], 1})
}

// srh is an IPv6 segment routing header (type 4) whose one segment, the
// one the kernel routes to, is hop.
func srh(hop netip.Addr) string {
	h := hop.As16()
	// next header (the kernel's), length in 8-byte units past the first
	// 8, type 4, segments left 0, last entry 0, flags, tag; the segment.
	return string(append([]byte{0, 2, 4, 0, 0, 0, 0, 0}, h[:]...))
}

func tcp4SourceRoute(allowed, canary netip.AddrPort) error {
	return routedDial("tcp4", allowed, func(fd int) error {
		return unix.SetsockoptString(fd, unix.IPPROTO_IP, unix.IP_OPTIONS, lsrr(canary.Addr(), allowed.Addr()))
	})
}

func tcp6RoutingHeader(allowed, canary netip.AddrPort) error {
	return routedDial("tcp6", allowed, func(fd int) error {
		return unix.SetsockoptString(fd, unix.IPPROTO_IPV6, unix.IPV6_RTHDR, srh(canary.Addr()))
	})
}

// udp6RoutingHeader sends a datagram to loopback at the canary's port
// with a routing header through the canary.
func udp6RoutingHeader(canary netip.AddrPort) error {
	fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM, 0)
	if err != nil {
		return fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptString(fd, unix.IPPROTO_IPV6, unix.IPV6_RTHDR, srh(canary.Addr())); err != nil {
		return fmt.Errorf("setsockopt: %w", err)
	}
	to := netip.AddrPortFrom(netip.IPv6Loopback(), canary.Port())
	if err := unix.Sendto(fd, []byte("escaped"), 0, sockaddr(to, unix.AF_INET6)); err != nil {
		return fmt.Errorf("sendto: %w", err)
	}
	return nil
}

// tcpFastOpenConnect connects with TCP_FASTOPEN_CONNECT, where connect()
// returns before any SYN and the first write sends it with the data.
func tcpFastOpenConnect(canary netip.AddrPort) error {
	return routedDial("tcp4", canary, func(fd int) error {
		return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_FASTOPEN_CONNECT, 1)
	})
}
