//go:build linux

package rootdir

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// TrustedPath resolves path checking that no one but root or owner can
// change what it names: each directory a name is looked up in is
// theirs and not writable by group or others (unless sticky, as /tmp
// is), and each link followed is theirs. Otherwise a user could put
// another file of root's (a gateway route's secret, the upstream
// proxy's credentials, root's own tokens) where trialnet reads this one,
// and trialnet would send its content on. It returns the path with its
// links resolved; the last name is not followed (the caller opens it
// with O_NOFOLLOW).
func TrustedPath(path string, owner uint32) (string, error) {
	cur, rest := "/", strings.Split(strings.TrimPrefix(path, "/"), "/")
	for links := 0; len(rest) > 0; {
		if err := trustedDir(cur, owner); err != nil {
			return "", err
		}
		name := rest[0]
		rest = rest[1:]
		switch {
		case name == "" || name == ".":
			continue
		case name == "..":
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, name)
		if len(rest) == 0 {
			return next, nil
		}
		fi, err := os.Lstat(next)
		if err != nil {
			return "", err
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			cur = next
			continue
		}
		if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != 0 && uid != owner {
			return "", fmt.Errorf("%s is a link owned by uid %d, not %s: whoever owns it can point it elsewhere (replace it with one %s owns)", next, uid, whose(owner), whose(owner))
		}
		if links++; links > maxLinks {
			return "", fmt.Errorf("%s: more than %d links on the way (a loop of links?): name the file by a path with fewer links", next, maxLinks)
		}
		target, err := os.Readlink(next)
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(target) {
			cur = "/"
		}
		rest = append(strings.Split(strings.TrimPrefix(target, "/"), "/"), rest...)
	}
	return cur, nil
}

// trustedDir refuses a directory someone but root or owner can change.
func trustedDir(dir string, owner uint32) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	uid, mode := fi.Sys().(*syscall.Stat_t).Uid, fi.Mode()
	switch {
	case !fi.IsDir():
		return fmt.Errorf("%s is not a directory", dir)
	case uid != 0 && uid != owner:
		return fmt.Errorf("directory %s is owned by uid %d, not %s: its owner could put another file there (chown root %s)", dir, uid, whose(owner), dir)
	case mode.Perm()&0o022 != 0 && mode&os.ModeSticky == 0:
		return fmt.Errorf("directory %s (mode %04o) is writable by others than its owner, who could put another file there (chmod go-w %s)", dir, mode.Perm(), dir)
	}
	return nil
}

// ClosedDir refuses dir, the directory of a file whose content trialnet
// sends on (a gateway secret, the upstream proxy's credentials), if
// others than its owner may add names to it, sticky or not: sticky keeps
// the names there from them, not a name that is absent (before the file
// is made, while it is replaced), which a user may then take with a hard
// link to another's file (fs.protected_hardlinks=0) that trialnet would
// read as this one.
func ClosedDir(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o022 != 0 {
		// The mode with its sticky bit: /tmp reads 1777, not 0777.
		mode := fi.Sys().(*syscall.Stat_t).Mode & 0o7777
		return fmt.Errorf("its directory %s (mode %04o) lets others add names, sticky or not: one could put a link to another file of root's where this one is read (move the file to a directory only its owner can write, such as /etc/trialnet)", dir, mode)
	}
	return nil
}

// whose names who may own the path's directories and links.
func whose(owner uint32) string {
	if owner == 0 {
		return "root"
	}
	return fmt.Sprintf("root or uid %d", owner)
}
