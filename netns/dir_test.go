//go:build linux

package netns

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/internal/privtest"
	"golang.org/x/sys/unix"
)

// nsfsMounts counts the mounts of namespace ns in this mount namespace.
func nsfsMounts(t *testing.T, ns string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[3] == ns && strings.Contains(line, " - nsfs ") {
			n++
		}
	}
	return n
}

// Making the netns directory a mount of its own, on a host where an
// earlier agent left live Trials' namespaces in it (an upgrade), keeps
// each where it was, mounted once (the original, covered by the new
// mount, would hold the namespace past its Trial and keep its file from
// being removed), and one made after it is mounted once, whether the
// directory's parent propagates (shared, as /run is under systemd) or not. A directory that is a mount already (a
// restart, a hand-over) is left as it is.
func TestPrivilegedMountDirKeepsLiveNamespaces(t *testing.T) {
	privtest.Require(t)
	for _, propagation := range []uintptr{unix.MS_SHARED, unix.MS_PRIVATE} {
		t.Run(map[uintptr]string{unix.MS_SHARED: "shared", unix.MS_PRIVATE: "private"}[propagation], func(t *testing.T) {
			parent := t.TempDir()
			if err := unix.Mount("tmpfs", parent, "tmpfs", 0, "size=64k"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = unix.Unmount(parent, unix.MNT_DETACH) })
			if err := unix.Mount("", parent, "", propagation, ""); err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(parent, "netns")
			ns, err := Create(dir, "live")
			if err != nil {
				t.Fatal(err)
			}
			var st unix.Stat_t
			if err := unix.Stat(ns.Path, &st); err != nil {
				t.Fatal(err)
			}
			own := fmt.Sprintf("net:[%d]", st.Ino) // as mountinfo names it
			for range 2 {
				if err := MountDir(dir); err != nil {
					t.Fatal(err)
				}
				if m, err := isMountPoint(dir); err != nil || !m {
					t.Fatalf("%s is no mount of its own: %v", dir, err)
				}
				if n := nsfsMounts(t, own); n != 1 {
					t.Errorf("the live namespace %s is mounted %d times, want once", own, n)
				}
				got, err := Open(dir, "live")
				if err != nil || got.Cookie != ns.Cookie {
					t.Fatalf("the live namespace after MountDir: %+v, %v", got, err)
				}
			}
			later, err := Create(dir, "later")
			if err != nil {
				t.Fatal(err)
			}
			if err := unix.Stat(later.Path, &st); err != nil {
				t.Fatal(err)
			}
			if n := nsfsMounts(t, fmt.Sprintf("net:[%d]", st.Ino)); n != 1 {
				t.Errorf("a namespace made after MountDir is mounted %d times, want once (a copy on the parent, covered?)", n)
			}
			if err := later.Delete(); err != nil {
				t.Fatal(err)
			}
			b, _ := os.ReadFile("/proc/self/mountinfo")
			if n := strings.Count(string(b), " "+dir+" "); n != 1 {
				t.Errorf("%s is mounted %d times, want once", dir, n)
			}
			if err := ns.Delete(); err != nil {
				t.Fatalf("destroy after MountDir: %v", err)
			}
			if n := nsfsMounts(t, own); n != 0 {
				t.Errorf("the destroyed namespace %s is still mounted %d times", own, n)
			}
			if err := ReleaseDir(dir); err != nil {
				t.Fatal(err)
			}
			if m, _ := isMountPoint(dir); m {
				t.Errorf("%s is still a mount after ReleaseDir", dir)
			}
		})
	}
}

// A netns directory named through a symlink is made a mount once, not
// once more at each agent's start.
func TestPrivilegedMountDirThroughSymlink(t *testing.T) {
	privtest.Require(t)
	parent := t.TempDir()
	real, link := filepath.Join(parent, "real"), filepath.Join(parent, "link")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ReleaseDir(real) })
	for range 2 {
		if err := MountDir(link); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := os.ReadFile("/proc/self/mountinfo")
	if n := strings.Count(string(b), " "+real+" "); n != 1 {
		t.Errorf("%s is mounted %d times, want once", real, n)
	}
}

// On a fresh host (an empty directory) under a shared parent, a
// namespace made after MountDir is mounted once: as a peer of the parent,
// the directory's mount would pass each one on to the parent's copy of
// the path, covered, where an init detaching the directory would keep it.
func TestPrivilegedMountDirFreshUnderShared(t *testing.T) {
	privtest.Require(t)
	parent := t.TempDir()
	if err := unix.Mount("tmpfs", parent, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(parent, unix.MNT_DETACH) })
	if err := unix.Mount("", parent, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(parent, "netns")
	if err := MountDir(dir); err != nil {
		t.Fatal(err)
	}
	ns, err := Create(dir, "fresh")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Delete() })
	var st unix.Stat_t
	if err := unix.Stat(ns.Path, &st); err != nil {
		t.Fatal(err)
	}
	if n := nsfsMounts(t, fmt.Sprintf("net:[%d]", st.Ino)); n != 1 {
		t.Errorf("the namespace is mounted %d times, want once", n)
	}
}
