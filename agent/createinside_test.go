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
// which socket failed and why. So does a create that fails after the
// trip, with the sockets made.
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
	endpoints := a.host.Proxy
	for _, tc := range []struct {
		name  string
		proxy []netip.AddrPort
		req   trialspec.Request
		want  []string
	}{
		{"the stub's address taken", append(slices.Clone(endpoints), netip.MustParseAddrPort(bpf.StubAddr)), trialspec.Request{ID: "inside-fails"},
			[]string{"open the DNS stub's sockets", "address already in use"}},
		// Every socket is made in the namespace, then the policy entry
		// refuses a strict Trial with no proxy endpoint: the agent closes
		// the transparent sockets.
		{"the policy refused after", nil, trialspec.Request{ID: "after-fails", Strict: true}, []string{"create Trial after-fails"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a.host.Proxy = tc.proxy
			before := sockets()
			_, err := a.Create(ctx, tc.req)
			if err == nil {
				t.Fatal("the Trial was made")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("the error does not say %q: %v", w, err)
				}
			}
			if after := sockets(); len(after) != len(before) {
				t.Fatalf("%d sockets held after the failed create (%v), %d before (%v)", len(after), after, len(before), before)
			}
			for _, p := range []string{filepath.Join(host.NetnsDir, tc.req.ID), filepath.Join(host.Parent, tc.req.ID)} {
				if _, err := os.Lstat(p); !os.IsNotExist(err) {
					t.Errorf("%s is left after the failed create (%v)", p, err)
				}
			}
		})
	}
}
