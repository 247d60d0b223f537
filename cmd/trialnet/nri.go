//go:build linux

package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/nriplugin"
)

// cmdNRI runs the NRI plugin: the DaemonSet's trialnet-nri container
// (docs/containers.md, Kubernetes).
func cmdNRI(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("nri", "nri [--socket S] [--nri-socket PATH] [--hook-path PATH] [--resolv-conf PATH] [--exempt NS,...] [--index NN]",
		"trialnet nri --hook-path /opt/trialnet/bin/trialnet   # in the DaemonSet, with /opt/trialnet a hostPath at the same path", stderr)
	socket := socketFlag(fs)
	nriSocket := fs.String("nri-socket", "/var/run/nri/nri.sock", "the runtime's NRI socket")
	hookPath := fs.String("hook-path", "/opt/trialnet/bin/trialnet", "where this binary is installed for the runtime to run as the createRuntime hook: the same path in this container and on the node")
	resolv := fs.String("resolv-conf", "/opt/trialnet/resolv.conf", "where transparent Trials' resolv.conf is installed, the same path here and on the node (\"\": containers keep the runtime's)")
	exempt := fs.String("exempt", strings.Join(nriplugin.DefaultExempt(), ","), "namespaces whose pods pass untouched (an annotated pod there is refused), comma-separated")
	index := fs.String("index", nriplugin.DefaultIndex, "the plugin's NRI index (two digits): its place among the runtime's plugins")
	if err := parseNoArgs(fs, args); err != nil {
		return exitUsage
	}
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	p := &nriplugin.Plugin{
		Agent:      client.NewClient(*socket),
		HookPath:   *hookPath,
		Socket:     *socket,
		ResolvConf: *resolv,
		Exempt:     splitList(*exempt),
		Log:        log,
	}
	if err := p.Install(); err != nil {
		return fail(stdout, stderr, false, exitFailure, fmt.Errorf("nri: %w", err))
	}
	if err := p.Run(ctx, *nriSocket, *index); err != nil {
		return fail(stdout, stderr, false, exitFailure, fmt.Errorf("nri: %w", err))
	}
	return exitOK
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
