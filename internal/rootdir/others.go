//go:build linux

package rootdir

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrOthersReach is wrapped by OthersOutOfReach's refusals.
var ErrOthersReach = errors.New("in reach of another user of this host")

// OthersOutOfReach is OutOfReach for everyone but root and the caller
// (uid and gid; 0 and 0: root alone): a user of the host who is not the
// Trial's, who owns or may write a directory on the way, may move the
// file root writes there and put their own at its name once it has been
// verified, before a harness reads it. Every directory the kernel
// crosses is checked, as OutOfReach checks them: owned by root or uid,
// on no FUSE, writable by no one else (mode bits, the group only when it
// is one this process holds or gid as uid's own private group, and the access ACL), but for sticky
// ones above the file's own, where each entry on the way must be root's
// or uid's. The file itself is not judged (OutOfReach does), and
// directories missing on the way are root's to make.
func OthersOutOfReach(path string, uid, gid uint32) error {
	abs, err := Unclean(path)
	if err != nil {
		return err
	}
	dir := func(d string, last bool) error { return dirOutOfOthersReach(d, uid, gid, last) }
	return walk(abs, dir, func(next string, st *unix.Stat_t, err error, last bool) (bool, error) {
		switch {
		case last:
			return true, nil // the file, replaced by the rename
		case errors.Is(err, unix.ENOENT):
			return true, nil // made by root, or not at all
		case err != nil:
			return true, fmt.Errorf("%s: %w", next, err)
		case st.Uid != 0 && st.Uid != uid:
			return true, fmt.Errorf("%w: %s is owned by uid %d, who may replace it", ErrOthersReach, next, st.Uid)
		}
		return false, nil
	})
}

// dirOutOfOthersReach refuses dir if someone but root or uid owns it, if
// it is on FUSE, or if someone else may write it and it is the file's own
// directory (last) or not sticky.
func dirOutOfOthersReach(dir string, uid, gid uint32, last bool) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	if st.Uid != 0 && st.Uid != uid {
		return fmt.Errorf("%w: %s is owned by uid %d, who may change its mode and rename what is in it", ErrOthersReach, dir, st.Uid)
	}
	if owner, err := fuseOwner(dir); err != nil {
		return err
	} else if owner != 0 {
		return fmt.Errorf("%w: %s is on a FUSE filesystem mounted by uid %d, whose server says who owns what", ErrOthersReach, dir, owner)
	}
	how, err := othersWrite(dir, &st, uid, gid)
	switch {
	case err != nil:
		return err
	case how == "":
		return nil
	case last:
		return fmt.Errorf("%w: %s may be written by %s, who may move the file there and put another at its name", ErrOthersReach, dir, how)
	case st.Mode&unix.S_ISVTX == 0:
		return fmt.Errorf("%w: %s may be written by %s, who may rename or replace what is in it", ErrOthersReach, dir, how)
	}
	return nil // sticky: the entry below is checked to be root's or uid's
}

// othersWrite says who but root, uid, gid and this process's groups may
// write path (stat st), or "" if no one: by its mode bits, or by its
// access ACL, whose named entries and group entries are under its mask.
func othersWrite(path string, st *unix.Stat_t, uid, gid uint32) (string, error) {
	groups, _ := unix.Getgroups()
	ours := func(g uint32) bool {
		return g == 0 || g == uint32(os.Getegid()) || slices.Contains(groups, int(g)) || (g == gid && privateGroup(uid, gid))
	}
	b, err := accessACL(path)
	switch {
	case err != nil:
		return "", err
	case b == nil:
		switch {
		case st.Mode&0o002 != 0:
			return fmt.Sprintf("anyone (mode %04o)", st.Mode&0o7777), nil
		case st.Mode&0o020 != 0 && !ours(st.Gid):
			return fmt.Sprintf("the members of %s, by its mode %04o", groupName(st.Gid), st.Mode&0o7777), nil
		}
		return "", nil
	}
	if len(b) < 4 || binary.LittleEndian.Uint32(b) != aclVersion || (len(b)-4)%8 != 0 {
		return "", errors.New("an access ACL trialnet cannot read: refused, as it may grant anything")
	}
	mask := uint16(0xffff)
	for e := b[4:]; len(e) >= 8; e = e[8:] {
		if binary.LittleEndian.Uint16(e) == aclMask {
			mask = binary.LittleEndian.Uint16(e[2:])
		}
	}
	for e := b[4:]; len(e) >= 8; e = e[8:] {
		tag, perm, id := binary.LittleEndian.Uint16(e), binary.LittleEndian.Uint16(e[2:]), binary.LittleEndian.Uint32(e[4:])
		switch {
		case tag == aclUser && id != 0 && id != uid && perm&mask&aclWrite != 0:
			return fmt.Sprintf("uid %d (its ACL)", id), nil
		case tag == aclGroupObj && !ours(st.Gid) && perm&mask&aclWrite != 0:
			return fmt.Sprintf("the members of %s, by its ACL", groupName(st.Gid)), nil
		case tag == aclGroup && !ours(id) && perm&mask&aclWrite != 0:
			return fmt.Sprintf("the members of %s, by its ACL", groupName(id)), nil
		case tag == aclOther && perm&aclWrite != 0:
			return "anyone (its ACL)", nil
		}
	}
	return "", nil
}

// privateGroup says whether gid is uid's own group: its primary one, named
// as the user is (a user private group, useradd's default), with no one
// else listed in groupFile as its member. A primary group users share
// (users, staff), or one a colleague was added to, is not: each of its
// members could write where it may.
func privateGroup(uid, gid uint32) bool {
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil || u.Gid != strconv.FormatUint(uint64(gid), 10) {
		return false
	}
	g, err := user.LookupGroupId(u.Gid)
	if err != nil || g.Name != u.Username {
		return false
	}
	b, err := os.ReadFile(groupFile)
	if err != nil {
		return false // its members unknown
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Split(strings.TrimSpace(line), ":")
		if len(f) == 4 && f[2] == u.Gid && f[3] != "" && f[3] != u.Username {
			return false
		}
	}
	return true
}

// groupFile lists groups' members (a test's copy in tests).
var groupFile = "/etc/group"

// groupName is "group NAME (gid N)", or "group N" where gid has no name.
func groupName(gid uint32) string {
	if g, err := user.LookupGroupId(strconv.FormatUint(uint64(gid), 10)); err == nil {
		return fmt.Sprintf("group %s (gid %d)", g.Name, gid)
	}
	return fmt.Sprintf("group %d", gid)
}

// FileOthersOutOfReach is OthersOutOfReach for a file written in place
// (a caller's descriptor on it): the file too must be root's or uid's,
// and writable by no one else.
func FileOthersOutOfReach(path string, uid, gid uint32) error {
	if err := OthersOutOfReach(path, uid, gid); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if st.Uid != 0 && st.Uid != uid {
		return fmt.Errorf("%w: %s is owned by uid %d, who may write it", ErrOthersReach, path, st.Uid)
	}
	how, err := othersWrite(path, &st, uid, gid)
	if err == nil && how != "" {
		err = fmt.Errorf("%w: %s may be written by %s", ErrOthersReach, path, how)
	}
	return err
}
