//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"os"
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
	path, err := ocicmd.Companion(nriBinary, "the NRI plugin's own binary now")
	if err != nil {
		return cli.Fail(stdout, stderr, false, exitFailure, fmt.Errorf("nri: %w", err))
	}
	err = syscall.Exec(path, append([]string{nriBinary}, args...), os.Environ())
	return cli.Fail(stdout, stderr, false, exitFailure, fmt.Errorf("nri: run the NRI plugin, %s: %w (install it beside trialnet, as 'make install' does)", path, err))
}
