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
func Self() (string, error) { return executable() }

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
	return filepath.EvalSymlinks(path)
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
