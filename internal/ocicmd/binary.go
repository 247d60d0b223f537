//go:build linux

package ocicmd

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Name is the OCI commands' own binary, installed beside trialnet.
const Name = "trialnet-oci"

// A Binary finds the binary that install writes into a runtime's
// configuration (hooks.d, daemon.json), by its real path.
type Binary func() (string, error)

// Self is this binary: trialnet-oci installs itself.
func Self() (string, error) {
	self, err := executable()
	if err != nil {
		return "", err
	}
	return self, ownedHere(self)
}

// Beside is trialnet-oci beside this binary's real path, never one found
// through PATH: trialnet installs it, so that each container's hook and
// runtime call starts the small binary.
func Beside() (string, error) {
	self, err := executable()
	if err != nil {
		return "", err
	}
	path := filepath.Join(filepath.Dir(self), Name)
	if err := unix.Access(path, unix.X_OK); err != nil {
		return "", fmt.Errorf("%s, the binary the entries run, is not an executable beside this trialnet: %w (install it beside trialnet, as 'make install' does)", path, err)
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", err
	}
	return real, ownedHere(real)
}

// ownedHere refuses a binary that a user other than root and the one
// installing could replace or change: the entries make the runtime run
// it as root for every container, so a trialnet built in a user's tree
// and installed from there with sudo would hand that user root. The file
// and each directory above it must be owned by root or by this process's
// user and writable by no one else (a sticky directory, such as /tmp,
// lets no one else rename or remove what it holds).
func ownedHere(path string) error {
	euid := uint32(os.Geteuid())
	for p := path; ; p = filepath.Dir(p) {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("%s, the binary the entries run as root for every container: %w", path, err)
		}
		dir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		writable := st.Mode&0o022 != 0 && !(dir && st.Mode&unix.S_ISVTX != 0)
		if (st.Uid != 0 && st.Uid != euid) || writable {
			return fmt.Errorf("%s, the binary the entries run as root for every container, could be changed by others: %s is owned by uid %d, mode %o "+
				"(install trialnet and trialnet-oci in a directory only root writes, as 'make install' does, and run install from there)", path, p, st.Uid, st.Mode&0o7777)
		}
		if p == "/" {
			return nil
		}
	}
}

// executable is this binary's real path.
func executable() (string, error) {
	self, err := os.Executable()
	if err == nil {
		self, err = filepath.EvalSymlinks(self)
	}
	if err != nil {
		return "", fmt.Errorf("where is this trialnet: %w", err)
	}
	return self, nil
}

// Executable is this binary's real path, for a command that runs a
// companion installed beside it (trialnet nri's trialnet-nri): beside a
// symlink to trialnet (/usr/local/bin/trialnet) there is none.
func Executable() (string, error) { return executable() }
