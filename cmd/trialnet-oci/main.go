//go:build linux

// Command trialnet-oci is trialnet's OCI hook and Docker runtime
// wrapper: trialnet-oci oci-hook, which podman and CRI-O run for each
// container with a trialnet.io/ annotation, and trialnet-oci
// oci-runtime, which Docker runs in place of runc for each of its calls
// on a container (docs/containers.md). A container's start waits on
// these processes, and Go runs the init of every linked package in each
// start: this binary links the agent's wire types (internal/agentwire,
// no net/http nor crypto/tls) and the OCI packages only, none of the
// agent, the sandbox, cilium/ebpf, netlink, the proxy, YAML or DNS, and
// the Makefile builds it without cgo. 'trialnet oci-hook install' and
// 'trialnet oci-runtime install' write it, from beside trialnet, into
// the runtime's configuration; trialnet runs the same commands for
// entries written before.
package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/trialnet/trialnet/internal/cli"
	"github.com/trialnet/trialnet/internal/ocicmd"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run takes trialnet's command lines for the OCI commands, so that an
// entry reads the same whichever binary it names.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return cli.ExitUsage
	}
	ctx := context.Background()
	switch args[0] {
	case "oci-hook":
		// No signal handler: ^C or SIGTERM ends the process, as the
		// runtime's SIGKILL at the hook's timeout does, and the runtime
		// refuses the container; a handler's set-up would cost each start
		// a thread (0.6 ms here).
		return ocicmd.Hook(ctx, args[1:], stdout, stderr, ocicmd.Self)
	case "oci-runtime":
		// runc, which it becomes, takes the signals.
		return ocicmd.Runtime(ctx, args[1:], stdout, stderr, ocicmd.Self)
	case "help", "-h", "--help":
		usage(stdout)
		return cli.ExitOK
	}
	fmt.Fprintf(stderr, "trialnet-oci: %q is not one of its commands: it runs trialnet's OCI hook and Docker runtime wrapper only (oci-hook, oci-runtime); run trialnet %s\n", args[0], args[0])
	return cli.ExitUsage
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "Usage: trialnet-oci oci-hook|oci-runtime [flags]")
	fmt.Fprintln(w, "\nRuns trialnet's OCI hook (podman, CRI-O) and Docker runtime wrapper, which a container's start waits on,")
	fmt.Fprintln(w, "from a binary that links nothing else; 'trialnet oci-hook install' and 'trialnet oci-runtime install' register it.")
	fmt.Fprintln(w, "'trialnet-oci COMMAND -h' shows a command's flags and an example.")
}
