//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A Landlock domain of its own for every Trial command. Its point is not
// the filesystem: a task in a Landlock domain cannot ptrace (nor
// pidfd_getfd, nor open /proc/PID/mem of) any task outside the domain,
// and from ABI 6 cannot signal one either. The PID namespace hides other
// processes' pids, but a pidfd needs no pid: SO_PEERPIDFD on a unix socket
// whose peer lives outside (an allowed socket served by a process of the
// Trial's uid) gives one, and with it that process's sockets. Landlock
// closes that way whether or not the BPF LSM layer runs.

// landlockRuleset is struct landlock_ruleset_attr up to the scopes (ABI 6);
// the kernel accepts a shorter struct from a caller that knows less.
type landlockRuleset struct {
	handledFS  uint64
	handledNet uint64
	scoped     uint64
}

// LandlockABI is the Landlock ABI version this kernel offers (0: none).
func LandlockABI() int {
	v, _, errno := unix.RawSyscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if errno != 0 {
		return 0
	}
	return int(v)
}

// ErrNoLandlock means the kernel has no Landlock (or it is not enabled).
var ErrNoLandlock = errors.New("this kernel offers no Landlock (Linux 5.13+, with landlock in the active LSM list)")

// enterLandlock puts the calling thread in a new Landlock domain. Its only
// filesystem rule refuses to make block devices, which a Trial without
// CAP_MKNOD cannot anyway: a domain needs something to handle. no_new_privs
// must already be set.
func enterLandlock() error {
	abi := LandlockABI()
	if abi < 1 {
		return ErrNoLandlock
	}
	attr := landlockRuleset{handledFS: unix.LANDLOCK_ACCESS_FS_MAKE_BLOCK}
	size := unsafe.Offsetof(attr.handledNet) // ABI 1-3 know handled_access_fs only
	if abi >= 4 {
		size = unsafe.Offsetof(attr.scoped)
	}
	if abi >= 6 {
		attr.scoped = unix.LANDLOCK_SCOPE_SIGNAL
		size = unsafe.Sizeof(attr)
	}
	// Raw: it runs after setuid, where the runtime must not need a new
	// thread (trialExec says why).
	fd, _, errno := unix.RawSyscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), size, 0)
	if errno != 0 {
		return fmt.Errorf("landlock ruleset: %w", errno)
	}
	defer unix.RawSyscall(unix.SYS_CLOSE, fd, 0, 0)
	if _, _, errno := unix.RawSyscall(unix.SYS_LANDLOCK_RESTRICT_SELF, fd, 0, 0); errno != 0 {
		return fmt.Errorf("landlock restrict_self: %w", errno)
	}
	return nil
}
