//go:build linux

package sandbox

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/netns"
)

// ErrChroot is why Trials cannot run from a root directory that is not
// its mount namespace's root.
var ErrChroot = errors.New("cannot run Trials from a chroot: this process's root directory is not its mount namespace's root. " +
	"A Trial's commands join the Trial's mount namespace, which starts them at that namespace's root, outside this chroot, " +
	"where the Trial's own /proc and /dev/pts are not mounted: they would see the host's files and /proc. " +
	"Run trialnet outside the chroot, or in a container whose root is its mount namespace's root (docker, podman and systemd-nspawn pivot_root into theirs)")

// CheckRoot returns ErrChroot where this process's root directory is not
// its mount namespace's root: the Trial's setup would mount its /proc,
// devpts and masks under this root, and its commands would start at the
// other, the host's files in view. It asks the kernel before the
// runtime starts where it can (earlyRoot), else on a thread of its own.
func CheckRoot() error {
	if same, ok := earlyRoot(); ok {
		if !same {
			return ErrChroot
		}
		return nil
	}
	same, err := netns.RootIsNamespaceRoot()
	if errors.Is(err, unix.EPERM) {
		return fmt.Errorf("cannot tell whether this process's root directory is its mount namespace's root (a chroot, where Trials cannot run): %w: joining its own mount namespace needs CAP_SYS_CHROOT besides CAP_SYS_ADMIN; give the agent both (deploy/trialnet.service does)", err)
	}
	if err != nil {
		return fmt.Errorf("cannot tell whether this process's root directory is its mount namespace's root (a chroot, where Trials cannot run): %w", err)
	}
	if !same {
		return ErrChroot
	}
	return nil
}
