//go:build linux

package proxy

import (
	"context"
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestListenConfigClientKeepalive: a connection accepted on a
// ListenConfig listener has the client side's keepalive (inherited from
// the listening socket, since Go no longer sets it per connection), and
// the listener is plain TCP.
func TestListenConfigClientKeepalive(t *testing.T) {
	for _, network := range []string{"tcp4", "tcp6"} {
		t.Run(network, func(t *testing.T) {
			addr := "127.0.0.1:0"
			if network == "tcp6" {
				addr = "[::1]:0"
			}
			ln, err := ListenConfig().Listen(context.Background(), network, addr)
			if err != nil {
				t.Skipf("no %s loopback here: %v", network, err)
			}
			defer ln.Close()
			if proto := sockopt(t, ln.(*net.TCPListener), unix.SOL_SOCKET, unix.SO_PROTOCOL); proto != unix.IPPROTO_TCP {
				t.Errorf("listening socket's protocol %d, want plain TCP (%d)", proto, unix.IPPROTO_TCP)
			}
			c, err := net.Dial(network, ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			a, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			for _, o := range clientKeepalive {
				if got := sockopt(t, a.(*net.TCPConn), o.level, o.opt); got != o.value {
					t.Errorf("accepted socket: option %d/%d is %d, want %d", o.level, o.opt, got, o.value)
				}
			}
		})
	}
}

func sockopt(t *testing.T, c interface {
	SyscallConn() (syscall.RawConn, error)
}, level, opt int) int {
	t.Helper()
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var serr error
	if err := rc.Control(func(fd uintptr) { v, serr = unix.GetsockoptInt(int(fd), level, opt) }); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	return v
}
