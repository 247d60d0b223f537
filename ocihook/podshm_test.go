//go:build linux

package ocihook

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/internal/privtest"
	"golang.org/x/sys/unix"
)

// The hook lets a container bind its pod's /dev/shm from under the
// runtime's protected state only where containerd's tmpfs is: not a
// plain directory named shm, not a link named shm to a tmpfs elsewhere,
// not another pod's.
func TestPrivilegedHookPodShm(t *testing.T) {
	privtest.Require(t)
	const sb = "6f1b3a0e9c4d2b7a8e5f0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f"
	const plain = "1f1b3a0e9c4d2b7a8e5f0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f"
	const linked = "2f1b3a0e9c4d2b7a8e5f0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d0e1f"
	state, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(state, "io.containerd.grpc.v1.cri", "sandboxes")
	mountTmpfs := func(p string) {
		t.Helper()
		if err := os.MkdirAll(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("shm", p, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=1777,size=64k"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(p, unix.MNT_DETACH) })
	}
	mountTmpfs(filepath.Join(dir, sb, "shm"))
	if err := os.MkdirAll(filepath.Join(dir, plain, "shm"), 0o700); err != nil {
		t.Fatal(err)
	}
	elsewhere := filepath.Join(state, "elsewhere")
	mountTmpfs(elsewhere)
	if err := os.MkdirAll(filepath.Join(dir, linked), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, filepath.Join(dir, linked, "shm")); err != nil {
		t.Fatal(err)
	}
	h := &Hook{ContainerdShmDir: dir, Protected: []string{state}}
	check := func(annotation, id string) []string {
		c := config{Annotations: map[string]string{AnnotationSandboxID: annotation}, Linux: &linuxOf{Namespaces: []namespaceOf{
			{Type: "network"}, {Type: "pid"}, {Type: "cgroup"}, {Type: "mount"}, {Type: "ipc"}}},
			Mounts: []mountOf{{Destination: "/dev/shm", Type: "bind", Source: filepath.Join(dir, id, "shm"), Options: []string{"rbind", "rprivate", "rw"}}}}
		c.podShm = h.podShm(c.Annotations[AnnotationSandboxID])
		return c.check("/", h.protected())
	}
	if why := check(sb, sb); len(why) > 0 {
		t.Fatalf("the pod's own tmpfs: refused %q", why)
	}
	for _, tc := range []struct{ name, annotation, id string }{
		{"a plain directory named shm", plain, plain},
		{"a link named shm to a tmpfs elsewhere", linked, linked},
		{"another pod's tmpfs", plain, sb},
		{"no sandbox annotation", "", sb},
	} {
		why := strings.Join(check(tc.annotation, tc.id), "; ")
		if !strings.Contains(why, "holds or is inside "+state) {
			t.Errorf("%s: refusals %q, want the protected state named", tc.name, why)
		}
	}
}
