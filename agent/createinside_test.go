//go:build linux

package agent

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/privtest"
	trialspec "github.com/trialnet/trialnet/trial"
)

// A create whose sockets in the new namespace fail part way, in the one
// trip into it that makes them all, leaves nothing: here the stub's TCP
// socket fails after its UDP one, on an address a proxy endpoint (opened
// first) took. The proxy endpoint's listeners and the stub's UDP socket
// are closed, the namespace and the cgroup removed, and the error says
// which socket failed and why.
func TestPrivilegedCreateFailingInsideLeavesNothing(t *testing.T) {
	privtest.Require(t)
	sockets := func() []string {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		var held []string
		for _, e := range ents {
			if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.HasPrefix(l, "socket:") {
				held = append(held, l)
			}
		}
		return held
	}
	host := isolatedHost(t)
	a := startAgent(t, AgentConfig{Host: host, DataDir: t.TempDir(), Ephemeral: true, File: &config.File{}})
	ctx := context.Background()
	// The runtime's and the proxy's own sockets, made at the first create.
	if _, err := a.Create(ctx, trialspec.Request{ID: "inside-first"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Destroy(ctx, "inside-first"); err != nil {
		t.Fatal(err)
	}
	a.host.Proxy = append(slices.Clone(a.host.Proxy), netip.MustParseAddrPort(bpf.StubAddr))
	before := sockets()
	_, err := a.Create(ctx, trialspec.Request{ID: "inside-fails"})
	if err == nil {
		t.Fatal("a Trial was made with its stub's address taken")
	}
	if !strings.Contains(err.Error(), "open the DNS stub's sockets") || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("the error does not say which socket failed, and why: %v", err)
	}
	if after := sockets(); len(after) != len(before) {
		t.Fatalf("%d sockets held after the failed create (%v), %d before (%v)", len(after), after, len(before), before)
	}
	for _, p := range []string{filepath.Join(host.NetnsDir, "inside-fails"), filepath.Join(host.Parent, "inside-fails")} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s is left after the failed create (%v)", p, err)
		}
	}
}
