//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testenv"
)

// agentUnderTest is a `trialnet agent` process on an isolated host of its
// own, configured through a file as a deployed one is.
type agentUnderTest struct {
	host   agent.Config
	config string
	sock   string
	log    string
	cmd    *exec.Cmd
}

func newAgentUnderTest(t *testing.T, name string) *agentUnderTest {
	t.Helper()
	dir := t.TempDir()
	a := &agentUnderTest{host: testenv.IsolatedHost(t, name), config: filepath.Join(dir, "trialnet.yaml"),
		sock: filepath.Join(dir, "agent.sock"), log: filepath.Join(dir, "agent.log")}
	// No resolver answers: nothing a Trial asks for leaves this machine.
	yaml := fmt.Sprintf("resolvers: [\"127.0.0.1:9\"]\npaths:\n  socket: %s\n  state_dir: %s\n  data_dir: %s\n  pin_dir: %s\n  netns_dir: %s\n  cgroup_parent: %s\n",
		a.sock, a.host.StateDir, filepath.Join(dir, "data"), a.host.PinDir, a.host.NetnsDir, a.host.Parent)
	if err := os.WriteFile(a.config, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return a
}

// start starts the agent through wrapper and waits until trialnet health
// says it is ready.
func (a *agentUnderTest) start(t *testing.T, wrapper ...string) {
	t.Helper()
	a.cmd = wrappedTrialnet(t, wrapper, "agent", "--config", a.config)
	log, err := os.OpenFile(a.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	a.cmd.Stdout, a.cmd.Stderr = log, log
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if code, _, _ := trialnet("health", "--socket", a.sock, "--timeout", "1s"); code == exitOK {
			return
		}
		if time.Now().After(end) || exited(a.cmd.Process.Pid) {
			b, _ := os.ReadFile(a.log)
			t.Fatalf("the agent did not become ready:\n%s", b)
		}
	}
}

// stop ends the agent with sig and waits for it.
func (a *agentUnderTest) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := a.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	err := a.cmd.Wait()
	if sig == syscall.SIGTERM && err != nil {
		b, _ := os.ReadFile(a.log)
		t.Fatalf("agent after SIGTERM: %v\n%s", err, b)
	}
}

// exited reports whether the child pid has exited (a zombie not yet
// reaped, or gone).
func exited(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) == 0 || f[0] == "Z"
}

// trialnet health against a real agent process: ready, then unready once
// a link pin is gone (alive all the same), then, the agent SIGKILLed, the
// socket file it leaves behind is recognised as nobody's.
func TestPrivilegedHealthOfARunningAgent(t *testing.T) {
	privtest.Require(t)
	a := newAgentUnderTest(t, "health")
	a.start(t)
	code, out, errOut := trialnet("health", "--socket", a.sock, "-j")
	var h agent.Health
	if code != exitOK || json.Unmarshal([]byte(out), &h) != nil || !h.OK || h.EBPF != "attached" || h.Agent != "serving" || !h.Layers.CgroupEBPF {
		t.Fatalf("health -j of a ready agent: exit %d, %q %q", code, out, errOut)
	}
	pins, _ := filepath.Glob(filepath.Join(a.host.PinDir, "link_*"))
	if len(pins) == 0 {
		t.Fatal("the agent pinned no links")
	}
	if err := os.Remove(pins[0]); err != nil {
		t.Fatal(err)
	}
	if code, out, _ := trialnet("health", "--socket", a.sock); code != exitFailure || !strings.Contains(out, "is not ready: its eBPF links are not all pinned") {
		t.Errorf("health with a link pin gone: exit %d, %q", code, out)
	}
	if code, out, _ := trialnet("health", "--socket", a.sock, "--live"); code != exitOK {
		t.Errorf("health --live of an agent that answers: exit %d, %q", code, out)
	}
	a.stop(t, syscall.SIGKILL)
	if _, err := os.Stat(a.sock); err != nil {
		t.Fatalf("the killed agent left no socket, so the test shows nothing: %v", err)
	}
	for _, args := range [][]string{{}, {"--live"}} {
		code, out, errOut := trialnet(append([]string{"health", "--socket", a.sock}, args...)...)
		if code != exitFailure || !strings.Contains(out+errOut, "left over from an agent that is gone") {
			t.Errorf("health %v after SIGKILL: exit %d, %q %q", args, code, out, errOut)
		}
	}
}
