//go:build linux

// Command trialnet-nri is trialnet's NRI plugin, the DaemonSet's
// trialnet-nri container (docs/containers.md, Kubernetes). It is a
// binary of its own so that trialnet, which every run, exec and OCI hook
// starts, links none of NRI's dependencies (ttrpc, protobuf, wazero,
// gRPC status), whose package inits would run in every one of those
// starts. It installs the trialnet-oci binary beside it (--hook-binary)
// at --hook-path, for the runtime to run as the createRuntime hook: the
// hook's own small binary, whose start each container's start waits on.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/ocicmd"
	"github.com/trialnet/trialnet/nriplugin"
)

const (
	exitOK      = 0
	exitUsage   = 2
	exitFailure = 125
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("trialnet-nri", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: trialnet-nri [--socket S] [--nri-socket PATH] [--hook-path PATH] [--hook-binary PATH] [--resolv-conf PATH] [--exempt NS,...] [--index NN]")
		fmt.Fprintln(stderr, "\nRuns the NRI plugin that makes a Trial of each pod annotated trialnet.io/profile (containerd 1.7+, CRI-O).")
		fmt.Fprintln(stderr)
		fs.PrintDefaults()
		fmt.Fprintln(stderr, "\nExample:\n  trialnet-nri --hook-path /opt/trialnet/bin/trialnet-oci   # in the DaemonSet, with /opt/trialnet a hostPath at the same path")
	}
	socket := fs.String("socket", client.DefaultSocket, "the agent's control socket")
	nriSocket := fs.String("nri-socket", "/var/run/nri/nri.sock", "the runtime's NRI socket")
	hookPath := fs.String("hook-path", "/opt/trialnet/bin/"+ocicmd.Name, "where the hook's binary is installed for the runtime to run as the createRuntime hook: the same path in this container and on the node")
	hookBinary := fs.String("hook-binary", "", "the hook's binary to install at --hook-path (default: "+ocicmd.Name+" beside this binary)")
	resolv := fs.String("resolv-conf", "/opt/trialnet/resolv.conf", "where transparent Trials' resolv.conf is installed, the same path here and on the node (\"\": containers keep the runtime's)")
	exempt := fs.String("exempt", strings.Join(nriplugin.DefaultExempt(), ","), "namespaces whose pods pass untouched (an annotated pod there is refused), comma-separated")
	index := fs.String("index", nriplugin.DefaultIndex, "the plugin's NRI index (two digits): its place among the runtime's plugins")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "trialnet-nri: unexpected argument %q: it takes flags only\n", fs.Arg(0))
		fs.Usage()
		return exitUsage
	}
	if *hookBinary == "" {
		self, err := os.Executable()
		if err != nil {
			return failed(stderr, fmt.Errorf("find the %s binary beside this one: %w (give it with --hook-binary)", ocicmd.Name, err))
		}
		*hookBinary = filepath.Join(filepath.Dir(self), ocicmd.Name)
	}
	p := &nriplugin.Plugin{
		Agent:      client.NewClient(*socket),
		HookPath:   *hookPath,
		HookBinary: *hookBinary,
		Socket:     *socket,
		ResolvConf: *resolv,
		Exempt:     splitList(*exempt),
		Log:        slog.New(slog.NewJSONHandler(stderr, nil)),
	}
	if err := p.Install(); err != nil {
		return failed(stderr, err)
	}
	if err := p.Run(ctx, *nriSocket, *index); err != nil {
		return failed(stderr, err)
	}
	return exitOK
}

func failed(stderr io.Writer, err error) int {
	fmt.Fprintf(stderr, "trialnet-nri: %v\n", err)
	return exitFailure
}

// splitList splits a comma-separated flag, dropping empty items.
func splitList(s string) []string {
	out := []string{}
	for it := range strings.SplitSeq(s, ",") {
		if it = strings.TrimSpace(it); it != "" {
			out = append(out, it)
		}
	}
	return out
}
