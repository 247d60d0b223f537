//go:build linux

package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// checkUnixPathSafe refuses an allowed unix socket path that anyone but
// root could make lead elsewhere. Without the BPF LSM layer, the allowed
// socket is recognised by its path string alone; a Trial cannot mount
// (no capabilities, no user namespace), but a Trial whose user owns the
// socket or can write a directory on its way could put a symlink or
// another socket there. So every component of the path, and of where it
// resolves, must be owned by root, and every directory must be writable
// by root alone or sticky (where others cannot rename or remove what
// root owns). Sticky only beneath the Trial's own directories, where the
// socket is bound in at start: elsewhere the Trial looks the path up in
// the host's directories, and once the socket is gone for a moment (its
// service restarting) anyone who may write a sticky directory on the way
// can put a symlink to another socket at the name.
func checkUnixPathSafe(path string) error {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return fmt.Errorf("unix path %s: %w", path, err)
	}
	boundIn := OwnDirOf(path) != ""
	for _, p := range []string{path, real} {
		prefix := "/"
		parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
		for i := 0; ; i++ {
			var st unix.Stat_t
			if err := unix.Lstat(prefix, &st); err != nil {
				return fmt.Errorf("unix path %s: %s: %w", path, prefix, err)
			}
			if st.Uid != 0 {
				return fmt.Errorf("unix path %s: %s is owned by uid %d, who could replace what the path leads to", path, prefix, st.Uid)
			}
			dir := st.Mode&unix.S_IFMT == unix.S_IFDIR
			if dir && st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
				return fmt.Errorf("unix path %s: directory %s is writable by group or others (mode %o), who could replace what the path leads to", path, prefix, st.Mode&0o7777)
			}
			if dir && st.Mode&0o022 != 0 && !boundIn {
				return fmt.Errorf("unix path %s: directory %s is sticky but writable by group or others (mode %o): while the socket is gone (its service restarting) they could put a symlink to another socket at its name", path, prefix, st.Mode&0o7777)
			}
			if i == len(parts) {
				break
			}
			prefix = filepath.Join(prefix, parts[i])
		}
	}
	var st os.FileInfo
	if st, err = os.Stat(real); err == nil && st.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("unix path %s is not a socket", path)
	}
	return err
}
