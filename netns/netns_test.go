//go:build linux

package netns

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/trialnet/trialnet/internal/privtest"
	"golang.org/x/sys/unix"
)

func TestCheckName(t *testing.T) {
	for _, id := range []string{"", "../x", "a/b", "A", "-x", "x y", "x\x00", string(make([]byte, 64))} {
		if checkName(id) == nil {
			t.Errorf("checkName(%q) accepted", id)
		}
	}
	for _, id := range []string{"a", "trial-1", "run_0a"} {
		if err := checkName(id); err != nil {
			t.Errorf("checkName(%q): %v", id, err)
		}
	}
}

func TestPrivilegedCreateListenDelete(t *testing.T) {
	privtest.Require(t)
	dir := t.TempDir()
	ns, err := Create(dir, "t1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Delete() })

	if _, err := Create(dir, "t1"); !errors.Is(err, errExists) {
		t.Fatalf("second Create: got %v, want ErrExists", err)
	}
	host, err := currentCookieHere()
	if err != nil {
		t.Fatal(err)
	}
	if ns.Cookie == 0 || ns.Cookie == host {
		t.Fatalf("netns cookie %d, host cookie %d: want a distinct non-zero cookie", ns.Cookie, host)
	}
	opened, err := Open(dir, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if opened.Cookie != ns.Cookie {
		t.Fatalf("Open cookie %d != Create cookie %d", opened.Cookie, ns.Cookie)
	}

	// A listener inside the namespace is reachable from inside only.
	ln, err := ns.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_, _ = c.Write([]byte("hi"))
			_ = c.Close()
		}
	}()
	err = ns.Do(func() error {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return err
		}
		defer c.Close()
		b := make([]byte, 2)
		_, err = c.Read(b)
		return err
	})
	if err != nil {
		t.Fatalf("dial the listener from inside its netns (lo must be up): %v", err)
	}
	if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		_ = c.Close()
		t.Fatal("the in-netns listener was reachable from the host's namespace")
	}

	if err := ns.Delete(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "t1")); !os.IsNotExist(err) {
		t.Fatalf("netns mount point left after Delete: %v", err)
	}
	if err := Delete(dir, "t1"); err != nil {
		t.Fatalf("deleting twice must be harmless: %v", err)
	}
}

// CreateIn's in runs inside the new namespace: the listener it opens
// lives there, is plain TCP with the clients' keepalive, and the thread
// goes back to the host's namespace. When in fails, the namespace is removed.
func TestPrivilegedCreateIn(t *testing.T) {
	privtest.Require(t)
	dir := t.TempDir()
	var ln net.Listener
	ns, err := CreateIn(dir, "in", nil, func(listen ListenFunc) (err error) {
		ln, err = listen(context.Background(), "tcp", "127.0.0.1:0")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Delete() })
	defer ln.Close()
	raw, err := ln.(*net.TCPListener).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var cookie uint64
	var proto, keepalive int
	var cerr, perr, kerr error
	if err := raw.Control(func(fd uintptr) {
		cookie, cerr = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		proto, perr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PROTOCOL)
		keepalive, kerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_KEEPALIVE)
	}); err != nil || cerr != nil || perr != nil || kerr != nil {
		t.Fatal(err, cerr, perr, kerr)
	}
	if cookie != ns.Cookie {
		t.Fatalf("the listener in's namespace has cookie %d, want the new namespace's %d", cookie, ns.Cookie)
	}
	if proto != unix.IPPROTO_TCP {
		t.Fatalf("the listener's protocol is %d, want plain TCP (%d): a Trial cannot open MPTCP sockets", proto, unix.IPPROTO_TCP)
	}
	if keepalive != 1 {
		t.Fatal("the listener has no keepalive: its accepted sockets, which inherit it, would go without (Go no longer sets it per connection)")
	}

	failed := errors.New("in failed")
	if _, err := CreateIn(dir, "in-fails", nil, func(ListenFunc) error { return failed }); !errors.Is(err, failed) {
		t.Fatalf("CreateIn with in failing: %v, want in's error", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "in-fails")); !os.IsNotExist(err) {
		t.Fatalf("the namespace of a CreateIn whose in failed is left: %v", err)
	}
	threadsInHost(t)
}

func TestPrivilegedNoThreadLeftBehind(t *testing.T) {
	privtest.Require(t)
	dir := t.TempDir()
	for i := range 50 {
		ns, err := Create(dir, "leak")
		if err != nil {
			t.Fatalf("iteration %d: %v", i, err)
		}
		if err := ns.Delete(); err != nil {
			t.Fatal(err)
		}
	}
	threadsInHost(t)
}

// threadsInHost fails t unless every thread of this process is in the
// host's network namespace.
func threadsInHost(t *testing.T) {
	t.Helper()
	want, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		got, err := os.Readlink(filepath.Join("/proc/self/task", task.Name(), "ns/net"))
		if err == nil && got != want {
			t.Fatalf("thread %s is in %s, not %s", task.Name(), got, want)
		}
	}
}

func currentCookieHere() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	return unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
}
