//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/trialnet/trialnet/internal/cli"
	"github.com/trialnet/trialnet/internal/ocicmd"
)

// nriBinary is the NRI plugin's own binary, installed beside trialnet.
const nriBinary = "trialnet-nri"

// cmdNRI execs trialnet-nri, the NRI plugin, from beside this binary's
// real path (as trialnet-oci's installs find theirs), so
// that manifests and scripts written for 'trialnet nri' keep working.
// The plugin is a binary of its own because what it links (NRI's ttrpc,
// protobuf, wazero) would otherwise be initialised in every start of
// trialnet: every run, exec and OCI hook.
func cmdNRI(_ context.Context, args []string, stdout, stderr io.Writer) int {
	self, err := ocicmd.Executable()
	if err != nil {
		return cli.Fail(stdout, stderr, false, exitFailure, fmt.Errorf("nri: find %s beside this binary: %w (run %s itself)", nriBinary, err, nriBinary))
	}
	path := filepath.Join(filepath.Dir(self), nriBinary)
	err = syscall.Exec(path, append([]string{nriBinary}, args...), os.Environ())
	return cli.Fail(stdout, stderr, false, exitFailure, fmt.Errorf("nri: the NRI plugin is its own binary now, %s: %w (install it beside trialnet, as 'make install' does)", path, err))
}
