//go:build linux

// Package netns creates, opens and deletes per-Trial network namespaces and
// runs code on a thread inside one. It is the only package that switches a
// thread's network namespace.
package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"

	"github.com/trialnet/trialnet/internal/ident"
	"github.com/trialnet/trialnet/internal/tcplisten"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// DefaultDir holds one bind mount per Trial namespace, so that tools like
// nsenter --net=/run/trialnet/netns/<id> can enter it.
const DefaultDir = "/run/trialnet/netns"

// checkName checks a namespace's name, which becomes a file name.
func checkName(id string) error {
	if !ident.Valid(id) {
		return fmt.Errorf("invalid namespace name %q: use 1-63 characters from a-z, 0-9, '-' and '_', starting with a letter or digit", id)
	}
	return nil
}

// Namespace is a bind-mounted network namespace.
type Namespace struct {
	ID   string
	Path string
	// Cookie is the kernel's SO_NETNS_COOKIE for this namespace.
	Cookie uint64
}

// errExists means a namespace with that id is already mounted.
var errExists = errors.New("network namespace already exists")

// Create makes a new network namespace with lo up, bind-mounted at dir/id.
// lo carries loAddrs besides its own 127.0.0.1/8 and ::1 (an IPv6 one is
// left out where the kernel has no IPv6). On error nothing is left behind.
func Create(dir, id string, loAddrs ...netip.Prefix) (*Namespace, error) {
	return CreateIn(dir, id, loAddrs, nil)
}

// ListenFunc opens a listening socket, as Namespace.Listen does.
type ListenFunc func(ctx context.Context, network, addr string) (net.Listener, error)

// CreateIn is Create that also runs in (unless nil) on the thread that
// made the namespace, inside it, once lo is up and before the thread goes
// back: the sockets in opens, with listen or itself, live in the
// namespace, and making them takes no trip of its own into it. in runs on
// that locked thread alone: it must not unlock it, nor open its sockets
// from another goroutine. On error the namespace is removed, and what in
// opened, whether in failed or a step after it, is its caller's to close.
func CreateIn(dir, id string, loAddrs []netip.Prefix, in func(listen ListenFunc) error) (_ *Namespace, err error) {
	if err := checkName(id); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create netns directory %s: %w", dir, err)
	}
	path := filepath.Join(dir, id)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("netns %s: %w (a Trial with this id is live, or a crashed one left it; 'trialnet destroy %s' removes it)", path, errExists, id)
		}
		return nil, fmt.Errorf("create netns mount point: %w", err)
	}
	_ = f.Close()
	mounted := false
	defer func() {
		if err != nil {
			if mounted {
				_ = unix.Unmount(path, unix.MNT_DETACH)
			}
			_ = os.Remove(path)
		}
	}()

	ns := &Namespace{ID: id, Path: path}
	err = onNewThread(func() (restore func() error, err error) {
		if restore, err = unshareNet(); err != nil {
			return nil, err
		}
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
			return restore, fmt.Errorf("bind-mount netns at %s: %w", path, err)
		}
		mounted = true
		if err := loUp(loAddrs); err != nil {
			return restore, err
		}
		if ns.Cookie, err = currentCookie(); err != nil || in == nil {
			return restore, err
		}
		return restore, in(ns.listenHere)
	})
	if err != nil {
		return nil, err
	}
	return ns, nil
}

// listenHere opens a listening socket in the calling thread's namespace,
// which is n (CreateIn's in); it fails as Listen does.
func (n *Namespace) listenHere(ctx context.Context, network, addr string) (net.Listener, error) {
	ln, err := tcplisten.Config().Listen(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s %s in netns %s: %w", network, addr, n.ID, err)
	}
	return ln, nil
}

// unshareNet moves the calling thread (onNewThread's) into a new network
// namespace; restore moves it back.
func unshareNet() (restore func() error, _ error) {
	orig, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("open current netns: %w", err)
	}
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		_ = orig.Close()
		return nil, fmt.Errorf("unshare network namespace: %w", err)
	}
	return func() error {
		defer orig.Close()
		return netns.Set(orig)
	}, nil
}

// loUp brings up loopback in the current thread's namespace, with addrs
// added. A handle made here opens its netlink socket in this namespace.
func loUp(addrs []netip.Prefix) error {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink in new netns: %w", err)
	}
	defer h.Close()
	return loUpWith(h, addrs)
}

// loUpWith brings up loopback in h's namespace, with addrs added.
func loUpWith(h *netlink.Handle, addrs []netip.Prefix) error {
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("bring lo up: %w", err)
	}
	for _, a := range addrs {
		ipn := &net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), a.Addr().BitLen())}
		err := h.AddrAdd(lo, &netlink.Addr{IPNet: ipn})
		if a.Addr().Is6() && errors.Is(err, unix.EAFNOSUPPORT) {
			continue // no IPv6 in this kernel: nothing to add it to
		}
		if errors.Is(err, unix.EEXIST) {
			continue // an adopted namespace's runtime added it already
		}
		if err != nil {
			return fmt.Errorf("add %s to lo: %w", a, err)
		}
	}
	return nil
}

func currentCookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket for netns cookie: %w", err)
	}
	defer unix.Close(fd)
	c, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("SO_NETNS_COOKIE: %w", err)
	}
	return c, nil
}

// Open opens the namespace bind-mounted at dir/id.
func Open(dir, id string) (*Namespace, error) {
	if err := checkName(id); err != nil {
		return nil, err
	}
	ns := &Namespace{ID: id, Path: filepath.Join(dir, id)}
	var st unix.Statfs_t
	if err := unix.Statfs(ns.Path, &st); err != nil {
		return nil, fmt.Errorf("open netns %s: %w", ns.Path, err)
	}
	if st.Type != unix.NSFS_MAGIC {
		return nil, fmt.Errorf("open netns %s: not a mounted namespace (a leftover file?)", ns.Path)
	}
	err := ns.Do(func() error {
		var err error
		ns.Cookie, err = currentCookie()
		return err
	})
	if err != nil {
		return nil, err
	}
	return ns, nil
}

// List returns the ids of the namespaces mounted under dir.
func List(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list netns: %w", err)
	}
	var ids []string
	for _, e := range entries {
		ids = append(ids, e.Name())
	}
	return ids, nil
}

// Delete unmounts and removes the namespace's bind mount. The kernel frees
// the namespace once no process or socket holds it any more.
func (n *Namespace) Delete() error {
	return Delete(filepath.Dir(n.Path), n.ID)
}

// Delete removes dir/id; a namespace that is already gone is not an error.
func Delete(dir, id string) error {
	if err := checkName(id); err != nil {
		return err
	}
	path := filepath.Join(dir, id)
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", path, err)
	}
	return nil
}

// Do runs fn on an OS thread inside the namespace. Sockets fn creates and
// processes it starts stay in the namespace; the caller's thread never moves.
func (n *Namespace) Do(fn func() error) error {
	return Do(n.Path, fn)
}

// Do runs fn on an OS thread inside the namespace mounted at path.
func Do(path string, fn func() error) error {
	return onNewThread(func() (func() error, error) {
		orig, err := netns.Get()
		if err != nil {
			return nil, fmt.Errorf("open current netns: %w", err)
		}
		target, err := netns.GetFromPath(path)
		if err != nil {
			_ = orig.Close()
			return nil, fmt.Errorf("open netns %s: %w", path, err)
		}
		defer target.Close()
		if err := netns.Set(target); err != nil {
			_ = orig.Close()
			return nil, fmt.Errorf("enter netns %s: %w", path, err)
		}
		restore := func() error {
			defer orig.Close()
			return netns.Set(orig)
		}
		return restore, fn()
	})
}

// onNewThread runs body on a locked OS thread of a fresh goroutine. body
// returns how to restore the thread; if that fails, the thread stays locked
// so that the runtime discards it when the goroutine ends.
func onNewThread(body func() (restore func() error, err error)) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		restore, err := body()
		if restore != nil {
			if rerr := restore(); rerr != nil {
				errc <- errors.Join(err, fmt.Errorf("restore the thread's netns (thread discarded): %w", rerr))
				return
			}
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// Listen opens a listening socket inside the namespace; the caller accepts
// on it from its own namespace.
func (n *Namespace) Listen(ctx context.Context, network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := n.Do(func() error {
		var err error
		ln, err = tcplisten.Config().Listen(ctx, network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on %s %s in netns %s: %w", network, addr, n.ID, err)
	}
	return ln, nil
}

// EnterProcess runs fn on an OS thread that has joined the mount, PID and
// IPC namespaces of the process pidfd refers to and the network namespace
// mounted at netnsPath: processes fn starts are born in all four (the PID
// namespace applies to children only). The thread's mount namespace and fs
// state cannot be given back, so the thread is never unlocked and dies
// with its goroutine.
func EnterProcess(pidfd int, netnsPath string, fn func() error) error {
	// Opened first: the path may not exist in the mount namespace joined.
	target, err := netns.GetFromPath(netnsPath)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", netnsPath, err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	go offMain(func() error {
		// setns(CLONE_NEWNS) refuses a thread that shares its fs state
		// with the rest of the process, as every Go thread does.
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			return fmt.Errorf("unshare fs state: %w", err)
		}
		if err := unix.Setns(pidfd, unix.CLONE_NEWNS|unix.CLONE_NEWPID|unix.CLONE_NEWIPC); err != nil {
			return fmt.Errorf("enter the namespaces of the Trial's init: %w", err)
		}
		if err := netns.Set(target); err != nil {
			return fmt.Errorf("enter netns %s: %w", netnsPath, err)
		}
		return fn()
	}, errc)
	return <-errc
}

// offMain runs fn on a locked thread that is then discarded, for work
// that changes the thread in ways that cannot be given back (its mount
// namespace and fs state), and sends its result to errc. That thread must
// not be the main thread: Go keeps it when its locked goroutine ends, so
// it would stay changed for the process's life, and /proc/self (the main
// thread's view) with it. Landed there, this goroutine holds the main
// thread while another does the work: a thread locked to a waiting
// goroutine runs nothing else.
func offMain(fn func() error, errc chan<- error) {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		done := make(chan struct{})
		go func() {
			defer close(done)
			offMain(fn, errc)
		}()
		<-done
		runtime.UnlockOSThread()
		return
	}
	// From here the thread stays locked: it is discarded with this
	// goroutine.
	errc <- fn()
}
