//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/netns"
)

// dialEndpointIn connects to the Trial's proxy endpoint from inside the
// namespace held open by ns, and says how that went.
func dialEndpointIn(ns *os.File) error {
	return netns.Do(fmt.Sprintf("/proc/self/fd/%d", ns.Fd()), func() error {
		c, err := net.DialTimeout("tcp", agent.ProxyEndpoints[0].String(), 2*time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err
	})
}

// A run through the agent that is killed outright cannot tear its Trial
// down; the agent does, because the run owns it: its namespace, cgroup,
// record and proxy listener go, and the agent's log says why.
func TestPrivilegedRunThroughAgentKilledIsRemoved(t *testing.T) {
	privtest.Require(t)
	privtest.RequireKernel(t, agent.HavePeerPidfd())
	dir := t.TempDir()
	host := testenv.IsolatedHost(t, "owner")
	var log privtest.SyncBuffer
	a, err := agent.Start(agent.AgentConfig{Host: host, DataDir: filepath.Join(dir, "data"), Resolvers: []string{"127.0.0.1:9"},
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(true) })
	sock := filepath.Join(dir, "agent.sock")
	ln, err := agent.ListenSocket(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := a.Server()
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	cmd := trialnetProcess(t, "run", "--socket", sock, "--uid", "65534", "--", "sleep", "60")
	var errOut privtest.SyncBuffer
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var info client.TrialInfo
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if l, _ := a.List(context.Background()); len(l) == 1 {
			info = l[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run's Trial did not appear in the agent:\n%s", errOut.String())
		}
	}
	if info.Owner == nil || info.Owner.PID != cmd.Process.Pid {
		t.Fatalf("the run's Trial has owner %+v, want the run, pid %d", info.Owner, cmd.Process.Pid)
	}
	// Held open, the namespace outlives its removal: the proxy listener
	// inside it can be looked for afterwards.
	ns, err := os.Open(info.Netns)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := dialEndpointIn(ns); err != nil {
		t.Fatalf("the Trial's proxy endpoint does not answer while the run lives: %v", err)
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	record := filepath.Join(host.StateDir, info.ID+".json")
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var left []string
		if l, _ := a.List(context.Background()); len(l) > 0 {
			left = append(left, "listed by the agent")
		}
		for _, p := range []string{info.Netns, info.Cgroup, record} {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("15 s after its run was killed, the Trial is still there: %s\n%s", strings.Join(left, ", "), log.String())
		}
	}
	if err := dialEndpointIn(ns); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("the removed Trial's proxy endpoint: %v, want connection refused (its listener closed)", err)
	}
	if want := fmt.Sprintf("owner pid %d exited", cmd.Process.Pid); !strings.Contains(log.String(), want) {
		t.Errorf("the agent's log does not say %q:\n%s", want, log.String())
	}
}
