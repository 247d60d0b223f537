//go:build linux

package sandbox

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/trial"

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
