//go:build linux

package sandbox

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/internal/cgroup2"
	"github.com/trialnet/trialnet/internal/rootdir"
)

// hiddenDirs are the directories every Trial's init covers with an empty
// read-only tmpfs: trialnet's runtime directory (with the defaults: the
// netns files naming every Trial, the agent socket, the Trial records,
// the launch locks) and the netns directory, wherever the Host keeps it.
// The agent socket and state directory are the agent's configuration,
// which the sandbox does not know: moved out of rootdir.Run, they stay
// visible (root-only, as ever). Nothing in a Trial needs these paths:
// commands open the netns file before they join the Trial's mounts.
func hiddenDirs(netnsDir string) []string {
	dirs := []string{rootdir.Run}
	if abs, err := filepath.Abs(netnsDir); err == nil && !under(abs, rootdir.Run) {
		dirs = append(dirs, abs)
	}
	return dirs
}

// under reports whether path is dir or below it (both clean, absolute).
func under(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, dir+"/")
}

// checkUnixPathsVisible refuses an allowed unix socket that a Trial could
// not reach, being under a directory every Trial's mounts hide.
func checkUnixPathsVisible(paths []string, hidden []string) error {
	for _, p := range paths {
		if d := unixPathUnder(p, hidden); d != "" {
			return fmt.Errorf("unix path %s is under %s, which trialnet hides from every Trial (it holds trialnet's own files): put the socket elsewhere", p, d)
		}
	}
	return nil
}

// unixPathUnder is the one of dirs that path is under, as named or with
// its symlinks followed, or "".
func unixPathUnder(path string, dirs []string) string {
	names := []string{filepath.Clean(path)}
	if real, err := filepath.EvalSymlinks(path); err == nil {
		names = append(names, real)
	}
	for _, n := range names {
		for _, d := range dirs {
			if under(n, d) {
				return d
			}
		}
	}
	return ""
}

// checkUnixPathsOffSharedDirs refuses an allowed unix socket under one
// of sharedDirs, which every Trial has an empty one of (coverSharedDirs).
func checkUnixPathsOffSharedDirs(paths []string) error {
	for _, p := range paths {
		if d := unixPathUnder(p, sharedDirs); d != "" {
			return fmt.Errorf("unix path %s is under %s, which every Trial has an empty one of its own of (no file a Trial leaves there outlives it): put the socket elsewhere", p, d)
		}
	}
	return nil
}

// checkUnixPathsOffHostShm refuses an allowed unix socket on a mount of
// the host's /dev/shm tmpfs other than /dev/shm (a bind of it, a
// chroot's /dev/shm, /run/shm where that links to /dev/shm): the init
// detaches those (hostShmDrop), and binds into the Trial's own /dev/shm
// only the sockets named beneath it, so such a socket would be out of
// the Trial's reach without a word. The nearest existing directory
// stands for a socket not made yet.
func checkUnixPathsOffHostShm(paths []string) error {
	host, err := hostShmDev()
	if err != nil || host == 0 {
		return err
	}
	for _, p := range paths {
		p = filepath.Clean(p)
		if OwnDirOf(p) != "" {
			continue // bound into the Trial's own directory
		}
		var st unix.Stat_t
		for q := p; ; q = filepath.Dir(q) {
			if err := unix.Stat(q, &st); err == nil || q == "/" {
				break
			}
		}
		if st.Dev == host {
			return fmt.Errorf("unix path %s is on a mount of the host's /dev/shm, which trialnet detaches from every Trial (it holds the host's POSIX shared memory): name the socket by its path under /dev/shm, or put it elsewhere", p)
		}
	}
	return nil
}

// checkUnixPathsOffRemoteFS refuses an allowed unix socket on a FUSE or
// network file system (remoteFS) other than the root's: the init
// detaches those (hideRemoteFS), so such a socket would be out of the
// Trial's reach without a word. The one holding the working directory
// of the command that starts the init is kept too, but which command
// that is is not known here. The nearest existing path stands for a
// socket not made yet.
func checkUnixPathsOffRemoteFS(paths []string) error {
	var root unix.Stat_t
	if err := unix.Stat("/", &root); err != nil {
		return fmt.Errorf("look at /: %w", err)
	}
	for _, p := range paths {
		// One beneath an own directory too: the bind that keeps it there
		// is of the remote file system's inode, a mount of its type.
		var st unix.Stat_t
		q := filepath.Clean(p)
		for ; ; q = filepath.Dir(q) {
			if err := unix.Stat(q, &st); err == nil || q == "/" {
				break
			}
		}
		if st.Dev == root.Dev {
			continue
		}
		fstype, err := mountType(q)
		if err != nil {
			return fmt.Errorf("unix path %s: find the file system it is on: %w", p, err)
		}
		if remoteType(fstype) {
			return fmt.Errorf("unix path %s is on a %s mount, which trialnet detaches from every Trial unless it is the root's file system (%s): put the socket on a local file system", p, fstype, remoteWhy)
		}
	}
	return nil
}

// mountType is the file-system type of the mount on top at path, as
// mountinfo names it.
func mountType(path string) (string, error) {
	id, err := mountIDAt(unix.AT_FDCWD, path, 0)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return "", err
	}
	want := strconv.FormatUint(id, 10)
	for line := range strings.Lines(string(b)) {
		pre, post, ok := strings.Cut(line, " - ")
		if f := strings.Fields(pre); ok && len(f) > 0 && f[0] == want {
			fstype, _, _ := strings.Cut(post, " ")
			return fstype, nil
		}
	}
	return "", fmt.Errorf("mount %d of %s is not in mountinfo", id, path)
}

// maskHost narrows what the Trial's mount namespace shows of the host:
// kernel settings and sysfs read-only, a cgroup2 mount rooted at the
// Trial's own cgroup (the caller has unshared the cgroup namespace), the
// cgroup v1 hierarchies showing only the Trial's own groups, v1 (hideV1),
// and hidden the directories naming other Trials. Even a uid-0 Trial owns
// root's files: these mounts, not permissions, keep it from the host's
// core_pattern, other Trials' cgroup.kill and trialnet's sockets.
func maskHost(nested bool, hide, v1 []string, hostShm uint64) error {
	cgroup2, err := Cgroup2Mount()
	if err != nil {
		return err
	}
	// Where the kernel has them, as container runtimes do: sysctls, the
	// SysRq trigger, IRQ affinities and device buses, all host-wide. Not
	// in a nested Trial, whose sandboxes could not mount a /proc of their
	// own over a masked one, and whose commands are never uid 0.
	for _, p := range maskedProc(nested) {
		if _, err := os.Lstat(p); err != nil {
			continue // not on this kernel: nothing to protect
		}
		if err := unix.Mount(p, p, "", unix.MS_BIND, ""); err != nil {
			return maskErr("bind "+p, "to make it read-only", err)
		}
		if err := unix.Mount("", p, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return maskErr("make "+p+" read-only", "a Trial must not change the host's kernel settings", err)
		}
	}
	// Before /sys is made read-only: a v1 mount detached may uncover
	// mounts below /sys that were out of reach (hideV1).
	if err := hideV1(v1); err != nil {
		return err
	}
	if err := dropHostMounts(hostShm); err != nil {
		return err
	}
	// Before the autofs mounts: a direct one is reached once what it
	// mounted on its own point is gone.
	if err := hideRemoteFS(); err != nil {
		return err
	}
	if err := hideAutofs(); err != nil {
		return err
	}
	if err := hideHostTtys(); err != nil {
		return err
	}
	if err := readOnlySys(); err != nil {
		return err
	}
	// Rooted at the Trial's cgroup, this shows none of its siblings nor
	// the parent's limits. It replaces the host's mount, which
	// dropHostMounts detached (the kernel refuses a superblock over its
	// own mount), mounted read-write and then made read-only by a bind
	// remount: the superblock is the host's, and only this mount's flag
	// may change.
	if err := unix.Mount("cgroup2", cgroup2, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return maskErr("mount the Trial's own cgroup2 on "+cgroup2, "the host's shows every Trial", err)
	}
	if err := unix.Mount("", cgroup2, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return maskErr("make the Trial's cgroup2 on "+cgroup2+" read-only", "a Trial must not change its own limits", err)
	}
	for _, d := range hide {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			continue // nothing there to hide
		}
		const flags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
		if err := unix.Mount("tmpfs", d, "tmpfs", flags, "mode=0755,size=4k"); err != nil {
			return maskErr("hide "+d, "it names other Trials and holds trialnet's sockets", err)
		}
		if d == rootdir.Run {
			if err := mountViews(d); err != nil {
				return err
			}
		}
		// Read-only: a uid-0 Trial owns the tmpfs's root, and could bind a
		// socket where a client looks for trialnet's.
		if err := unix.Mount("", d, "", unix.MS_REMOUNT|unix.MS_RDONLY|flags, "mode=0755,size=4k"); err != nil {
			return maskErr("make "+d+" read-only", "a uid-0 Trial could put a socket where a client looks for trialnet's", err)
		}
	}
	return nil
}

// hideV1 replaces each cgroup v1 hierarchy mounted here with the
// Trial's own group in it (the entry of own, the Trial's groups as the
// host names them, below its mount point), bound read-only at the mount
// point, as container runtimes mount a container's; a hierarchy with no
// group of the Trial's is taken away. The Trial's commands unshare their
// cgroup namespace in those groups, so /proc/self/cgroup names each "/",
// and a reader that joins the two, as a JVM does to find its memory
// limit, finds the group at the mount point. The host's mounts are
// detached, not covered: mountinfo would still list them first, with a
// root outside the namespace's ("/../.."), which a JVM cannot place (its
// ManagementFactory threw). Nothing is left half made on a failure:
// these mounts are the init's namespace's, which dies with it.
//
// Where the hierarchies are mounted on a tmpfs of their own (systemd's
// /sys/fs/cgroup on a hybrid host), that tmpfs is detached with all of
// them at once and a copy of it alone mounted back, its directories
// empty mount points (hideV1Tree): each unmount waits for an RCU grace
// period, nine of them on such a host. Elsewhere each goes on its own.
//
// A mount detached shows what it covered, which may be another v1
// mount (or a directory holding some, under a v1 hierarchy mounted over
// it): the mount table is walked again, until a walk finds no v1 mount
// of the host's on top at its point, and only such a mount is acted on
// (one covered is reached once what covers it is gone).
func hideV1(own []string) error {
	placed := map[uint64]bool{} // the mounts of the Trial's groups
	for pass := 0; ; pass++ {
		// Each pass uncovers what the last detached: a host has not this
		// many layers, so more means a walk that no longer ends.
		if pass == v1Max {
			return maskErr("hide the cgroup v1 hierarchies", fmt.Sprintf("the mount table still changed after %d passes over it", v1Max), unix.ELOOP)
		}
		acted, left, err := hideV1Tree(own, placed)
		if err != nil || !left {
			return err
		}
		if acted {
			continue
		}
		// This thread's: the namespace its mounts are made in.
		b, err := os.ReadFile("/proc/thread-self/mountinfo")
		if err != nil {
			return fmt.Errorf("read mountinfo: %w", err)
		}
		done := map[string]bool{}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			pre, post, ok := strings.Cut(sc.Text(), " - ")
			f := strings.Fields(pre)
			if !ok || len(f) < 5 || !strings.HasPrefix(post, "cgroup ") {
				continue
			}
			id, err := strconv.ParseUint(f[0], 10, 64)
			if err != nil {
				return fmt.Errorf("read mountinfo: mount id %q: %w", f[0], err)
			}
			mnt := cgroup2.UnescapeMountPath(f[4])
			if placed[id] || done[mnt] {
				continue
			}
			mnt, top, err := mountOnTop(b, id, mnt, unix.AT_SYMLINK_NOFOLLOW, v1Why)
			if err != nil {
				return err
			}
			if !top {
				continue
			}
			done[mnt], acted = true, true
			shown, err := hideV1Mount(mnt, own)
			if err != nil {
				return err
			}
			placed[shown] = shown != 0
		}
		if !acted {
			return nil
		}
	}
}

const v1Why = "to hide the host's cgroup v1 hierarchy there"

// v1Max bounds the passes of hideV1 (the init's V1_MAX).
const v1Max = 64

// v1Entry is a mount of the table as hideV1Tree judges it.
type v1Entry struct {
	id, parent uint64
	fstype     string
	point      string
}

// hideV1Tree replaces, where one is found, a tmpfs on which only the
// host's cgroup hierarchies are mounted (v1TreeAlone) by a copy of it
// alone, with the Trial's groups on it (replaceV1Tree). acted: it did;
// left: the table still has a cgroup v1 mount of the host's (then the
// walk of hideV1 goes on).
func hideV1Tree(own []string, placed map[uint64]bool) (acted, left bool, err error) {
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return false, false, fmt.Errorf("read mountinfo: %w", err)
	}
	var e []v1Entry
	for line := range strings.Lines(string(b)) {
		pre, post, ok := strings.Cut(strings.TrimSuffix(line, "\n"), " - ")
		f := strings.Fields(pre)
		if len(f) < 5 {
			continue
		}
		id, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return false, false, fmt.Errorf("read mountinfo: mount id %q: %w", f[0], err)
		}
		parent, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			return false, false, fmt.Errorf("read mountinfo: parent id %q: %w", f[1], err)
		}
		fstype, _, _ := strings.Cut(post, " ")
		if !ok {
			fstype = ""
		}
		e = append(e, v1Entry{id: id, parent: parent, fstype: fstype, point: cgroup2.UnescapeMountPath(f[4])})
		left = left || (fstype == "cgroup" && !placed[id])
	}
	for _, m := range e {
		if !left || m.fstype != "cgroup" || placed[m.id] {
			continue
		}
		t := slices.IndexFunc(e, func(p v1Entry) bool { return p.id == m.parent })
		if t < 0 || e[t].fstype != "tmpfs" || e[t].point == "/" || !v1TreeAlone(e, e[t], placed) {
			continue
		}
		top, err := mountIDAt(unix.AT_FDCWD, e[t].point, unix.AT_SYMLINK_NOFOLLOW)
		if err != nil {
			return false, true, maskErr("find what is mounted on "+e[t].point, v1Why, err)
		}
		if top != e[t].id {
			continue
		}
		return true, true, replaceV1Tree(e, e[t].point, own, placed)
	}
	return false, left, nil
}

// v1TreeAlone reports whether every mount below the tmpfs t's point is
// a cgroup one of the host's (no copy placed), on a directory of that
// tmpfs (stacked ones too), and one at least is v1: what detaching t
// takes away is then what hideV1 and dropHostCgroup2 would.
func v1TreeAlone(e []v1Entry, t v1Entry, placed map[uint64]bool) bool {
	v1 := false
	for _, m := range e {
		if !under(m.point, t.point) || m.point == t.point {
			continue
		}
		if (m.fstype != "cgroup" && m.fstype != "cgroup2") || placed[m.id] || filepath.Dir(m.point) != t.point {
			return false
		}
		if m.parent != t.id && !slices.ContainsFunc(e, func(p v1Entry) bool { return p.id == m.parent && p.point == m.point }) {
			return false
		}
		v1 = v1 || m.fstype == "cgroup"
	}
	return v1
}

// replaceV1Tree detaches the tmpfs on dir with every cgroup hierarchy
// mounted on it, in one unmount, and mounts there a copy of the tmpfs
// alone (its directories are the mount points, empty), then the Trial's
// group of each v1 hierarchy, read-only, as hideV1Mount does.
func replaceV1Tree(e []v1Entry, dir string, own []string, placed map[uint64]bool) error {
	// Copied first, so that mountinfo lists it before the groups'
	// copies mounted on it.
	tmp, err := unix.OpenTree(unix.AT_FDCWD, dir, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_NO_AUTOMOUNT|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return maskErr("copy the tmpfs on "+dir+" without the cgroup hierarchies mounted on it", v1Why, err)
	}
	defer unix.Close(tmp)
	type shown struct {
		tree       int
		group, mnt string
	}
	var groups []shown
	defer func() {
		for _, g := range groups {
			_ = unix.Close(g.tree)
		}
	}()
	seen := map[string]bool{}
	for _, m := range e {
		if seen[m.point] || !under(m.point, dir) || m.point == dir {
			continue
		}
		seen[m.point] = true
		// Only where a v1 hierarchy is on top: that is where the Trial's
		// group path leads.
		var st unix.Statfs_t
		if err := unix.Statfs(m.point, &st); err != nil || st.Type != unix.CGROUP_SUPER_MAGIC {
			continue
		}
		tree, group, err := ownGroupTree(m.point, own)
		if err != nil {
			return err
		}
		if tree >= 0 {
			groups = append(groups, shown{tree, group, m.point})
		}
	}
	// One detach for every hierarchy: each unmount waits for an RCU
	// grace period (docs/performance.md, "Trial start").
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
		return maskErr("detach the tmpfs on "+dir+" with the host's cgroup hierarchies on it", "they show every Trial's groups and the host's", err)
	}
	if err := unix.MoveMount(tmp, "", unix.AT_FDCWD, dir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return maskErr("mount the copy of the tmpfs on "+dir+" again", "its directories are the cgroup mount points the Trial sees", err)
	}
	for _, g := range groups {
		id, err := showV1Group(g.tree, g.group, g.mnt)
		if err != nil {
			return err
		}
		placed[id] = true
	}
	return nil
}

// dropForeign detaches every mount of fstype but the Trial's own on
// ownPath (every one where optional and ownPath is absent). The Trial's
// own covers the host's there, but the host's mounted anywhere else (a
// chroot's /dev/pts or /proc, a bind of /dev with its submounts) stays:
// through the host's devpts a Trial running as the operator's uid opened
// the operator's pty and read what was typed into it; through the host's
// procfs it read every host process's command line and mount table, and
// a uid-0 Trial opened core_pattern for writing; through the host's
// mqueue (an instance per IPC namespace) it opened a queue of the
// operator's. As hideV1, it walks the mount table until no such mount is
// on top at its point.
func dropForeign(fstype, ownPath string, optional bool, held string) error {
	drop, err := foreign(fstype, ownPath, optional, held)
	if err != nil {
		return err
	}
	return dropMounts(drop)
}

// foreign is dropForeign's pick: fstype's mounts but the Trial's own on
// ownPath.
func foreign(fstype, ownPath string, optional bool, held string) (mountDrop, error) {
	var own unix.Stat_t
	if err := unix.Stat(ownPath, &own); err != nil {
		if !optional || !errors.Is(err, unix.ENOENT) {
			return mountDrop{}, maskErr("find the Trial's own "+fstype+" on "+ownPath, "to tell the host's from it", err)
		}
		own.Dev = 0 // no mount has device 0:0
	}
	return mountDrop{fstype, held, func(dev uint64, _ string) bool { return dev != own.Dev }}, nil
}

// dropHostMounts detaches the host's devpts, procfs, mqueue, /dev/shm
// tmpfs (hostShm, hostShmDev's), hugetlbfs and cgroup2 mounts, each pass
// one walk of the mount table for all six, in passes until one detaches nothing:
// each pass takes only mounts on top at their point, and one detached may
// uncover another kind's that it left as covered (a bind of the host's
// /dev/shm under a hugetlbfs). Where there is none, one read of the table.
func dropHostMounts(hostShm uint64) error {
	for {
		var drops []mountDrop
		for _, d := range []struct {
			fstype, own string
			optional    bool
			held        string
		}{
			{"devpts", "/dev/pts", false, devptsHeld},
			{"proc", "/proc", false, procHeld},
			{"mqueue", "/dev/mqueue", true, mqueueHeld},
		} {
			drop, err := foreign(d.fstype, d.own, d.optional, d.held)
			if err != nil {
				return err
			}
			drops = append(drops, drop)
		}
		if hostShm != 0 {
			drops = append(drops, hostShmDrop(hostShm))
		}
		// A file of its own on the host's hugetlbfs (/dev/hugepages)
		// would take the reserved pages that the seccomp filter's
		// MAP_HUGETLB rule keeps from the Trial.
		drops = append(drops, mountDrop{"hugetlbfs", hugetlbfsHeld, func(uint64, string) bool { return true }},
			// Every cgroup2 mount, not only the first, which the Trial's
			// own replaces: another (the tree bound into a chroot, a
			// second mount of it) showed every Trial, and, outside /sys, a
			// subtree delegated to the Trial's uid (systemd's
			// user@UID.service) writable, its cgroup.kill among it.
			mountDrop{"cgroup2", cgroup2Held, func(uint64, string) bool { return true }})
		acted, err := dropPass(drops)
		if !acted || err != nil {
			return err
		}
	}
}

// hostShmDrop picks every mount of the host's /dev/shm tmpfs (host,
// hostShmDev's) but the sockets kept in the Trial's own directories:
// through one (a chroot's /dev/shm, a bind for a container) a Trial
// running as the operator's uid opened the operator's POSIX shared
// memory and semaphores. The Trial's own tmpfs covers it on /dev/shm.
func hostShmDrop(host uint64) mountDrop {
	var own []string
	for _, d := range ownDirs {
		if real, err := filepath.EvalSymlinks(d.dir); err == nil {
			own = append(own, real)
		}
	}
	return mountDrop{"tmpfs", shmHeld, func(dev uint64, point string) bool {
		return dev == host && !slices.ContainsFunc(own, func(d string) bool { return under(point, d) })
	}}
}

// hostShmDev is the device of the host's /dev/shm, read before the
// Trial's own covers it, where it is a tmpfs mounted there whole (its
// root "/"): every mount of that device holds the host's shared memory.
// 0 where /dev/shm is anything else (a directory of /dev, part of a
// larger tmpfs bound there), whose device another file system's mounts
// share.
func hostShmDev() (uint64, error) {
	real, err := filepath.EvalSymlinks("/dev/shm")
	if err != nil {
		return 0, nil // none: nothing to detach
	}
	id, err := mountIDAt(unix.AT_FDCWD, real, 0)
	if err != nil || id == 0 {
		return 0, err
	}
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return 0, fmt.Errorf("read mountinfo: %w", err)
	}
	want := strconv.FormatUint(id, 10)
	for line := range strings.Lines(string(b)) {
		pre, post, ok := strings.Cut(line, " - ")
		f := strings.Fields(pre)
		if !ok || len(f) < 5 || f[0] != want {
			continue
		}
		if !strings.HasPrefix(post, "tmpfs ") || f[3] != "/" || cgroup2.UnescapeMountPath(f[4]) != real {
			return 0, nil
		}
		var maj, min uint32
		if _, err := fmt.Sscanf(f[2], "%d:%d", &maj, &min); err != nil {
			return 0, fmt.Errorf("read mountinfo: device %q: %w", f[2], err)
		}
		return unix.Mkdev(maj, min), nil
	}
	return 0, nil
}

// mountDrop is a kind of mount dropPass detaches: one of fstype that
// drop picks by its device and point (held says why it goes).
type mountDrop struct {
	fstype, held string
	drop         func(dev uint64, point string) bool
}

// dropMounts detaches each mount d picks on top at its point, walking the
// mount table until none is left.
func dropMounts(d mountDrop) error {
	for {
		acted, err := dropPass([]mountDrop{d})
		if !acted || err != nil {
			return err
		}
	}
}

// dropPass walks the mount table once and detaches each mount on top at
// its point that one of drops picks; it says whether it detached one.
func dropPass(drops []mountDrop) (acted bool, _ error) {
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return false, fmt.Errorf("read mountinfo: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f := strings.Fields(pre)
		if !ok || len(f) < 5 {
			continue
		}
		i := slices.IndexFunc(drops, func(d mountDrop) bool { return strings.HasPrefix(post, d.fstype+" ") })
		if i < 0 {
			continue
		}
		d := drops[i]
		id, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return acted, fmt.Errorf("read mountinfo: mount id %q: %w", f[0], err)
		}
		var maj, min uint32
		if _, err := fmt.Sscanf(f[2], "%d:%d", &maj, &min); err != nil {
			return acted, fmt.Errorf("read mountinfo: device %q: %w", f[2], err)
		}
		mnt := cgroup2.UnescapeMountPath(f[4])
		if !d.drop(unix.Mkdev(maj, min), mnt) {
			continue
		}
		// Only a mount on top at its point: Unmount takes what is on
		// top, and one covered is out of reach until that goes.
		mnt, top, err := mountOnTop(b, id, mnt, unix.AT_SYMLINK_NOFOLLOW, "to detach the host's "+d.fstype+" there")
		if err != nil {
			return acted, err
		}
		if !top {
			continue
		}
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			return acted, maskErr("detach the "+d.fstype+" on "+mnt, d.held, err)
		}
		acted = true
	}
	return acted, nil
}

// What dropForeign's mounts hold, each the reason it is detached.
const (
	devptsHeld = "it holds terminals outside the Trial, the operator's among them"
	procHeld   = "it shows the host's processes, and its kernel settings writable"
	mqueueHeld = "it holds the host's POSIX message queues"
	shmHeld    = "it is the host's /dev/shm, with its POSIX shared memory and semaphores"

	hugetlbfsHeld = "it draws on the host's reserved huge pages, which no limit of the Trial's bounds"
)

const (
	autofsWhy     = "to keep the host's automount daemon from the Trial's lookups"
	autofsMaxKept = 64
)

// hideAutofs replaces each autofs mount with what was mounted beneath it
// when the Trial started. A lookup under an autofs mount point hands the
// name to the host's automount daemon (root, in the host's namespaces),
// which acts on it outside the Trial: the -hosts map resolves it by DNS
// and asks that host for its exports, a wildcard map asks the NFS server
// for it, an LDAP map the directory; a name is data. What was already
// mounted there stays, on a read-only tmpfs (a home on NFS only where
// hideRemoteFS kept it); nothing new
// is mounted for the Trial. As hideV1, it walks the mount table until no
// autofs mount is on top at its point (a copy kept may hold one).
func hideAutofs() error {
	for pass := 0; ; pass++ {
		if pass == autofsMaxKept {
			return maskErr("detach the host's autofs mounts", autofsWhy, fmt.Errorf("still one after %d passes: %w", pass, unix.ELOOP))
		}
		b, err := os.ReadFile("/proc/thread-self/mountinfo")
		if err != nil {
			return fmt.Errorf("read mountinfo: %w", err)
		}
		acted := false
		sc := bufio.NewScanner(bytes.NewReader(b))
		for !acted && sc.Scan() {
			pre, post, ok := strings.Cut(sc.Text(), " - ")
			f := strings.Fields(pre)
			if !ok || len(f) < 5 || !strings.HasPrefix(post, "autofs ") {
				continue
			}
			id, err := strconv.ParseUint(f[0], 10, 64)
			if err != nil {
				return fmt.Errorf("read mountinfo: mount id %q: %w", f[0], err)
			}
			mnt := cgroup2.UnescapeMountPath(f[4])
			listed := mnt
			mnt, top, err := mountOnTop(b, id, mnt, unix.AT_SYMLINK_NOFOLLOW, autofsWhy)
			if err != nil {
				return err
			}
			if !top {
				continue
			}
			// Moved: b lists what is mounted beneath it elsewhere.
			if mnt != listed {
				if b, err = os.ReadFile("/proc/thread-self/mountinfo"); err != nil {
					return fmt.Errorf("read mountinfo: %w", err)
				}
			}
			if err := coverAutofs(mnt, f[0], b); err != nil {
				return err
			}
			acted = true
		}
		if !acted {
			return nil
		}
	}
}

// coverAutofs replaces the autofs mount id on mnt (mountinfo b, read
// before) with what was mounted beneath it, each at its place on a
// read-only tmpfs.
func coverAutofs(mnt, id string, b []byte) error {
	type kept struct {
		rel  string
		tree int
	}
	var keep []kept
	defer func() {
		for _, k := range keep {
			_ = unix.Close(k.tree)
		}
	}()
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		pre, _, _ := strings.Cut(sc.Text(), " - ")
		f := strings.Fields(pre)
		if len(f) < 5 || f[1] != id {
			continue
		}
		point := cgroup2.UnescapeMountPath(f[4])
		if len(keep) == autofsMaxKept {
			return maskErr("keep what is mounted beneath the autofs on "+mnt, autofsWhy, fmt.Errorf("more than %d mounts: %w", autofsMaxKept, unix.E2BIG))
		}
		// A copy made before the autofs goes, through no automount.
		tree, err := unix.OpenTree(unix.AT_FDCWD, point, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_NO_AUTOMOUNT|unix.AT_SYMLINK_NOFOLLOW)
		if err != nil {
			return maskErr("copy what is mounted on "+point+" beneath the autofs on "+mnt, autofsWhy, err)
		}
		keep = append(keep, kept{strings.TrimPrefix(point, mnt), tree})
	}
	if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
		return maskErr("detach the autofs on "+mnt, autofsWhy, err)
	}
	if len(keep) == 0 {
		return nil
	}
	const flags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := unix.Mount("tmpfs", mnt, "tmpfs", flags, "mode=0755,size=4k"); err != nil {
		return maskErr("mount a tmpfs on "+mnt+" for what the autofs there had mounted", autofsWhy, err)
	}
	for _, k := range keep {
		at := mnt + k.rel
		if err := os.MkdirAll(at, 0o755); err != nil {
			return maskErr("make "+at+" for what was mounted there", autofsWhy, err)
		}
		if err := unix.MoveMount(k.tree, "", unix.AT_FDCWD, at, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return maskErr("mount again on "+at+" what the autofs there had mounted", autofsWhy, err)
		}
	}
	if err := unix.Mount("", mnt, "", unix.MS_REMOUNT|unix.MS_RDONLY|flags, "mode=0755,size=4k"); err != nil {
		return maskErr("make the tmpfs on "+mnt+" read-only", autofsWhy, err)
	}
	return nil
}

// remoteFS are the types of the file systems a process or server
// outside the Trial serves: FUSE (an entry ending in "." names each
// subtype, "fuse.sshfs") and the network ones. The init's table
// (init_early.c's trialnet_init_remote_fs) is this one
// (TestEarlyInitTables). A hypervisor's shared folders (virtiofs,
// vboxsf, prl_fs, vmhgfs) are not in it: their one server is the VM's
// host, the machine the operator runs the VM on, as its disk is; a VM
// whose root or work is one (lima, Docker Desktop, vmtest's guests)
// would lose its files. 9p is in it: it runs over TCP too.
var remoteFS = []string{
	"fuse", "fuse.", "fuseblk", "fuseblk.",
	"nfs", "nfs4", "cifs", "smb3", "smbfs", "ncpfs", "9p",
	"ceph", "afs", "coda", "lustre", "orangefs", "beegfs", "gpfs",
}

// remoteType reports whether a mount of fstype is remoteFS's.
func remoteType(fstype string) bool {
	return slices.ContainsFunc(remoteFS, func(r string) bool {
		if strings.HasSuffix(r, ".") {
			return strings.HasPrefix(fstype, r) && len(fstype) > len(r)
		}
		return fstype == r
	})
}

const (
	remoteWhy = "every lookup, read and write beneath it is a request to a process or server outside the Trial, which sends its names and data past trialnet's proxy"
	// remoteMaxPasses bounds hideRemoteFS's walks (the init's REMOTE_MAX_PASSES).
	remoteMaxPasses = 64
)

// hideRemoteFS detaches every FUSE and network file-system mount
// (remoteFS) but those of the file systems on the way to the init's
// working directory, the first command's (initDir), / among them: the
// Trial's root and its work (a bind of the same file system elsewhere,
// an NFS root bound on a second path, asks the same server
// nothing new). Through any other, a lookup hands a name to a FUSE
// daemon or a file server in the host's namespaces (sshfs, rclone or
// s3fs send it to their remote, NFS to its server), around the proxy.
// Detached, not covered: the mount point shows the directory beneath,
// as on a host where nothing is mounted there, and what was mounted
// under it goes too. As hideV1, it walks the mount table until no such
// mount is on top at its point. The init's working directory is / after.
func hideRemoteFS() error {
	cwd, err := unix.Getwd()
	if err != nil {
		cwd = "/" // unreachable from the Trial's root: nothing to keep
	}
	kept := map[uint64]bool{} // the devices of the file systems on the way
	for p := cwd; ; p = filepath.Dir(p) {
		var st unix.Stat_t
		switch err := unix.Stat(p, &st); {
		case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR):
			// Under a mount of the Trial's own (its /tmp), out of its view:
			// nothing to keep; the launch says why the command cannot start there.
		case err != nil:
			return maskErr("look at "+p+", on the way to the working directory of the Trial's first command", "to keep the file system holding it", err)
		default:
			kept[st.Dev] = true
		}
		if p == "/" {
			break
		}
	}
	for pass := 0; ; pass++ {
		if pass == remoteMaxPasses {
			return maskErr("detach the host's FUSE and network file-system mounts", remoteWhy, fmt.Errorf("still one after %d passes: %w", pass, unix.ELOOP))
		}
		b, err := os.ReadFile("/proc/thread-self/mountinfo")
		if err != nil {
			return fmt.Errorf("read mountinfo: %w", err)
		}
		acted := false
		for line := range strings.Lines(string(b)) {
			pre, post, ok := strings.Cut(strings.TrimSuffix(line, "\n"), " - ")
			f := strings.Fields(pre)
			fstype, _, _ := strings.Cut(post, " ")
			if !ok || len(f) < 5 || !remoteType(fstype) {
				continue
			}
			var maj, min uint32
			if _, err := fmt.Sscanf(f[2], "%d:%d", &maj, &min); err != nil {
				return fmt.Errorf("read mountinfo: device %q: %w", f[2], err)
			}
			if kept[unix.Mkdev(maj, min)] {
				continue // the Trial's root, or holding its work
			}
			mnt := cgroup2.UnescapeMountPath(f[4])
			id, err := strconv.ParseUint(f[0], 10, 64)
			if err != nil {
				return fmt.Errorf("read mountinfo: mount id %q: %w", f[0], err)
			}
			// Cached attributes: a server that does not answer must not
			// hold up every Trial's start (CIFS asks its server otherwise;
			// FUSE and NFS ask nothing for a mount id alone).
			mnt, top, err := mountOnTop(b, id, mnt, unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_DONT_SYNC, remoteWhy)
			if err != nil {
				return err
			}
			if !top {
				continue
			}
			if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
				return maskErr("detach the "+fstype+" mount on "+mnt, remoteWhy, err)
			}
			acted = true
		}
		if !acted {
			break
		}
	}
	// Not left on a host mount that the Trial's own may cover.
	if err := unix.Chdir("/"); err != nil {
		return maskErr("change the init's working directory to /", "it was the first command's, to keep the mounts holding it", err)
	}
	return nil
}

const cgroup2Held = "it shows every Trial, and a subtree delegated to the Trial's uid writable"

const ttysWhy = "a terminal login gave the Trial's uid, the operator's among them"

// vcsMajor is the major of vcs, vcsa and vcsu: a console's screen, which
// login may give its user with the console.
const vcsMajor = 7

// ttyMajors are the majors of the kernel's terminal drivers but ptys, as
// /proc/tty/drivers lists them, and the consoles' screens'.
func ttyMajors() (map[uint32]bool, error) {
	b, err := os.ReadFile("/proc/tty/drivers")
	if err != nil {
		return nil, maskErr("read /proc/tty/drivers", "to find the host's terminals", err)
	}
	majors := map[uint32]bool{vcsMajor: true}
	for line := range strings.Lines(string(b)) {
		// NAME NODE MAJOR MINORS TYPE
		f := strings.Fields(line)
		if len(f) < 5 || strings.HasPrefix(f[4], "pty:") {
			continue
		}
		if m, err := strconv.ParseUint(f[2], 10, 32); err == nil {
			majors[uint32(m)] = true
		}
	}
	return majors, nil
}

// coveredMisc are misc devices (major 10) that a Trial command must not
// open, covered whoever owns them: a rule may make them 0666 or give the
// seat's user an ACL on them (systemd's uaccess, which Steam's rules put
// on uinput), and a Trial under sudo runs as that user.
var coveredMisc = []struct {
	minor     uint32
	name, why string
}{
	// A VM's end of AF_VSOCK; systemd makes its static node 0666, and
	// opening it loads the driver: the opener owns a guest CID and talks
	// to the host's vsock services, which no network namespace holds.
	{241, "vhost-vsock device", "any process that opens it talks to the host's vsock services as a VM, past every network layer"},
	// A keyboard of its own, typing into the operator's session.
	{223, "uinput device", "through it a process types into the host's display and consoles"},
	{239, "uhid device", "through it a process types into the host's display and consoles"},
}

// coveredDevice says why a host device node in a devtmpfs mount gets
// /dev/null over it in the Trial ("" if it does not): a terminal that is
// not root's, and the coveredMisc devices whoever owns them.
func coveredDevice(st *unix.Stat_t, ttys map[uint32]bool) (what, why string) {
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return "", ""
	}
	for _, m := range coveredMisc {
		if st.Rdev == unix.Mkdev(10, m.minor) {
			return m.name, m.why
		}
	}
	if st.Uid != 0 && ttys[unix.Major(st.Rdev)] {
		return "terminal", ttysWhy
	}
	return "", ""
}

// hideHostTtys covers with /dev/null each terminal of the host's that
// is not root's (a virtual console or serial line that a login gave its
// user) in every devtmpfs mount, and in /dev whatever it is: the Trial's
// own pty is relayed, but a Trial running as that user opened the
// operator's console directly, read what was typed there and wrote to
// it. The devpts ones are dropHostDevpts's. The coveredMisc devices are
// covered the same way.
func hideHostTtys() error {
	majors, err := ttyMajors()
	if err != nil {
		return err
	}
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return fmt.Errorf("read mountinfo: %w", err)
	}
	devDone := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f := strings.Fields(pre)
		if !ok || len(f) < 5 || !strings.HasPrefix(post, "devtmpfs ") {
			continue
		}
		id, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return fmt.Errorf("read mountinfo: mount id %q: %w", f[0], err)
		}
		mnt := cgroup2.UnescapeMountPath(f[4])
		mnt, top, err := mountOnTop(b, id, mnt, unix.AT_SYMLINK_NOFOLLOW, "to cover the host's terminals there")
		if err != nil {
			return err
		}
		if !top {
			continue
		}
		if err := coverDevices(mnt, majors); err != nil {
			return err
		}
		devDone = devDone || mnt == "/dev"
	}
	// /dev need not be a devtmpfs: in a container (a privileged one's
	// holds a node of each host device, numbers and owners copied) or
	// systemd-nspawn it is a tmpfs of nodes. Where it is the devtmpfs
	// just walked, a second look would find only /dev/null there.
	if devDone {
		return nil
	}
	return coverDevices("/dev", majors)
}

// coverDevices binds /dev/null over each node directly in dir that
// coveredDevice names.
func coverDevices(dir string, majors map[uint32]bool) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return maskErr("list "+dir, "to cover the host's terminals there", err)
	}
	for _, e := range entries {
		if e.Type()&os.ModeCharDevice == 0 {
			continue
		}
		path := filepath.Join(dir, e.Name())
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			continue
		}
		what, why := coveredDevice(&st, majors)
		if what == "" {
			continue
		}
		if err := unix.Mount("/dev/null", path, "", unix.MS_BIND, ""); err != nil {
			return maskErr("cover the host's "+what+" "+path+" with /dev/null", why, err)
		}
	}
	return nil
}

// movedMax bounds mountOnTop's looks (the init's MOVED_MAX).
const movedMax = 16

// topMountID is mountIDAt; a test stands in for a host process that
// renames a directory above a mount each time the init looks.
var topMountID = mountIDAt

// mountOnTop says whether the mount id, which the mount table (table,
// its walk's) listed on mnt, is on top at its point, and where that
// point is now. A walk finds a mount by its listed point: a host process
// that renames a directory above its own mount (a FUSE one in its home,
// a chroot's /proc) in the instant between the read and the look makes
// the point lead elsewhere, and the mount, left in the Trial's view,
// seemed covered. A rename moves no mount (and the set-up's propagation
// is private: only it mounts here), so a mount the table shows covered
// (a mount on it or over a directory above it: reached once that goes)
// is; one it does not is looked for where a fresh table lists it, and
// movedMax looks that miss it refuse the Trial.
func mountOnTop(table []byte, id uint64, mnt string, flags int, why string) (string, bool, error) {
	for look := 1; ; look++ {
		top, err := topMountID(unix.AT_FDCWD, mnt, flags)
		if err != nil {
			return mnt, false, maskErr("find what is mounted on "+mnt, why, err)
		}
		if top == id {
			return mnt, true, nil
		}
		if _, _, covered := mountCovered(string(table), id); look == 1 && covered {
			return mnt, false, nil // hidden, reached once what hides it goes
		}
		if look == movedMax {
			return mnt, false, fmt.Errorf("find the mount on %s (%s): it was not there, nor covered, each of the %d times the init looked (a directory above it renamed meanwhile): %w; trialnet does not start a Trial that may see a mount it is to hide: start it again, and find what renames directories there", mnt, why, look, unix.EAGAIN)
		}
		if table, err = os.ReadFile("/proc/thread-self/mountinfo"); err != nil {
			return mnt, false, fmt.Errorf("read mountinfo: %w", err)
		}
		point, listed, covered := mountCovered(string(table), id)
		if !listed || covered {
			return mnt, false, nil
		}
		mnt = cgroup2.UnescapeMountPath(point)
	}
}

// mountCovered finds the mount id in table (mountinfo's text): its point
// as the table prints it, whether it is listed, and whether the table
// shows it covered: a mount on it, or on a mount below it, at its point
// or at a directory above that point, the mount below's (the init's
// trialnet_mount_covered, TestMountCovered). Escaped as the table prints
// them, points compare as the paths do: no escape holds a '/'.
func mountCovered(table string, id uint64) (point string, listed, covered bool) {
	type ref struct {
		id, parent uint64
		point      string
	}
	var refs []ref
	byID := map[uint64]ref{}
	for line := range strings.Lines(table) {
		f := strings.Split(strings.TrimSuffix(line, "\n"), " ")
		if len(f) < 5 || f[4] == "" {
			continue
		}
		mid, err1 := strconv.ParseUint(f[0], 10, 64)
		parent, err2 := strconv.ParseUint(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		r := ref{mid, parent, f[4]}
		refs = append(refs, r)
		if _, dup := byID[mid]; !dup {
			byID[mid] = r
		}
	}
	m, listed := byID[id]
	if !listed {
		return "", false, false
	}
	// The chain of mounts below id's (the init follows chainMax).
	chain := []ref{m}
	for r := m; len(chain) < chainMax && r.parent != r.id; {
		var ok bool
		if r, ok = byID[r.parent]; !ok {
			break
		}
		chain = append(chain, r)
	}
	atOrAbove := func(dir, path string) bool { return dir == "/" || under(path, dir) }
	for _, c := range refs {
		if slices.ContainsFunc(chain, func(r ref) bool { return r.id == c.id }) {
			continue
		}
		for k, r := range chain {
			if c.parent == r.id && atOrAbove(c.point, chain[max(k-1, 0)].point) {
				return m.point, true, true
			}
		}
	}
	return m.point, true, false
}

// chainMax is the init's CHAIN_MAX: the mounts below one that
// mountCovered follows.
const chainMax = 64

// mountIDAt is the id (mountinfo's) of the mount on top at path; 0 when
// path cannot be reached (a mount over a directory above it hides it).
func mountIDAt(dirfd int, path string, flags int) (uint64, error) {
	var st unix.Statx_t
	err := unix.Statx(dirfd, path, flags|unix.AT_NO_AUTOMOUNT, unix.STATX_MNT_ID, &st)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return 0, nil
	}
	if err == nil && st.Mask&unix.STATX_MNT_ID == 0 {
		err = errors.New("the kernel gives no mount id (statx STATX_MNT_ID, Linux 5.8)")
	}
	return st.Mnt_id, err
}

// ownGroupTree is a copy of the Trial's group below the cgroup v1 mount
// point mnt, named in own (-1: none), and the group's name. The copy is
// made through the host's mount before it goes (a bind's source must be
// attached; the copy is attached nowhere until moved); a group gone (an
// operator removed it) is not there to show.
func ownGroupTree(mnt string, own []string) (tree int, group string, err error) {
	tree = -1
	for _, g := range own {
		// One group named twice: the pids and memory controllers share
		// this hierarchy.
		if !under(g, mnt) || g == mnt || (tree >= 0 && g == group) {
			continue
		}
		if tree >= 0 {
			_ = unix.Close(tree)
			return -1, "", maskErr("show the Trial's cgroup v1 groups "+group+" and "+g, "they share one hierarchy, whose mount point shows one group", unix.EINVAL)
		}
		tree, err = unix.OpenTree(unix.AT_FDCWD, g, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if errors.Is(err, unix.ENOENT) {
			tree = -1
			continue
		}
		if err != nil {
			return -1, "", maskErr("copy the Trial's cgroup v1 group "+g, "to show it alone", err)
		}
		group = g
	}
	return tree, group, nil
}

// showV1Group moves tree, the copy of the Trial's group, to mnt and
// makes it read-only; it returns the copy's mount id.
func showV1Group(tree int, group, mnt string) (uint64, error) {
	id, err := mountIDAt(tree, "", unix.AT_EMPTY_PATH)
	if err != nil {
		return 0, maskErr("find the mount id of the copy of the Trial's cgroup v1 group "+group, "to tell it from the host's", err)
	}
	if err := unix.MoveMount(tree, "", unix.AT_FDCWD, mnt, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return 0, maskErr("mount the Trial's cgroup v1 group "+group+" on "+mnt, "to show it alone", err)
	}
	const flags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := unix.Mount("", mnt, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|flags, ""); err != nil {
		return 0, maskErr("make the Trial's cgroup v1 group on "+mnt+" read-only", "a Trial must not change its own limits", err)
	}
	return id, nil
}

// hideV1Mount detaches every cgroup v1 mount stacked on mnt and moves
// there a read-only copy of the Trial's group below it, if any; it
// returns the copy's mount id (0: none).
func hideV1Mount(mnt string, own []string) (uint64, error) {
	tree, group, err := ownGroupTree(mnt, own)
	if err != nil {
		return 0, err
	}
	if tree >= 0 {
		defer unix.Close(tree)
	}
	// Every cgroup v1 mount stacked there, and only those: what the host
	// put over one (a tmpfs) already hides it.
	for {
		var st unix.Statfs_t
		if err := unix.Statfs(mnt, &st); err != nil || st.Type != unix.CGROUP_SUPER_MAGIC {
			break
		}
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			return 0, maskErr("detach the host's cgroup v1 hierarchy from "+mnt, "it shows every Trial's groups and the host's", err)
		}
	}
	if tree < 0 {
		return 0, nil
	}
	return showV1Group(tree, group, mnt)
}

func maskedProc(nested bool) []string {
	if nested {
		return nil
	}
	return []string{"/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"}
}

// readOnlySys makes /sys and every mount below it read-only, keeping
// each one's other flags: in one mount_setattr over the tree on /sys
// (Linux 5.12), which also reaches the mounts that others cover there,
// else by a bind remount of each mount the table lists.
func readOnlySys() error {
	// Whatever the refusal (a kernel before 5.12, a /sys that is no
	// mount's root, a filter that does not know the call), the walk makes
	// every mount a path reaches read-only, or fails naming the one it
	// could not.
	ro := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY}
	if unix.MountSetattr(unix.AT_FDCWD, "/sys", unix.AT_RECURSIVE|unix.AT_SYMLINK_NOFOLLOW|unix.AT_NO_AUTOMOUNT, ro) == nil {
		return nil
	}
	return readOnlySysEach()
}

// readOnlySysEach bind-remounts /sys and every mount below it read-only,
// keeping each one's other flags (a bind remount sets them all).
func readOnlySysEach() error {
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return fmt.Errorf("read mountinfo: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 {
			continue
		}
		path := cgroup2.UnescapeMountPath(fields[4])
		if !under(path, "/sys") {
			continue
		}
		flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY)
		for _, o := range strings.Split(fields[5], ",") {
			flags |= mountFlag(o)
		}
		err := unix.Mount("", path, "", flags, "")
		if errors.Is(err, unix.ENOENT) {
			continue // covered by a later mount: unreachable anyway
		}
		if err != nil {
			return maskErr("make "+path+" read-only", "a Trial must not change the host's devices or kernel state", err)
		}
	}
	return nil
}

// mountFlag is the flag of a mountinfo per-mount option that a remount
// must repeat, 0 for any other (a switch, not a map: a package-level map
// is built by every start of the binary, docs/performance.md).
func mountFlag(option string) uintptr {
	switch option {
	case "nosuid":
		return unix.MS_NOSUID
	case "nodev":
		return unix.MS_NODEV
	case "noexec":
		return unix.MS_NOEXEC
	case "noatime":
		return unix.MS_NOATIME
	case "nodiratime":
		return unix.MS_NODIRATIME
	case "relatime":
		return unix.MS_RELATIME
	}
	return 0
}

func maskErr(what, why string, err error) error {
	return fmt.Errorf("%s (%s): %w; trialnet does not start a Trial without it: check that nothing (an AppArmor or SELinux policy, a container runtime) stops root mounting", what, why, err)
}
