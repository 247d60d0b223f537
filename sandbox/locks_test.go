//go:build linux

package sandbox

import (
	"errors"
	"os"
	"sync"
	"testing"

	"github.com/trialnet/trialnet/trial"
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
	tr := newTrial(t, h, trial.Spec{})
	cg, err := os.Open(tr.Cgroup) // the launch's first step
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	if _, err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := beginJoin(cg); !errors.Is(err, errGone) {
		t.Errorf("join lock taken after the teardown: %v, want errGone", err)
	}
	if _, err := lockInit(cg); !errors.Is(err, errGone) {
		t.Errorf("launch lock taken after the teardown: %v, want errGone", err)
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
