//go:build linux

// Package tcplisten makes the listening sockets that trialnet's proxies
// accept clients on: the standalone proxy's and every Trial's, in its
// namespace.
package tcplisten

import (
	"errors"
	"net"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Keepalive is the keepalive of a client's connection: Go's default for
// an accepted connection (the first probe after 15 s idle, then every
// 15 s, the peer dropped after 9 unanswered). An idle tunnel is never
// cut by it: a live peer answers every probe.
var Keepalive = []struct{ Level, Opt, Value int }{
	{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
	{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, 15},
	{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, 15},
	{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, 9},
}

// Config makes a listening socket. The client side's keepalive is set
// once, on the listening socket, which every accepted socket inherits in
// the kernel, instead of four setsockopt(2) calls per accepted
// connection (Go's default, turned off by KeepAlive -1). The socket is
// plain TCP: Go listens with MPTCP by default, which serves no client
// here (a Trial's seccomp filter refuses the protocol, and Go and curl
// fall back to TCP), and whose first use in a process costs a probe of
// the kernel, about 0.2 ms here.
func Config() *net.ListenConfig {
	lc := &net.ListenConfig{KeepAlive: -1, Control: setKeepalive}
	lc.SetMultipathTCP(false)
	return lc
}

func setKeepalive(network, _ string, rc syscall.RawConn) error {
	if !strings.HasPrefix(network, "tcp") {
		return nil
	}
	var serr error
	err := rc.Control(func(fd uintptr) {
		for _, o := range Keepalive {
			if serr = unix.SetsockoptInt(int(fd), o.Level, o.Opt, o.Value); serr != nil {
				serr = os.NewSyscallError("setsockopt", serr)
				return
			}
		}
	})
	return errors.Join(err, serr)
}
