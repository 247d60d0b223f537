//go:build linux

package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/internal/cgroup2"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/rootdir"
	"github.com/trialnet/trialnet/netns"
	"github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

// Every step of the Trial's init's set-up leaves its mark on the init,
// whichever set-up ran it (init_early.c in a cgo build, runInit without
// cgo): read from the host, each must be there. A step skipped, in either
// set-up, fails here by name.
func TestPrivilegedInitIsSetUp(t *testing.T) {
	mountTracefs(t)
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{Transparent: true, UnixOpen: true})
	if code, out := runProbe(t, tr, "procs"); code != probeOK {
		t.Fatalf("%d %s", code, out)
	}
	init, err := findInit(tr.Cgroup)
	if err != nil || init.pidfd < 0 {
		t.Fatalf("the Trial's init: %+v, %v", init, err)
	}
	t.Cleanup(func() { _ = unix.Close(init.pidfd) })
	proc := func(name string) string {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", init.pid, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	status := strings.Join(strings.Fields(proc("status")), " ")
	for _, want := range []string{
		"CapInh: 0000000000000000", "CapPrm: 0000000000000000", "CapEff: 0000000000000000",
		"CapBnd: 0000000000000000", "CapAmb: 0000000000000000", "NoNewPrivs: 1", "Seccomp: 2",
	} {
		if !strings.Contains(status, want) {
			t.Errorf("the init's status lacks %q", want)
		}
	}
	if got := strings.TrimSpace(proc("oom_score_adj")); got != "1000" {
		t.Errorf("the init's oom_score_adj is %s, want 1000", got)
	}
	own, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/cgroup", init.pid))
	if host, _ := os.Readlink("/proc/self/ns/cgroup"); own == host {
		t.Errorf("the init shares the host's cgroup namespace %s", own)
	}
	if fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", init.pid)); err != nil || len(fds) != 3 {
		var held []string
		for _, fd := range fds {
			target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", init.pid, fd.Name()))
			held = append(held, fd.Name()+"="+target)
		}
		t.Errorf("the init holds %d descriptors (%v), want its stdio only: %s", len(fds), err, strings.Join(held, " "))
	}

	mounts := initMounts(t, proc("mountinfo"))
	want := func(point, fstype string, opts ...string) {
		t.Helper()
		m, ok := mounts[point]
		if !ok {
			t.Errorf("the init has no mount on %s", point)
			return
		}
		if fstype != "" && m.fstype != fstype {
			t.Errorf("the init's %s is %s, want %s", point, m.fstype, fstype)
		}
		for _, o := range opts {
			if !slices.Contains(m.opts, o) {
				t.Errorf("the init's %s (%s) lacks %s: %q", point, m.fstype, o, m.opts)
			}
		}
	}
	for p, m := range mounts {
		if m.fstype == "nsfs" {
			t.Errorf("the init keeps the host's namespace file %s", p)
		}
		if under(p, "/sys") {
			want(p, "", "ro")
		}
	}
	want("/proc", "proc", "nosuid", "nodev", "noexec")
	want("/dev/pts", "devpts", "nosuid", "noexec", fmt.Sprintf("max=%d", MaxPtys), "ptmxmode=666")
	want("/dev/ptmx", "devpts")
	if fi, err := os.Stat("/dev/mqueue"); err == nil && fi.IsDir() {
		want("/dev/mqueue", "mqueue", "nosuid", "nodev", "noexec")
	}
	for _, d := range ownDirs {
		if real, err := filepath.EvalSymlinks(d.dir); err == nil {
			want(real, "tmpfs", "nosuid", "nodev")
		}
		want(filepath.Join(rootdir.Run, d.view), "tmpfs", "nosymfollow", "nosuid", "nodev", "noexec")
	}
	for _, d := range sharedDirs {
		if real, err := filepath.EvalSymlinks(d); err == nil {
			want(real, "tmpfs", "nosuid", "nodev", "noexec")
		}
	}
	for _, p := range maskedProc(false) {
		if _, err := os.Lstat(p); err == nil {
			want(p, "", "ro")
		}
	}
	cg, err := Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	want(cg, "cgroup2", "ro")
	want(rootdir.Run, "tmpfs", "ro", "nosuid", "nodev", "noexec")
	want(resolvPath, "", "ro")
	// The resolv.conf's scratch tmpfs is left beneath maskHost's (one
	// umount2 fewer): through the Trial's root, only the views show.
	if names, err := os.ReadDir(fmt.Sprintf("/proc/%d/root%s", init.pid, rootdir.Run)); err != nil || len(names) != len(ownDirs) {
		var got []string
		for _, n := range names {
			got = append(got, n.Name())
		}
		t.Errorf("the Trial's %s holds %q (%v), want only the views of its own directories", rootdir.Run, got, err)
	}
}

type initMount struct {
	fstype string
	opts   []string // the mount's and its super block's
}

// initMounts reads mountinfo into the topmost mount on each point.
func initMounts(t *testing.T, mountinfo string) map[string]initMount {
	mounts := map[string]initMount{}
	for _, line := range strings.Split(mountinfo, "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 6 || len(g) < 3 {
			continue
		}
		opts := append(strings.Split(f[5], ","), strings.Split(g[2], ",")...)
		mounts[cgroup2.UnescapeMountPath(f[4])] = initMount{g[0], opts}
	}
	if len(mounts) == 0 {
		t.Fatalf("no mounts in the init's mountinfo:\n%s", mountinfo)
	}
	return mounts
}

// A Trial's init holds no namespace mount of the host's: not another
// Trial's, whose namespace its copy would keep alive past that Trial's
// destroy and whose id its mountinfo would show, in the agent's netns
// directory made a mount of its own (one detach takes them all) under a
// shared parent (which must not receive copies of them), nor one
// elsewhere (detached one by one). The directory may be a mount already
// when the agent starts: as `ip netns` makes it (bound onto itself, a
// peer of its shared parent, which then holds a covered copy of every
// namespace mounted in it), or mounted twice (a copy under the top
// mount). Whatever the detach uncovers goes too.
func TestPrivilegedInitHoldsNoNamespaceMount(t *testing.T) {
	for _, c := range []struct {
		name    string
		premade func(t *testing.T, dir string)
	}{
		{"MountDir", nil},
		{"ip-netns", func(t *testing.T, dir string) { bindOnto(t, dir) }},
		{"stacked", func(t *testing.T, dir string) {
			bindOnto(t, dir)
			bindOnto(t, dir)
		}},
	} {
		t.Run(c.name, func(t *testing.T) { testInitHoldsNoNamespaceMount(t, c.premade) })
	}
}

// bindOnto binds dir onto itself, as `ip netns` makes /run/netns a
// mount, and makes it shared.
func bindOnto(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dir, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		t.Fatal(err)
	}
}

func testInitHoldsNoNamespaceMount(t *testing.T, premade func(t *testing.T, dir string)) {
	h := newHost(t)
	// Under a shared parent, as /run is under systemd.
	parent := privtest.SharedDir(t, "netns-parent-")
	if err := unix.Mount("tmpfs", parent, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(parent, unix.MNT_DETACH) })
	if err := unix.Mount("", parent, "", unix.MS_SHARED, ""); err != nil {
		t.Fatal(err)
	}
	h.NetnsDir = filepath.Join(parent, "netns")
	if premade != nil {
		premade(t, h.NetnsDir)
	}
	if err := netns.MountDir(h.NetnsDir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netns.ReleaseDir(h.NetnsDir); err != nil {
			t.Error(err)
		}
	})
	elsewhere := privtest.SharedDir(t, "netns-elsewhere-")
	other, err := netns.Create(elsewhere, "outside")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Delete() })
	first := newTrial(t, h, trial.Spec{})
	second := newTrial(t, h, trial.Spec{})
	for _, tr := range []*Trial{first, second} {
		if code, out := runProbe(t, tr, "procs"); code != probeOK {
			t.Fatalf("%d %s", code, out)
		}
		init, err := findInit(tr.Cgroup)
		if err != nil || init.pidfd < 0 {
			t.Fatalf("the Trial's init: %+v, %v", init, err)
		}
		_ = unix.Close(init.pidfd)
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", init.pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, " - nsfs ") {
				t.Errorf("Trial %s's init keeps the host's namespace mount %s", tr.ID, line)
			}
		}
	}
}

// A mount point longer than PATH_MAX (made through relative paths) is
// listed in full in mountinfo, and no call takes it whole: the init's
// set-up must not act on a cut-short copy of it. Here a namespace is
// mounted at one: whichever set-up runs, the Trial does not start with
// it in its mount table (the detach fails with ENAMETOOLONG, and so does
// the start); C that cut the path to fit its buffer detached nothing
// (ENOENT, taken for "gone") and started the Trial holding it.
func TestPrivilegedInitActsOnNoCutShortMountPoint(t *testing.T) {
	h := newHost(t)
	base := privtest.SharedDir(t, "longpath-")
	if err := unix.Mount("tmpfs", base, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(base, unix.MNT_DETACH) }) // the namespace's mount with it
	ns, err := netns.Create(privtest.SharedDir(t, "longpath-ns-"), "deep")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Delete() })
	if err := mountDeep(base, ns.Path, unix.PathMax+200); err != nil {
		t.Fatal(err)
	}
	tr := newTrial(t, h, trial.Spec{})
	p, err := tr.Start(Command{Args: []string{"true"}, Env: []string{"PATH=/usr/bin:/bin"}, UID: 65534, GID: 65534})
	if err != nil {
		if !strings.Contains(err.Error(), "file name too long") {
			t.Errorf("the start failed, not for the long mount point: %v", err)
		}
		return
	}
	_, _ = p.Wait()
	init, err := findInit(tr.Cgroup)
	if err != nil || init.pidfd < 0 {
		t.Fatalf("the Trial's init: %+v, %v", init, err)
	}
	_ = unix.Close(init.pidfd)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", init.pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, " - nsfs ") {
			t.Errorf("the Trial started, its init holding the namespace mount at a path of %d bytes", len(strings.Fields(line)[4]))
		}
	}
}

// mountDeep binds src at a path beneath base at least depth bytes long,
// reached step by step from a thread with a working directory of its own.
func mountDeep(base, src string, depth int) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread, its working directory changed, ends
		// with this goroutine.
		runtime.LockOSThread()
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_FS); err != nil {
				return err
			}
			if err := unix.Chdir(base); err != nil {
				return err
			}
			name := strings.Repeat("d", 250)
			for n := len(base); n < depth; n += len(name) + 1 {
				if err := unix.Mkdir(name, 0o755); err != nil {
					return err
				}
				if err := unix.Chdir(name); err != nil {
					return err
				}
			}
			if err := os.WriteFile("ns", nil, 0o600); err != nil {
				return err
			}
			return unix.Mount(src, "ns", "", unix.MS_BIND, "")
		}()
	}()
	return <-errc
}

// The launcher names where the Trial's namespace is mounted, and the init
// detaches that path's directory whole only when the path is its own
// namespace and the directory a mount of its own: a wrong word (another
// namespace's file, a directory that is only part of its parent's mount,
// such as /run itself, a symlink to a namespace elsewhere) must not make
// it detach anything but the namespaces' directory.
func TestPrivilegedOwnNsDirIsChecked(t *testing.T) {
	privtest.Require(t)
	base := privtest.SharedDir(t, "ownnsdir-")
	dir := filepath.Join(base, "netns")
	if err := netns.MountDir(dir); err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs last: after every mount in dir is gone.
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	plain := filepath.Join(base, "plain")
	if err := os.Mkdir(plain, 0o755); err != nil {
		t.Fatal(err)
	}
	bind := func(path string) {
		t.Helper()
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mount("/proc/self/ns/net", path, "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(path, unix.MNT_DETACH) })
	}
	own, inPlain := filepath.Join(dir, "own"), filepath.Join(plain, "own")
	bind(own)
	bind(inPlain)
	other, err := netns.Create(dir, "other")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Delete() })
	// A symlink in the directory mount to the namespace mounted in the
	// plain directory: followed, the directory to detach would be the
	// wrong one.
	link := filepath.Join(dir, "link")
	if err := os.Symlink(inPlain, link); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, path, dir string
	}{
		{"own namespace in the directory mount", own, dir},
		{"another namespace", other.Path, ""},
		{"a file that is no namespace", empty, ""},
		{"own namespace in a directory that is no mount", inPlain, ""},
		{"a symlink to its own namespace", link, ""},
		{"no path", "", ""},
		{"a relative path", "own", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := ownNsDir(c.path)
			if !ok {
				got = ""
			}
			if got != c.dir {
				t.Errorf("ownNsDir(%q) = %q, %v; want %q", c.path, got, ok, c.dir)
			}
		})
	}
}
