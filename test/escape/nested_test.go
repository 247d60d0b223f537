//go:build linux

package escape

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/sandbox"
)

// nestingRefused passes a nested Trial's refusal where the host has no BPF
// LSM layer (where it must be refused, saying why) and fails it elsewhere.
func nestingRefused(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, sandbox.ErrNestingUnavailable) && !strings.Contains(err.Error(), "nested sandboxes are not available here") {
		t.Fatalf("a nested Trial: %v", err)
	}
	if os.Getenv("TRIALNET_REQUIRE_LSM") == "1" {
		t.Fatalf("a nested Trial on a host with the BPF LSM layer: %v", err)
	}
	t.Logf("refused here, as it must be without the BPF LSM layer: %v", err)
}

// seedSandbox is the seed's bwrap command line for uid 65534: a fresh
// home (over a directory of its own) with a login file bound in.
func seedSandbox(t *testing.T) []string {
	t.Helper()
	dir := privtest.SharedDir(t, "nested-home-")
	home, login := filepath.Join(dir, "home"), filepath.Join(dir, "login.json")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(login, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{home, login} {
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	return testenv.SeedBwrap(home, login)
}

// Every way out, tried from inside bwrap in a nested Trial (strict mode):
// all blocked, and the kernel counted each network attempt.
func TestPrivilegedEscapeNested(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "bwrap")
	c := newCanaries(t, 175)
	a, err := agent.Start(agent.AgentConfig{Host: testenv.IsolatedHost(t, "escnest"), DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(true) })
	info, err := a.Create(context.Background(), trial.Request{ID: "escape-nested", Strict: true, Nested: true, Allow: []string{"allowed.example.test:443"}})
	if err != nil {
		nestingRefused(t, err)
		return
	}
	tr, err := agent.Attach(info)
	if err != nil {
		t.Fatal(err)
	}
	var loop atomic.Int64
	loopPort := listenLoopback(t, tr.Netns, &loop)
	res := runEscapeeIn(t, c, tr, c.host.Local4, seedSandbox(t), "-loopback-port", loopPort, "-proxy", agent.ProxyEndpoints[0].String())
	blocked := requireAllBlocked(t, c, res)
	if loop.Load() != 0 {
		t.Error("a loopback port other than the proxy's was reached in strict mode")
	}
	st, err := a.Stats(context.Background(), info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d := deniedTotal(st.Kernel); d < uint64(blocked) || st.Egress != 0 {
		t.Errorf("kernel counted %d refusals for %d blocked network attempts (egress %d): %v", d, blocked, st.Egress, st.Kernel)
	}
	if st.Kernel["foreign_socket_denied"] != 0 {
		t.Errorf("the sandbox's own sockets were counted as foreign: %v", st.Kernel)
	}
}

// The process-boundary suite, from inside bwrap in a nested Trial: no
// victim socket reached, and the unix spoof by a bind mount from the
// sandbox's own user namespace refused.
func TestPrivilegedEscapeBoundaryNested(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "bwrap")
	w := newBoundaryWorld(t)
	h, err := agent.OpenHost(testenv.IsolatedHost(t, "bndnest"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	tr, err := h.Create(trial.Spec{ID: "boundary-nested", UnixAllow: []string{w.allowed}, Nested: true}, nil)
	if err != nil {
		nestingRefused(t, err)
		return
	}
	t.Cleanup(func() { _, _ = tr.Close() })
	res := runInTrialIn(t, w, tr, seedSandbox(t))
	requireNoneArrived(t, w, res, nil)
	if r := res["allowed-unix-connect"]; r.Result != "escaped" {
		t.Errorf("the allowed unix socket was not reachable from the nested sandbox: %+v", r)
	}
	if r := res["userns-bind-mount-unix"]; r.Result != "blocked" {
		t.Errorf("a bind mount over the allowed path from a user namespace: %+v", r)
	}
	k, err := tr.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if k.UnixIdentityDenied == 0 {
		t.Errorf("the spoofed unix path was refused, but unix_identity_denied did not count it: %+v", k)
	}
}
