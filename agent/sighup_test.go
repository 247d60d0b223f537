//go:build linux

package agent

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/privtest"
)

// SIGHUP under load: tunnels kept open through a live Trial carry a
// request after every one of several SIGHUPs, and every SIGHUP is a
// reload. A bad file is refused through 'trialnet reload' with its
// reason and through SIGHUP with a log line, and the agent goes on.
func TestPrivilegedReloadSIGHUPUnderLoad(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 236, "upstream.example.test")
	p := startAgentWithTrial(t, w, "agt-hup")
	target := fmt.Sprintf("upstream.example.test:%d", upstreamPort)
	type tun struct {
		c  interface{ SetDeadline(time.Time) error }
		rt func() error
	}
	var tunnels []tun
	for range 4 {
		conn, br := tunnelFrom(t, p.info, target)
		tunnels = append(tunnels, tun{conn, func() error {
			if _, err := fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: upstream.example.test\r\n\r\n"); err != nil {
				return err
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				return err
			}
			_ = resp.Body.Close()
			if resp.StatusCode != 200 {
				return fmt.Errorf("status %d", resp.StatusCode)
			}
			return nil
		}})
	}
	const hups = 5
	for i := range hups {
		if err := p.first.cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		for j, tn := range tunnels {
			_ = tn.c.SetDeadline(time.Now().Add(5 * time.Second))
			if err := tn.rt(); err != nil {
				t.Fatalf("after SIGHUP %d, tunnel %d: %v\n%s", i+1, j, err, p.first.stderr.String())
			}
		}
		// Each SIGHUP is followed by a reload; one that arrives while a
		// reload runs (a slow guest) is folded into the next, which
		// reads the file as it is then, so wait for this one's.
		waitLog(t, p.first, "config reloaded", i+1)
	}

	// A bad file: the caller of 'trialnet reload' gets the reason.
	cfgPath := p.args[1]
	good, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, append(good, []byte("allow_cidrs: [127.0.0.0/8]\n")...), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(p.bin, "reload", "--socket", p.c.Socket).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 || !strings.Contains(string(out), "reload refused, nothing changed") || !strings.Contains(string(out), "127.0.0.0/8") {
		t.Fatalf("trialnet reload with a bad file: %v\n%s", err, out)
	}
	_ = p.first.cmd.Process.Signal(syscall.SIGHUP)
	waitLog(t, p.first, "level=ERROR msg=reload signal=hangup", 1)
	for j, tn := range tunnels {
		if err := tn.rt(); err != nil {
			t.Fatalf("after the refused reload, tunnel %d: %v", j, err)
		}
	}
	if err := os.WriteFile(cfgPath, good, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(p.bin, "reload", "--socket", p.c.Socket, "-j").CombinedOutput(); err != nil || !strings.Contains(string(out), `"config":"`+filepath.Clean(cfgPath)) {
		t.Fatalf("trialnet reload with the good file again: %v\n%s", err, out)
	}
	if _, err := p.c.Destroy(context.Background(), p.info.ID); err != nil {
		t.Fatal(err)
	}
}

// waitLog waits until the agent's log holds s at least n times.
func waitLog(t *testing.T, p *agentProc, s string, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if strings.Count(p.stderr.String(), s) >= n {
			return
		}
	}
	t.Fatalf("the agent's log has %q %d times, want %d:\n%s", s, strings.Count(p.stderr.String(), s), n, p.stderr.String())
}
