//go:build linux

package sandbox

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/trialnet/trialnet/internal/cgroup2"
	"golang.org/x/sys/unix"
)

// Cgroup2Mount finds where the cgroup2 hierarchy is mounted, from
// /proc/self/mountinfo (on hybrid hosts it is not /sys/fs/cgroup).
func Cgroup2Mount() (string, error) { return cgroup2.Mount() }

// killCgroup kills every process in the cgroup and waits, bounded, until
// it is empty. Empty is what cgroup.events says, never less: the
// counters and receipt read after it depend on it.
func killCgroup(dir string, wait time.Duration) error {
	// Opened before the kill, so that the change the kill brings about is
	// one this file's poll sees (kernfs compares against the last read).
	// Raw descriptors: os.File would register each with Go's poller
	// (kernfs files poll), and Fd take it back out, four more calls each.
	events, err := openKernfs(filepath.Join(dir, "cgroup.events"), unix.O_RDONLY)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("kill cgroup %s: %w", dir, err)
	}
	defer unix.Close(events)
	if err := writeKernfs(filepath.Join(dir, "cgroup.kill"), "1"); err != nil {
		if cgroupGone(err) {
			return nil
		}
		return fmt.Errorf("kill cgroup %s: %w", dir, err)
	}
	var exits exitWait
	defer exits.close()
	deadline := time.Now().Add(wait)
	for {
		populated, err := eventsPopulated(events)
		if err != nil || !populated {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s still has processes %v after cgroup.kill", dir, wait)
		}
		if len(exits.fds) == 0 {
			exits.watch(dir)
		}
		exits.await(events)
	}
}

// cgroupGone reports whether err says the cgroup was removed: not found
// at open (ENOENT), or removed between the open and the write (ENODEV, as
// a container runtime's rmdir racing the kill). Either way it holds no
// processes, and the verdict over it is no less sure.
func cgroupGone(err error) bool {
	return errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENODEV)
}

// eventsPopulated reads an open cgroup.events from its start. A cgroup
// removed meanwhile (ENODEV on its open file) has no processes.
func eventsPopulated(fd int) (bool, error) {
	var buf [256]byte
	n, err := unix.Pread(fd, buf[:], 0)
	if errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read cgroup.events: %w", err)
	}
	return bytes.Contains(buf[:n], []byte("populated 1")), nil
}

// exitWait wakes the wait for an empty cgroup when one of its processes
// exits. cgroup.events alone comes late after a short life: the kernel
// spaces one file's notifications 10 ms apart (cgroup_file_notify), so
// the populated 1 -> 0 of a Trial killed within 10 ms of its launch's
// 0 -> 1 is told only then. A pidfd is readable once its whole thread
// group has exited, after the kernel took each of its tasks out of the
// cgroup (cgroup_exit before exit_notify in do_exit).
//
// The pidfds only wake the wait; cgroup.events decides it. Processes of
// the cgroup that none of them names (forked while the kill ran, in a
// cgroup below, a pid reused before it was opened) keep it populated,
// and await's re-read every millisecond, the bound of each wait, finds
// them gone.
type exitWait struct {
	fds []unix.PollFd // one pidfd (POLLIN) a process not yet seen to exit
}

// maxWatched bounds the pidfds one wait holds: the agent's descriptors
// are shared with every Trial's listeners, and a Trial may have thousands
// of processes. The first ones' exits wake the wait; once they are gone,
// the next are watched.
const maxWatched = 64

// watch opens a pidfd for each process cgroup.procs lists now, up to
// maxWatched.
func (w *exitWait) watch(dir string) {
	b, err := readKernfs(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return
	}
	for f := range strings.FieldsSeq(string(b)) {
		if len(w.fds) == maxWatched {
			return
		}
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 0 {
			continue // 0: a process outside this PID namespace
		}
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // gone already (ESRCH), or no pidfds: the re-read finds it
		}
		w.fds = append(w.fds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
	}
}

// await waits until cgroup.events changes, a watched process exits, or a
// millisecond passes, whichever is first, and forgets the processes that
// exited.
func (w *exitWait) await(events int) {
	fds := append([]unix.PollFd{{Fd: int32(events), Events: unix.POLLPRI}}, w.fds...)
	if n, err := unix.Poll(fds, 1); err != nil || n == 0 {
		return
	}
	w.fds = w.fds[:0]
	for _, p := range fds[1:] {
		if p.Revents == 0 {
			w.fds = append(w.fds, p)
			continue
		}
		_ = unix.Close(int(p.Fd))
	}
}

func (w *exitWait) close() {
	for _, p := range w.fds {
		_ = unix.Close(int(p.Fd))
	}
	w.fds = nil
}

func cgroupPopulated(dir string) (bool, error) {
	b, err := readKernfs(filepath.Join(dir, "cgroup.events"))
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

// openKernfs opens a cgroup or proc file as a raw descriptor: through
// os.File, a kernfs file is registered with Go's poller (it polls), eight
// calls a read where three or four do (docs/performance.md, "Trial start").
// Errors are os.ReadFile's, a *os.PathError.
func openKernfs(path string, flags int) (int, error) {
	for {
		fd, err := unix.Open(path, flags|unix.O_CLOEXEC, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, &os.PathError{Op: "open", Path: path, Err: err}
		}
		return fd, nil
	}
}

// readKernfs is os.ReadFile for cgroup and proc files.
func readKernfs(path string) ([]byte, error) {
	fd, err := openKernfs(path, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	b := make([]byte, 0, 512)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := unix.Read(fd, b[len(b):cap(b)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if n == 0 {
			return b, nil
		}
		b = b[:len(b)+n]
	}
}

// writeKernfs writes a cgroup interface file that must be there. Opened
// without O_CREAT, a missing one (its controller disabled) fails ENOENT,
// which setupPools takes for a controller gone; creating one in cgroupfs
// fails EACCES, which it would take for a refusal.
func writeKernfs(path, value string) error {
	fd, err := openKernfs(path, unix.O_WRONLY)
	if err != nil {
		return err
	}
	_, err = unix.Write(fd, []byte(value))
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err != nil {
		return &os.PathError{Op: "write", Path: path, Err: err}
	}
	return nil
}
