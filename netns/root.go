//go:build linux

package netns

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// RootIsNamespaceRoot reports whether this process's root directory is
// its mount namespace's root. A process that joins a mount namespace
// (setns, as a Trial's commands join their Trial's) starts at that
// namespace's root, whatever root it had: under chroot(2) the two differ.
// It asks the kernel the same way, on a thread that joins this process's
// own mount namespace and is then discarded.
func RootIsNamespaceRoot() (bool, error) {
	var same bool
	errc := make(chan error, 1)
	go offMain(func() error {
		own, err := rootOf()
		if err != nil {
			return err
		}
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			return fmt.Errorf("unshare fs state: %w", err)
		}
		pidfd, err := unix.PidfdOpen(os.Getpid(), 0) // no /proc needed: a chroot may have none
		if err != nil {
			return fmt.Errorf("pidfd_open: %w", err)
		}
		defer unix.Close(pidfd)
		if err := unix.Setns(pidfd, unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("join this process's own mount namespace: %w", err)
		}
		ns, err := rootOf()
		same = own == ns
		return err
	}, errc)
	err := <-errc
	return same, err
}

// mountedFile is a file by its mount, device and inode: two roots of
// filesystems of one kind share an inode number (2 on ext4), and a mount
// id alone is one mount of possibly several of the same filesystem.
type mountedFile struct{ mnt, devMajor, devMinor, ino uint64 }

// rootOf is the calling thread's root directory.
func rootOf() (mountedFile, error) {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, "/", 0, unix.STATX_INO|unix.STATX_MNT_ID, &st); err != nil {
		return mountedFile{}, fmt.Errorf("statx /: %w", err)
	}
	if st.Mask&unix.STATX_MNT_ID == 0 {
		return mountedFile{}, errors.New("statx /: the kernel gives no mount id (before Linux 5.8)")
	}
	return mountedFile{st.Mnt_id, uint64(st.Dev_major), uint64(st.Dev_minor), st.Ino}, nil
}
