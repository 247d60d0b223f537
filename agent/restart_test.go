//go:build linux

package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/keeper"
	trialspec "github.com/trialnet/trialnet/trial"
)

// agentProc is a `trialnet agent` process of the test's own.
type agentProc struct {
	cmd    *exec.Cmd
	stderr lockedBuffer
}

// lockedBuffer is the agent's log, read by the test while it is written.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func runAgent(t *testing.T, bin string, args ...string) *agentProc {
	t.Helper()
	p := &agentProc{cmd: exec.Command(bin, append([]string{"agent"}, args...)...)}
	p.cmd.Stderr = &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			_ = p.cmd.Wait()
		}
	})
	return p
}

func waitReady(t *testing.T, c *client.Client, p *agentProc) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := c.List(context.Background()); err == nil {
			return
		}
	}
	t.Fatalf("agent did not answer on %s:\n%s", c.Socket, p.stderr.String())
}

// waitAllowed waits until the Trial's proxy counted n allowed tunnels.
func waitAllowed(t *testing.T, c *client.Client, id string, n uint64) client.Stats {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := c.Stats(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if st.Proxy.Allowed == n {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("the proxy counted %d allowed tunnels, want %d", st.Proxy.Allowed, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// agentCmd is a trialnet agent's command line with paths of the test's
// own: its isolated host's (host), and a socket, state and data
// directory.
type agentCmd struct {
	bin               string
	args              []string // the agent's arguments, to start it (again)
	c                 *client.Client
	host              Config
	sock, state, data string
}

// newAgentCmd builds trialnet and writes the agent's config: those
// paths, then more (YAML at the top level). The keeper its agents start
// ends with the test.
func newAgentCmd(t *testing.T, w *world, more string) agentCmd {
	t.Helper()
	// The kernel matrix builds trialnet on the host for its guests.
	bin := os.Getenv("TRIALNET_TEST_BIN")
	if bin == "" {
		bin = filepath.Join(t.TempDir(), "trialnet")
		testkit.BuildTrialnet(t, "..", bin)
	}
	dir := t.TempDir()
	a := agentCmd{bin: bin, host: isolatedHost(t), sock: filepath.Join(dir, "agent.sock"), state: filepath.Join(dir, "state"), data: filepath.Join(dir, "data")}
	cfg := filepath.Join(dir, "trialnet.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("paths:\n  socket: %s\n  state_dir: %s\n  data_dir: %s\n  pin_dir: %s\n  netns_dir: %s\n  cgroup_parent: %s\n%s",
		a.sock, a.state, a.data, a.host.PinDir, a.host.NetnsDir, a.host.Parent, more)), 0o600); err != nil {
		t.Fatal(err)
	}
	a.args = []string{"--config", cfg, "--resolver", w.dnsAddr, "--allow-cidr", "198.18.0.0/15"}
	a.c = client.NewClient(a.sock)
	t.Cleanup(func() {
		if err := keeper.Stop(keeper.DefaultSocket(a.sock)); err != nil {
			t.Errorf("stop the keeper: %v", err)
		}
	})
	return a
}

// agentWithTrial is a trialnet agent process with one Trial, allowed
// to reach upstream.example.test.
type agentWithTrial struct {
	agentCmd
	first *agentProc
	info  client.TrialInfo
}

// startAgentWithTrial builds trialnet, starts its agent with isolated
// paths and creates Trial id through it.
func startAgentWithTrial(t *testing.T, w *world, id string) agentWithTrial {
	t.Helper()
	p := agentWithTrial{agentCmd: newAgentCmd(t, w, "")}
	p.first = runAgent(t, p.bin, p.args...)
	waitReady(t, p.c, p.first)
	var err error
	if p.info, err = p.c.Create(context.Background(), trialspec.Request{ID: id, Allow: []string{fmt.Sprintf("upstream.example.test:%d", upstreamPort)}}); err != nil {
		t.Fatal(err)
	}
	return p // the isolated host's cleanup (uninstall --force) removes the Trial
}

// SIGKILL the agent with a Trial live: in the gap the Trial stays
// enforced (direct connections fail), and a CONNECT to its proxy port
// waits (the keeper holds the listener) and is served once the restarted
// agent has re-adopted the Trial; the kernel counters continued.
func TestPrivilegedAgentRestartReadopts(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 224, "upstream.example.test")
	p := startAgentWithTrial(t, w, "agt-restart")
	bin, args, c, first, info := p.bin, p.args, p.c, p.first, p.info
	url := fmt.Sprintf("http://upstream.example.test:%d/", upstreamPort)
	direct := fmt.Sprintf("http://%s:%d/", w.host.Addr4, upstreamPort)
	if code, _ := curlIn(t, info, "--proxytunnel", url); code != 0 {
		t.Fatalf("before the restart: curl exit %d", code)
	}
	before := waitAllowed(t, c, info.ID, 1) // the tunnel's event is written when it closes
	// The DNS stub's counts are the Trial's: they go on past the kill.
	if _, rcode := stubLookup(t, info.Netns, "udp", "off.example.test"); rcode != dns.RcodeNameError {
		t.Fatalf("an off-list name: rcode %d, want NXDOMAIN", rcode)
	}
	if addr, _ := stubLookup(t, info.Netns, "udp", "upstream.example.test"); !addr.IsValid() {
		t.Fatal("the stub gave no address for an allowed name")
	}

	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.cmd.Wait()
	if code, _ := curlIn(t, info, "--noproxy", "*", direct); code == 0 {
		t.Fatal("a direct connection succeeded while the agent was dead")
	}
	waited := make(chan int, 1)
	go func() {
		code, _ := curlIn(t, info, "--proxytunnel", "--max-time", "15", url)
		waited <- code
	}()
	if _, err := c.List(context.Background()); err == nil || !strings.Contains(err.Error(), "no trialnet agent is running") {
		t.Fatalf("client with no agent: %v", err)
	}
	time.Sleep(time.Second) // the CONNECT waits meanwhile

	second := runAgent(t, bin, args...)
	waitReady(t, c, second)
	if code := <-waited; code != 0 {
		t.Fatalf("a CONNECT made while no agent ran: curl exit %d, want 0 (it waits, then is served)\n%s", code, second.stderr.String())
	}
	list, err := c.List(context.Background())
	if err != nil || len(list) != 1 || list[0].ID != info.ID {
		t.Fatalf("after restart: %v %v\n%s", list, err, second.stderr.String())
	}
	if code, _ := curlIn(t, info, "--proxytunnel", url); code != 0 {
		t.Fatalf("after the restart: curl exit %d\n%s", code, second.stderr.String())
	}
	after := waitAllowed(t, c, info.ID, 3)
	for _, k := range []string{"connect4_allowed", "connect4_denied", "egress_loopback_packets"} {
		if after.Kernel[k] <= before.Kernel[k] {
			t.Errorf("kernel counter %s went %d -> %d: it should have continued and grown", k, before.Kernel[k], after.Kernel[k])
		}
	}
	if after.Egress != 0 {
		t.Fatalf("direct egress packets %d", after.Egress)
	}
	// The proxy's counters continued too (rebuilt from the decision log).
	if after.Proxy.BytesDown <= before.Proxy.BytesDown {
		t.Errorf("proxy bytes went %d -> %d: they should have continued", before.Proxy.BytesDown, after.Proxy.BytesDown)
	}
	if _, rcode := stubLookup(t, info.Netns, "tcp", "other.example.test"); rcode != dns.RcodeNameError {
		t.Fatalf("an off-list name after the restart: rcode %d, want NXDOMAIN", rcode)
	}
	st, err := c.Stats(context.Background(), info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d := st.DNS; d == nil || d.Denied != 2 || d.NXDomain != 2 || d.Answered != 1 || d.Names != 1 {
		t.Fatalf("the stub's counts after the restart: %+v, want 2 denied and NXDOMAIN, 1 answered: one of each before the kill, a denial after", d)
	}
	if _, err := c.Destroy(context.Background(), info.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(p.state, info.ID+".dnscounts")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the Trial's DNS counts file outlived it: %v", err)
	}
	_ = second.cmd.Process.Signal(syscall.SIGTERM)
	if err := second.cmd.Wait(); err != nil {
		t.Fatalf("agent exit: %v\n%s", err, second.stderr.String())
	}
}

// A restarted agent re-adopts healthy Trials and removes the rest: one
// whose cgroup disappeared and one that was still being created.
func TestPrivilegedReadoptCleansUp(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 226)
	cfg := w.config(t)
	a, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"agt-keep", "agt-gone"} {
		if _, err := a.Create(context.Background(), trialspec.Request{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	gone, _ := a.Get(context.Background(), "agt-gone")
	a.Close(false) // Trials stay enforced
	if err := os.Remove(gone.Cgroup); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfg.Host.StateDir, "agt-half.json"), []byte(`{"phase":"creating","id":"agt-half"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	b := startAgent(t, cfg)
	list := b.list()
	if len(list) != 1 || list[0].ID != "agt-keep" {
		t.Fatalf("re-adopted %v, want only agt-keep", list)
	}
	if _, err := os.Stat(gone.Netns); !os.IsNotExist(err) {
		t.Fatalf("the namespace of the Trial whose cgroup vanished is still there: %v", err)
	}
	if b.host.BPF.HasTrial(gone.CgroupID) {
		t.Fatal("the vanished Trial's policy entry is still there")
	}
	for _, id := range []string{"agt-gone", "agt-half"} {
		if _, err := os.Stat(filepath.Join(cfg.Host.StateDir, id+".json")); !os.IsNotExist(err) {
			t.Fatalf("state of %s left: %v", id, err)
		}
	}
	if n := b.host.BPF.TrialCount(); n != 1 {
		t.Fatalf("%d policy entries, want 1", n)
	}
}
