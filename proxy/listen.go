//go:build linux

package proxy

import (
	"errors"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// clientKeepalive is the keepalive of a client's connection to the proxy:
// Go's default for an accepted connection (the first probe after 15 s
// idle, then every 15 s, the peer dropped after 9 unanswered). An idle
// tunnel is never cut by it: a live peer answers every probe.
var clientKeepalive = []struct{ level, opt, value int }{
	{unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1},
	{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, 15},
	{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, 15},
	{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, 9},
}

// ListenConfig makes a listening socket for the proxy's clients. The
// client side's keepalive is set once, on the listening socket, which
// every accepted socket inherits in the kernel, instead of four
// setsockopt(2) calls per accepted connection (Go's default, turned off
// by KeepAlive -1). The socket is plain TCP: a client of the proxy gains
// nothing from MPTCP, which Go listens with by default, and each of its
// SYNs would take the MPTCP path.
func ListenConfig() *net.ListenConfig {
	lc := &net.ListenConfig{KeepAlive: -1, Control: setClientKeepalive}
	lc.SetMultipathTCP(false)
	return lc
}

func setClientKeepalive(_, _ string, rc syscall.RawConn) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		for _, o := range clientKeepalive {
			if serr = unix.SetsockoptInt(int(fd), o.level, o.opt, o.value); serr != nil {
				serr = os.NewSyscallError("setsockopt", serr)
				return
			}
		}
	})
	return errors.Join(err, serr)
}
