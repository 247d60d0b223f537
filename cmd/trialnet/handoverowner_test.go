//go:build linux

package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/rootdir"
)

// An owned Trial whose owner exits while a hand-over is under way fails
// nothing: the running agent holds the destroy its watch began, the new
// agent adopts the Trial all the same, takes over, and destroys it. Any
// Trial ending at that moment (a container's Trial ends when its init
// does, which the container decides) used to fail the whole hand-over:
// the new agent refused to adopt a Trial the old one served.
//
// The new agent is held at its start by the pin directory's install
// lock, which it takes after it has the offer (the old agent holds its
// calls from then on) and before it adopts: the owner exits in between.
func TestPrivilegedAgentHandoverOwnerExits(t *testing.T) {
	privtest.Require(t)
	privtest.RequireKernel(t, agent.HavePeerPidfd())
	a := newAgentUnderTest(t, "ho-owner")
	a.start(t)
	oldPID := a.cmd.Process.Pid
	run := trialnetProcess(t, "run", "--socket", a.sock, "--id", "ho-owned", "--uid", "65534", "--", "sleep", "600")
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	c := client.NewClient(a.sock)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if info, err := c.Get(context.Background(), "ho-owned"); err == nil && info.Owner != nil && info.Owner.PID == run.Process.Pid {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the run's Trial did not appear in the agent")
		}
	}

	pins := "install-" + strings.ReplaceAll(strings.Trim(filepath.Clean(a.host.PinDir), "/"), "/", "_") + ".lock"
	lock, err := rootdir.OpenLock(rootdir.Locks, pins)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	next := wrappedTrialnet(t, nil, "agent", "--config", a.config)
	log, err := os.OpenFile(a.log, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	next.Stdout, next.Stderr = log, log
	err = next.Start()
	_ = log.Close()
	if err != nil {
		t.Fatal(err)
	}
	// It has the offer once it holds one of the old agent's sockets.
	for deadline := time.Now().Add(30 * time.Second); !sharesSocket(oldPID, next.Process.Pid); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) || exited(next.Process.Pid) {
			t.Fatalf("the new agent took no listener over:\n%s", a.events())
		}
	}
	_ = run.Process.Kill()
	_ = run.Wait()
	_ = lock.Close() // the new agent adopts now

	for deadline := time.Now().Add(60 * time.Second); agentPID(t, a.sock) != next.Process.Pid; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) || exited(next.Process.Pid) {
			t.Fatalf("the hand-over failed when a Trial's owner exited during it:\n%s", a.events())
		}
	}
	a.cmd = next
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := c.Get(context.Background(), "ho-owned"); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Trial whose owner exited is still live on the new agent:\n%s", a.events())
		}
	}
	_ = next.Process.Signal(syscall.SIGTERM)
}

// sharesSocket reports whether process b holds a socket that process a
// holds too (one passed to it with SCM_RIGHTS).
func sharesSocket(a, b int) bool {
	held := map[string]bool{}
	for _, pid := range []int{a, b} {
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			l, err := os.Readlink(filepath.Join(dir, e.Name()))
			if err != nil || !strings.HasPrefix(l, "socket:") {
				continue
			}
			if pid == b && held[l] {
				return true
			}
			if pid == a {
				held[l] = true
			}
		}
	}
	return false
}
