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

// enterLandlock puts the calling thread in a new Landlock domain. It
// refuses to make block devices (a Trial without CAP_MKNOD cannot anyway:
// a domain needs something to handle) and, with confineSockets, to make a
// unix socket or a FIFO anywhere but beneath the Trial's own directories
// (ownDirs), which no host process sees: a host client that looks for a
// server at a path the Trial may write finds nothing there. no_new_privs
// must already be set.
//
// nested keeps the scopes only: a domain that handles any filesystem
// access refuses mount, which a sandbox inside a nested Trial needs. Below
// ABI 6 (no signal scope) that leaves nothing to ask for: no domain, and
// the LSM layer (which nesting needs) keeps ptrace inside the Trial.
func enterLandlock(confineSockets, nested bool) error {
	abi := LandlockABI()
	if abi < 1 {
		return ErrNoLandlock
	}
	if nested && abi < 6 {
		return nil
	}
	attr := landlockRuleset{handledFS: unix.LANDLOCK_ACCESS_FS_MAKE_BLOCK}
	if nested {
		attr.handledFS, confineSockets = 0, false
	}
	const sockets = unix.LANDLOCK_ACCESS_FS_MAKE_SOCK | unix.LANDLOCK_ACCESS_FS_MAKE_FIFO
	if confineSockets {
		attr.handledFS |= sockets
	}
	size := unsafe.Offsetof(attr.handledNet) // ABI 1-3 know handled_access_fs only
	if abi >= 4 {
		size = unsafe.Offsetof(attr.scoped)
	}
	if abi >= 6 {
		attr.scoped = unix.LANDLOCK_SCOPE_SIGNAL
		size = unsafe.Sizeof(attr)
	}
	// Raw: it runs after setuid, where the runtime must not need a new
	// thread (becomeCommand says why).
	fd, _, errno := unix.RawSyscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), size, 0)
	if errno != 0 {
		return fmt.Errorf("landlock ruleset: %w", errno)
	}
	defer unix.RawSyscall(unix.SYS_CLOSE, fd, 0, 0)
	if confineSockets {
		for _, d := range ownDirs {
			if err := allowBeneath(fd, d.dir, sockets); err != nil {
				return err
			}
		}
	}
	if _, _, errno := unix.RawSyscall(unix.SYS_LANDLOCK_RESTRICT_SELF, fd, 0, 0); errno != 0 {
		return fmt.Errorf("landlock restrict_self: %w", errno)
	}
	return nil
}

// allowBeneath adds to ruleset fd a rule allowing access beneath dir.
func allowBeneath(fd uintptr, dir string, access uint64) error {
	p, err := unix.BytePtrFromString(dir)
	if err != nil {
		return err
	}
	cwd := unix.AT_FDCWD
	d, _, errno := unix.RawSyscall6(unix.SYS_OPENAT, uintptr(cwd), uintptr(unsafe.Pointer(p)),
		uintptr(unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC), 0, 0, 0)
	if errno == unix.ENOENT {
		return nil // the host has no such directory, so the Trial has none
	}
	if errno != 0 {
		return fmt.Errorf("landlock: open %s: %w", dir, errno)
	}
	defer unix.RawSyscall(unix.SYS_CLOSE, d, 0, 0)
	rule := unix.LandlockPathBeneathAttr{Allowed_access: access, Parent_fd: int32(d)}
	if _, _, errno := unix.RawSyscall6(unix.SYS_LANDLOCK_ADD_RULE, fd, unix.LANDLOCK_RULE_PATH_BENEATH,
		uintptr(unsafe.Pointer(&rule)), 0, 0, 0); errno != 0 {
		return fmt.Errorf("landlock: allow sockets beneath %s: %w", dir, errno)
	}
	return nil
}
