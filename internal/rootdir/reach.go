//go:build linux

package rootdir

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrInReach is wrapped by OutOfReach's refusals.
var ErrInReach = errors.New("in reach of the Trial")

// maxLinks bounds the symlinks followed on one path, as the kernel's
// MAXSYMLINKS does.
const maxLinks = 40

// OutOfReach checks that a process of uid and gid, with no supplementary
// groups and no capabilities (a Trial's), cannot change what path names,
// a file root is to replace by a rename: it owns no directory on the
// way; it can write none of them, but for sticky ones above the file's
// own, where it can move only its own entries and none on the way is
// its own; none is on FUSE, whose server says what owns what; and the
// file, if it is there, is a regular file or a symlink (which the rename
// replaces), never a device or a directory. Every directory the kernel
// crosses to resolve path is checked, those a symlink leads through
// included, as a reader of path will cross them. Directories missing on
// the way are root's to make, below the last that is checked. Refusals
// wrap ErrInReach, naming the directory and why.
func OutOfReach(path string, uid, gid uint32) error { return reach(path, uid, gid, false) }

// reach is OutOfReach; inPlace: the file is written in place, so it must
// be there, a regular file or a FIFO.
func reach(path string, uid, gid uint32, inPlace bool) error {
	abs, err := Unclean(path)
	if err != nil {
		return err
	}
	dir := func(d string, last bool) error { return dirOutOfReach(d, uid, gid, last) }
	return walk(abs, dir, func(next string, st *unix.Stat_t, err error, last bool) (bool, error) {
		if err != nil {
			if errors.Is(err, unix.ENOENT) && !inPlace {
				return true, nil // made by root, or not at all
			}
			return true, fmt.Errorf("%s: %w", next, err)
		}
		if st.Uid == uid && !last {
			// Its own entry, in a directory checked above: only a sticky
			// one lets it get here, and there it may move this one. (The
			// file itself is replaced, whoever owns it.)
			return true, fmt.Errorf("%w: %s is owned by uid %d, the Trial's, which may replace it", ErrInReach, next, uid)
		}
		kind := st.Mode & unix.S_IFMT
		switch {
		case last && inPlace && kind != unix.S_IFREG && kind != unix.S_IFIFO:
			return true, fmt.Errorf("%s is not a regular file or FIFO (mode %o)", next, st.Mode)
		case last && !inPlace && kind != unix.S_IFREG && kind != unix.S_IFLNK:
			return true, fmt.Errorf("%s is not a regular file (mode %o): trialnet writes a report only where it may replace a file", next, st.Mode)
		}
		// The file itself (or a symlink there) is replaced by the rename,
		// never written through.
		return last, nil
	})
}

// walk resolves abs (absolute, not cleaned) name by name as the kernel
// does, ".." and symlinks (at most maxLinks) included. It calls dir with
// each directory it crosses (last: the one the final name is in), then
// name with each name looked up there, its lstat and the lstat's error
// (last: the final name); name says whether the walk ends there. Any
// other name that is no symlink must be a directory.
func walk(abs string, dir func(d string, last bool) error, name func(next string, st *unix.Stat_t, err error, last bool) (bool, error)) error {
	rest := strings.Split(abs, "/")
	d, links := "/", 0
	for len(rest) > 0 {
		n := rest[0]
		rest = rest[1:]
		if n == "" || n == "." {
			continue
		}
		if err := dir(d, len(rest) == 0); err != nil {
			return err
		}
		if n == ".." {
			d = filepath.Dir(d)
			continue
		}
		next := filepath.Join(d, n)
		var st unix.Stat_t
		lerr := unix.Lstat(next, &st)
		if done, err := name(next, &st, lerr, len(rest) == 0); done || err != nil {
			return err
		}
		if lerr != nil {
			return fmt.Errorf("%s: %w", next, lerr)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			if links++; links > maxLinks {
				return fmt.Errorf("%s: %w", abs, unix.ELOOP)
			}
			target, err := os.Readlink(next)
			if err != nil {
				return err
			}
			if filepath.IsAbs(target) {
				d = "/"
			}
			rest = append(strings.Split(target, "/"), rest...)
		case unix.S_IFDIR:
			d = next
		default:
			return fmt.Errorf("%s: %w", next, unix.ENOTDIR)
		}
	}
	return nil
}

// FileOutOfReach is OutOfReach for a file that is written in place (a
// caller's descriptor on it), not replaced: the file itself must not be
// uid's, nor writable by uid or gid.
func FileOutOfReach(path string, uid, gid uint32) error {
	if err := reach(path, uid, gid, true); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if st.Uid == uid {
		return fmt.Errorf("%w: %s is owned by uid %d, the Trial's", ErrInReach, path, uid)
	}
	how, err := writableBy(path, &st, uid, gid)
	if err != nil {
		return err
	}
	if how != "" {
		return fmt.Errorf("%w: the Trial (uid %d, gid %d) may write %s (%s)", ErrInReach, uid, gid, path, how)
	}
	return nil
}

// Unclean makes path absolute as the kernel will resolve it: joined to
// the working directory, but not cleaned (a "link/.." is not "").
func Unclean(path string) (string, error) {
	if filepath.IsAbs(path) {
		return path, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	return wd + "/" + path, nil
}

// fuseMagic is FUSE's statfs f_type (linux/magic.h), virtiofs's too.
const fuseMagic = 0x65735546

// fuseOwner is the uid that mounted the FUSE filesystem dir is on, as
// its user_id= option says, 0 for root's, and 0 for a filesystem that is
// not FUSE or is virtiofs (served by the host's virtiofsd, as a VM's root
// may be). A FUSE mount whose owner cannot be read counts as no one's,
// and so not root's (-1).
func fuseOwner(dir string) (int, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return 0, fmt.Errorf("%s: %w", dir, err)
	}
	if fs.Type != fuseMagic {
		return 0, nil
	}
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, dir, 0, unix.STATX_MNT_ID, &st); err != nil || st.Mask&unix.STATX_MNT_ID == 0 {
		return -1, nil
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return -1, nil
	}
	return mountOwner(b, strconv.FormatUint(st.Mnt_id, 10)), nil
}

// mountOwner reads mountinfo for the FUSE mount id: its user_id= (0 for
// virtiofs), -1 where it cannot tell.
func mountOwner(mountinfo []byte, id string) int {
	for line := range strings.Lines(string(mountinfo)) {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != id {
			continue
		}
		i := slices.Index(f, "-")
		if i < 0 || i+3 >= len(f) {
			return -1
		}
		if f[i+1] == "virtiofs" {
			return 0
		}
		for _, o := range strings.Split(f[i+3], ",") {
			if v, ok := strings.CutPrefix(o, "user_id="); ok {
				if uid, err := strconv.Atoi(v); err == nil {
					return uid
				}
			}
		}
		return -1
	}
	return -1
}

// dirOutOfReach refuses dir if uid owns it (and so may chmod it), if it
// is on FUSE, or if uid and gid may write it and it is the file's own
// directory (last) or not sticky.
func dirOutOfReach(dir string, uid, gid uint32, last bool) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	if st.Uid == uid {
		return fmt.Errorf("%w: %s is owned by uid %d, the Trial's, which may change its mode and rename what is in it", ErrInReach, dir, uid)
	}
	if owner, err := fuseOwner(dir); err != nil {
		return err
	} else if owner != 0 {
		return fmt.Errorf("%w: %s is on a FUSE filesystem mounted by uid %d, whose server (perhaps the Trial's user) says who owns what", ErrInReach, dir, owner)
	}
	how, err := writableBy(dir, &st, uid, gid)
	if err != nil {
		return err
	}
	switch {
	case how == "":
		return nil
	case last:
		return fmt.Errorf("%w: the Trial (uid %d, gid %d) may write %s (%s), and so put its own file at the report's name before trialnet does", ErrInReach, uid, gid, dir, how)
	case st.Mode&unix.S_ISVTX == 0:
		return fmt.Errorf("%w: the Trial (uid %d, gid %d) may write %s (%s), and so rename or replace what is in it", ErrInReach, uid, gid, dir, how)
	}
	return nil // sticky: the entry below is checked not to be the Trial's
}

// POSIX ACL xattr layout (linux/posix_acl_xattr.h).
const (
	aclVersion  = 2
	aclUser     = 0x02
	aclGroupObj = 0x04
	aclGroup    = 0x08
	aclMask     = 0x10
	aclOther    = 0x20
	aclWrite    = 0x02
)

// writableBy says how uid and gid (no other groups) may write path,
// whose stat is st, or "" if they may not: by its mode
// bits, or by its access ACL, evaluated as the kernel does (a named user
// entry decides alone; the group class grants if any matching group
// entry does, masked; only then the other entry).
func writableBy(path string, st *unix.Stat_t, uid, gid uint32) (string, error) {
	acl, err := accessACL(path)
	switch {
	case err != nil:
		return "", err
	case acl == nil:
		return modeWritable(st.Mode, st.Gid == gid), nil
	}
	return aclWritable(acl, st.Gid == gid, uid, gid)
}

// accessACL is path's access ACL as the kernel stores it, nil if it has
// none (or its file system keeps none).
func accessACL(path string) ([]byte, error) {
	buf := make([]byte, 4+8*64)
	n, err := unix.Getxattr(path, "system.posix_acl_access", buf)
	if errors.Is(err, unix.ERANGE) {
		if n, err = unix.Getxattr(path, "system.posix_acl_access", nil); err == nil {
			buf = make([]byte, n)
			n, err = unix.Getxattr(path, "system.posix_acl_access", buf)
		}
	}
	switch {
	case errors.Is(err, unix.ENODATA), errors.Is(err, unix.EOPNOTSUPP):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("read the ACL of %s: %w", path, err)
	}
	return buf[:n], nil
}

func modeWritable(mode uint32, inGroup bool) string {
	switch {
	case inGroup && mode&0o020 != 0:
		return fmt.Sprintf("its group's, mode %04o", mode&0o7777)
	case !inGroup && mode&0o002 != 0:
		return fmt.Sprintf("world-writable, mode %04o", mode&0o7777)
	}
	return ""
}

func aclWritable(b []byte, ownerGroup bool, uid, gid uint32) (string, error) {
	if len(b) < 4 || binary.LittleEndian.Uint32(b) != aclVersion || (len(b)-4)%8 != 0 {
		return "", errors.New("an access ACL trialnet cannot read: refused, as it may grant anything")
	}
	mask := uint16(0xffff)
	var user, group, other *uint16
	groupMatched := false
	for e := b[4:]; len(e) >= 8; e = e[8:] {
		tag, perm, id := binary.LittleEndian.Uint16(e), binary.LittleEndian.Uint16(e[2:]), binary.LittleEndian.Uint32(e[4:])
		switch {
		case tag == aclMask:
			mask = perm
		case tag == aclUser && id == uid:
			user = &perm
		case tag == aclGroupObj && ownerGroup, tag == aclGroup && id == gid:
			groupMatched = true
			if perm&aclWrite != 0 {
				group = &perm
			}
		case tag == aclOther:
			other = &perm
		}
	}
	switch {
	case user != nil:
		if *user&mask&aclWrite != 0 {
			return fmt.Sprintf("its ACL names uid %d with write", uid), nil
		}
	case groupMatched:
		if group != nil && *group&mask&aclWrite != 0 {
			return fmt.Sprintf("its ACL gives gid %d write", gid), nil
		}
	case other != nil && *other&aclWrite != 0:
		return "its ACL gives others write", nil
	}
	return "", nil
}

// FileID is a file's identity: the device and inode it is.
type FileID struct{ Dev, Ino uint64 }

// IDOf is the identity of the file path names, symlinks followed, as a
// reader opening path reaches it.
func IDOf(path string) (FileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return FileID{}, err
	}
	return FileID{st.Dev, st.Ino}, nil
}

// idOfFd is the identity of the file open on fd.
func idOfFd(fd int) (FileID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return FileID{}, err
	}
	return FileID{st.Dev, st.Ino}, nil
}
