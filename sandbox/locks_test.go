//go:build linux

package sandbox

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

// noLocksLeft fails the test if a launch lock of cgroup id is left.
func noLocksLeft(t *testing.T, id uint64) {
	t.Helper()
	for _, p := range []string{initLockPath(id), joinLockPath(id)} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is left after the teardown (%v)", p, err)
			_ = os.Remove(p)
		}
	}
}

// A launch that opened a Trial's cgroup just before its teardown, and
// takes its locks once the teardown removed the cgroup and the locks, is
// refused, and makes no lock again to stay until reboot.
func TestPrivilegedLaunchAfterTeardownLeavesNoLock(t *testing.T) {
	h := newHost(t)
	lockAfterTeardown(t, newTrial(t, h, trial.Spec{}), errGone)
}

// lockAfterTeardown opens tr's cgroup, as a launch does first, tears tr
// down, then takes its join and launch locks through the opened
// directory, as the launch does next: both must fail with want, and
// leave no lock file.
func lockAfterTeardown(t *testing.T, tr *Trial, want error) {
	t.Helper()
	cg, err := os.Open(tr.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	if _, err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if end, err := beginJoin(cg); !errors.Is(err, want) {
		t.Errorf("join lock taken after the teardown: %v, want %v", err, want)
		if err == nil {
			end()
		}
	}
	if f, err := lockInit(cg); !errors.Is(err, want) {
		t.Errorf("launch lock taken after the teardown: %v, want %v", err, want)
		if err == nil {
			_ = f.Close()
		}
	}
	noLocksLeft(t, tr.CgroupID)
}

// Launches racing the teardown of their Trial leave no lock behind,
// whichever comes first.
func TestPrivilegedLaunchesRacingTeardownLeaveNoLock(t *testing.T) {
	h := newHost(t)
	const rounds = 10
	for range rounds {
		tr := newTrial(t, h, trial.Spec{})
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				p, err := tr.Start(Command{Args: []string{"true"}, Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody})
				if err == nil {
					_, _ = p.Wait()
				}
			})
		}
		if _, err := tr.Close(); err != nil {
			t.Error(err)
		}
		wg.Wait()
		noLocksLeft(t, tr.CgroupID)
	}
}

// adoptTrial makes a Trial around a container of the test's own: a
// cgroup under h's parent holding a process in a network namespace of
// its own, as a runtime leaves it at its createRuntime stage. The cgroup
// stays the test's (the runtime's) to remove, after the Trial's end.
func adoptTrial(t *testing.T, h *Host) *Trial {
	t.Helper()
	dir := filepath.Join(h.Parent, "ctr-"+randSuffix())
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = removeCgroup(dir) })
	cg, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	cmd := exec.Command("sleep", "1000")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	fd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	pidfd := os.NewFile(uintptr(fd), "pidfd")
	t.Cleanup(func() { _ = pidfd.Close() })
	tr, err := h.Adopt(trial.Spec{ID: "t-" + randSuffix()}, nil, Container{PID: cmd.Process.Pid, Pidfd: pidfd})
	if err != nil {
		t.Fatal(err)
	}
	closeAtCleanup(t, tr)
	return tr
}

// A Trial made around a container leaves its cgroup (the runtime's) at
// its teardown: a launch that opened it before, and takes its locks once
// the teardown removed them, is refused all the same (the cgroup's own
// closing mark), and makes no lock again to stay until reboot.
func TestPrivilegedLaunchAfterAdoptedTeardownLeavesNoLock(t *testing.T) {
	h := newHost(t)
	tr := adoptTrial(t, h)
	lockAfterTeardown(t, tr, errClosing)
	if _, err := os.Stat(filepath.Join(tr.Cgroup, "cgroup.procs")); err != nil {
		t.Fatalf("the adopted cgroup went with its Trial: %v", err)
	}
	// The whole launch, by path as trialnet exec's: refused before it
	// starts anything in the cgroup.
	if p, err := tr.Start(Command{Args: []string{"true"}, Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody}); !errors.Is(err, errClosing) {
		t.Errorf("a command started in the destroyed Trial's cgroup: %v, want errClosing", err)
		if err == nil {
			_, _ = p.Wait()
		}
	}
	noLocksLeft(t, tr.CgroupID)
}
