//go:build linux

package agent

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	trialspec "github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/sandbox"
	"golang.org/x/sys/unix"
)

func TestPrivilegedUninstallRefusesWhileTrialsLive(t *testing.T) {
	privtest.Require(t)
	cfg := isolatedHost(t)
	h, err := OpenHost(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	tr, err := h.Create(trialspec.Spec{ID: "live", UnixOpen: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := Uninstall(cfg, "", false); err == nil || !strings.Contains(err.Error(), "live") {
		t.Fatalf("uninstall with a live Trial: %v; want a refusal naming it", err)
	}
	if _, err := os.Stat(cfg.PinDir); err != nil {
		t.Fatal("the refused uninstall removed the pins")
	}
	if _, err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := Uninstall(cfg, "", false); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{cfg.PinDir, cfg.Parent} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("%s left after uninstall", p)
		}
	}
}

// A host that cannot open (its cgroup parent is not on cgroup2) leaves
// its netns directory as it found it, not made a mount of its own. Seen
// red with the directory mounted before the eBPF layer's load: the mount
// was left.
func TestPrivilegedOpenHostFailingLeavesNoMount(t *testing.T) {
	privtest.Require(t)
	var b [4]byte
	_, _ = rand.Read(b[:])
	cfg := Config{Parent: t.TempDir(), PinDir: bpf.DefaultPinDir + "-agenttest-" + hex.EncodeToString(b[:]), NetnsDir: t.TempDir(), StateDir: t.TempDir()}
	t.Cleanup(func() { _ = unix.Unmount(cfg.NetnsDir, unix.MNT_DETACH); _ = os.RemoveAll(cfg.PinDir) })
	if h, err := OpenHost(cfg); err == nil {
		_ = h.Close()
		t.Fatalf("OpenHost with a parent not on cgroup2 (%s): no error", cfg.Parent)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(mi)) {
		if f := strings.Fields(line); len(f) > 4 && f[4] == cfg.NetnsDir {
			t.Fatalf("a failed OpenHost left %s mounted: %s", cfg.NetnsDir, line)
		}
	}
}

// --force destroys live Trials first: their processes, cgroups and
// namespaces go with the eBPF layer, none is left half-confined.
func TestPrivilegedUninstallForceDestroysTrials(t *testing.T) {
	privtest.Require(t)
	cfg := isolatedHost(t)
	h, err := OpenHost(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := h.Create(trialspec.Spec{ID: "forced", UnixOpen: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	p, err := tr.Start(sandbox.Command{Args: []string{"sleep", "600"}, Env: []string{"PATH=/usr/bin:/bin"}, UID: 65534, GID: 65534})
	if err != nil {
		t.Fatal(err)
	}
	_ = h.Close()
	if err := Uninstall(cfg, "", true); err != nil {
		t.Fatal(err)
	}
	if code, _ := p.Wait(); code != 128+9 && code != -1 {
		t.Fatalf("the Trial's process exited %d, want killed", code)
	}
	for _, path := range []string{cfg.PinDir, cfg.Parent, tr.Cgroup, tr.Netns.Path} {
		if _, err := os.Stat(path); !os.IsNotExist(err) {
			t.Fatalf("%s left after uninstall --force", path)
		}
	}
}

// Uninstall removes the files a stopped agent prepared for Trials (its
// data directories and ledgers), and leaves a running agent's and the
// Trials' own.
func TestPrivilegedUninstallSweepsPreparedFiles(t *testing.T) {
	privtest.Require(t)
	cfg := isolatedHost(t)
	data := t.TempDir()
	onlyLive := leavePreparedFiles(t, data, cfg.StateDir)
	kept := []string{filepath.Join(data, "t-kept", decisionsFile), filepath.Join(cfg.StateDir, "t-kept"+ledgersSuffix, "1")}
	for _, p := range kept {
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := Uninstall(cfg, data, false); err != nil {
		t.Fatal(err)
	}
	onlyLive("uninstall")
	for _, p := range kept {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("a Trial's own file is gone after uninstall: %v", err)
		}
	}
}

// isolatedHost is a host configuration of the test's own: its own parent
// cgroup, pins and namespace directory, so that tests running at the same
// time (other packages too) never see each other's Trials.
func isolatedHost(t testing.TB) Config {
	t.Helper()
	mount, err := sandbox.Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	suffix := hex.EncodeToString(b[:])
	cfg := Config{
		Parent:   filepath.Join(mount, "trialnet-agenttest-"+suffix),
		PinDir:   bpf.DefaultPinDir + "-agenttest-" + suffix,
		NetnsDir: t.TempDir(),
		StateDir: t.TempDir(),
	}
	if err := os.Mkdir(cfg.Parent, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Uninstall(cfg, "", true); _ = os.Remove(cfg.Parent) })
	return cfg
}
