//go:build linux

package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/trialnet/trialnet/internal/cgroup2"
	"golang.org/x/sys/unix"
)

// Cgroup2Mount finds where the cgroup2 hierarchy is mounted, from
// /proc/self/mountinfo (on hybrid hosts it is not /sys/fs/cgroup).
func Cgroup2Mount() (string, error) { return cgroup2.Mount() }

// killCgroup kills every process in the cgroup and waits, bounded, until
// it is empty.
func killCgroup(dir string, wait time.Duration) error {
	// Opened before the kill, so that the change the kill brings about is
	// one this file's poll sees (kernfs compares against the last read).
	events, err := os.Open(filepath.Join(dir, "cgroup.events"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("kill cgroup %s: %w", dir, err)
	}
	defer events.Close()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("kill cgroup %s: %w", dir, err)
	}
	deadline := time.Now().Add(wait)
	for {
		populated, err := eventsPopulated(events)
		if err != nil || !populated {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s still has processes %v after cgroup.kill", dir, wait)
		}
		awaitEvent(events)
	}
}

// eventsPopulated reads an open cgroup.events from its start. A cgroup
// removed meanwhile (ENODEV on its open file) has no processes.
func eventsPopulated(f *os.File) (bool, error) {
	var buf [256]byte
	n, err := unix.Pread(int(f.Fd()), buf[:], 0)
	if errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read cgroup.events: %w", err)
	}
	return bytes.Contains(buf[:n], []byte("populated 1")), nil
}

// awaitEvent waits until cgroup.events changes or a millisecond passes,
// whichever is first. The kernel wakes a poller of the file with POLLPRI
// when its values change, but spaces its notifications of one file at
// least 10 ms apart (cgroup_file_notify), so the millisecond re-read, the
// cadence this wait had before, stays as the bound.
func awaitEvent(f *os.File) {
	fds := []unix.PollFd{{Fd: int32(f.Fd()), Events: unix.POLLPRI}}
	_, _ = unix.Poll(fds, 1)
}

func cgroupPopulated(dir string) (bool, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read cgroup.events: %w", err)
	}
	return bytes.Contains(b, []byte("populated 1")), nil
}

// populated reports whether the Trial still has processes; a cgroup that
// cannot be read counts as empty, so that nothing waits on it.
func (t *Launcher) populated() bool {
	p, _ := cgroupPopulated(t.Cgroup)
	return p
}

// removeCgroup removes a cgroup directory whose processes are gone, with
// the cgroups under it (a container's, which its runtime made in the
// Trial's and may not have removed yet); one already gone is fine.
func removeCgroup(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove cgroup %s: %w", dir, err)
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := removeCgroup(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	err = unix.Rmdir(dir)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return fmt.Errorf("remove cgroup %s: %w", dir, err)
}
