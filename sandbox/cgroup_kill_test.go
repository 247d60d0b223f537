//go:build linux

package sandbox

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

// TestPrivilegedKillCgroupWaitsUntilEmpty: killCgroup returns only once
// every process of the cgroup is gone (it waits on cgroup.events), and a
// cgroup already removed is not an error.
func TestPrivilegedKillCgroupWaitsUntilEmpty(t *testing.T) {
	privtest.Require(t)
	dir := killTestCgroup(t)
	t.Cleanup(func() { _ = killCgroup(dir, killWait) })
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var cmds []*exec.Cmd
	for range 4 {
		c := exec.Command("sleep", "100")
		c.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, c)
	}
	if p, err := cgroupPopulated(dir); err != nil || !p {
		t.Fatalf("cgroup.events before the kill: populated %v, %v; want populated", p, err)
	}
	if err := killCgroup(dir, killWait); err != nil {
		t.Fatal(err)
	}
	// Read before reaping: populated falls as each process exits, so a
	// return before the last exit shows here.
	if p, err := cgroupPopulated(dir); err != nil || p {
		t.Fatalf("cgroup.events after killCgroup returned: populated %v, %v; want empty", p, err)
	}
	for _, c := range cmds {
		if err := c.Wait(); err == nil || c.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("a process of the cgroup ended with %v, want killed by SIGKILL", err)
		}
	}
	if err := unix.Rmdir(dir); err != nil {
		t.Fatal(err)
	}
	if err := killCgroup(dir, killWait); err != nil {
		t.Errorf("killCgroup of a removed cgroup: %v, want nil", err)
	}
	if err := killCgroup(filepath.Join(dir, "never"), killWait); err != nil {
		t.Errorf("killCgroup of a cgroup never made: %v, want nil", err)
	}
}

// TestPrivilegedKillOfACgroupRemovedMidWrite: a cgroup removed between
// killCgroup's open of cgroup.kill and its write (a runtime's rmdir)
// fails the write with ENODEV, which says gone, as ENOENT does: no
// error, so no verdict turns UNKNOWN over it.
func TestPrivilegedKillOfACgroupRemovedMidWrite(t *testing.T) {
	privtest.Require(t)
	dir := killTestCgroup(t)
	fd, err := openKernfs(filepath.Join(dir, "cgroup.kill"), unix.O_WRONLY)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Rmdir(dir); err != nil {
		t.Fatal(err)
	}
	_, err = unix.Write(fd, []byte("1"))
	if err == nil || !cgroupGone(err) {
		t.Errorf("write to cgroup.kill of a removed cgroup: %v; want an error cgroupGone takes as gone", err)
	}
}

// TestPrivilegedKillCgroupWaitsForEveryProcess: killCgroup's wait, woken
// by the exits of the processes it saw, still returns only once the
// cgroup and the cgroups below it are empty, for every shape a Trial's
// processes take: a tree of them, one forking while the kill runs, a
// PID namespace's init with its children beside a process outside that
// namespace (an exec'd command, an adopted container's), and processes
// only in a cgroup below (a nested Trial's, a container's).
func TestPrivilegedKillCgroupWaitsForEveryProcess(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "unshare")
	mount, err := Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		// cmds run in the cgroup, or in its child "below" if below.
		cmds  [][]string
		below bool
		procs int // processes to wait for before the kill; 0: a shell's children
	}{
		{name: "tree", cmds: [][]string{{"sh", "-c", "sleep 100 & (sleep 100 & sleep 100 & wait) & wait"}}},
		{name: "forking", cmds: [][]string{{"sh", "-c", "while :; do sleep 100 & done"}}},
		{name: "more than one wait watches", procs: 2 * maxWatched, cmds: [][]string{{"sh", "-c", "for i in $(seq 150); do sleep 100 & done; wait"}}},
		{name: "pid namespace and outside it", cmds: [][]string{
			{"unshare", "--pid", "--fork", "sh", "-c", "sleep 100 & sleep 100 & wait"},
			{"sleep", "100"},
		}},
		{name: "only below", below: true, cmds: [][]string{
			{"sh", "-c", "sleep 100 & sleep 100 & wait"},
			{"unshare", "--pid", "--fork", "sleep", "100"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, err := os.MkdirTemp(mount, "trialnet-killcg-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = killCgroup(dir, killWait); _ = removeCgroup(dir) })
			in := dir
			if tc.below {
				in = filepath.Join(dir, "below")
				if err := os.Mkdir(in, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			var cmds []*exec.Cmd
			for _, argv := range tc.cmds {
				cmds = append(cmds, startIn(t, in, argv))
			}
			// Wait for the tree to grow: each shell's children are there.
			if tc.procs == 0 {
				tc.procs = len(tc.cmds) + 2
			}
			waitForProcs(t, in, tc.procs)
			if err := killCgroup(dir, killWait); err != nil {
				t.Fatal(err)
			}
			for _, d := range []string{dir, in} {
				if p, err := cgroupPopulated(d); err != nil || p {
					t.Errorf("%s after killCgroup returned: populated %v, %v; want empty", d, p, err)
				}
				if b, err := os.ReadFile(filepath.Join(d, "cgroup.procs")); err != nil || len(b) != 0 {
					t.Errorf("%s/cgroup.procs after killCgroup returned: %q, %v; want none", d, b, err)
				}
			}
			for _, c := range cmds {
				_ = c.Wait()
			}
		})
	}
}

// startIn starts argv in the cgroup at dir.
func startIn(t *testing.T, dir string, argv []string) *exec.Cmd {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	c := exec.Command(argv[0], argv[1:]...)
	c.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	return c
}

// waitForProcs waits until the cgroup at dir has at least n processes.
func waitForProcs(t testing.TB, dir string, n int) {
	t.Helper()
	for range 5000 {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			t.Fatal(err)
		}
		if len(strings.Fields(string(b))) >= n {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("the cgroup %s never had %d processes", dir, n)
}

// CloseWith runs its caller's work at the Trial's end once the Trial's
// processes are gone and its final counters and pool use are read (what a
// receipt is signed over), beside the removals, and returns its error; a
// later CloseWith runs its own with the same counters.
func TestPrivilegedCloseWithRunsAfterTheKill(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{UnixOpen: true})
	p, err := tr.Start(Command{Args: []string{"sleep", "100"}, Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = p.Wait() })
	errDuring := errors.New("the caller's work failed")
	var seen []bpf.Counters
	during := func(k bpf.Counters, unsure error) error {
		if unsure != nil {
			t.Errorf("during ran unsure of the counters (%v) after a kill that ended every process", unsure)
		}
		// It runs beside the removal: a cgroup already removed (ENOENT,
		// or ENODEV for a file opened just before) held no process.
		populated, err := cgroupPopulated(tr.Cgroup)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) {
			populated, err = false, nil
		}
		if err != nil || populated {
			t.Errorf("during ran with the Trial's cgroup populated %v (%v): its processes must be gone", populated, err)
		}
		if tr.finalPools.Load() == nil {
			t.Error("during ran before the Trial's final pool use was read")
		}
		seen = append(seen, k)
		return errDuring
	}
	k, err := tr.CloseWith(during)
	if !errors.Is(err, errDuring) {
		t.Fatalf("CloseWith returned %v, want the error of during", err)
	}
	if _, err := os.Stat(tr.Cgroup); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the Trial's cgroup after CloseWith: %v, want removed", err)
	}
	if k2, err := tr.CloseWith(during); !errors.Is(err, errDuring) || k2 != k {
		t.Fatalf("a second CloseWith: %+v, %v; want the first's counters and the error of its during", k2, err)
	}
	if len(seen) != 2 || seen[0] != k || seen[1] != k {
		t.Fatalf("during saw %+v, want the final counters %+v twice", seen, k)
	}
}

// killTestCgroup makes an empty cgroup for a test, removed after it (a
// test that fills it kills it first, in a cleanup of its own).
func killTestCgroup(t *testing.T) string {
	t.Helper()
	mount, err := Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(mount, "trialnet-killcg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Rmdir(dir) })
	return dir
}
