//go:build linux

package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/trialnet/trialnet/internal/tcplisten"
	"golang.org/x/sys/unix"
)

// Held is a network namespace made ahead of its Trial (Prepare) and held
// by a descriptor of this process alone, until Mount gives it the path
// Create would have. Nothing names it meanwhile: no other process can
// open it by a path, and if this process dies the kernel frees it with
// the descriptor, so a crash leaves nothing of it to sweep.
type Held struct {
	f *os.File
	// Cookie is the kernel's SO_NETNS_COOKIE for the namespace.
	Cookie uint64
}

// Prepare makes a new network namespace as Create does (lo up, with
// loAddrs), held, not mounted.
func Prepare(loAddrs ...netip.Prefix) (*Held, error) {
	held := &Held{}
	err := onNewThread(func() (restore func() error, err error) {
		if restore, err = unshareNet(); err != nil {
			return nil, err
		}
		if held.f, err = os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())); err != nil {
			return restore, fmt.Errorf("open the new netns: %w", err)
		}
		if err := loUp(loAddrs); err != nil {
			return restore, err
		}
		held.Cookie, err = currentCookie()
		return restore, err
	})
	if err != nil {
		_ = held.Close()
		return nil, err
	}
	return held, nil
}

// Path names the namespace through this process's descriptor: for this
// process alone.
func (h *Held) Path() string { return fmt.Sprintf("/proc/self/fd/%d", h.f.Fd()) }

// Listen opens a listening socket inside the namespace, as
// Namespace.Listen does.
func (h *Held) Listen(ctx context.Context, network, addr string) (net.Listener, error) {
	var ln net.Listener
	err := Do(h.Path(), func() error {
		var err error
		ln, err = tcplisten.Config().Listen(ctx, network, addr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listen on %s %s in a prepared netns: %w", network, addr, err)
	}
	return ln, nil
}

// Mount bind-mounts the namespace at dir/id, where Create mounts one, and
// lets go of the descriptor: from here it is a Namespace like any other.
// On error nothing is mounted and the namespace is still held.
func (h *Held) Mount(dir, id string) (*Namespace, error) {
	if err := checkName(id); err != nil {
		return nil, err
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
	if err := unix.Mount(h.Path(), path, "none", unix.MS_BIND, ""); err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("bind-mount a prepared netns at %s: %w", path, err)
	}
	ns := &Namespace{ID: id, Path: path, Cookie: h.Cookie}
	_ = h.Close()
	return ns, nil
}

// Close lets go of the namespace: the kernel frees it once nothing else
// (a socket made in it) holds it.
func (h *Held) Close() error {
	if h.f == nil {
		return nil
	}
	err := h.f.Close()
	h.f = nil
	return err
}
