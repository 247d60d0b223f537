//go:build linux

package main

import (
	"context"
	"io"

	"github.com/trialnet/trialnet/internal/ocicmd"
)

// cmdOCIHook and cmdOCIRuntime run the OCI commands in this process, for
// hooks.d and daemon.json entries written before trialnet-oci was; their
// install writes trialnet-oci, from beside this binary, into those
// entries, so that each container's hook and runtime call starts the
// small binary rather than this one.
func cmdOCIHook(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return ocicmd.Hook(ctx, args, stdout, stderr, ocicmd.Beside)
}

func cmdOCIRuntime(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return ocicmd.Runtime(ctx, args, stdout, stderr, ocicmd.Beside)
}
