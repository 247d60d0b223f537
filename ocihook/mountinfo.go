//go:build linux

package ocihook

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/trialnet/trialnet/internal/cgroup2"
	"golang.org/x/sys/unix"
)

// mountEntry is one line of /proc/<pid>/mountinfo: what the kernel has
// mounted, whatever a config said.
type mountEntry struct {
	id     uint64 // the mount's id, as statx's STATX_MNT_ID gives it
	dev    uint64 // the file system's device (not always stat's st_dev: btrfs)
	root   string // the mounted directory, as a path within its file system
	point  string // where, relative to the reading process's root
	fstype string
}

// readMountinfo parses a mountinfo file (proc(5)).
func readMountinfo(path string) ([]mountEntry, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []mountEntry
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if sep < 6 || len(f) < sep+2 {
			return nil, fmt.Errorf("%s: a line the hook cannot read: %q", path, line)
		}
		id, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: a mount id the hook cannot read: %q", path, f[0])
		}
		maj, min, ok := strings.Cut(f[2], ":")
		ma, err1 := strconv.ParseUint(maj, 10, 32)
		mi, err2 := strconv.ParseUint(min, 10, 32)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%s: a device the hook cannot read: %q", path, f[2])
		}
		out = append(out, mountEntry{id: id, dev: unix.Mkdev(uint32(ma), uint32(mi)), root: cgroup2.UnescapeMountPath(f[3]),
			point: cgroup2.UnescapeMountPath(f[4]), fstype: f[sep+1]})
	}
	return out, nil
}

// protectedFile is a protected host path as the kernel knows it: its
// file system's device and its path within that file system, so that a
// mount of it is seen whatever name it was mounted by.
type protectedFile struct {
	path, inFS string
	dev        uint64
}

// locate finds each protected path that exists in the hook's own mount
// table (the runtime's, the host's).
func locate(self []mountEntry, protected []string) []protectedFile {
	var out []protectedFile
	for _, p := range protected {
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			continue // absent: nothing to mount
		}
		var st unix.Statx_t
		if unix.Statx(unix.AT_FDCWD, real, 0, unix.STATX_MNT_ID, &st) != nil {
			continue
		}
		// The mount the path is on, by the id the kernel gives: its device
		// as mountinfo says it, which the container's mounts are told by.
		// stat's st_dev is not it on btrfs (each subvolume's own), so a
		// match on st_dev would leave every path there unprotected.
		best := -1
		if st.Mask&unix.STATX_MNT_ID != 0 {
			best = slices.IndexFunc(self, func(m mountEntry) bool { return m.id == st.Mnt_id })
		}
		if best < 0 {
			// Before Linux 5.8: the last mount on the longest prefix is
			// the one the path is on, if its device is stat's.
			for i, m := range self {
				if within(real, m.point) && (best < 0 || len(m.point) >= len(self[best].point)) {
					best = i
				}
			}
			if best >= 0 && self[best].dev != unix.Mkdev(st.Dev_major, st.Dev_minor) {
				best = -1
			}
		}
		if best < 0 || !within(real, self[best].point) {
			continue // on no mount the hook sees as the kernel does
		}
		m := self[best]
		rel, _ := filepath.Rel(m.point, real)
		out = append(out, protectedFile{path: p, inFS: filepath.Join(m.root, rel), dev: m.dev})
	}
	return out
}

// kernelFS are file system types no container in a Trial may have
// mounted at all: bpffs holds trialnet's pins, debugfs and tracefs read
// the kernel's memory and tracing, configfs makes kernel objects (an
// NVMe-over-TCP target, listening in the host's network, that exports a
// disk) and efivarfs writes the firmware's boot entries; root needs no
// capability for the last two. A recursive bind of /sys/kernel or
// /sys/firmware brings them in, writable under a read-only top (runc
// makes rbind,ro read-only at the top mount only).
var kernelFS = []string{"bpf", "debugfs", "tracefs", "configfs", "efivarfs"}

// checkMounts judges the container's mounts as the kernel has made
// them, the second line behind the config's: a bind source swapped
// after the runtime resolved it, a mount that propagated in, or one the
// runtime added itself is named by no config. At createRuntime the
// runtime has made the container's mounts; before pivot_root (runc) its
// mount namespace still holds a copy of the host's, which the pivot
// drops, so only the mounts at or under its root file system are its.
func (h *Hook) checkMounts(pid int, rootfs, trialCgroup string) []string {
	p := filepath.Join(h.proc(), strconv.Itoa(pid))
	mounts, err := readMountinfo(filepath.Join(p, "mountinfo"))
	if err != nil {
		return []string{fmt.Sprintf("cannot read its mounts as the kernel has them: %v", err)}
	}
	self, err := readMountinfo(filepath.Join(h.proc(), "self", "mountinfo"))
	if err != nil {
		return []string{fmt.Sprintf("cannot read the runtime's mounts: %v", err)}
	}
	hostRoot, err := sameFile(filepath.Join(p, "root"), filepath.Join(h.proc(), "self", "root"))
	if err != nil {
		return []string{fmt.Sprintf("cannot tell its root from the runtime's: %v", err)}
	}
	base := "/" // after pivot_root every mount it sees is its
	if hostRoot {
		base = rootfs
	}
	if base == "" {
		return []string{"its bundle names no root file system, so its mounts cannot be told from the runtime's"}
	}
	mount, _ := h.cgroupMount() // unknown: checkCgroup refuses the container
	rel := "/" + strings.TrimPrefix(strings.TrimPrefix(trialCgroup, mount), "/")
	prot := locate(self, h.protected())
	var roots []protectedFile
	if h.data != nil {
		roots = locate(self, h.data.roots)
	}
	// The host's terminals: a devpts instance mounted in the runtime's
	// own namespace (the operator's pty among them), bound in by path or
	// with a recursive bind of /dev. Docker's default device rules open
	// every pty (136:*), and its root reads any.
	hostPts := map[uint64]bool{}
	for _, m := range self {
		if m.fstype == "devpts" {
			hostPts[m.dev] = true
		}
	}
	var why []string
	for _, m := range mounts {
		if !within(m.point, base) {
			continue
		}
		w := m.refusal(prot, rel)
		if w == "" && m.fstype == "devpts" && hostPts[m.dev] {
			w = "is the host's devpts, which holds the host's terminals, the operator's among them: bind nothing of /dev/pts (nor /dev recursively); the runtime gives the container a devpts of its own"
		}
		if w == "" && h.data != nil {
			w = h.data.mountRefusal(roots, m)
		}
		if w != "" {
			why = append(why, fmt.Sprintf("the kernel shows a mount on %s (%s, %s within its file system) that %s", m.point, m.fstype, m.root, w))
		}
	}
	return why
}

// refusal says why the container must not have mount m, or "". Whether
// a mount is read-only is the config's check alone: at createRuntime
// runc and crun have not yet made read-only what the config says is
// (crun's /sys and /sys/fs/cgroup, runc's readonlyPaths), so the kernel
// still shows them writable.
func (m mountEntry) refusal(prot []protectedFile, trialCgroup string) string {
	switch {
	case slices.Contains(kernelFS, m.fstype):
		return "shows it the kernel's own state (trialnet's pins, tracing)"
	case m.fstype == "autofs":
		// A bind of a directory holding one (an rbind of /home or /net).
		return "hands each name looked up beneath it to the host's automount daemon, which acts on it outside the Trial (resolves it, asks an NFS or LDAP server for it): bind what is mounted beneath it instead, non-recursively"
	case m.fstype == "cgroup2":
		if !within(m.root, trialCgroup) {
			return fmt.Sprintf("is of the cgroup tree above its Trial's (%s): it could move out of it", trialCgroup)
		}
		return "" // its own part of the tree, which the protected cgroup tree holds
	}
	for _, p := range prot {
		if m.dev == p.dev && (within(p.inFS, m.root) || within(m.root, p.inFS)) {
			return fmt.Sprintf("holds or is inside %s (trialnet's own: its control socket, state, data, keys, pins or cgroups): bind nothing of it", p.path)
		}
	}
	return ""
}
