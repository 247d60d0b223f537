//go:build linux

package rootdir

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// OpenOnlyHere refuses a file that another open of it holds (another
// descriptor, or a mapping made from one), which could write to it
// later: the kernel grants a write lease only to the one open of a file.
func OpenOnlyHere(f *os.File) error {
	_, err := unix.FcntlInt(f.Fd(), unix.F_SETLEASE, unix.F_WRLCK)
	switch {
	case errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EBUSY):
		return fmt.Errorf("it is open elsewhere (%w)", err)
	case err != nil:
		// Not a sign of tampering: leases are off (fs.leases-enable=0)
		// or the file system has none, so no prepared file can be shown
		// unshared, and each is made afresh.
		return fmt.Errorf("the kernel cannot lease it to tell whether it is open elsewhere (%w): with fs.leases-enable=0 or a "+
			"file system without leases no prepared file is used; set fs.leases-enable=1, or prepared: 0 to stop preparing them", err)
	}
	_, err = unix.FcntlInt(f.Fd(), unix.F_SETLEASE, unix.F_UNLCK)
	return err
}
