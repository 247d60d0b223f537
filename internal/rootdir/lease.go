//go:build linux

package rootdir

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// OpenOnlyHere refuses a file that another open of it holds (another
// descriptor, or a mapping made from one), which could write to it
// later: the kernel grants a write lease only to the one open of a file.
func OpenOnlyHere(f *os.File) error {
	if _, err := unix.FcntlInt(f.Fd(), unix.F_SETLEASE, unix.F_WRLCK); err != nil {
		return fmt.Errorf("it is open elsewhere, or cannot be leased to tell (%w)", err)
	}
	_, err := unix.FcntlInt(f.Fd(), unix.F_SETLEASE, unix.F_UNLCK)
	return err
}
