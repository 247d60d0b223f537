//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/netns"
	"github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/internal/cgroup2"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/rootdir"
	"golang.org/x/sys/unix"
)

// A uid-0 Trial (no capabilities, but the owner of root's files) must not
// see other Trials, change the host's kernel settings or another Trial's
// cgroup, nor plant a socket where trialnet's are. Only writes that are
// opened and not made, or that would hit the test's own sibling Trial, are
// tried: the host's values stay as they are.
func TestPrivilegedMountsHideTheHost(t *testing.T) {
	mountTracefs(t)
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{UnixOpen: true}) // the unix hooks stay out of the way of bind
	sibling := newTrial(t, h, trial.Spec{UnixOpen: true})
	// The sibling's init keeps it populated: what kills its cgroup kills it.
	if code, out := runProbeAs(t, sibling, nobody, Command{}, "procs"); code != probeOK {
		t.Fatalf("sibling: %d %s", code, out)
	}
	cgroup2, err := Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}

	// Each refused as the mounts refuse it: EROFS where the Trial sees
	// the file read-only, ENOENT where the Trial's cgroup2 mount has no
	// such path (the host's parent and the sibling are not in it).
	for _, w := range []struct{ what, path, want string }{
		{"the host's core_pattern", "/proc/sys/kernel/core_pattern", "EROFS"},
		{"the parent cgroup's limit", filepath.Join(h.Parent, "cgroup.max.descendants"), "ENOENT"},
		{"sysfs", "/sys/kernel/mm/transparent_hugepage/enabled", "EROFS"},
		{"a mount below /sys", "/sys/kernel/tracing/tracing_on", "EROFS"},
		{"the Trial's own cgroup", filepath.Join(cgroup2, "cgroup.max.descendants"), "EROFS"},
	} {
		if _, err := os.Stat(w.path); err != nil {
			if os.Getenv("CI") == "true" {
				t.Errorf("%s: %s is not on this host, and CI=true: the check did not run", w.what, w.path)
			} else {
				t.Logf("%s: %s is not on this host", w.what, w.path)
			}
			continue
		}
		if code, out := runProbeAs(t, tr, 0, Command{}, "open-write", w.path); code == probeOK || out != w.want {
			t.Errorf("a uid-0 Trial opening %s (%s) for writing: %d %q, want %s", w.path, w.what, code, out, w.want)
		}
	}
	// The control: the same uid-0 probe writes where it may.
	if code, out := runProbeAs(t, tr, 0, Command{}, "write", "/dev/shm/control", "1"); code != probeOK {
		t.Fatalf("a uid-0 Trial could not write its own /dev/shm: %d %q: the refusals above show nothing", code, out)
	}

	kill := filepath.Join(sibling.Cgroup, "cgroup.kill")
	if code, out := runProbeAs(t, tr, 0, Command{}, "write", kill, "1"); code == probeOK || out != "ENOENT" {
		t.Errorf("a uid-0 Trial writing its sibling's %s: %d %q, want ENOENT (not in its cgroup2 mount)", kill, code, out)
	}
	if populated, err := cgroupPopulated(sibling.Cgroup); err != nil || !populated {
		t.Errorf("the sibling Trial's processes are gone (%v)", err)
	}

	sock := filepath.Join(rootdir.Run, "test-"+randSuffix()+".sock")
	t.Cleanup(func() { _ = os.Remove(sock) }) // made on the host only if the test fails
	if code, out := runProbeAs(t, tr, 0, Command{}, "bind-unix", sock); code == probeOK || out != "EROFS" {
		t.Errorf("bind %s from a uid-0 Trial: %d %q, want EROFS", sock, code, out)
	}

	// The cgroup2 mount shows the Trial's own cgroup, as the host lists it.
	own, err := os.ReadDir(tr.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, e := range own {
		want = append(want, e.Name())
	}
	if code, out := runProbeAs(t, tr, nobody, Command{}, "ls", cgroup2); code != probeOK || !slices.Equal(strings.Fields(out), want) {
		t.Errorf("%s in the Trial: %d %q, want the Trial's own cgroup %q", cgroup2, code, out, want)
	}
	nsDir := filepath.Dir(tr.Netns.Path)
	if code, out := runProbeAs(t, tr, 0, Command{}, "ls", nsDir); code != probeOK || out != "" {
		t.Errorf("%s in the Trial: %d %q, want it empty", nsDir, code, out)
	}
	// trialnet's runtime directory shows only the views of the Trial's own
	// directories.
	if code, out := runProbeAs(t, tr, 0, Command{}, "ls", rootdir.Run); code != probeOK || out != "d\nt\nv" {
		t.Errorf("%s in the Trial: %d %q, want only the views d, t and v", rootdir.Run, code, out)
	}
}

// Every mount on /sys and below it is read-only in the Trial, those that
// others cover there too: out of a Trial's reach, but in every copy its
// mount namespace is made into. Here two tmpfs stacked on the tracefs
// directory, in a mount namespace of the test's own. Seen red with the
// remounts by path of before (in the init, the Go set-up, and its
// fall-back still): the two mounts covered there stayed read-write.
func TestPrivilegedSysReadOnlyCovered(t *testing.T) {
	const dir = "/sys/kernel/tracing"
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("no %s on this kernel, the directory the test stacks mounts on: %v", dir, err)
	}
	stack := func() error {
		for range 2 {
			if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOATIME, "size=4k"); err != nil {
				return err
			}
		}
		return nil
	}
	// writable lists the mounts on /sys or below it in mountinfo b that
	// are not read-only; covered counts those on dir.
	writable := func(b []byte) (bad []string, covered int) {
		for line := range strings.Lines(string(b)) {
			f := strings.Fields(line)
			if len(f) < 6 || !under(cgroup2.UnescapeMountPath(f[4]), "/sys") {
				continue
			}
			if f[4] == dir {
				covered++
			}
			if !strings.HasPrefix(f[5], "ro,") && f[5] != "ro" {
				bad = append(bad, fmt.Sprintf("%s (mount %s) is %s, want read-only", f[4], f[0], f[5]))
			}
		}
		return bad, covered
	}
	t.Run("init", func(t *testing.T) {
		tr := newTrial(t, newHost(t), trial.Spec{})
		filter, err := seccompFile(false)
		if err != nil {
			t.Fatal(err)
		}
		inOwnMounts(t, stack, func() []string {
			pid, stop, err := initHere(tr, filter)
			if err != nil {
				return []string{err.Error()}
			}
			defer stop()
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
			if err != nil {
				return []string{err.Error()}
			}
			bad, covered := writable(b)
			if covered < 2 {
				bad = append(bad, fmt.Sprintf("the init's mount table lists %d mounts on %s, want the two stacked there at least", covered, dir))
			}
			return bad
		})
	})
	for _, c := range []struct {
		name     string
		readOnly func() error
		covered  bool
	}{{"go", readOnlySys, true}, {"go-each", readOnlySysEach, false}} {
		t.Run(c.name, func(t *testing.T) {
			privtest.Require(t)
			inOwnMounts(t, stack, func() []string {
				if err := c.readOnly(); err != nil {
					return []string{err.Error()}
				}
				b, err := os.ReadFile("/proc/thread-self/mountinfo")
				if err != nil {
					return []string{err.Error()}
				}
				bad, _ := writable(b)
				if c.covered {
					return bad
				}
				// The remount by path reaches only the mount on top.
				var top []string
				for _, b := range bad {
					if !strings.HasPrefix(b, dir+" ") {
						top = append(top, b)
					}
				}
				var st unix.Statfs_t
				if err := unix.Statfs(dir, &st); err != nil || st.Flags&unix.ST_RDONLY == 0 {
					top = append(top, fmt.Sprintf("the mount on top at %s: flags %#x %v, want read-only", dir, st.Flags, err))
				}
				return top
			})
		})
	}
}

// The set-up's walks read the mount table of the thread that runs them,
// not the thread group leader's, which in a Go process may be in another
// mount namespace (the host's, here): a mount below /sys that only this
// thread's namespace has must still be made read-only, and an nsfs mount
// only it has detached. Seen red with /proc/self/mountinfo: the host's
// table, read instead, lists neither.
func TestPrivilegedSetupWalksItsThreadsTable(t *testing.T) {
	privtest.Require(t)
	host, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	dir := ""
	for _, d := range []string{"/sys/kernel/mm", "/sys/kernel/irq", "/sys/power", "/sys/block"} {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() && !strings.Contains(string(host), " "+d+" ") {
			dir = d
			break
		}
	}
	if dir == "" {
		t.Fatal("every candidate directory below /sys is a mount point on this host: the test needs one that is not")
	}
	nsFile := filepath.Join(t.TempDir(), "ns")
	if err := os.WriteFile(nsFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	inOwnMounts(t, func() error {
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=4k"); err != nil {
			return err
		}
		return unix.Mount("/proc/thread-self/ns/uts", nsFile, "", unix.MS_BIND, "")
	}, func() (bad []string) {
		if err := readOnlySysEach(); err != nil {
			return []string{err.Error()}
		}
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil || st.Flags&unix.ST_RDONLY == 0 {
			bad = append(bad, fmt.Sprintf("the tmpfs on %s only this thread's namespace has: flags %#x %v, want read-only", dir, st.Flags, err))
		}
		if err := dropNsMounts(""); err != nil {
			return append(bad, err.Error())
		}
		if err := unix.Statfs(nsFile, &st); err != nil || st.Type == unix.NSFS_MAGIC {
			bad = append(bad, fmt.Sprintf("the nsfs mount on %s only this thread's namespace has: type %#x %v, want it detached", nsFile, st.Type, err))
		}
		return bad
	})
}

// mountTracefs makes sure a mount below /sys exists before the Trials are
// made, for a host (like these machines and their CI) that has none of its
// own there: tracefs, at the place the kernel keeps for it, taken down after.
func mountTracefs(t *testing.T) {
	const dir = "/sys/kernel/tracing"
	if _, err := os.Stat(filepath.Join(dir, "tracing_on")); err == nil {
		return
	}
	if err := unix.Mount("tracefs", dir, "tracefs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		t.Fatalf("mount tracefs on %s for a mount below /sys: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
}

// The mounts are the Trial's: the host's /sys and cgroup2 mounts stay
// read-write, and the Trial's netns file stays on the host.
func TestPrivilegedMaskLeavesTheHostAlone(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{UnixOpen: true})
	if code, out := runProbeAs(t, tr, nobody, Command{}, "procs"); code != probeOK {
		t.Fatalf("%d %s", code, out)
	}
	// This thread's: the thread that joined the Trial to start the probe
	// may have been the process's main thread, which Go keeps (wedged).
	mi, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	cgroup2, _ := Cgroup2Mount()
	for _, line := range strings.Split(string(mi), "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && (f[4] == "/sys" || f[4] == cgroup2) && !strings.HasPrefix(f[5], "rw") {
			t.Errorf("the host's %s became %s", f[4], f[5])
		}
	}
	if _, err := os.Stat(tr.Netns.Path); err != nil {
		t.Errorf("the host lost the Trial's netns file: %v", err)
	}
}

// An allowed unix socket that every Trial's mounts hide is refused at
// create, not silently unreachable.
func TestUnixAllowUnderHiddenDirIsRefused(t *testing.T) {
	h := &Host{NetnsDir: t.TempDir()}
	for _, p := range []string{filepath.Join(rootdir.Run, "agent.sock"), filepath.Join(h.NetnsDir, "x.sock")} {
		if _, err := h.Create(trial.Spec{ID: "u", UnixAllow: []string{p}}, nil); err == nil || !strings.Contains(err.Error(), "hides from every Trial") {
			t.Errorf("%s: %v, want a refusal naming the hidden directory", p, err)
		}
	}
	if err := checkUnixPathsVisible([]string{"/run/trialnetx/a.sock", "/tmp/a.sock"}, hiddenDirs(h.NetnsDir)); err != nil {
		t.Errorf("a path outside the hidden directories: %v", err)
	}
}

// v1MountPoints are where this mount namespace has cgroup v1
// hierarchies mounted.
func v1MountPoints(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for line := range strings.Lines(string(b)) {
		pre, post, ok := strings.Cut(line, " - ")
		if f := strings.Fields(pre); ok && len(f) >= 5 && strings.HasPrefix(post, "cgroup ") {
			out = append(out, cgroup2.UnescapeMountPath(f[4]))
		}
	}
	return out
}

// On a host with cgroup v1 hierarchies beside the unified one, a Trial
// sees at the mount point of each hierarchy that holds a group of its
// own (pids, memory) that group, read-only, as a container does: none of
// another Trial's, nor the host's own files and groups; the other
// hierarchies show nothing. Its /proc/self/cgroup and mountinfo agree,
// as a JVM joins them to find its memory limit: each such controller's
// group is "/", and its one mount is rooted there. Seen red with
// hideV1's call taken out of both init_early.c and mask.go: the
// sibling's cgroup.procs and the host's root files were read, and every
// hierarchy listed in full; and with the cover of before (a tmpfs over
// the host's mount, the group bound at its host path): the host's mount
// listed first, rooted at "/../..".
func TestPrivilegedV1ShowsOnlyTheTrialsOwnGroups(t *testing.T) {
	tr, sibling, own, theirs := v1Siblings(t)
	if code, out := runProbeAs(t, sibling, nobody, Command{}, "procs"); code != probeOK {
		t.Fatalf("sibling: %d %s", code, out)
	}
	mounts := v1MountPoints(t)
	code, cgroups := runProbeAs(t, tr, nobody, Command{}, "read", "/proc/self/cgroup")
	if code != probeOK {
		t.Fatalf("/proc/self/cgroup in the Trial: %d %s", code, cgroups)
	}
	code, mountinfo := runProbeAs(t, tr, nobody, Command{}, "read", "/proc/self/mountinfo")
	if code != probeOK {
		t.Fatalf("mountinfo in the Trial: %d %s", code, mountinfo)
	}
	for i, g := range own {
		mnt, err := cachedV1Mount(g.name)
		if err != nil {
			t.Fatal(err)
		}
		// Each there on the host: the refusals below are the mounts'.
		// cgroup.sane_behavior is only in a v1 hierarchy's root.
		for _, p := range []string{filepath.Join(theirs[i].dir, "cgroup.procs"), filepath.Join(mnt, "cgroup.sane_behavior")} {
			if _, err := os.Stat(p); err != nil {
				t.Fatal(err)
			}
			if code, out := runProbeAs(t, tr, 0, Command{}, "read", p); code == probeOK || out != "ENOENT" {
				t.Errorf("a uid-0 Trial reading %s: %d %q, want ENOENT", p, code, out)
			}
		}
		if code, out := runProbeAs(t, tr, 0, Command{}, "ls", theirs[i].dir); code == probeOK {
			t.Errorf("a Trial listed its sibling's %s group %s: %q", g.name, theirs[i].dir, out)
		}
		want, err := dirNames(g.dir)
		if err != nil {
			t.Fatal(err)
		}
		if code, out := runProbeAs(t, tr, nobody, Command{}, "ls", mnt); code != probeOK || strings.Join(strings.Fields(out), " ") != want {
			t.Errorf("%s in the Trial: %d %q, want its own group's %q", mnt, code, out, want)
		}
		limit := map[string]string{PoolPids: "pids.max", PoolMemory: "memory.limit_in_bytes"}[g.name]
		host, err := os.ReadFile(filepath.Join(g.dir, limit))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(mnt, limit)
		if code, out := runProbeAs(t, tr, nobody, Command{}, "read", path); code != probeOK || out != string(host)+"ok" {
			t.Errorf("the Trial's own %s, at %s in the Trial: %d %q, want %q as the host reads it", limit, path, code, out, host)
		}
		if code, out := runProbeAs(t, tr, 0, Command{}, "open-write", path); code == probeOK || out != "EROFS" {
			t.Errorf("a uid-0 Trial opening its own %s for writing: %d %q, want EROFS", path, code, out)
		}
		if !slices.ContainsFunc(strings.Split(cgroups, "\n"), func(l string) bool {
			_, rest, _ := strings.Cut(l, ":")
			ctrls, path, _ := strings.Cut(rest, ":")
			return slices.Contains(strings.Split(ctrls, ","), g.name) && path == "/"
		}) {
			t.Errorf("the Trial's /proc/self/cgroup does not name its %s group \"/\": %q", g.name, cgroups)
		}
		if got := v1MountsIn(mountinfo, g.name); len(got) != 1 || got[0] != "/ "+mnt {
			t.Errorf("the Trial's mountinfo has %s mounts %q, want one, its own group (\"/\") on %s", g.name, got, mnt)
		}
		mounts = slices.DeleteFunc(mounts, func(m string) bool { return m == mnt })
	}
	// The host's other v1 hierarchies show nothing, and are not mounted.
	for _, m := range mounts {
		if code, out := runProbeAs(t, tr, 0, Command{}, "ls", m); code != probeOK || out != "" {
			t.Errorf("%s in the Trial: %d %q, want it empty", m, code, out)
		}
		if strings.Contains(mountinfo, " "+m+" ") {
			t.Errorf("the Trial's mountinfo still lists %s", m)
		}
	}
}

// v1MountsIn are the cgroup v1 mounts of controller in mountinfo, each
// as "ROOT MOUNTPOINT".
func v1MountsIn(mountinfo, controller string) []string {
	var out []string
	for line := range strings.Lines(mountinfo) {
		pre, post, ok := strings.Cut(line, " - ")
		f, p := strings.Fields(pre), strings.Fields(post)
		if ok && len(f) >= 5 && len(p) >= 3 && p[0] == "cgroup" && slices.Contains(strings.Split(p[2], ","), controller) {
			out = append(out, f[3]+" "+f[4])
		}
	}
	return out
}

// hideV1, the Go init's (runInit: off x86-64 without cgo, which this
// host's tests do not run as the init), leaves the same view as
// init_early.c's: run here on a thread of its own in a mount namespace of
// its own, discarded after. Seen red with its cover taken out (the
// sibling's group and the host's files were read).
func TestPrivilegedGoHideV1(t *testing.T) {
	tr, _, own, theirs := v1Siblings(t)
	mounts := v1MountPoints(t)
	inOwnNamespaces(t, unix.CLONE_NEWNS, func() (bad []string) {
		want := map[string]string{}
		for _, g := range own {
			names, err := dirNames(g.dir)
			if err != nil {
				bad = append(bad, err.Error())
				return
			}
			want[g.name] = names
		}
		if err := hideV1(tr.v1Dirs()); err != nil {
			bad = append(bad, err.Error())
			return
		}
		mi, err := os.ReadFile("/proc/thread-self/mountinfo")
		if err != nil {
			bad = append(bad, err.Error())
			return
		}
		shown := map[string]bool{}
		for i, g := range own {
			mnt, _ := cachedV1Mount(g.name)
			shown[mnt] = true
			for _, p := range []string{filepath.Join(theirs[i].dir, "cgroup.procs"), filepath.Join(mnt, "cgroup.sane_behavior")} {
				if _, err := os.ReadFile(p); !errors.Is(err, os.ErrNotExist) {
					bad = append(bad, fmt.Sprintf("read %s: %v, want ENOENT", p, err))
				}
			}
			if names, err := dirNames(mnt); err != nil || names != want[g.name] {
				bad = append(bad, fmt.Sprintf("%s: %q %v, want its own group's %q", mnt, names, err, want[g.name]))
			}
			limit := filepath.Join(mnt, map[string]string{PoolPids: "pids.max", PoolMemory: "memory.limit_in_bytes"}[g.name])
			if _, err := os.ReadFile(limit); err != nil {
				bad = append(bad, fmt.Sprintf("the Trial's own %s: %v", limit, err))
			}
			if err := openWrite(limit); !errors.Is(err, unix.EROFS) {
				bad = append(bad, fmt.Sprintf("open %s for writing: %v, want EROFS", limit, err))
			}
			// This thread's cgroup namespace is the test's: the group's
			// root is its path there.
			if got := v1MountsIn(string(mi), g.name); len(got) != 1 || !strings.HasSuffix(got[0], " "+mnt) {
				bad = append(bad, fmt.Sprintf("%s mounts %q, want one, on %s", g.name, got, mnt))
			}
		}
		for _, m := range mounts {
			if names, err := dirNames(m); !shown[m] && (err != nil || names != "") {
				bad = append(bad, fmt.Sprintf("%s: %q %v, want it empty", m, names, err))
			}
		}
		return bad
	})
}

// v1Overmountable is v1Siblings, with each pool's v1 mount point by
// controller and the one directory that holds them all (skipped where
// they are mounted apart: one mount over it cannot hide them all).
func v1Overmountable(t *testing.T) (tr *Trial, own, theirs []v1Group, mnts map[string]string, parent string) {
	t.Helper()
	tr, _, own, theirs = v1Siblings(t)
	mnts = map[string]string{}
	for _, g := range own {
		mnt, err := cachedV1Mount(g.name)
		if err != nil {
			t.Fatal(err)
		}
		mnts[g.name] = mnt
	}
	parent = filepath.Dir(mnts[own[0].name])
	for _, mnt := range mnts {
		if filepath.Dir(mnt) != parent {
			t.Skipf("the pool hierarchies are not mounted in one directory (%s, %s)", parent, mnt)
		}
	}
	return tr, own, theirs, mnts, parent
}

func dirNames(dir string) (string, error) {
	entries, err := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return strings.Join(names, " "), err
}

// v1Siblings makes two Trials on one host and their cgroup v1 groups;
// it skips where the host has no v1 pids or memory controller (then the
// Trial's cgroup2 mount is all it has to hide).
func v1Siblings(t *testing.T) (tr, sibling *Trial, own, theirs []v1Group) {
	t.Helper()
	h := newHost(t)
	tr = newTrial(t, h, trial.Spec{})
	sibling = newTrial(t, h, trial.Spec{})
	own, err := tr.v1Groups()
	if err != nil {
		t.Fatal(err)
	}
	if len(own) == 0 {
		t.Skip("no cgroup v1 pids or memory controller on this host: the Trial's cgroup2 mount is all it has")
	}
	if theirs, err = sibling.v1Groups(); err != nil {
		t.Fatal(err)
	}
	return tr, sibling, own, theirs
}

// inOwnMounts runs fn on a thread of its own in a private mount
// namespace of its own, after setup there, and reports what fn found
// wrong; the thread and its mounts go with the goroutine.
func inOwnMounts(t *testing.T, setup func() error, fn func() []string) {
	t.Helper()
	inOwnNamespaces(t, unix.CLONE_NEWNS, func() (bad []string) {
		if err := setup(); err != nil {
			bad = append(bad, "set-up: "+err.Error())
			return
		}
		bad = fn()
		return bad
	})
}

// A cgroup v1 hierarchy mounted over the directory that holds the
// others (a named one over /sys/fs/cgroup, here) hides them, and
// detaching it shows them again: the set-up must then take them away
// too, rather than leave the host's pids and memory hierarchies (their
// release_agent, every Trial's limits) in the Trial's view. Seen red
// before hideV1 walked the mount table again: the host's release_agent
// was read.
func TestPrivilegedGoHideV1UnderAnOvermount(t *testing.T) {
	tr, own, theirs, mnts, parent := v1Overmountable(t)
	want := map[string]string{}
	for _, g := range own {
		names, err := dirNames(g.dir)
		if err != nil {
			t.Fatal(err)
		}
		want[g.name] = names
	}
	inOwnMounts(t, func() error {
		// A hierarchy of its own, gone with the thread's mounts (it has no
		// group but its root).
		return unix.Mount("cgroup", parent, "cgroup", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "none,name=trialnet-test-over")
	}, func() []string {
		var bad []string
		if err := hideV1(tr.v1Dirs()); err != nil {
			return []string{err.Error()}
		}
		for i, g := range own {
			mnt := mnts[g.name]
			for _, p := range []string{filepath.Join(mnt, "release_agent"), filepath.Join(theirs[i].dir, "cgroup.procs")} {
				if _, err := os.ReadFile(p); !errors.Is(err, os.ErrNotExist) {
					bad = append(bad, fmt.Sprintf("read %s: %v, want ENOENT", p, err))
				}
			}
			if names, err := dirNames(mnt); err != nil || names != want[g.name] {
				bad = append(bad, fmt.Sprintf("%s: %q %v, want its own group's %q", mnt, names, err, want[g.name]))
			}
		}
		return bad
	})
}

// The init's set-up (C on x86-64) under the same overmount, with the
// host's cgroup2 mounted elsewhere so that its replacement does not fail
// first: the pool hierarchies the detach uncovers are hidden too, and
// the directory it uncovers (the host's tmpfs) is read-only. Seen red
// with the C of before (one walk, after /sys was made read-only): the
// host's release_agent was read through the init's root, and a
// directory made in the host's /sys/fs/cgroup.
func TestPrivilegedInitHidesV1UnderAnOvermount(t *testing.T) {
	tr, own, theirs, mnts, parent := v1Overmountable(t)
	cg2, err := Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	// Not under /tmp, which the init mounts afresh.
	elsewhere, err := os.MkdirTemp("/run", "trialnet-test-cgroup2-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(elsewhere) })
	filter, err := seccompFile(false)
	if err != nil {
		t.Fatal(err)
	}
	inOwnMounts(t, func() error {
		if err := unix.Unmount(cg2, unix.MNT_DETACH); err != nil {
			return err
		}
		if err := unix.Mount("cgroup2", elsewhere, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return err
		}
		// A hierarchy of its own, gone with the thread's mounts (it has no
		// group but its root).
		return unix.Mount("cgroup", parent, "cgroup", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "none,name=trialnet-test-over-init")
	}, func() []string {
		pid, stop, err := initHere(tr, filter)
		if err != nil {
			return []string{err.Error()}
		}
		defer stop()
		root := fmt.Sprintf("/proc/%d/root", pid)
		var bad []string
		for i, g := range own {
			for _, p := range []string{filepath.Join(mnts[g.name], "release_agent"), filepath.Join(theirs[i].dir, "cgroup.procs")} {
				if _, err := os.ReadFile(root + p); !errors.Is(err, os.ErrNotExist) {
					bad = append(bad, fmt.Sprintf("read %s in the init's mounts: %v, want ENOENT", p, err))
				}
			}
		}
		probe := filepath.Join(root, parent, "trialnet-test-probe")
		if err := unix.Mkdir(probe, 0o755); !errors.Is(err, unix.EROFS) {
			bad = append(bad, fmt.Sprintf("mkdir %s: %v, want EROFS", probe, err))
			if err == nil {
				_ = unix.Rmdir(probe)
			}
		}
		return bad
	})
}

// initHere starts the init's set-up (C on x86-64) for tr's cgroup v1
// groups, forked from this thread (its mounts are a copy of the
// thread's), and waits until it is set up; stop kills it.
func initHere(tr *Trial, filter *os.File) (pid int, stop func(), err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return 0, nil, err
	}
	defer r.Close()
	cmd, release, err := initCommand(initArgs(false, false, "", nil, tr.v1Dirs(), nil), w, filter)
	if err != nil {
		_ = w.Close()
		return 0, nil, err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC}
	err = cmd.Start()
	_ = w.Close()
	if err != nil {
		release()
		return 0, nil, err
	}
	stop = func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		release()
	}
	if msg, _ := io.ReadAll(r); len(msg) != 1 {
		stop()
		return 0, nil, errors.New("the init: " + execMessage(msg))
	}
	return cmd.Process.Pid, stop, nil
}

// v1OnTmpfsAlone reports whether the mount on dir is a tmpfs on which
// only cgroup hierarchies are mounted (systemd's /sys/fs/cgroup on a
// hybrid host): the set-up detaches it with them in one unmount.
func v1OnTmpfsAlone(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	alone := false
	for line := range strings.Lines(string(b)) {
		pre, post, _ := strings.Cut(line, " - ")
		f := strings.Fields(pre)
		if len(f) < 5 {
			continue
		}
		point, fstype := cgroup2.UnescapeMountPath(f[4]), strings.Fields(post + " ")[0]
		if point == dir {
			alone = fstype == "tmpfs" // the last listed is on top
		} else if under(point, dir) && fstype != "cgroup" && fstype != "cgroup2" {
			return false
		}
	}
	return alone
}

// A cgroup v1 hierarchy mounted twice on its point (bound over itself)
// is hidden as one mounted once, by the Go set-up and by the init's (C
// on x86-64): the Trial's group is shown once, read-only, and neither
// the host's release_agent nor the sibling's group is reached. Where the
// host's hierarchies are on a tmpfs of their own, the Go set-up replaces
// that tmpfs (another mount on its point: one unmount for all of them,
// as the init's does, under strace one umount2 where there were nine).
// Seen red with the copy of the tmpfs made recursive in both (the host's
// hierarchies came back with it, listed beside the group) and with stacked
// mounts refused by v1TreeAlone (the tmpfs stayed, each hierarchy
// detached on its own).
func TestPrivilegedHideV1StackedTwice(t *testing.T) {
	tr, own, theirs, mnts, parent := v1Overmountable(t)
	alone := v1OnTmpfsAlone(t, parent)
	filter, err := seccompFile(false)
	if err != nil {
		t.Fatal(err)
	}
	stack := func() error {
		for _, mnt := range mnts {
			if err := unix.Mount(mnt, mnt, "", unix.MS_BIND, ""); err != nil {
				return err
			}
		}
		return nil
	}
	// root: where the set-up's mounts are reached from, and its mountinfo.
	check := func(root, mountinfo string) (bad []string) {
		for i, g := range own {
			mnt := mnts[g.name]
			for _, p := range []string{filepath.Join(mnt, "release_agent"), filepath.Join(theirs[i].dir, "cgroup.procs")} {
				if _, err := os.ReadFile(root + p); !errors.Is(err, os.ErrNotExist) {
					bad = append(bad, fmt.Sprintf("read %s: %v, want ENOENT", p, err))
				}
			}
			limit := filepath.Join(mnt, map[string]string{PoolPids: "pids.max", PoolMemory: "memory.limit_in_bytes"}[g.name])
			if err := openWrite(root + limit); !errors.Is(err, unix.EROFS) {
				bad = append(bad, fmt.Sprintf("open %s for writing: %v, want EROFS", limit, err))
			}
			if got := v1MountsIn(mountinfo, g.name); len(got) != 1 || !strings.HasSuffix(got[0], " "+mnt) {
				bad = append(bad, fmt.Sprintf("%s mounts %q, want one, on %s", g.name, got, mnt))
			}
		}
		return bad
	}
	t.Run("go", func(t *testing.T) {
		inOwnMounts(t, stack, func() []string {
			before, err := mountIDAt(unix.AT_FDCWD, parent, unix.AT_SYMLINK_NOFOLLOW)
			if err != nil {
				return []string{err.Error()}
			}
			if err := hideV1(tr.v1Dirs()); err != nil {
				return []string{err.Error()}
			}
			mi, err := os.ReadFile("/proc/thread-self/mountinfo")
			if err != nil {
				return []string{err.Error()}
			}
			bad := check("", string(mi))
			if after, err := mountIDAt(unix.AT_FDCWD, parent, unix.AT_SYMLINK_NOFOLLOW); alone && (err != nil || after == before) {
				bad = append(bad, fmt.Sprintf("the tmpfs on %s is still mount %d (%v): each hierarchy was detached on its own", parent, after, err))
			}
			return bad
		})
	})
	t.Run("init", func(t *testing.T) {
		inOwnMounts(t, stack, func() []string {
			pid, stop, err := initHere(tr, filter)
			if err != nil {
				return []string{err.Error()}
			}
			defer stop()
			mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
			if err != nil {
				return []string{err.Error()}
			}
			return check(fmt.Sprintf("/proc/%d/root", pid), string(mi))
		})
	})
}

// cgroup v1 mounts each covering the next, more than hideV1 walks the
// table for (a walk detaches what is on top at each point and so
// uncovers what is beneath), are refused, saying so, by the Go set-up and
// the init alike, rather than walked for ever; a few are hidden as
// before. Seen red with the bound taken out of both (the chain of
// v1Max+6 was hidden, no refusal).
func TestPrivilegedHideV1PassesBounded(t *testing.T) {
	tr, _, _, _, _ := v1Overmountable(t)
	filter, err := seccompFile(false)
	if err != nil {
		t.Fatal(err)
	}
	top := privtest.SharedDir(t, "v1-chain-") // not under /tmp, which the init covers
	stack := func(n int) func() error {
		return func() error {
			points := []string{top}
			for i := 1; i < n; i++ {
				points = append(points, filepath.Join(points[i-1], "d"))
			}
			if err := os.MkdirAll(points[n-1], 0o755); err != nil {
				return err
			}
			for _, p := range slices.Backward(points) { // the deepest first: each then covered by the one above
				if err := unix.Mount("cgroup", p, "cgroup", 0, "none,name=trialnet-bound-test"); err != nil {
					return err
				}
			}
			return nil
		}
	}
	hidden := func(mountinfo string) []string {
		mi, err := os.ReadFile(mountinfo)
		if err != nil {
			return []string{err.Error()}
		}
		if got := v1MountsIn(string(mi), "name=trialnet-bound-test"); len(got) != 0 {
			return []string{fmt.Sprintf("left mounted: %q", got)}
		}
		return nil
	}
	for _, c := range []struct {
		n       int
		refused bool
	}{{4, false}, {v1Max + 6, true}} {
		t.Run(fmt.Sprintf("go, %d", c.n), func(t *testing.T) {
			inOwnMounts(t, stack(c.n), func() []string {
				err := hideV1(tr.v1Dirs())
				if c.refused != (err != nil && strings.Contains(err.Error(), "passes over it")) {
					return []string{fmt.Sprintf("hideV1: %v, want refused: %v", err, c.refused)}
				}
				if c.refused {
					return nil
				}
				return hidden("/proc/thread-self/mountinfo")
			})
		})
		t.Run(fmt.Sprintf("init, %d", c.n), func(t *testing.T) {
			inOwnMounts(t, stack(c.n), func() []string {
				pid, stop, err := initHere(tr, filter)
				if err == nil {
					defer stop()
				}
				if c.refused != (err != nil && strings.Contains(err.Error(), "passes over it")) {
					return []string{fmt.Sprintf("the init: %v, want refused: %v", err, c.refused)}
				}
				if c.refused {
					return nil
				}
				return hidden(fmt.Sprintf("/proc/%d/mountinfo", pid))
			})
		})
	}
}

// Where the pids and memory controllers share one cgroup v1 hierarchy,
// the Trial's two groups are one directory, named twice: shown once,
// not refused (every Trial's start failed). Seen red before: "show the
// Trial's cgroup v1 groups ... and ...: they share one hierarchy".
func TestPrivilegedGoHideV1OneGroupNamedTwice(t *testing.T) {
	tr, _, own, _ := v1Siblings(t)
	want, err := dirNames(own[0].dir)
	if err != nil {
		t.Fatal(err)
	}
	mnt, err := cachedV1Mount(own[0].name)
	if err != nil {
		t.Fatal(err)
	}
	inOwnMounts(t, func() error { return nil }, func() []string {
		if err := hideV1(append(tr.v1Dirs(), own[0].dir)); err != nil {
			return []string{err.Error()}
		}
		if names, err := dirNames(mnt); err != nil || names != want {
			return []string{fmt.Sprintf("%s: %q %v, want its own group's %q", mnt, names, err, want)}
		}
		return nil
	})
}

// The host's devpts mounted anywhere but /dev/pts (a chroot's /dev/pts, a
// bind of /dev with its submounts) holds the host's terminals: a Trial
// running as the operator's uid opened the operator's pty there, read
// what was typed into it and wrote to it. The init detaches it, mounted
// twice on one point too (the walk goes on until none is on top).
func TestPrivilegedHostTerminalsOutOfReach(t *testing.T) {
	dir := hostDevptsElsewhere(t)
	// The operator's terminal: a pty of the host's, its slave the
	// Trial's uid's, as login makes it.
	master, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Close(master) })
	if err := unix.IoctlSetPointerInt(master, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(master, unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	slave := filepath.Join(dir, fmt.Sprint(n))
	if err := os.Chown(slave, nobody, -1); err != nil {
		t.Fatalf("the host's pty at %s: %v", slave, err)
	}
	if err := os.Chmod(slave, 0o620); err != nil {
		t.Fatal(err)
	}

	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	if code, out := runProbeAs(t, tr, nobody, Command{}, "open-write", slave); code == probeOK || out != "ENOENT" {
		t.Errorf("the Trial opening the host's pty %s: %d %q, want ENOENT (the host's devpts detached)", slave, code, out)
	}
	if code, out := runProbeAs(t, tr, nobody, Command{}, "write", slave, "typed by the Trial"); code == probeOK {
		t.Errorf("the Trial wrote to the host's pty %s: %d %q", slave, code, out)
	}
	buf := make([]byte, 64)
	if m, err := unix.Read(master, buf); m > 0 {
		t.Errorf("the host's terminal got %q from the Trial (%v)", buf[:m], err)
	}
	// The control: the Trial's own devpts gives it a pty.
	if code, out := runProbeAs(t, tr, nobody, Command{}, "open-write", "/dev/ptmx"); code != probeOK {
		t.Errorf("the Trial opening its own /dev/ptmx: %d %q", code, out)
	}
}

// hostDevptsElsewhere binds the host's devpts twice on a directory of its
// own outside the Trial's own directories, and returns it.
func hostDevptsElsewhere(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/run", "trialnet-test-devpts-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(dir) })
	if err := os.Chmod(dir, 0o755); err != nil { // as a chroot's /dev is
		t.Fatal(err)
	}
	for range 2 {
		if err := unix.Mount("/dev/pts", dir, "", unix.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	}
	return dir
}

// The Go set-up's dropForeign of devpts, run on a thread in a mount namespace of
// its own with a new devpts on /dev/pts as the init has: the host's
// devpts is gone from the other point, and the Trial's own stays.
func TestPrivilegedGoDropHostDevpts(t *testing.T) {
	dir := hostDevptsElsewhere(t)
	inOwnNamespaces(t, unix.CLONE_NEWNS, func() (bad []string) {
		if err := unix.Mount("devpts", "/dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666"); err != nil {
			bad = append(bad, err.Error())
			return
		}
		var own unix.Stat_t
		if err := unix.Stat("/dev/pts", &own); err != nil {
			bad = append(bad, err.Error())
			return
		}
		if err := dropForeign("devpts", "/dev/pts", false, devptsHeld); err != nil {
			bad = append(bad, err.Error())
			return
		}
		if names, err := dirNames(dir); err != nil || names != "" {
			bad = append(bad, fmt.Sprintf("%s: %q %v, want it empty (the host's devpts detached)", dir, names, err))
		}
		var st unix.Stat_t
		if err := unix.Stat("/dev/pts", &st); err != nil || st.Dev != own.Dev {
			bad = append(bad, fmt.Sprintf("/dev/pts is no longer the new devpts (%v)", err))
		}
		return bad
	})
}

// The host's cgroup2 mounted a second time (the tree bound into a chroot)
// showed every Trial, and a subtree delegated to the Trial's uid (as
// systemd's user@UID.service is) writable: a Trial killed the processes
// there through cgroup.kill. The init detaches every cgroup2 mount.
func TestPrivilegedSecondCgroup2Detached(t *testing.T) {
	cg2, err := Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	second, err := os.MkdirTemp("/run", "trialnet-test-cgroup2-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(second) })
	if err := os.Chmod(second, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("cgroup2", second, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(second, unix.MNT_DETACH) })
	// The delegated subtree, with a host process in it.
	name := "trialnet-test-delegated-" + randSuffix()
	deleg := filepath.Join(cg2, name)
	if err := os.Mkdir(deleg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(deleg) })
	for _, f := range []string{"", "cgroup.procs", "cgroup.kill"} {
		if err := os.Chown(filepath.Join(deleg, f), nobody, nobody); err != nil {
			t.Fatal(err)
		}
	}
	victim := exec.Command("sleep", "60")
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = victim.Process.Kill(); _ = victim.Wait() })
	if err := os.WriteFile(filepath.Join(deleg, "cgroup.procs"), []byte(fmt.Sprint(victim.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}

	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	kill := filepath.Join(second, name, "cgroup.kill")
	if code, out := runProbeAs(t, tr, nobody, Command{}, "write", kill, "1"); code == probeOK || out != "ENOENT" {
		t.Errorf("the Trial writing %s: %d %q, want ENOENT (the second cgroup2 mount detached)", kill, code, out)
	}
	// A zombie still takes signal 0; only a live process is listed.
	if b, err := os.ReadFile(filepath.Join(deleg, "cgroup.procs")); err != nil || strings.TrimSpace(string(b)) != fmt.Sprint(victim.Process.Pid) {
		t.Errorf("the host process in the delegated cgroup is gone: %q %v", b, err)
	}
	if code, out := runProbeAs(t, tr, nobody, Command{}, "ls", second); code != probeOK || out != "" {
		t.Errorf("%s in the Trial: %d %q, want it empty", second, code, out)
	}
}

// The Go set-up's dropHostMounts, run on a thread in a mount namespace of
// its own with the host's cgroup2 mounted a second time: no cgroup2 mount
// is left for the Trial's own to replace.
func TestPrivilegedGoDropHostCgroup2(t *testing.T) {
	second, err := os.MkdirTemp("/run", "trialnet-test-cgroup2-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(second) })
	inOwnNamespaces(t, unix.CLONE_NEWNS, func() (bad []string) {
		if err := unix.Mount("cgroup2", second, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			bad = append(bad, err.Error())
			return
		}
		if err := dropHostMounts(0); err != nil {
			bad = append(bad, err.Error())
			return
		}
		mi, err := os.ReadFile("/proc/thread-self/mountinfo")
		if err != nil {
			bad = append(bad, err.Error())
			return
		}
		for _, l := range strings.Split(string(mi), "\n") {
			if _, post, _ := strings.Cut(l, " - "); strings.HasPrefix(post, "cgroup2 ") {
				bad = append(bad, "a cgroup2 mount is left: "+l)
			}
		}
		return bad
	})
}

// A terminal outside devpts that a login gave its user (a virtual console,
// a serial line) is the operator's terminal itself, past the relay: the
// init covers each such node of the host's /dev with /dev/null. Made
// here as a node of VT 63 in the host's /dev, the Trial's uid's.
func TestPrivilegedHostConsoleCovered(t *testing.T) {
	node := hostConsoleNode(t)
	// A root-owned one is not covered (the Trial cannot open it anyway).
	rootNode := node + "-root"
	if err := unix.Mknod(rootNode, unix.S_IFCHR|0o620, int(unix.Mkdev(4, 62))); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(rootNode) })

	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	for _, n := range []string{node, node + "-vcs"} {
		if code, out := runProbeAs(t, tr, nobody, Command{}, "rdev", n); code != probeOK || strings.TrimSpace(out) != "1:3" {
			t.Errorf("the host's console %s in the Trial: %d %q, want /dev/null (1:3) over it", n, code, out)
		}
	}
	if code, out := runProbeAs(t, tr, nobody, Command{}, "rdev", rootNode); code != probeOK || strings.TrimSpace(out) != "4:62" {
		t.Errorf("a root-owned console %s in the Trial: %d %q, want it as it is (4:62)", rootNode, code, out)
	}
}

// hostConsoleNode makes a node of VT 63 in the host's /dev, and one of
// its screen (vcs63) beside it with "-vcs" added, uid nobody's, as a
// console login makes its terminal its user's.
func hostConsoleNode(t *testing.T) string {
	t.Helper()
	node := "/dev/trialnet-test-tty-" + randSuffix()
	for _, n := range []struct {
		path string
		dev  uint64
	}{{node, unix.Mkdev(4, 63)}, {node + "-vcs", unix.Mkdev(7, 63)}} {
		if err := unix.Mknod(n.path, unix.S_IFCHR|0o620, int(n.dev)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Remove(n.path) })
		if err := os.Chown(n.path, nobody, -1); err != nil {
			t.Fatal(err)
		}
	}
	return node
}

// Misc devices a Trial command must not open, whoever owns them:
// vhost-vsock's (a VM's end of vsock: the opener takes a CID and talks to
// the host's vsock services as a guest, past every network layer;
// systemd's rules make it 0666), uinput's and uhid's (a keyboard of its
// own, typing into the operator's session; Steam's rules give the seat's
// user an ACL on uinput, and a Trial under sudo runs as that user). Each
// is covered with /dev/null in the Trial. Where the kernel has the
// driver, the probes show what the Trial could do otherwise.
func TestPrivilegedHostMiscDevicesCovered(t *testing.T) {
	nodes := hostMiscNodes(t)
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	for _, n := range nodes {
		if code, out := runProbeAs(t, tr, nobody, Command{}, "rdev", n.path); code != probeOK || strings.TrimSpace(out) != "1:3" {
			t.Errorf("the host's %s %s in the Trial: %d %q, want /dev/null (1:3) over it", n.name, n.path, code, out)
		}
		if n.probe == "" {
			continue
		}
		if code, out := runProbeAs(t, tr, nobody, Command{}, n.probe, n.path); code == probeOK {
			t.Errorf("a Trial command used the host's %s %s: %q", n.name, n.path, out)
		}
	}
}

type miscNode struct{ path, name, probe string }

// hostMiscNodes makes a node of each coveredMisc device in the host's
// /dev: vhost-vsock's root's and 0666, as systemd's rules make it,
// uinput's and uhid's uid nobody's, as an ACL of the seat's user opens
// them to it.
func hostMiscNodes(t *testing.T) []miscNode {
	t.Helper()
	suffix := randSuffix()
	nodes := []struct {
		miscNode
		minor uint32
		owner int
		mode  uint32
	}{
		{miscNode{"/dev/trialnet-test-vhost-vsock-" + suffix, "vhost-vsock device", "vhost-vsock"}, 241, 0, 0o666},
		{miscNode{"/dev/trialnet-test-uinput-" + suffix, "uinput device", "uinput"}, 223, nobody, 0o600},
		{miscNode{"/dev/trialnet-test-uhid-" + suffix, "uhid device", ""}, 239, nobody, 0o600},
	}
	var made []miscNode
	for _, n := range nodes {
		if err := unix.Mknod(n.path, unix.S_IFCHR|n.mode, int(unix.Mkdev(10, n.minor))); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Remove(n.path) })
		// Mknod's mode is cut by the umask.
		if err := os.Chmod(n.path, os.FileMode(n.mode)); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(n.path, n.owner, -1); err != nil {
			t.Fatal(err)
		}
		made = append(made, n.miscNode)
	}
	return made
}

// The Go set-up's hideHostTtys, run on a thread in a mount namespace of
// its own: the console node and each coveredMisc device's are /dev/null
// there.
func TestPrivilegedGoHideHostTtys(t *testing.T) {
	node := hostConsoleNode(t)
	misc := hostMiscNodes(t)
	inOwnNamespaces(t, unix.CLONE_NEWNS, func() (bad []string) {
		if err := hideHostTtys(); err != nil {
			bad = append(bad, err.Error())
			return
		}
		paths := []string{node, node + "-vcs"}
		for _, m := range misc {
			paths = append(paths, m.path)
		}
		for _, n := range paths {
			var st unix.Stat_t
			if err := unix.Stat(n, &st); err != nil || st.Rdev != unix.Mkdev(1, 3) {
				bad = append(bad, fmt.Sprintf("%s: %d:%d %v, want /dev/null over it", n, unix.Major(st.Rdev), unix.Minor(st.Rdev), err))
			}
		}
		return bad
	})
}

// The host's procfs mounted a second time (a chroot's /proc, bound by
// schroot) shows every host process to a Trial: their command lines, and
// the host's kernel settings writable by a uid-0 Trial, core_pattern
// among them. The init detaches every proc mount but the Trial's own.
func TestPrivilegedHostProcOutOfReach(t *testing.T) {
	dir := hostMountElsewhere(t, "proc", func(dir string) error { return unix.Mount("/proc", dir, "", unix.MS_BIND, "") })
	pid := strconv.Itoa(victim(t))
	cmdline := filepath.Join(dir, pid, "cmdline")
	// The victim may not have exec'd sleep yet (a slow guest): bounded.
	for i := 0; ; i++ {
		b, err := os.ReadFile(cmdline)
		if err == nil && strings.HasPrefix(string(b), "sleep") {
			break
		}
		if i == 100 {
			t.Fatalf("the host's %s: %q %v (the test cannot tell)", cmdline, b, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	for _, c := range []struct {
		uid  uint32
		args []string
	}{
		{nobody, []string{"read", cmdline}},
		{nobody, []string{"ls", filepath.Join(dir, pid, "root")}},
		{nobody, []string{"ls", filepath.Join(dir, pid, "cwd")}},
		{nobody, []string{"read", filepath.Join(dir, pid, "ns/net")}},
		{nobody, []string{"read", filepath.Join(dir, pid, "environ")}},
		{nobody, []string{"read", filepath.Join(dir, pid, "mountinfo")}},
		{0, []string{"open-write", filepath.Join(dir, "sys/kernel/core_pattern")}},
	} {
		if code, out := runProbeAs(t, tr, c.uid, Command{}, c.args...); code == probeOK || !strings.Contains(out, "ENOENT") && !strings.Contains(out, "no such file") {
			t.Errorf("the Trial (uid %d) %v: %d %q, want ENOENT (the host's procfs detached)", c.uid, c.args, code, out)
		}
	}
	// The control: the Trial's own /proc stays.
	if code, out := runProbeAs(t, tr, nobody, Command{}, "read", "/proc/self/cmdline"); code != probeOK {
		t.Errorf("the Trial reading its own /proc/self/cmdline: %d %q", code, out)
	}
}

// A mount of the host's mqueue file system holds the host IPC
// namespace's POSIX message queues, though the Trial has an IPC
// namespace of its own: a Trial of the queue owner's uid opened one
// there. The init detaches every mqueue mount not of its namespace.
func TestPrivilegedHostMqueueOutOfReach(t *testing.T) {
	dir := hostMountElsewhere(t, "mqueue", func(dir string) error { return unix.Mount("mqueue", dir, "mqueue", 0, "") })
	q := hostQueue(t, dir)
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	for _, args := range [][]string{{"open-write", q}, {"read", q}} {
		if code, out := runProbeAs(t, tr, nobody, Command{}, args...); code == probeOK || !strings.Contains(out, "ENOENT") && !strings.Contains(out, "no such file") {
			t.Errorf("the Trial %v: %d %q, want ENOENT (the host's mqueue detached)", args, code, out)
		}
	}
}

// hostQueue makes a POSIX message queue of uid nobody's in the host's IPC
// namespace through its mqueue mount on dir (removed at cleanup), and
// returns its path.
func hostQueue(t *testing.T, dir string) string {
	t.Helper()
	q := filepath.Join(dir, "operator")
	f, err := os.OpenFile(q, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatalf("make a host message queue at %s: %v", q, err)
	}
	_ = f.Close()
	t.Cleanup(func() { _ = os.Remove(q) })
	if err := os.Chown(q, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	return q
}

// hostMountElsewhere makes a directory of its own under /run (outside the
// Trial's own directories), mounts on it with mount, binds that on top of
// it (the walk must go on until none is left), and returns it.
func hostMountElsewhere(t *testing.T, what string, mount func(dir string) error) string {
	t.Helper()
	dir, err := os.MkdirTemp("/run", "trialnet-test-"+what+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, m := range []func(string) error{mount, func(dir string) error { return unix.Mount(dir, dir, "", unix.MS_BIND, "") }} {
		if err := m(dir); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	}
	return dir
}

// The Go set-up's dropForeign of proc and mqueue, run on a thread in
// mount and IPC namespaces of its own with a new procfs on /proc and a new
// mqueue mounted, as the init has: the host's procfs and mqueue are gone
// from their other points, and the thread's own stay.
func TestPrivilegedGoDropHostProcMqueue(t *testing.T) {
	procDir := hostMountElsewhere(t, "proc", func(dir string) error { return unix.Mount("/proc", dir, "", unix.MS_BIND, "") })
	mqDir := hostMountElsewhere(t, "mqueue", func(dir string) error { return unix.Mount("mqueue", dir, "mqueue", 0, "") })
	hostQueue(t, mqDir)
	ownMq, err := os.MkdirTemp("/run", "trialnet-test-own-mqueue-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(ownMq) })
	inOwnNamespaces(t, unix.CLONE_NEWNS|unix.CLONE_NEWIPC, func() (bad []string) {
		own := map[string]uint64{}
		for _, m := range []struct{ fstype, dir string }{{"proc", "/proc"}, {"mqueue", ownMq}} {
			if err := unix.Mount(m.fstype, m.dir, m.fstype, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
				bad = append(bad, err.Error())
				return
			}
			var st unix.Stat_t
			if err := unix.Stat(m.dir, &st); err != nil {
				bad = append(bad, err.Error())
				return
			}
			own[m.dir] = st.Dev
		}
		for _, d := range []struct{ fstype, own, held string }{{"proc", "/proc", procHeld}, {"mqueue", ownMq, mqueueHeld}} {
			if err := dropForeign(d.fstype, d.own, false, d.held); err != nil {
				bad = append(bad, err.Error())
				return
			}
		}
		for _, dir := range []string{procDir, mqDir} {
			if names, err := dirNames(dir); err != nil || names != "" {
				bad = append(bad, fmt.Sprintf("%s: %q %v, want it empty (the host's mount detached)", dir, names, err))
			}
		}
		for dir, dev := range own {
			var st unix.Stat_t
			if err := unix.Stat(dir, &st); err != nil || st.Dev != dev {
				bad = append(bad, fmt.Sprintf("%s is no longer the thread's own mount (%v)", dir, err))
			}
		}
		return bad
	})
}

// inOwnNamespaces runs body on a thread of its own in new namespaces
// (flags, CLONE_NEWNS among them) with every mount private, as the init
// runs, and reports what body found wrong. The thread stays locked and is
// discarded with its goroutine: it never comes back changed (the main
// thread is the main goroutine's, see init).
func inOwnNamespaces(t *testing.T, flags int, body func() (bad []string)) {
	t.Helper()
	errs := make(chan []string, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if err := unix.Unshare(flags); err != nil {
			errs <- []string{err.Error()}
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			errs <- []string{err.Error()}
			return
		}
		errs <- body()
	}()
	for _, b := range <-errs {
		t.Error(b)
	}
}

// hostShmFile makes a directory of root's in the host's /dev/shm, and in
// it a file of uid nobody's (what a same-uid host process's POSIX shared
// memory is), both removed at cleanup; it returns the directory.
func hostShmFile(t *testing.T) string {
	t.Helper()
	if dev, err := hostShmDev(); err != nil || dev == 0 {
		t.Fatalf("this host's /dev/shm is not a tmpfs of its own (%v): the test needs one", err)
	}
	dir, err := os.MkdirTemp("/dev/shm", "trialnet-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(dir, "operator")
	if err := os.WriteFile(f, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(f, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A second mount of the host's /dev/shm tmpfs (a chroot's /dev/shm, a
// bind for a container) holds the host's POSIX shared memory and
// semaphores, past the Trial's own /dev/shm: a Trial of the owner's uid
// read one there. The init detaches every mount of the host's /dev/shm
// but the sockets it keeps in the Trial's own.
func TestPrivilegedHostShmOutOfReach(t *testing.T) {
	shm := hostShmFile(t)
	dir := hostMountElsewhere(t, "shm", func(dir string) error { return unix.Mount("/dev/shm", dir, "", unix.MS_BIND, "") })
	allowed := filepath.Join(shm, "allowed.sock")
	self, err := netns.Open(filepath.Dir(selfNetns()), filepath.Base(selfNetns()))
	if err != nil {
		t.Fatal(err)
	}
	listenUnixIn(t, self, allowed, false)
	if err := os.Chmod(allowed, 0o777); err != nil { // a socket's connect wants write
		t.Fatal(err)
	}
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{UnixAllow: []string{allowed}})
	through := filepath.Join(dir, filepath.Base(shm), "operator")
	if code, out := runProbeAs(t, tr, nobody, Command{}, "read", through); code == probeOK || !strings.Contains(out, "ENOENT") && !strings.Contains(out, "no such file") {
		t.Errorf("the Trial reading the host's shared memory at %s: %d %q, want ENOENT (the host's /dev/shm detached)", through, code, out)
	}
	// The controls: the allowed socket is still bound in the Trial's own
	// /dev/shm, and that is the Trial's, not the host's.
	if code, out := runProbeAs(t, tr, nobody, Command{}, "unix", allowed); code != probeOK {
		t.Errorf("the Trial connecting to the allowed socket %s in its own /dev/shm: %d %q", allowed, code, out)
	}
	if code, out := runProbeAs(t, tr, nobody, Command{}, "read", filepath.Join(shm, "operator")); code == probeOK {
		t.Errorf("the Trial read the host's shared memory through its own /dev/shm: %q", out)
	}
}

// The Go set-up's drop of the host's /dev/shm (hostShmDrop), run on a thread in a mount namespace of
// its own with a tmpfs of its own on /dev/shm, as the init has: the
// host's /dev/shm is gone from its other point, a bind kept in the own
// /dev/shm stays.
func TestPrivilegedGoDropHostShm(t *testing.T) {
	shm := hostShmFile(t)
	dir := hostMountElsewhere(t, "shm", func(dir string) error { return unix.Mount("/dev/shm", dir, "", unix.MS_BIND, "") })
	kept := filepath.Join(shm, "operator")
	inOwnNamespaces(t, unix.CLONE_NEWNS, func() (bad []string) {
		host, err := hostShmDev()
		if err != nil || host == 0 {
			return []string{fmt.Sprintf("the host's /dev/shm: %d %v", host, err)}
		}
		if err := unix.Mount("tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
			return []string{err.Error()}
		}
		// As mountOwnDirs keeps an allowed socket: the host's file bound
		// at its path in the own tmpfs.
		own := filepath.Join("/dev/shm", filepath.Base(shm), "operator")
		if err := os.MkdirAll(filepath.Dir(own), 0o755); err != nil {
			return []string{err.Error()}
		}
		if err := os.WriteFile(own, nil, 0o600); err != nil {
			return []string{err.Error()}
		}
		if err := unix.Mount(filepath.Join(dir, filepath.Base(shm), "operator"), own, "", unix.MS_BIND, ""); err != nil {
			return []string{err.Error()}
		}
		if err := dropMounts(hostShmDrop(host)); err != nil {
			return []string{err.Error()}
		}
		if names, err := dirNames(dir); err != nil || names != "" {
			bad = append(bad, fmt.Sprintf("%s: %q %v, want it empty (the host's /dev/shm detached)", dir, names, err))
		}
		if b, err := os.ReadFile(own); err != nil || string(b) != "secret" {
			bad = append(bad, fmt.Sprintf("the bind kept in the own /dev/shm (%s): %q %v", kept, b, err))
		}
		return bad
	})
}

// The host's reserved huge pages (vm.nr_hugepages) are bounded by no
// limit of a Trial's: a Trial that maps them (MAP_HUGETLB, or a file of
// its own on the host's hugetlbfs) takes what a host database reserved.
// The filter refuses the flag with ENOMEM and the init detaches every
// hugetlbfs mount. The pool is given one page for the test, so that the
// host's own map (the control) succeeds.
func TestPrivilegedHostHugePagesOutOfReach(t *testing.T) {
	const sysctl = "/proc/sys/vm/nr_hugepages"
	b, err := os.ReadFile(sysctl)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err != nil || n == 0 {
		if err := os.WriteFile(sysctl, []byte("1"), 0); err != nil {
			t.Fatalf("reserve a huge page for the test: %v", err)
		}
		t.Cleanup(func() { _ = os.WriteFile(sysctl, b, 0) })
	}
	if err := hugePage(); err != nil {
		t.Fatalf("the host's own huge page (the control): %v", err)
	}
	dir := hostMountElsewhere(t, "hugetlbfs", func(dir string) error { return unix.Mount("hugetlbfs", dir, "hugetlbfs", 0, "mode=0777") })
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	if code, out := runProbeAs(t, tr, nobody, Command{}, "hugepage"); code == probeOK || out != "ENOMEM" {
		t.Errorf("the Trial mapping a huge page: %d %q, want ENOMEM", code, out)
	}
	// A file there: what a uid-0 Trial could make and map.
	file := filepath.Join(dir, "pages")
	f, err := os.OpenFile(file, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	if code, out := runProbeAs(t, tr, 0, Command{}, "open-write", file); code == probeOK || out != "ENOENT" {
		t.Errorf("the Trial (uid 0) opening %s on the host's hugetlbfs: %d %q, want ENOENT (detached)", file, code, out)
	}
}

// The Go set-up's detach of hugetlbfs, run on a thread in a mount
// namespace of its own.
func TestPrivilegedGoDropHugetlbfs(t *testing.T) {
	dir := hostMountElsewhere(t, "hugetlbfs", func(dir string) error { return unix.Mount("hugetlbfs", dir, "hugetlbfs", 0, "mode=0777") })
	inOwnNamespaces(t, unix.CLONE_NEWNS, func() (bad []string) {
		if err := dropMounts(mountDrop{"hugetlbfs", hugetlbfsHeld, func(uint64, string) bool { return true }}); err != nil {
			return []string{err.Error()}
		}
		var fs unix.Statfs_t
		if err := unix.Statfs(dir, &fs); err != nil || fs.Type == unix.HUGETLBFS_MAGIC {
			bad = append(bad, fmt.Sprintf("%s is still a hugetlbfs (%v)", dir, err))
		}
		return bad
	})
}

// An allowed unix socket on another mount of the host's /dev/shm (a bind
// of it, a chroot's /dev/shm) is refused at create: the init detaches
// that mount, and the socket would be out of the Trial's reach without a
// word. Named under /dev/shm itself, it is bound into the Trial's own.
func TestPrivilegedUnixAllowOnHostShmIsRefused(t *testing.T) {
	shm := hostShmFile(t)
	dir := hostMountElsewhere(t, "shm", func(dir string) error { return unix.Mount("/dev/shm", dir, "", unix.MS_BIND, "") })
	h := &Host{NetnsDir: t.TempDir()}
	for _, p := range []string{filepath.Join(dir, filepath.Base(shm), "operator"), filepath.Join(dir, "not-yet", "app.sock")} {
		// UnixOpen: no BPF layer here to judge the path's safety by.
		if err := h.checkSpec(trial.Spec{ID: "u", UnixOpen: true, UnixAllow: []string{p}}); err == nil || !strings.Contains(err.Error(), "on a mount of the host's /dev/shm") {
			t.Errorf("%s: %v, want a refusal naming the host's /dev/shm", p, err)
		}
	}
	if err := h.checkSpec(trial.Spec{ID: "u", UnixOpen: true, UnixAllow: []string{filepath.Join(shm, "operator"), filepath.Join(dir, "..", "elsewhere.sock")}}); err != nil {
		t.Errorf("a path under /dev/shm itself, and one off it: %v", err)
	}
}

// A bind of the host's /dev/shm covered by a hugetlbfs at the same point:
// the /dev/shm pass leaves it (only a mount on top at its point can be
// detached), the hugetlbfs pass then uncovers it. The Go set-up's passes
// run again until one detaches nothing, on a thread in a mount namespace
// of its own with a tmpfs of its own on /dev/shm, as the init has.
func TestPrivilegedGoDropUncoveredHostShm(t *testing.T) {
	shm := hostShmFile(t)
	dir := hostMountElsewhere(t, "shm", func(dir string) error { return unix.Mount("/dev/shm", dir, "", unix.MS_BIND, "") })
	inOwnNamespaces(t, unix.CLONE_NEWNS, func() (bad []string) {
		host, err := hostShmDev()
		if err != nil || host == 0 {
			return []string{fmt.Sprintf("the host's /dev/shm: %d %v", host, err)}
		}
		if err := unix.Mount("tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
			return []string{err.Error()}
		}
		if err := unix.Mount("hugetlbfs", dir, "hugetlbfs", 0, "mode=0777"); err != nil {
			return []string{err.Error()}
		}
		if err := dropHostMounts(host); err != nil {
			return []string{err.Error()}
		}
		if names, err := dirNames(dir); err != nil || names != "" {
			bad = append(bad, fmt.Sprintf("%s: %q %v, want it empty (the host's /dev/shm under the hugetlbfs detached too; %s)", dir, names, err, filepath.Base(shm)))
		}
		return bad
	})
}

// The init's passes (C) run again until one detaches nothing: a bind of
// the host's /dev/shm covered by a hugetlbfs at the same point is
// uncovered by the hugetlbfs pass, after the /dev/shm pass left it. A
// Trial of a segment's uid read the host's shared memory there.
func TestPrivilegedHostShmUnderHugetlbfsOutOfReach(t *testing.T) {
	shm := hostShmFile(t)
	dir := hostMountElsewhere(t, "shm", func(dir string) error { return unix.Mount("/dev/shm", dir, "", unix.MS_BIND, "") })
	if err := unix.Mount("hugetlbfs", dir, "hugetlbfs", 0, "mode=0777"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	through := filepath.Join(dir, filepath.Base(shm), "operator")
	if code, out := runProbeAs(t, tr, nobody, Command{}, "read", through); code == probeOK || !strings.Contains(out, "ENOENT") && !strings.Contains(out, "no such file") {
		t.Errorf("the Trial reading the host's shared memory at %s: %d %q, want ENOENT (the host's /dev/shm detached)", through, code, out)
	}
}

// A tmpfs elsewhere on which only cgroup mounts are (its own, here:
// the pids hierarchy's root on a directory whose name mountinfo
// escapes, its release_agent bound on a file of the tmpfs, a named
// hierarchy, the unified one) is detached whole and copied back alone,
// by the Go set-up and by the init's (C on x86-64): none of those files
// is reached through it, the file shows the tmpfs's own content again,
// and mountinfo lists no cgroup mount on it. Seen red with the tmpfs
// copied with AT_RECURSIVE in both twins (every file read, in both
// subtests).
func TestPrivilegedHideV1OnATmpfsElsewhere(t *testing.T) {
	tr, _, _, mnts, _ := v1Overmountable(t)
	cg2, err := Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	// Not under /tmp, which the init mounts afresh.
	dir, err := os.MkdirTemp("/run", "trialnet-test-v1-tmpfs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(dir) })
	filter, err := seccompFile(false)
	if err != nil {
		t.Fatal(err)
	}
	const content = "the tmpfs's own"
	layout := func() error {
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=16k"); err != nil {
			return err
		}
		for _, d := range []string{"a b", "n", "u"} {
			if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
				return err
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "f"), []byte(content), 0o644); err != nil {
			return err
		}
		for _, b := range [][2]string{{mnts[PoolPids], "a b"}, {filepath.Join(mnts[PoolPids], "release_agent"), "f"}, {cg2, "u"}} {
			if err := unix.Mount(b[0], filepath.Join(dir, b[1]), "", unix.MS_BIND, ""); err != nil {
				return fmt.Errorf("bind %s on %s: %w", b[0], b[1], err)
			}
		}
		// A hierarchy of its own, gone with the thread's mounts.
		return unix.Mount("cgroup", filepath.Join(dir, "n"), "cgroup", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "none,name=trialnet-test-v1-tmpfs")
	}
	check := func(root, mountinfo string) (bad []string) {
		for _, p := range []string{"a b/release_agent", "n/release_agent", "u/cgroup.procs"} {
			if _, err := os.ReadFile(filepath.Join(root+dir, p)); !errors.Is(err, os.ErrNotExist) {
				bad = append(bad, fmt.Sprintf("read %s: %v, want ENOENT", filepath.Join(dir, p), err))
			}
		}
		if b, err := os.ReadFile(filepath.Join(root+dir, "f")); err != nil || string(b) != content {
			bad = append(bad, fmt.Sprintf("read %s: %q %v, want %q", filepath.Join(dir, "f"), b, err, content))
		}
		for line := range strings.Lines(mountinfo) {
			pre, post, _ := strings.Cut(line, " - ")
			if f := strings.Fields(pre); len(f) >= 5 && under(cgroup2.UnescapeMountPath(f[4]), dir) && strings.HasPrefix(post, "cgroup") {
				bad = append(bad, "still mounted: "+strings.TrimSpace(line))
			}
		}
		return bad
	}
	t.Run("go", func(t *testing.T) {
		inOwnMounts(t, layout, func() []string {
			if err := hideV1(tr.v1Dirs()); err != nil {
				return []string{err.Error()}
			}
			mi, err := os.ReadFile("/proc/thread-self/mountinfo")
			if err != nil {
				return []string{err.Error()}
			}
			return check("", string(mi))
		})
	})
	t.Run("init", func(t *testing.T) {
		inOwnMounts(t, layout, func() []string {
			pid, stop, err := initHere(tr, filter)
			if err != nil {
				return []string{err.Error()}
			}
			defer stop()
			mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
			if err != nil {
				return []string{err.Error()}
			}
			return check(fmt.Sprintf("/proc/%d/root", pid), string(mi))
		})
	})
}

// tmpfsDev mounts a tmpfs of device nodes over /dev, as a container (a
// privileged one's holds a node of each host device, numbers and owners
// copied) or systemd-nspawn has it, with a console node of uid nobody's
// and a node of each coveredMisc device; it returns their paths. For a
// thread in mounts of its own (inOwnMounts).
func tmpfsDev() ([]string, error) {
	if err := unix.Mount("tmpfs", "/dev", "tmpfs", unix.MS_NOSUID, "mode=755"); err != nil {
		return nil, err
	}
	for _, d := range []string{"pts", "shm", "mqueue"} {
		if err := os.Mkdir(filepath.Join("/dev", d), 0o755); err != nil {
			return nil, err
		}
	}
	nodes := []struct {
		name  string
		dev   uint64
		owner int
	}{
		{"null", unix.Mkdev(1, 3), 0}, {"zero", unix.Mkdev(1, 5), 0}, {"full", unix.Mkdev(1, 7), 0},
		{"random", unix.Mkdev(1, 8), 0}, {"urandom", unix.Mkdev(1, 9), 0},
		{"tty", unix.Mkdev(5, 0), 0}, {"ptmx", unix.Mkdev(5, 2), 0},
		{"tty63", unix.Mkdev(4, 63), nobody},
		{"vhost-vsock", unix.Mkdev(10, 241), 0}, {"uinput", unix.Mkdev(10, 223), nobody}, {"uhid", unix.Mkdev(10, 239), nobody},
	}
	var covered []string
	for _, n := range nodes {
		path := filepath.Join("/dev", n.name)
		if err := unix.Mknod(path, unix.S_IFCHR|0o666, int(n.dev)); err != nil {
			return nil, err
		}
		if err := os.Chmod(path, 0o666); err != nil {
			return nil, err
		}
		if n.owner != 0 || unix.Major(n.dev) == 10 {
			if err := os.Chown(path, n.owner, -1); err != nil {
				return nil, err
			}
			covered = append(covered, path)
		}
	}
	return covered, nil
}

// A /dev that is no devtmpfs (a container's, systemd-nspawn's) holds the
// same nodes: the init covers them there too. Seen red before the set-up
// looked at /dev whatever it is: vhost-vsock's node kept 10:241.
func TestPrivilegedInitCoversATmpfsDev(t *testing.T) {
	tr := newTrial(t, newHost(t), trial.Spec{})
	filter, err := seccompFile(false)
	if err != nil {
		t.Fatal(err)
	}
	var covered []string
	inOwnMounts(t, func() (err error) {
		covered, err = tmpfsDev()
		return err
	}, func() []string {
		pid, stop, err := initHere(tr, filter)
		if err != nil {
			return []string{err.Error()}
		}
		defer stop()
		var bad []string
		for _, p := range covered {
			var st unix.Stat_t
			if err := unix.Stat(fmt.Sprintf("/proc/%d/root%s", pid, p), &st); err != nil || st.Rdev != unix.Mkdev(1, 3) {
				bad = append(bad, fmt.Sprintf("%s in the init's mounts: %d:%d %v, want /dev/null over it", p, unix.Major(st.Rdev), unix.Minor(st.Rdev), err))
			}
		}
		return bad
	})
}

// The Go set-up's hideHostTtys over a tmpfs /dev.
func TestPrivilegedGoHideHostTtysInATmpfsDev(t *testing.T) {
	var covered []string
	inOwnMounts(t, func() (err error) {
		covered, err = tmpfsDev()
		return err
	}, func() (bad []string) {
		if err := hideHostTtys(); err != nil {
			return []string{err.Error()}
		}
		for _, p := range covered {
			var st unix.Stat_t
			if err := unix.Stat(p, &st); err != nil || st.Rdev != unix.Mkdev(1, 3) {
				bad = append(bad, fmt.Sprintf("%s: %d:%d %v, want /dev/null over it", p, unix.Major(st.Rdev), unix.Minor(st.Rdev), err))
			}
		}
		return bad
	})
}
