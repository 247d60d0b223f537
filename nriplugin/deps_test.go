package nriplugin

import (
	"os/exec"
	"strings"
	"testing"
)

// The plugin runs in a pod with no capability beside every runtime: it
// must not link the daemon's eBPF, proxy, namespace or cgroup code.
func TestPluginLinksNoDaemon(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps (go test runs with the go command on its PATH): %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		for _, banned := range []string{"github.com/trialnet/trialnet/agent", "github.com/trialnet/trialnet/bpf",
			"github.com/trialnet/trialnet/sandbox", "github.com/trialnet/trialnet/netns", "github.com/trialnet/trialnet/proxy",
			"github.com/cilium/ebpf", "github.com/vishvananda/netlink"} {
			if p == banned || strings.HasPrefix(p, banned+"/") {
				t.Errorf("package nriplugin links %s", p)
			}
		}
	}
}
