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
func Beside() (string, error) { return Companion(Name, "the binary the entries run") }

// Companion is the binary name (what it is, for the error) beside this
// binary's real path, resolved: the companions trialnet runs or installs
// (trialnet-oci, trialnet-nri) are those installed with it, wherever a
// symlink to it (/usr/local/bin/trialnet) lives.
func Companion(name, what string) (string, error) {
	self, err := executable()
	if err != nil {
		return "", err
	}
	path := filepath.Join(filepath.Dir(self), name)
	if err := unix.Access(path, unix.X_OK); err != nil {
		return "", fmt.Errorf("%s, %s, is not an executable beside this trialnet: %w (install it beside trialnet, as 'make install' does)", path, what, err)
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
