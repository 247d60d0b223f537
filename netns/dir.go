//go:build linux

package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// MountDir makes dir (the agent's netns directory) and makes it a mount
// of its own, as `ip netns` does for /run/netns, so that a Trial's init
// detaches every Trial's namespace mount in it with one umount2 (one RCU
// grace period) instead of one each (sandbox's dropNsMounts).
//
// Shared, as `ip netns` makes it, but in a peer group of its own: a
// namespace mounted in it, or unmounted at destroy, shows in every mount
// namespace copied from the agent's after this (by a tool or a service);
// one copied before sees the directory as it was then. A Trial's init
// makes its own copy private before it detaches it.
//
// A directory that is a mount already (an agent's restart or hand-over,
// `ip netns`, the operator's) is left as it is. One that is not, but holds
// live Trials' namespace mounts (an agent before this one served them), is
// bound onto itself with its submounts (MS_REC; without it, the new mount
// would hide them), and the originals, shadowed by the new mount, are
// detached: else they would hold each namespace after its Trial's destroy,
// and its mount point could not be removed.
func MountDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create netns directory %s: %w", dir, err)
	}
	if mounted, err := isMountPoint(dir); err != nil || mounted {
		return err
	}
	// The directory as its parent's mount holds it: the originals stay
	// reachable through it once the new mount covers the path.
	below, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open netns directory %s: %w", dir, err)
	}
	defer unix.Close(below)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list netns directory %s: %w", dir, err)
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make netns directory %s a mount of its own: %w", dir, err)
	}
	// Out of the parent's peer group, if it has one (/run under systemd):
	// as a peer of its parent, a namespace mounted in it would also be
	// mounted on the parent's copy of the path, covered, where a Trial's
	// init, detaching the directory, would keep it. As a peer, too, the
	// copies of the originals that dropCovered detaches would go with them.
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make netns directory %s private: %w", dir, err)
	}
	if err := dropCovered(below, entries); err != nil {
		return err
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("make netns directory %s shared: %w", dir, err)
	}
	return nil
}

// ReleaseDir undoes MountDir once dir holds no namespace mount: a plain
// unmount, which the kernel refuses (EBUSY) while anything is mounted in
// it, such as another tool's namespaces.
func ReleaseDir(dir string) error {
	err := unix.Unmount(dir, 0)
	if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EBUSY) {
		return nil
	}
	return fmt.Errorf("unmount netns directory %s: %w", dir, err)
}

// isMountPoint reports whether dir (followed) is the root of a mount: its
// mount id differs from its parent's.
func isMountPoint(dir string) (bool, error) {
	id := func(p string) (uint64, error) {
		var st unix.Statx_t
		if err := unix.Statx(unix.AT_FDCWD, p, 0, unix.STATX_MNT_ID, &st); err != nil {
			return 0, fmt.Errorf("statx %s: %w", p, err)
		}
		if st.Mask&unix.STATX_MNT_ID == 0 {
			return 0, fmt.Errorf("statx %s: the kernel gives no mount id (before Linux 5.8)", p)
		}
		return st.Mnt_id, nil
	}
	self, err := id(dir)
	if err != nil {
		return false, err
	}
	// Not filepath.Join, which would take ".." off the path's text: dir
	// may be a symlink, and its target's parent is the one mounted on.
	parent, err := id(dir + "/..")
	return err == nil && self != parent, err
}

// dropCovered detaches the namespace mounts that the directory's new
// mount covers, reached through below, the directory as its parent's
// mount holds it.
func dropCovered(below int, entries []os.DirEntry) error {
	base := "/proc/self/fd/" + strconv.Itoa(below)
	for _, e := range entries {
		err := unix.Unmount(filepath.Join(base, e.Name()), unix.MNT_DETACH)
		if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("detach the netns mount %s, covered by its directory's new mount: %w", e.Name(), err)
		}
	}
	return nil
}
