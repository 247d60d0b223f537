//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/sandbox"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/keeper"
	"golang.org/x/sys/unix"
)

// agentUnderTest is a `trialnet agent` process on an isolated host of its
// own, configured through a file as a deployed one is.
type agentUnderTest struct {
	host   agent.Config
	config string
	sock   string
	log    string
	data   string
	cmd    *exec.Cmd
}

func newAgentUnderTest(t testing.TB, name string) *agentUnderTest {
	// No resolver answers: nothing a Trial asks for leaves this machine.
	return newAgentWithConfig(t, name, `resolvers: ["127.0.0.1:9"]`+"\n")
}

// newAgentWithConfig is newAgentUnderTest with yaml (resolvers, limits,
// ...) before the paths. The keeper its agents start is stopped when
// the test ends.
func newAgentWithConfig(t testing.TB, name, yaml string) *agentUnderTest {
	t.Helper()
	dir := t.TempDir()
	a := &agentUnderTest{host: testenv.IsolatedHost(t, name), config: filepath.Join(dir, "trialnet.yaml"),
		sock: filepath.Join(dir, "agent.sock"), log: filepath.Join(dir, "agent.log"), data: filepath.Join(dir, "data")}
	yaml += fmt.Sprintf("paths:\n  socket: %s\n  state_dir: %s\n  data_dir: %s\n  pin_dir: %s\n  netns_dir: %s\n  cgroup_parent: %s\n",
		a.sock, a.host.StateDir, a.data, a.host.PinDir, a.host.NetnsDir, a.host.Parent)
	if err := os.WriteFile(a.config, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := keeper.Stop(keeper.DefaultSocket(a.sock)); err != nil {
			t.Errorf("stop the keeper: %v", err)
		}
	})
	return a
}

// start starts the agent through wrapper and waits until trialnet health
// says it is ready.
func (a *agentUnderTest) start(t testing.TB, wrapper ...string) {
	t.Helper()
	a.startCmd(t, wrappedTrialnet(t, wrapper, "agent", "--config", a.config))
}

// startCmd starts the agent as cmd and waits until trialnet health says
// it is ready.
func (a *agentUnderTest) startCmd(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	a.cmd = cmd
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
func (a *agentUnderTest) stop(t testing.TB, sig syscall.Signal) {
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
	// Out of the OOM killer's way (a Trial's processes take 1000), or,
	// where this root lacks CAP_SYS_RESOURCE (these machines), saying
	// that it could not be.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/oom_score_adj", a.cmd.Process.Pid))
	logged, _ := os.ReadFile(a.log)
	if lowered := err == nil && strings.TrimSpace(string(b)) == strconv.Itoa(agent.AgentOOMScoreAdj); lowered != (effectiveCaps(t, os.Getpid())&(1<<unix.CAP_SYS_RESOURCE) != 0) ||
		!lowered && !strings.Contains(string(logged), "could not lower the agent's OOM score") {
		t.Errorf("the agent's oom_score_adj: %q %v (want %d where root has CAP_SYS_RESOURCE, else a warning)\nagent log:\n%s", b, err, agent.AgentOOMScoreAdj, logged)
	}
	code, out, errOut := trialnet("health", "--socket", a.sock, "-j")
	var h client.Health
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

// unitCapabilities is the bounding set deploy/trialnet.service gives the
// agent.
func unitCapabilities(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "trialnet.service"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CapabilityBoundingSet=(.*)$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("trialnet.service has no CapabilityBoundingSet=")
	}
	return strings.Fields(string(m[1]))
}

// capBits numbers the capabilities the unit may name; a test that meets
// another fails, asking for it here.
var capBits = map[string]uint{
	"CAP_SYS_ADMIN":        unix.CAP_SYS_ADMIN,
	"CAP_NET_ADMIN":        unix.CAP_NET_ADMIN,
	"CAP_BPF":              unix.CAP_BPF,
	"CAP_PERFMON":          unix.CAP_PERFMON,
	"CAP_DAC_READ_SEARCH":  unix.CAP_DAC_READ_SEARCH,
	"CAP_SYS_CHROOT":       unix.CAP_SYS_CHROOT,
	"CAP_NET_BIND_SERVICE": unix.CAP_NET_BIND_SERVICE,
}

// effectiveCaps is the CapEff mask of process pid.
func effectiveCaps(t *testing.T, pid int) uint64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CapEff:\s*([0-9a-f]+)$`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no CapEff in /proc/%d/status", pid)
	}
	v, err := strconv.ParseUint(string(m[1]), 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The agent does all its work with no capability but those of the systemd
// unit's bounding set (the Kubernetes manifest lists the same): it makes,
// serves, counts, changes and destroys Trials, commands run in them, a
// Trial with a process in it is torn down, the config is reloaded, and a
// restarted agent re-adopts what the last one left.
func TestPrivilegedAgentWorksWithTheUnitsCapabilities(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "setpriv")
	privtest.RequireTool(t, "curl")
	caps := unitCapabilities(t)
	wrapper, want := capsWrapper(t, caps)
	// What the unit's ExecStartPre does with full privileges.
	if err := sandbox.PreparePools(); err != nil {
		t.Fatal(err)
	}
	a := newAgentUnderTest(t, "caps")
	a.start(t, wrapper...)
	if got := effectiveCaps(t, a.cmd.Process.Pid); got != want {
		t.Fatalf("the agent runs with capabilities %#x, want the unit's %v (%#x): the test would show nothing", got, caps, want)
	}
	sock := []string{"--socket", a.sock}
	run := func(args ...string) string {
		t.Helper()
		code, out, errOut := trialnet(append(args[:1:1], append(sock, args[1:]...)...)...)
		if code != exitOK {
			b, _ := os.ReadFile(a.log)
			t.Fatalf("trialnet %v: exit %d, %q %q\nagent log:\n%s", args, code, out, errOut, b)
		}
		return out
	}
	// An allowed unix socket: its identity is recorded at create.
	unixSock := filepath.Join(t.TempDir(), "allowed.sock")
	ul, err := net.Listen("unix", unixSock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ul.Close() })

	run("create", "--id", "caps-1", "--allow", "allowed.example.test:443", "--unix-allow", unixSock)
	run("exec", "--trial", "caps-1", "--uid", "65534", "--", "sh", "-c", "curl -sS --max-time 5 https://refused.example.test/ 2>/dev/null; exit 0")
	// The proxy writes the record after it has answered: curl, and exec
	// with it, may end first.
	var recs []record.Event
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		out := run("audit", "--trial", "caps-1", "-j")
		recs = nil
		if json.Unmarshal([]byte(out), &recs) == nil && len(recs) == 1 && recs[0].Reason == record.ReasonPolicyDenied {
			break
		}
		if len(recs) > 1 || time.Now().After(end) {
			t.Fatalf("audit after a refused CONNECT: %s", out)
		}
	}
	if out := run("stats", "--trial", "caps-1"); !strings.Contains(out, "0 direct egress packets") {
		t.Fatalf("stats: %s", out)
	}
	run("allow", "--trial", "caps-1", "more.example.test:443")
	run("deny", "--trial", "caps-1", "--cut", "more.example.test:443")
	run("reload")

	// A Trial torn down with a process in it.
	var info client.TrialInfo
	if err := json.Unmarshal([]byte(run("create", "--id", "caps-2", "-j")), &info); err != nil {
		t.Fatal(err)
	}
	sleeper := trialnetProcess(t, "exec", "--socket", a.sock, "--trial", "caps-2", "--uid", "65534", "--", "sleep", "300")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if procs, _ := os.ReadFile(filepath.Join(info.Cgroup, "cgroup.procs")); len(bytes.Fields(procs)) >= 2 {
			break // the Trial's init and the sleep
		}
		if time.Now().After(end) {
			t.Fatal("the command did not start in the Trial")
		}
	}
	run("destroy", "caps-2")
	done := make(chan error, 1)
	go func() { done <- sleeper.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the Trial's command outlived its Trial")
	}
	if _, err := os.Stat(info.Cgroup); !os.IsNotExist(err) {
		t.Errorf("the destroyed Trial's cgroup is still there: %v", err)
	}

	a.stop(t, syscall.SIGTERM)
	a.start(t, wrapper...)
	if out := run("list"); !strings.Contains(out, "caps-1") {
		t.Fatalf("the restarted agent did not re-adopt caps-1: %s", out)
	}
	run("exec", "--trial", "caps-1", "--uid", "65534", "--", "true")
	run("destroy", "caps-1")
	a.stop(t, syscall.SIGTERM)
}

// capsWrapper is the command prefix that runs a program with no
// capability but caps (its bounding set, nothing inherited: what a root
// process execs then has), and the CapEff mask it will have.
func capsWrapper(t *testing.T, caps []string) ([]string, uint64) {
	t.Helper()
	bounding, mask := "-all", uint64(0)
	for _, c := range caps {
		bit, ok := capBits[c]
		if !ok {
			t.Fatalf("trialnet.service names %s: add it to capBits", c)
		}
		mask |= 1 << bit
		bounding += ",+" + strings.ToLower(strings.TrimPrefix(c, "CAP_"))
	}
	return []string{"setpriv", "--bounding-set=" + bounding, "--inh-caps=-all", "--ambient-caps=-all", "--"}, mask
}

// An agent run without CAP_NET_BIND_SERVICE (a unit file from before
// transparent mode) cannot bind a Trial's DNS stub: its create says so and
// what to do, leaves nothing behind, and --no-transparent still works.
func TestPrivilegedAgentWithoutBindServiceSaysSo(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "setpriv")
	if err := sandbox.PreparePools(); err != nil {
		t.Fatal(err)
	}
	var caps []string
	for _, c := range unitCapabilities(t) {
		if c != "CAP_NET_BIND_SERVICE" {
			caps = append(caps, c)
		}
	}
	wrapper, want := capsWrapper(t, caps)
	a := newAgentUnderTest(t, "nobind")
	a.start(t, wrapper...)
	if got := effectiveCaps(t, a.cmd.Process.Pid); got != want {
		t.Fatalf("the agent runs with capabilities %#x, want %#x: the test would show nothing", got, want)
	}
	code, _, errOut := trialnet("create", "--socket", a.sock, "--id", "nobind-1")
	if code == exitOK || !strings.Contains(errOut, "CAP_NET_BIND_SERVICE") || !strings.Contains(errOut, "--no-transparent") {
		t.Errorf("create without CAP_NET_BIND_SERVICE: exit %d, %q; want a refusal naming the capability and --no-transparent", code, errOut)
	}
	if code, out, _ := trialnet("list", "--socket", a.sock); code != exitOK || strings.Contains(out, "nobind-1") {
		t.Errorf("after the refused create, list: exit %d, %q; want no nobind-1", code, out)
	}
	if code, out, errOut := trialnet("create", "--socket", a.sock, "--id", "nobind-2", "--no-transparent"); code != exitOK {
		t.Errorf("create --no-transparent without CAP_NET_BIND_SERVICE: exit %d, %q %q", code, out, errOut)
	}
	if code, _, errOut := trialnet("destroy", "--socket", a.sock, "nobind-2"); code != exitOK {
		t.Errorf("destroy nobind-2: exit %d, %q", code, errOut)
	}
	a.stop(t, syscall.SIGTERM)
}
