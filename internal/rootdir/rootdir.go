//go:build linux

// Package rootdir makes and checks the directories where trialnet keeps
// files it trusts (lock files with records in them): only root may have
// put anything there.
package rootdir

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Run is trialnet's runtime directory: /run is cleared at boot, as bpffs
// and the Trials' cgroups are.
const Run = "/run/trialnet"

// Locks holds trialnet's lock files: the install locks (bpf) and the
// launch locks (sandbox).
const Locks = Run + "/locks"

// Private creates dir (mode 0700) if it is missing and checks that it is
// a directory, not a symlink, owned by root, with no access for anyone
// else. A directory that fails the check was made by someone else and is
// refused: a file in it could have been planted.
func Private(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("check %s: %w", dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Uid != 0 || st.Mode&0o077 != 0 {
		return fmt.Errorf("%s must be a directory of root's with mode 0700 (it is uid %d, mode %o): remove it, and trialnet makes it again", dir, st.Uid, st.Mode&0o7777)
	}
	return nil
}

// OpenLock opens (creating it if missing) the lock file name in the
// private directory dir, never through a symlink.
func OpenLock(dir, name string) (*os.File, error) {
	if err := Private(dir); err != nil {
		return nil, err
	}
	return os.OpenFile(dir+"/"+name, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
}

// WriteFileAtomic writes data to path by way of a new temporary file in
// the same directory, renamed over path: a reader sees the old file or
// the new one, and a symlink or file planted at path is replaced, never
// followed or written through. Once it returns nil, the new file is on
// disk under its name: its data is synced before the rename, and the
// directory, which holds the name, after it.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir, err := os.OpenFile(filepath.Dir(path), os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer dir.Close()
	_, err = WriteAt(dir, filepath.Base(path), data, perm)
	return err
}

// ReplaceFile is WriteFileAtomic without the syncs, for a file that need
// not outlive a crash of the machine: a reader, and a process killed
// mid-write, see the old file or the new one whole; after a crash the
// name may hold the old file, the new one, none, or an empty file.
func ReplaceFile(path string, data []byte, perm os.FileMode) error {
	dir, err := os.OpenFile(filepath.Dir(path), os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer dir.Close()
	_, err = writeAt(dir, filepath.Base(path), data, perm, false)
	return err
}

// WriteAt is WriteFileAtomic relative to an open directory: a directory
// on the way swapped for a symlink since it was opened redirects nothing.
// It returns the identity of the file it wrote, for a caller that checks
// later that the name still leads there.
func WriteAt(dir *os.File, name string, data []byte, perm os.FileMode) (FileID, error) {
	return writeAt(dir, name, data, perm, true)
}

// makeTemp makes a new file beside name in dfd, to be renamed to it.
func makeTemp(dfd int, name string) (int, string, error) {
	tmp := "." + name + ".tmp-" + rand.Text()[:8]
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	return fd, tmp, err
}

// CanWriteAt makes and removes the file WriteAt would first make for
// name in dir: whether it could, told now rather than when the write
// comes (a read-only filesystem, one such as /proc that makes no files,
// a directory root may not write).
func CanWriteAt(dir *os.File, name string) error {
	dfd := int(dir.Fd())
	fd, tmp, err := makeTemp(dfd, name)
	if err != nil {
		return err
	}
	_ = unix.Close(fd)
	if err := unix.Unlinkat(dfd, tmp, 0); err != nil {
		// An append-only directory takes a name and gives none up: the
		// write's rename would fail the same way.
		return fmt.Errorf("made %s there, and could not remove it (%w): remove it once the directory lets you", tmp, err)
	}
	return nil
}

// writeAt is WriteAt, syncing the file and the directory if durable.
func writeAt(dir *os.File, name string, data []byte, perm os.FileMode, durable bool) (FileID, error) {
	dfd := int(dir.Fd())
	fd, tmp, err := makeTemp(dfd, name)
	if err != nil {
		return FileID{}, err
	}
	f := os.NewFile(uintptr(fd), tmp)
	id, err := idOfFd(fd)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil && durable {
		err = fsync(f)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dfd, tmp, dfd, name)
	}
	if err != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return id, err
	}
	if !durable {
		return id, nil
	}
	// The rename changed only the directory: until it is synced, a crash
	// may leave the old file, or none, under the name.
	if err := fsync(dir); err != nil {
		return id, fmt.Errorf("sync the directory of %s, which now names the new file: %w (it may not survive a crash; write it again)", name, err)
	}
	return id, nil
}

// SyncDir syncs directory path: the names made, renamed or removed in it
// are on disk once it returns nil.
func SyncDir(path string) error {
	dir, err := os.OpenFile(path, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer dir.Close()
	return fsync(dir)
}

// fsync is File.Sync: a test reads through it the order in which files
// and directories are synced.
var fsync = (*os.File).Sync

// ErrNotRegular is OpenRegular's refusal of what is not a regular file.
var ErrNotRegular = errors.New("not a regular file")

// OpenRegular opens path for reading, and only if it is a regular file:
// paths a command is given (verify's receipt, log and key, audit --from)
// may name a FIFO, which would hang it, or a device such as /dev/zero,
// which would never end. What it names is looked at through an O_PATH
// descriptor, which opens nothing, and the file reopened through that
// descriptor only once it is known to be regular: opening a device as
// root is itself an act (a watchdog armed, a terminal made the caller's).
func OpenRegular(path string) (*os.File, error) {
	p, err := os.OpenFile(path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	fi, err := p.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is %w (%v)", path, ErrNotRegular, fi.Mode().Type())
	}
	sc, err := p.SyscallConn()
	if err != nil {
		return nil, err
	}
	var f *os.File
	cerr := sc.Control(func(fd uintptr) {
		f, err = os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", fd), os.O_RDONLY|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	})
	if err = errors.Join(cerr, err); err != nil {
		return nil, fmt.Errorf("reopen %s, a regular file: %w", path, err)
	}
	return f, nil
}
