//go:build linux

package tcplisten

import (
	"context"
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestConfigKeepalive: a connection accepted on a Config
// listener has the client side's keepalive (inherited from
// the listening socket, since Go no longer sets it per connection), and
// the listener is plain TCP.
func TestConfigKeepalive(t *testing.T) {
	for _, network := range []string{"tcp4", "tcp6"} {
		t.Run(network, func(t *testing.T) {
			addr := "127.0.0.1:0"
			if network == "tcp6" {
				addr = "[::1]:0"
			}
			ln, err := Config().Listen(context.Background(), network, addr)
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
			for _, o := range Keepalive {
				if got := sockopt(t, a.(*net.TCPConn), o.Level, o.Opt); got != o.Value {
					t.Errorf("accepted socket: option %d/%d is %d, want %d", o.Level, o.Opt, got, o.Value)
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
