//go:build linux

package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// watchdogArg0 marks a re-executed trialnet binary that enforces a
// Trial's deadline (runWatchdog).
const watchdogArg0 = "trialnet-watchdog"

// The watchdog's descriptors, as WatchDeadline hands them over.
const (
	watchCgroup  = 3 // the Trial's cgroup directory
	watchRelease = 4 // a pipe: one byte is release, its end without one is the run's
	watchRun     = 5 // a pidfd of the process that started the watchdog
)

// Watchdog enforces a Trial's deadline from a process of its own.
type Watchdog struct {
	cmd     *exec.Cmd
	release *os.File
}

// WatchDeadline starts a watchdog process that, at deadline, kills every
// process in the Trial whose cgroup is cgroup (cgroup.kill) and then
// continues this process (SIGCONT), so that this process tears the
// Trial down even when it was stopped, without anyone's fg. The deadline
// must not wait on this process: whatever stops or blocks it (a ^Z, a
// SIGSTOP, a terminal nobody reads) would stop the clock. The watchdog
// leads a session of its own, so no job control signal for this process
// or its terminal reaches it, and a Trial, in its own PID namespace and
// Landlock domain, cannot name or signal it. Should this process end
// without Release (killed), the watchdog kills the Trial at once: nothing
// is left to enforce the deadline or tear the Trial down.
func WatchDeadline(cgroup string, deadline time.Time) (_ *Watchdog, err error) {
	dir, err := os.Open(cgroup)
	if err != nil {
		return nil, fmt.Errorf("start the --timeout watchdog: %w", err)
	}
	defer dir.Close()
	self, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return nil, fmt.Errorf("start the --timeout watchdog: pidfd_open: %w", err)
	}
	run := os.NewFile(uintptr(self), "trialnet-pidfd")
	defer run.Close()
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("start the --timeout watchdog: %w", err)
	}
	defer r.Close()
	cmd := &exec.Cmd{
		Path:        "/proc/self/exe",
		Args:        []string{watchdogArg0, strconv.FormatInt(int64(time.Until(deadline)), 10)},
		Stderr:      os.Stderr,
		ExtraFiles:  []*os.File{dir, r, run},
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if err := cmd.Start(); err != nil {
		_ = w.Close()
		return nil, fmt.Errorf("start the --timeout watchdog: %w", err)
	}
	return &Watchdog{cmd: cmd, release: w}, nil
}

// Release ends the watchdog, once the Trial is torn down, and reaps it.
func (w *Watchdog) Release() {
	_, _ = w.release.Write([]byte{0})
	_ = w.release.Close()
	_ = w.cmd.Wait()
}

// runWatchdog is the watchdog process; args is the time left until the
// deadline, in nanoseconds.
func runWatchdog(args []string) int {
	if len(args) != 1 {
		fmt.Fprintln(os.Stderr, "trialnet-watchdog: bad arguments")
		return 2
	}
	left, err := strconv.ParseInt(args[0], 10, 64)
	if err != nil {
		fmt.Fprintf(os.Stderr, "trialnet-watchdog: %v\n", err)
		return 2
	}
	ended, released := awaitRun(time.Now().Add(time.Duration(left)))
	if released {
		return 0
	}
	// The directory stays this one Trial's, even removed: a name could
	// be another's by then.
	if err := killCgroup(fmt.Sprintf("/proc/self/fd/%d", watchCgroup), killWait); err != nil {
		fmt.Fprintf(os.Stderr, "trialnet: --timeout: %v; the teardown will try again\n", err)
	}
	// The Trial is empty, so a run stopped waiting for it goes on to the
	// teardown (terminal.awaitForeground). Continued again and again: a
	// stop the run was about to make when this came would hold it.
	for !ended {
		_ = unix.PidfdSendSignal(watchRun, unix.SIGCONT, nil, 0)
		ended, _ = awaitRun(time.Now().Add(100 * time.Millisecond))
	}
	return 0
}

// awaitRun waits until deadline for the run to release the watchdog or
// to end without doing so (killed), and reports which came.
func awaitRun(deadline time.Time) (ended, released bool) {
	fds := []unix.PollFd{{Fd: watchRelease, Events: unix.POLLIN}}
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return false, false
		}
		// poll takes a C int of milliseconds: long waits go in steps.
		ms := int((min(left, time.Hour) + time.Millisecond - 1) / time.Millisecond)
		n, err := unix.Poll(fds, ms)
		if err == unix.EINTR || (err == nil && n == 0) {
			continue
		}
		if err != nil {
			return true, false
		}
		var b [1]byte
		k, _ := unix.Read(watchRelease, b[:])
		return true, k == 1
	}
}
