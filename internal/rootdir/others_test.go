//go:build linux

package rootdir

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/internal/privtest"
)

// another is a user of the host who is neither root, the caller nor the
// Trial; caller is the user who ran sudo.
const another, caller = 4242, 4343

// A report's path is out of every other user's reach only if no one but
// root or the caller owns a directory it crosses or may write one that
// is not sticky (the report's own, sticky or not), by mode or ACL; a
// group this process holds is root's. Each way
// another user could swap the report once verify read it is refused.
// Seen red with dirOutOfOthersReach returning nil and the entry owner
// check taken out: every refusal passed.
func TestPrivilegedOthersOutOfReach(t *testing.T) {
	privtest.Require(t)
	owned := func(rel string, uid int) func(*testing.T, string) string {
		return func(t *testing.T, base string) string {
			if err := os.Lchown(filepath.Join(base, rel), uid, uid); err != nil {
				t.Fatal(err)
			}
			return ""
		}
	}
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, base string) string
		why   string // "" for out of reach
	}{
		{"root's all the way", nil, ""},
		{"the report's directory another user's", owned("a/b", another), "owned by uid 4242"},
		{"an ancestor another user's", owned("a", another), "owned by uid 4242"},
		{"the caller's directories", func(t *testing.T, base string) string {
			owned("a", caller)(t, base)
			return owned("a/b", caller)(t, base)
		}, ""},
		{"the report's directory world-writable", chmod("a/b", 0o777), "anyone (mode 0777)"},
		{"the report's directory sticky", chmod("a/b", 0o1777), "put another at its name"},
		{"an ancestor writable by another group", chgrp("a", 0o775, 4244), "group 4244"},
		{"sticky and world-writable, entries root's", chmod("a", 0o1777), ""},
		{"another user's symlink in a sticky directory", func(t *testing.T, base string) string {
			chmod("a", 0o1777)(t, base)
			symlink(t, "b", filepath.Join(base, "a", "out"))
			owned("a/out", another)(t, base)
			return filepath.Join(base, "a", "out", "report.json")
		}, "owned by uid 4242, who may replace it"},
		{"an ACL naming another user", setACL("a", acl([3]uint32{aclUserObj, 7, 0}, [3]uint32{aclUser, 7, another}, [3]uint32{aclGroupObj, 5, 0}, [3]uint32{aclMask, 7, 0}, [3]uint32{aclOther, 5, 0})), "uid 4242 (its ACL)"},
		{"an ACL naming another user, masked", setACL("a", acl([3]uint32{aclUserObj, 7, 0}, [3]uint32{aclUser, 7, another}, [3]uint32{aclGroupObj, 5, 0}, [3]uint32{aclMask, 5, 0}, [3]uint32{aclOther, 5, 0})), ""},
		{"a symlink through another user's directory", func(t *testing.T, base string) string {
			mkdir(t, filepath.Join(base, "theirs"), 0o755)
			owned("theirs", another)(t, base)
			symlink(t, filepath.Join(base, "theirs"), filepath.Join(base, "a", "link"))
			return filepath.Join(base, "a", "link", "report.json")
		}, "owned by uid 4242"},
		{"a dot-dot through another user's directory", func(t *testing.T, base string) string {
			mkdir(t, filepath.Join(base, "theirs"), 0o755)
			owned("theirs", another)(t, base)
			return filepath.Join(base, "theirs") + "/../a/b/report.json"
		}, "owned by uid 4242"},
		{"missing directories below a checked one", func(t *testing.T, base string) string {
			return filepath.Join(base, "a", "b", "c", "report.json")
		}, ""},
		{"the report itself another user's (replaced by a rename)", func(t *testing.T, base string) string {
			p := filepath.Join(base, "a", "b", "report.json")
			if err := os.WriteFile(p, nil, 0o666); err != nil {
				t.Fatal(err)
			}
			return owned("a/b/report.json", another)(t, base) + p
		}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			othersCase(t, c.setup, c.why, caller, caller)
		})
	}
}

// SUDO_GID is the caller's group only when it is their own (a user
// private group, named as they are): a primary group many users share
// (users, staff, nogroup), or one a colleague was added to, lets each of
// them swap the report. Seen red with privateGroup returning true: the
// three refusals passed.
func TestPrivilegedOthersOutOfReachCallersGroup(t *testing.T) {
	privtest.Require(t)
	ids := func(name string) (uint32, uint32, string) {
		u, err := user.Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		g, err := user.LookupGroupId(u.Gid)
		if err != nil {
			t.Fatal(err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return uint32(uid), uint32(gid), g.Name
	}
	// daemon:1:1, its group daemon; sync:4:65534, its group nogroup,
	// which others share: on every Debian host and guest.
	uid, gid, _ := ids("daemon")
	othersCase(t, chgrp("a", 0o775, int(gid)), "", uid, gid)
	uid, gid, name := ids("sync")
	why := fmt.Sprintf("group %s (gid %d)", name, gid)
	t.Run("shared", func(t *testing.T) {
		othersCase(t, chgrp("a", 0o775, int(gid)), why, uid, gid)
	})
	t.Run("a colleague added to it", func(t *testing.T) {
		uid, gid, name := ids("daemon")
		groups := filepath.Join(t.TempDir(), "group")
		if err := os.WriteFile(groups, []byte(fmt.Sprintf("%s:x:%d:%s,sync\n", name, gid, name)), 0o644); err != nil {
			t.Fatal(err)
		}
		defer func(f string) { groupFile = f }(groupFile)
		groupFile = groups
		othersCase(t, chgrp("a", 0o775, int(gid)), fmt.Sprintf("group %s (gid %d)", name, gid), uid, gid)
	})
	t.Run("shared, by its ACL", func(t *testing.T) {
		othersCase(t, setACL("a", acl([3]uint32{aclUserObj, 7, 0}, [3]uint32{aclGroupObj, 5, 0}, [3]uint32{aclGroup, 7, gid}, [3]uint32{aclMask, 7, 0}, [3]uint32{aclOther, 5, 0})), why, uid, gid)
	})
}

// othersCase judges base/a/b/report.json (or the path setup returns)
// for the caller uid and gid after setup: out of reach if why is "".
func othersCase(t *testing.T, setup func(*testing.T, string) string, why string, uid, gid uint32) {
	t.Helper()
	base := t.TempDir()
	mkdir(t, filepath.Join(base, "a"), 0o755)
	mkdir(t, filepath.Join(base, "a", "b"), 0o755)
	path := filepath.Join(base, "a", "b", "report.json")
	if setup != nil {
		if p := setup(t, base); p != "" {
			path = p
		}
	}
	err := OthersOutOfReach(path, uid, gid)
	switch {
	case why == "" && err != nil:
		t.Fatalf("%s: %v, want out of reach", path, err)
	case why != "" && (err == nil || !strings.Contains(err.Error(), why) || !errors.Is(err, ErrOthersReach)):
		t.Fatalf("%s: %v, want refused: %s", path, err, why)
	}
}
