package client

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// linked is all a program that imports client may link beside the
// standard library: none of the daemon (agent, bpf, proxy, sandbox,
// netns, the cgroup code, github.com/cilium/ebpf, netlink).
var linked = []string{
	"github.com/trialnet/trialnet/client",
	"github.com/trialnet/trialnet/internal/agentwire",
	"github.com/trialnet/trialnet/internal/fdpass",
	"github.com/trialnet/trialnet/internal/ratelimit",
	"github.com/trialnet/trialnet/internal/rootdir",
	"github.com/trialnet/trialnet/record",
	"github.com/trialnet/trialnet/trial",
	"golang.org/x/sys/unix",
}

// A harness imports client to ask for Trials: it must not link the
// daemon's eBPF, proxy, namespace or cgroup code to do so.
func TestClientLinksNoDaemon(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps (go test runs with the go command on its PATH): %v", err)
	}
	var extra []string
	for _, p := range strings.Fields(string(out)) {
		if !slices.Contains(linked, p) {
			extra = append(extra, p)
		}
	}
	if len(extra) > 0 {
		t.Errorf("package client links %s, beside the standard library and %s: a harness importing it would link the daemon's code", strings.Join(extra, ", "), strings.Join(linked, ", "))
	}
}
