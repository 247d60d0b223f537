//go:build linux

package rootdir

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/internal/privtest"
)

const trialUID, trialGID = 65534, 65534

// acl encodes a POSIX access ACL xattr: entries of tag, perm, id.
func acl(entries ...[3]uint32) []byte {
	b := binary.LittleEndian.AppendUint32(nil, aclVersion)
	for _, e := range entries {
		b = binary.LittleEndian.AppendUint16(b, uint16(e[0]))
		b = binary.LittleEndian.AppendUint16(b, uint16(e[1]))
		b = binary.LittleEndian.AppendUint32(b, e[2])
	}
	return b
}

const aclUserObj = 0x01

// A path is out of a Trial's reach only if the Trial's uid owns no
// directory the path crosses and can write none that is not sticky, by
// mode or ACL; symlinks on the way are followed and their directories
// checked. Every case a Trial could use to swap the report is refused.
func TestPrivilegedOutOfReach(t *testing.T) {
	privtest.Require(t)
	for _, c := range []struct {
		name string
		// setup makes base/a/b (root's, 0755) and changes it; the path
		// checked is base/a/b/report.json unless it returns another.
		setup func(t *testing.T, base string) string
		why   string // "" for out of reach
	}{
		{"root's all the way", nil, ""},
		{"the report's directory owned by the Trial", chown("a/b"), "is owned by uid 65534"},
		{"an ancestor owned by the Trial", chown("a"), "is owned by uid 65534"},
		{"the report's directory world-writable", chmod("a/b", 0o777), "world-writable"},
		{"an ancestor world-writable", chmod("a", 0o777), "world-writable"},
		{"an ancestor writable by the Trial's group", chgrp("a", 0o775, trialGID), "its group's"},
		{"writable by another group", chgrp("a", 0o775, 4242), ""},
		{"sticky and world-writable, entries root's", chmod("a", 0o1777), ""},
		{"the report's directory sticky", chmod("a/b", 0o1777), "put its own file at the report's name"},
		{"the Trial's symlink in a sticky directory", func(t *testing.T, base string) string {
			if err := unix.Chmod(filepath.Join(base, "a"), 0o1777); err != nil {
				t.Fatal(err)
			}
			link := filepath.Join(base, "a", "out")
			symlink(t, "b", link)
			if err := os.Lchown(link, trialUID, trialGID); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(link, "report.json")
		}, "is owned by uid 65534, the Trial's, which may replace it"},
		{"the Trial's directory in a sticky directory", func(t *testing.T, base string) string {
			if err := unix.Chmod(filepath.Join(base, "a"), 0o1777); err != nil {
				t.Fatal(err)
			}
			return ""
		}, ""},
		{"a device at the report's name", func(t *testing.T, base string) string {
			p := filepath.Join(base, "a", "b", "null")
			if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
				t.Fatal(err)
			}
			return p
		}, "not a regular file"},
		{"a FIFO at the report's name", func(t *testing.T, base string) string {
			p := filepath.Join(base, "a", "b", "fifo")
			if err := unix.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
			return p
		}, "not a regular file"},
		{"a directory at the report's name", func(t *testing.T, base string) string {
			return filepath.Join(base, "a", "b")
		}, "not a regular file"},
		{"missing directories below a checked one", func(t *testing.T, base string) string {
			return filepath.Join(base, "a", "b", "c", "d", "report.json")
		}, ""},
		{"missing directories below the Trial's", func(t *testing.T, base string) string {
			if err := os.Chown(filepath.Join(base, "a", "b"), trialUID, trialGID); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(base, "a", "b", "c", "report.json")
		}, "is owned by uid 65534"},
		{"an ACL naming the Trial's uid", setACL("a", acl([3]uint32{aclUserObj, 7, 0}, [3]uint32{aclUser, 7, trialUID}, [3]uint32{aclGroupObj, 5, 0}, [3]uint32{aclMask, 7, 0}, [3]uint32{aclOther, 5, 0})), "ACL names uid 65534"},
		{"an ACL naming the Trial's uid, masked", setACL("a", acl([3]uint32{aclUserObj, 7, 0}, [3]uint32{aclUser, 7, trialUID}, [3]uint32{aclGroupObj, 5, 0}, [3]uint32{aclMask, 5, 0}, [3]uint32{aclOther, 5, 0})), ""},
		{"an ACL naming the Trial's gid", setACL("a/b", acl([3]uint32{aclUserObj, 7, 0}, [3]uint32{aclGroupObj, 5, 0}, [3]uint32{aclGroup, 7, trialGID}, [3]uint32{aclMask, 7, 0}, [3]uint32{aclOther, 5, 0})), "ACL gives gid 65534 write"},
		{"a named user entry without write decides alone", setACL("a", acl([3]uint32{aclUserObj, 7, 0}, [3]uint32{aclUser, 5, trialUID}, [3]uint32{aclGroupObj, 5, 0}, [3]uint32{aclMask, 7, 0}, [3]uint32{aclOther, 7, 0})), ""},
		{"a symlink in a directory the Trial writes", func(t *testing.T, base string) string {
			mkdir(t, filepath.Join(base, "open"), 0o777)
			symlink(t, filepath.Join(base, "a", "b"), filepath.Join(base, "open", "link"))
			return filepath.Join(base, "open", "link", "report.json")
		}, "world-writable"},
		{"a safe symlink to a directory the Trial writes", func(t *testing.T, base string) string {
			mkdir(t, filepath.Join(base, "open"), 0o777)
			symlink(t, filepath.Join(base, "open"), filepath.Join(base, "a", "link"))
			return filepath.Join(base, "a", "link", "report.json")
		}, "world-writable"},
		{"a relative symlink up and over", func(t *testing.T, base string) string {
			mkdir(t, filepath.Join(base, "open"), 0o777)
			symlink(t, "../../open", filepath.Join(base, "a", "b", "up"))
			return filepath.Join(base, "a", "b", "up", "report.json")
		}, "world-writable"},
		{"a safe symlink", func(t *testing.T, base string) string {
			symlink(t, "b", filepath.Join(base, "a", "link"))
			return filepath.Join(base, "a", "link", "report.json")
		}, ""},
		{"a dot-dot through a directory the Trial writes", func(t *testing.T, base string) string {
			mkdir(t, filepath.Join(base, "open"), 0o777)
			return filepath.Join(base, "open") + "/../a/b/report.json"
		}, "world-writable"},
		{"the report itself a symlink into the Trial's reach (replaced by a rename)", func(t *testing.T, base string) string {
			mkdir(t, filepath.Join(base, "open"), 0o777)
			p := filepath.Join(base, "a", "b", "report.json")
			symlink(t, filepath.Join(base, "open", "x"), p)
			return p
		}, ""},
		{"the report itself the Trial's (replaced by a rename)", func(t *testing.T, base string) string {
			p := filepath.Join(base, "a", "b", "report.json")
			if err := os.WriteFile(p, nil, 0o666); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(p, trialUID, trialGID); err != nil {
				t.Fatal(err)
			}
			return p
		}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := t.TempDir()
			mkdir(t, filepath.Join(base, "a"), 0o755)
			mkdir(t, filepath.Join(base, "a", "b"), 0o755)
			path := filepath.Join(base, "a", "b", "report.json")
			if c.setup != nil {
				if p := c.setup(t, base); p != "" {
					path = p
				}
			}
			err := OutOfReach(path, trialUID, trialGID)
			switch {
			case c.why == "" && err != nil:
				t.Fatalf("%s: %v, want out of reach", path, err)
			case c.why != "" && (err == nil || !strings.Contains(err.Error(), c.why)),
				strings.Contains(c.why, "uid 65534") && !errors.Is(err, ErrInReach):
				t.Fatalf("%s: %v, want refused: %s", path, err, c.why)
			}
		})
	}
}

// A file written in place (a descriptor's) must be neither the Trial's
// nor writable by it, besides the directories on its way.
func TestPrivilegedFileOutOfReach(t *testing.T) {
	privtest.Require(t)
	dir := t.TempDir()
	for _, c := range []struct {
		name       string
		mode       os.FileMode
		uid, gid   int
		why        string
		underOpen  bool
		isDirNamed bool
	}{
		{"root's, 0644", 0o644, 0, 0, "", false, false},
		{"the Trial's", 0o600, trialUID, trialGID, "is owned by uid 65534", false, false},
		{"world-writable", 0o666, 0, 0, "world-writable", false, false},
		{"its group's", 0o664, 0, trialGID, "its group's", false, false},
		{"root's, in a directory the Trial writes", 0o644, 0, 0, "world-writable", true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := dir
			if c.underOpen {
				d = filepath.Join(dir, "open")
				mkdir(t, d, 0o777)
			}
			p := filepath.Join(d, strings.ReplaceAll(c.name, " ", "_"))
			if err := os.WriteFile(p, nil, c.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, c.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(p, c.uid, c.gid); err != nil {
				t.Fatal(err)
			}
			err := FileOutOfReach(p, trialUID, trialGID)
			switch {
			case c.why == "" && err != nil:
				t.Fatalf("%v, want out of reach", err)
			case c.why != "" && (!errors.Is(err, ErrInReach) || !strings.Contains(err.Error(), c.why)):
				t.Fatalf("%v, want refused: %s", err, c.why)
			}
		})
	}
}

// An ACL it cannot read is refused, not taken for none.
func TestACLUnreadable(t *testing.T) {
	for _, b := range [][]byte{nil, {1, 0, 0, 0}, append(acl([3]uint32{aclOther, 0, 0}), 1)} {
		if _, err := aclWritable(b, false, trialUID, trialGID); err == nil {
			t.Errorf("ACL %x: no error", b)
		}
	}
}

func mkdir(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	if err := os.Mkdir(p, mode); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(p, uint32(mode)); err != nil { // raw bits: os.Chmod drops 0o1000
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, p string) {
	t.Helper()
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

func chown(rel string) func(*testing.T, string) string {
	return func(t *testing.T, base string) string {
		if err := os.Chown(filepath.Join(base, rel), trialUID, trialGID); err != nil {
			t.Fatal(err)
		}
		return ""
	}
}

func chmod(rel string, mode os.FileMode) func(*testing.T, string) string {
	return chgrp(rel, mode, 0)
}

func chgrp(rel string, mode os.FileMode, gid int) func(*testing.T, string) string {
	return func(t *testing.T, base string) string {
		p := filepath.Join(base, rel)
		if err := unix.Chmod(p, uint32(mode)); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, 0, gid); err != nil {
			t.Fatal(err)
		}
		return ""
	}
}

func setACL(rel string, b []byte) func(*testing.T, string) string {
	return func(t *testing.T, base string) string {
		if err := unix.Setxattr(filepath.Join(base, rel), "system.posix_acl_access", b, 0); err != nil {
			t.Fatalf("set an ACL (the filesystem under %s must take POSIX ACLs): %v", base, err)
		}
		return ""
	}
}

// A FUSE mount is trusted only as root's (user_id=0) or virtiofs (the
// host's virtiofsd, as a VM's root); a user's, or one whose owner
// mountinfo does not say, is not.
func TestMountOwner(t *testing.T) {
	info := []byte(`27 1 0:25 / / ro,relatime - virtiofs root ro
31 27 0:30 / /home/u/remote rw,nosuid,nodev - fuse.sshfs u@h:/ rw,user_id=65534,group_id=65534
32 27 0:31 / /mnt/rootfuse rw - fuse.bindfs /src rw,user_id=0,group_id=0,allow_other
33 27 0:32 / /mnt/odd rw - fuse odd rw
`)
	for id, want := range map[string]int{"27": 0, "31": 65534, "32": 0, "33": -1, "99": -1} {
		if got := mountOwner(info, id); got != want {
			t.Errorf("mount %s: owner %d, want %d", id, got, want)
		}
	}
}
