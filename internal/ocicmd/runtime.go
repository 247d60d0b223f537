//go:build linux

package ocicmd

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/trialnet/trialnet/internal/agentwire"
	"github.com/trialnet/trialnet/internal/cgroup2"
	"github.com/trialnet/trialnet/internal/cli"
	"github.com/trialnet/trialnet/ocihook"
	"github.com/trialnet/trialnet/ociruntime"
	"golang.org/x/sys/unix"
)

// Runtime is oci-runtime, the runtime Docker runs in place of runc
// ("install" registers bin in daemon.json): oci-runtime [--runc R]
// [--socket S] -- RUNC-ARGS. It prepares the bundle of a container that
// names a Trial, with this binary as its hook, and becomes runc; on any
// error it refuses, and runc never runs.
func Runtime(ctx context.Context, args []string, stdout, stderr io.Writer, bin Binary) int {
	if len(args) > 0 && args[0] == "install" {
		return runtimeInstall(args[1:], stdout, stderr, bin)
	}
	fs := cli.NewFlags("oci-runtime", "oci-runtime [--runc PATH] [--socket S] [--cgroup-parent DIR] [--netns-dir DIR] -- RUNC-ARGS...   (run by Docker as its runtime)\n       trialnet oci-runtime install [--daemon-json F] [--name N] [--runc PATH] [--force] [--print]",
		"docker run --runtime trialnet --cgroup-parent trialnet-eval-42.slice --network none IMAGE   (after: sudo trialnet oci-runtime install)", stderr)
	runc := fs.String("runc", ociruntime.DefaultRunc, "the OCI runtime to run")
	socket := cli.SocketFlag(fs)
	parent, netnsDir := placesFlags(fs)
	sep := slices.Index(args, "--")
	if sep < 0 {
		if err := cli.ParseNoArgs(fs, args); err == nil { // -h and bad flags are answered there
			fmt.Fprintln(stderr, "trialnet oci-runtime: no '--' before runc's arguments: is this run as the runtime daemon.json names ('trialnet oci-runtime install --print')?")
		}
		return cli.ExitUsage
	}
	if err := cli.ParseNoArgs(fs, args[:sep]); err != nil {
		return cli.ExitUsage
	}
	runcArgs := args[sep+1:]
	refuse := func(err error) int {
		fmt.Fprintf(stderr, "trialnet oci-runtime: %v\n", err)
		ociruntime.LogRefusal(runcArgs, err)
		logRefusal(err)
		return cli.ExitFailure
	}
	self, err := executable()
	if err != nil {
		return refuse(err)
	}
	ctx, cancel := context.WithTimeout(ctx, hookAgentTimeout)
	defer cancel()
	w := &ociruntime.Wrapper{
		Agent:    func() ociruntime.Agent { return agentwire.NewDirect(*socket) },
		Hook:     self,
		HookArgs: append(ociruntime.HookArgs(*socket), placesArgs(*parent, *netnsDir)...),
	}
	var mount string
	if *parent != "" {
		if mount, err = cgroup2.Mount(); err != nil {
			return refuse(err)
		}
	}
	if w.Trials, err = ocihook.AgentPlaces(*parent, *netnsDir, mount); err != nil {
		return refuse(err)
	}
	out, err := w.Prepare(ctx, runcArgs)
	if err != nil {
		return refuse(err)
	}
	// runc in this process's place: its exit status, signals and
	// standard streams are the caller's, as if it had run runc.
	return refuse(fmt.Errorf("run %s: %w", *runc, unix.Exec(*runc, append([]string{*runc}, out...), os.Environ())))
}

func runtimeInstall(args []string, stdout, stderr io.Writer, bin Binary) int {
	fs := cli.NewFlags("oci-runtime install", "oci-runtime install [--daemon-json F] [--name N] [--runc PATH] [--force] [--print] [--socket S] [--cgroup-parent DIR] [--netns-dir DIR]",
		"sudo trialnet oci-runtime install && sudo systemctl reload docker   # then: docker run --runtime trialnet ...", stderr)
	path := fs.String("daemon-json", ociruntime.DefaultDaemonJSON, "dockerd's configuration file")
	name := fs.String("name", ociruntime.DefaultName, "the runtime's name (docker run --runtime NAME)")
	runc := fs.String("runc", ociruntime.DefaultRunc, "the OCI runtime the wrapper runs")
	force := fs.Bool("force", false, "replace a different runtime of that name")
	printOnly := fs.Bool("print", false, "print the daemon.json entry instead of merging it")
	socket := cli.SocketFlag(fs)
	parent, netnsDir := placesFlags(fs)
	if err := cli.ParseNoArgs(fs, args); err != nil {
		return cli.ExitUsage
	}
	self, err := bin()
	if err != nil {
		return cli.Fail(stdout, stderr, false, cli.ExitFailure, fmt.Errorf("oci-runtime install: %w", err))
	}
	rt, err := ociruntime.Entry(self, *runc, *socket, placesArgs(*parent, *netnsDir)...)
	if err != nil {
		return cli.Fail(stdout, stderr, false, cli.ExitFailure, fmt.Errorf("oci-runtime install: %w", err))
	}
	if *printOnly {
		b, err := ociruntime.Fragment(*name, rt)
		if err != nil {
			return cli.Fail(stdout, stderr, false, cli.ExitFailure, err)
		}
		_, _ = stdout.Write(b)
		return cli.ExitOK
	}
	changed, err := ociruntime.Install(*path, *name, rt, *force)
	if err != nil {
		return cli.Fail(stdout, stderr, false, cli.ExitFailure, fmt.Errorf("oci-runtime install: %w", err))
	}
	if changed {
		fmt.Fprintf(stdout, "wrote runtimes.%s to %s: reload dockerd (systemctl reload docker, or SIGHUP) and run containers with --runtime %s --cgroup-parent %sID%s --network none\n",
			*name, *path, *name, ociruntime.SlicePrefix, ociruntime.SliceSuffix)
	} else {
		fmt.Fprintf(stdout, "%s already has this runtime %s\n", *path, *name)
	}
	return cli.ExitOK
}
