//go:build linux

package agent

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/trialnet/trialnet/internal/privtest"
)

// A metrics port in use fails the agent's start before it loads, adopts
// or serves anything: the error names the address, and neither the
// control socket nor a pin, nor a Trial record, is left behind.
func TestPrivilegedMetricsPortInUseFailsStart(t *testing.T) {
	privtest.Require(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	host := isolatedHost(t)
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = Serve(ctx, ServeConfig{
		AgentConfig: AgentConfig{Host: host, DataDir: t.TempDir(), Resolvers: []string{"127.0.0.1:9"}},
		Socket:      sock,
		MetricsAddr: busy.Addr().String(),
	})
	if err == nil {
		t.Fatal("Serve started with its metrics port in use")
	}
	if !errors.Is(err, syscall.EADDRINUSE) || !strings.Contains(err.Error(), busy.Addr().String()) || !strings.Contains(err.Error(), "--metrics-addr") {
		t.Errorf("Serve with its metrics port in use: %v; want EADDRINUSE naming the address and --metrics-addr", err)
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("control socket left behind: %v", err)
	}
	if _, err := os.Stat(host.PinDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the eBPF layer was loaded before the metrics port was bound: %s: %v", host.PinDir, err)
	}
	if recs, _ := os.ReadDir(host.StateDir); len(recs) > 0 {
		t.Errorf("state left in %s: %v", host.StateDir, recs)
	}
}

// --pid-file in a directory others can write (/tmp/agent.pid): a symlink
// or hard link planted at the name is replaced, and the file it leads to
// (root's /etc/passwd, for the agent) is left as it was. Seen red with
// writePIDFile as os.WriteFile: both victims held the pid.
func TestPIDFileFollowsNoLink(t *testing.T) {
	for _, plant := range []func(string, string) error{os.Symlink, os.Link} {
		dir, victim := t.TempDir(), filepath.Join(t.TempDir(), "victim")
		if err := os.WriteFile(victim, []byte("precious\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "agent.pid")
		if err := plant(victim, path); err != nil {
			t.Fatal(err)
		}
		if err := writePIDFile(path); err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(victim); err != nil || string(b) != "precious\n" {
			t.Errorf("the pid was written through the link at %s: %q %v", path, b, err)
		}
		if b, err := os.ReadFile(path); err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
			t.Errorf("%s: %q %v, want this pid", path, b, err)
		}
	}
}

// A draining agent's control socket listens until the successor's has
// replaced it at the path: closed while still there, it refused clients
// (CI: "dial unix .../agent.sock: connect: connection refused" when a
// loaded successor renamed its socket more than a second after it heard
// the old agent stopped). It stops waiting once the successor gives up,
// and at its bound. The waits run on synctest's clock: what is checked
// is whether awaitTaken returns, never how soon by the wall.
func TestDrainKeepsTheControlSocketUntilTaken(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	next, err := net.Listen("unix", path+".next")
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	own, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	never := func() bool { return false }
	synctest.Test(t, func(t *testing.T) {
		done := make(chan struct{})
		go func() { awaitTaken(path, own, never, time.Minute); close(done) }()
		time.Sleep(30 * time.Second) // the bubble's clock: 3000 looks at the path
		select {
		case <-done:
			t.Fatal("stopped waiting while its own socket was still at the path")
		default:
		}
		if err := os.Rename(path+".next", path); err != nil {
			t.Fatal(err)
		}
		<-done // before the bound, or the Fatal above would have run

		// Its own again (a fresh stat), but the successor has ended.
		own, _ := os.Stat(path)
		start := time.Now()
		awaitTaken(path, own, func() bool { return true }, time.Minute)
		if waited := time.Since(start); waited != 0 {
			t.Errorf("waited %s for a successor that had ended", waited)
		}
		start = time.Now()
		awaitTaken(path, own, never, 50*time.Millisecond)
		if waited := time.Since(start); waited > time.Second {
			t.Errorf("waited %s past a 50 ms bound", waited)
		}
	})
}
