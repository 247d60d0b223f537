//go:build linux

package netns

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// holder is a process in a namespace of its own (unshared, not
// mounted), as a container's init is at createRuntime.
func holder(t *testing.T) (*exec.Cmd, *os.File) {
	t.Helper()
	cmd := exec.Command("unshare", "--net", "sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	path := "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/net"
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var a, b unix.Stat_t
		if unix.Stat(path, &a) == nil && unix.Stat("/proc/self/ns/net", &b) == nil && a.Ino != b.Ino {
			break
		}
		if time.Now().After(end) {
			t.Fatal("unshare did not enter a namespace of its own")
		}
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return cmd, f
}

// A fresh namespace is adopted: mounted like a Trial's, lo up with the
// addresses given, listened in; deleting the mount leaves the namespace
// to its process. One with another link, or a socket in it, is refused
// and leaves no mount.
func TestPrivilegedAdopt(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "unshare")
	dir := t.TempDir()
	cmd, f := holder(t)
	ns, err := Adopt(dir, "adopted", f, cmd.Process.Pid, netip.MustParsePrefix("198.18.0.1/32"))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := ns.Listen(context.Background(), "tcp", "198.18.0.1:0")
	if err != nil {
		t.Fatalf("listen on the added address: %v", err)
	}
	_ = ln.Close()
	if err := ns.Delete(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/ns/net"); err != nil {
		t.Errorf("the process lost its namespace: %v", err)
	}

	t.Run("a link besides lo", func(t *testing.T) {
		cmd, f := holder(t)
		h, err := netlink.NewHandleAt(netns.NsHandle(int(f.Fd())))
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "out0"}, PeerName: "out1"}); err != nil {
			t.Fatal(err)
		}
		_, err = Adopt(dir, "veth", f, cmd.Process.Pid)
		if !errors.Is(err, ErrNotBare) || !strings.Contains(err.Error(), "out0 (veth)") {
			t.Errorf("got %v, want refused naming out0", err)
		}
		if _, err := os.Stat(dir + "/veth"); !os.IsNotExist(err) {
			t.Errorf("a refused namespace left its mount point: %v", err)
		}
	})
	t.Run("a socket in it", func(t *testing.T) {
		cmd, f := holder(t)
		var ln net.PacketConn
		err := onNewThread(func() (func() error, error) {
			orig, err := netns.Get()
			if err != nil {
				return nil, err
			}
			restore := func() error { defer orig.Close(); return netns.Set(orig) }
			if err := netns.Set(netns.NsHandle(int(f.Fd()))); err != nil {
				return restore, err
			}
			ln, err = net.ListenPacket("udp4", "127.0.0.1:0")
			return restore, err
		})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		if _, err := Adopt(dir, "sock", f, cmd.Process.Pid); !errors.Is(err, ErrNotBare) || !strings.Contains(err.Error(), "already has sockets (1 udp)") {
			t.Errorf("got %v, want refused: a socket", err)
		}
	})
	t.Run("another process's pid", func(t *testing.T) {
		_, f := holder(t)
		if _, err := Adopt(dir, "pid", f, os.Getpid()); err == nil || !strings.Contains(err.Error(), "is not in the namespace to adopt") {
			t.Errorf("got %v, want refused: the pid is elsewhere", err)
		}
	})
}
