//go:build linux

package netns

import (
	"context"
	"errors"
	"fmt"
	"io"
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
	// The TCP tables are skipped when the namespace's counters say they
	// are empty: a listener of each family and a connection that ended
	// (time-wait, no socket of any process left) must each still be
	// found there.
	for _, c := range []struct {
		name, want string
		make       func() (io.Closer, error)
	}{
		{"a udp socket", "1 udp", func() (io.Closer, error) { return net.ListenPacket("udp4", "127.0.0.1:0") }},
		{"a tcp listener", "1 tcp)", func() (io.Closer, error) { return net.Listen("tcp4", "127.0.0.1:0") }},
		{"a tcp6 listener", "1 tcp6", func() (io.Closer, error) { return net.Listen("tcp6", "[::]:0") }},
		{"a connection in time-wait", "1 tcp)", timeWait},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd, f := holder(t)
			var sock io.Closer
			err := onNewThread(func() (func() error, error) {
				orig, err := netns.Get()
				if err != nil {
					return nil, err
				}
				restore := func() error { defer orig.Close(); return netns.Set(orig) }
				if err := netns.Set(netns.NsHandle(int(f.Fd()))); err != nil {
					return restore, err
				}
				sock, err = c.make()
				return restore, err
			})
			if err != nil {
				t.Fatal(err)
			}
			defer sock.Close()
			ns, err := Adopt(dir, "sock", f, cmd.Process.Pid)
			if err == nil {
				_ = ns.Delete()
			}
			if !errors.Is(err, ErrNotBare) || !strings.Contains(err.Error(), "already has sockets ("+c.want) {
				t.Errorf("got %v, want refused: %s", err, c.want)
			}
			if _, err := os.Stat(dir + "/sock"); !os.IsNotExist(err) {
				t.Errorf("a refused namespace left its mount point: %v", err)
			}
		})
	}
	t.Run("another process's pid", func(t *testing.T) {
		_, f := holder(t)
		if _, err := Adopt(dir, "pid", f, os.Getpid()); err == nil || !strings.Contains(err.Error(), "is not in the namespace to adopt") {
			t.Errorf("got %v, want refused: the pid is elsewhere", err)
		}
	})
}

// timeWait leaves, in the calling thread's namespace, one TCP connection
// in time-wait and no socket open: lo brought up, a connection made over
// it and closed by the client first.
func timeWait() (io.Closer, error) {
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		err = netlink.LinkSetUp(lo)
	}
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		return nil, err
	}
	s, err := ln.Accept()
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	_ = c.Close()
	if _, err := s.Read(make([]byte, 1)); err != io.EOF {
		_ = s.Close()
		return nil, fmt.Errorf("the server saw %v, want the client's close", err)
	}
	return io.NopCloser(nil), s.Close()
}

// BenchmarkAdoptNoSockets is the adoption's check that a fresh namespace
// holds no socket, read through its process's /proc/PID/net.
func BenchmarkAdoptNoSockets(b *testing.B) {
	privtest.Require(b)
	cmd := exec.Command("unshare", "--net", "sleep", "60")
	if err := cmd.Start(); err != nil {
		b.Skipf("unshare: %v", err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	procNet := "/proc/" + strconv.Itoa(cmd.Process.Pid) + "/net"
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var a, s unix.Stat_t
		if unix.Stat("/proc/"+strconv.Itoa(cmd.Process.Pid)+"/ns/net", &a) == nil && unix.Stat("/proc/self/ns/net", &s) == nil && a.Ino != s.Ino {
			break
		}
		if time.Now().After(end) {
			b.Fatal("unshare did not enter a namespace of its own")
		}
	}
	for b.Loop() {
		if err := noSockets(procNet); err != nil {
			b.Fatal(err)
		}
	}
}
