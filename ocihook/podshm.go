//go:build linux

package ocihook

import (
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// ContainerdShmDir is where containerd's CRI plugin (1.7 and 2.x, with
// its default state directory /run/containerd, inside the protected
// /run/containerd) makes each pod sandbox's /dev/shm: a tmpfs of the
// pod's own, mounted at <dir>/<sandbox id>/shm and bound on /dev/shm of
// each of the pod's containers ("rbind", "rprivate", "rw"). CRI-O makes
// its pods' under /run/containers/storage, which no rule protects.
const ContainerdShmDir = "/run/containerd/io.containerd.grpc.v1.cri/sandboxes"

// AnnotationSandboxID is containerd's annotation on every container of a
// pod: the pod sandbox's id.
const AnnotationSandboxID = "io.kubernetes.cri.sandbox-id"

// isSandboxID says whether s is shaped as containerd's sandbox id: 32
// random bytes in lower-case hex.
func isSandboxID(s string) bool {
	return len(s) == 64 && strings.Trim(s, "0123456789abcdef") == ""
}

// podShmOptions are the options containerd gives the bind, and those
// that only take from it.
var podShmOptions = []string{"rbind", "bind", "rprivate", "private", "rw", "ro", "nosuid", "nodev", "noexec"}

// podShm says whether m is containerd's bind of pod sandbox's own
// /dev/shm, in the shape containerd makes it, under dir
// (ContainerdShmDir): on /dev/shm, a bind, from exactly dir/<sandbox>/shm
// with sandbox in containerd's id shape, with no option but
// podShmOptions. Nothing else under dir passes by being named shm.
func (m mountOf) podShm(dir, sandbox string) bool {
	return isSandboxID(sandbox) &&
		filepath.Clean(m.Destination) == "/dev/shm" && m.Type == "bind" &&
		m.Source == dir+"/"+sandbox+"/shm" &&
		!slices.ContainsFunc(m.Options, func(o string) bool { return !slices.Contains(podShmOptions, o) })
}

// ownTmpfs says whether path is a tmpfs mounted at path itself, reached
// through no symbolic link: what containerd mounts there, and not a
// directory of the runtime's state that happens to be named shm.
func ownTmpfs(path string) bool {
	if real, err := filepath.EvalSymlinks(path); err != nil || real != path {
		return false
	}
	var fs unix.Statfs_t
	var st, parent unix.Stat_t
	return unix.Statfs(path, &fs) == nil && fs.Type == unix.TMPFS_MAGIC &&
		unix.Lstat(path, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR &&
		unix.Stat(filepath.Dir(path), &parent) == nil && parent.Dev != st.Dev
}
