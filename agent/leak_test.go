//go:build linux

package agent

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/netns"
	trialspec "github.com/trialnet/trialnet/trial"
)

func cgroupChildren(t *testing.T, parent string) int {
	t.Helper()
	entries, err := os.ReadDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		if e.IsDir() {
			n++
		}
	}
	return n
}

// Creating and destroying 200 Trials leaks no namespace, cgroup,
// listener, goroutine or file descriptor.
func TestPrivilegedCreateDestroy200NoLeaks(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 225)
	a := startAgent(t, w.config(t))
	// One Trial first, so lazily made things (pools, watchers) exist
	// before the baseline.
	if _, err := a.Create(context.Background(), trialspec.Request{ID: "agt-warm"}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Destroy(context.Background(), "agt-warm"); err != nil {
		t.Fatal(err)
	}
	// The shell pool full, before and after: its shells hold descriptors.
	readyShells(t, a, a.file.Load().PreparedShells())
	fds, gor := testkit.CountFDs(t), runtime.NumGoroutine()
	ns, _ := netns.List(a.cfg.Host.NetnsDir)
	cgs := cgroupChildren(t, a.host.Parent)
	for i := range 200 {
		id := fmt.Sprintf("agt-leak-%d", i)
		if _, err := a.Create(context.Background(), trialspec.Request{ID: id, Allow: []string{"api.example.test:443"}}); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Destroy(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := netns.List(a.cfg.Host.NetnsDir); len(n) != len(ns) {
		t.Errorf("namespaces: %d before, %d after", len(ns), len(n))
	}
	if n := cgroupChildren(t, a.host.Parent); n != cgs {
		t.Errorf("Trial cgroups: %d before, %d after", cgs, n)
	}
	// A destroyed Trial's last descriptors may close just after Destroy
	// returns (a goroutine's); a leak stays.
	readyShells(t, a, a.file.Load().PreparedShells())
	deadline := time.Now().Add(5 * time.Second)
	for testkit.CountFDs(t) > fds && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := testkit.CountFDs(t); n > fds {
		t.Errorf("file descriptors: %d before, %d after (listeners or sockets leaked)", fds, n)
	}
	deadline = time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > gor && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > gor {
		t.Errorf("goroutines: %d before, %d after", gor, n)
	}
	if n := a.host.BPF.TrialCount(); n != 0 {
		t.Errorf("%d policy entries left", n)
	}
	// The Trials' files kept ready beside the shells are the pool's.
	if entries, _ := os.ReadDir(a.cfg.Host.StateDir); len(entries) != len(shellEntries(t, a.cfg.Host.StateDir)) {
		t.Errorf("state files left: %d", len(entries)-len(shellEntries(t, a.cfg.Host.StateDir)))
	}
	for _, d := range []string{a.cfg.Host.StateDir, a.cfg.DataDir} {
		if n := len(shellEntries(t, d)); n > a.file.Load().PreparedShells() {
			t.Errorf("%d Trials' files kept in %s, more than prepared", n, d)
		}
	}
}
