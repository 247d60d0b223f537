//go:build linux

package agent

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/client"
	trialspec "github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/netns"
	"github.com/trialnet/trialnet/sandbox"
)

// tunnelFrom opens a CONNECT tunnel through a Trial's proxy from inside
// its namespace (the test plays the Trial's process).
func tunnelFrom(t *testing.T, info client.TrialInfo, target string) (net.Conn, *bufio.Reader) {
	t.Helper()
	ns, err := netns.Open(filepath.Dir(info.Netns), filepath.Base(info.Netns))
	if err != nil {
		t.Fatal(err)
	}
	var c net.Conn
	if err := ns.Do(func() (err error) { c, err = net.Dial("tcp", ProxyEndpoints[0].String()); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT %s: %v %v", target, resp, err)
	}
	return c, br
}

// SIGKILL mid-tunnel: the Trial's tunnel ends (it is never left open to
// anything else), and after a restart new tunnels work.
func TestPrivilegedFaultAgentKilledMidTunnel(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 227, "upstream.example.test")
	p := startAgentWithTrial(t, w, "agt-midtunnel")
	bin, args, c, first, info := p.bin, p.args, p.c, p.first, p.info
	conn, br := tunnelFrom(t, info, fmt.Sprintf("upstream.example.test:%d", upstreamPort))
	fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: upstream.example.test\r\n\r\n")
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("request through the tunnel: %v %v", resp, err)
	}
	_ = first.cmd.Process.Signal(syscall.SIGKILL)
	_ = first.cmd.Wait()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: upstream.example.test\r\n\r\n")
	if _, err := io.ReadAll(br); err != nil && strings.Contains(err.Error(), "timeout") {
		t.Fatalf("the tunnel hung after the agent died: %v", err)
	}
	second := runAgent(t, bin, args...)
	waitReady(t, c, second)
	conn2, br2 := tunnelFrom(t, info, fmt.Sprintf("upstream.example.test:%d", upstreamPort))
	fmt.Fprintf(conn2, "GET / HTTP/1.1\r\nHost: upstream.example.test\r\n\r\n")
	if resp, err := http.ReadResponse(br2, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("after the restart: %v %v", resp, err)
	}
	if _, err := c.Destroy(context.Background(), info.ID); err != nil {
		t.Fatal(err)
	}
}

// SIGKILL mid-create leaves a "creating" record and whatever was made
// (here a cgroup and a namespace); the next agent removes all of it.
func TestPrivilegedFaultKilledMidCreate(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 228)
	cfg := w.config(t)
	h, err := OpenHost(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	cg := filepath.Join(h.Parent, "agt-mid")
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	ns, err := netns.Create(cfg.Host.NetnsDir, "agt-mid")
	if err != nil {
		t.Fatal(err)
	}
	_ = h.Close()
	if err := os.WriteFile(filepath.Join(cfg.Host.StateDir, "agt-mid.json"), []byte(`{"phase":"creating","id":"agt-mid"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, cfg)
	if len(a.list()) != 0 {
		t.Fatalf("a half-made Trial was adopted: %v", a.list())
	}
	if _, err := os.Stat(cg); !os.IsNotExist(err) {
		t.Fatalf("its cgroup is still there: %v", err)
	}
	if _, err := os.Stat(ns.Path); !os.IsNotExist(err) {
		t.Fatalf("its namespace is still there: %v", err)
	}
	// The id is free again.
	if _, err := a.Create(context.Background(), trialspec.Request{ID: "agt-mid"}); err != nil {
		t.Fatal(err)
	}
}

// A Trial process that forks 1,000 children ignoring SIGTERM: destroy
// still ends every one of them and removes the cgroup.
func TestPrivilegedFaultForkBombIgnoringTERM(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 229)
	a := startAgent(t, w.config(t))
	info, err := a.Create(context.Background(), trialspec.Request{ID: "agt-forks"})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	go func() {
		close(started)
		tr, err := Attach(info)
		if err != nil {
			t.Error(err)
			return
		}
		_, _ = tr.Exec(context.Background(), sandbox.Command{
			Args: []string{"sh", "-c", `trap "" TERM; i=0; while [ $i -lt 1000 ]; do sleep 600 & i=$((i+1)); done; wait`},
			Env:  []string{"PATH=/usr/bin:/bin"}, UID: 65534, GID: 65534,
		}, nil)
	}()
	<-started
	// Generous: under emulation (the kernel matrix's TCG guests) a
	// thousand forks take a while.
	deadline := time.Now().Add(3 * time.Minute)
	for n := 0; n < 1000; n = countCgroupProcs(t, info.Cgroup) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d processes in the Trial after 3 minutes", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t0 := time.Now()
	if _, err := a.Destroy(context.Background(), info.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(info.Cgroup); !os.IsNotExist(err) {
		t.Fatalf("the cgroup is still there after destroy: %v", err)
	}
	t.Logf("destroyed a Trial with 1,000 processes ignoring SIGTERM in %v", time.Since(t0))
}

// countCgroupProcs is how many processes the cgroup at path cgroup holds.
func countCgroupProcs(t *testing.T, cgroup string) int {
	b, err := os.ReadFile(filepath.Join(cgroup, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

// A pin deleted under a running agent: the links still hold the programs,
// so enforcement and the agent go on.
func TestPrivilegedFaultPinDeleted(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 230, "upstream.example.test")
	cfg := w.config(t)
	a := startAgent(t, cfg)
	info, err := a.Create(context.Background(), trialspec.Request{ID: "agt-pin", Allow: []string{fmt.Sprintf("upstream.example.test:%d", upstreamPort)}})
	if err != nil {
		t.Fatal(err)
	}
	pins, _ := filepath.Glob(filepath.Join(cfg.Host.PinDir, "*"))
	if len(pins) == 0 {
		t.Fatal("no pins")
	}
	for _, p := range pins {
		if !strings.HasSuffix(p, "_map") {
			if err := os.Remove(p); err != nil { // a link's pin
				t.Fatal(err)
			}
			break
		}
	}
	if code, out := curl(t, a, info.ID, "--noproxy", "*", fmt.Sprintf("http://%s:%d/", w.host.Addr4, upstreamPort)); code == 0 {
		t.Fatalf("a direct connection succeeded after a pin was deleted: %s", out)
	}
	if code, out := through(t, a, info.ID, fmt.Sprintf("http://upstream.example.test:%d/", upstreamPort)); code != 0 {
		t.Fatalf("the proxy stopped working after a pin was deleted: %d %s", code, out)
	}
	if _, err := a.Create(context.Background(), trialspec.Request{ID: "agt-pin2"}); err != nil {
		t.Fatalf("create after a pin was deleted: %v", err)
	}
}

// A Trial that exhausts its tunnel limit gets a classified refusal.
func TestPrivilegedFaultTunnelLimit(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 231, "upstream.example.test")
	a := startAgent(t, w.config(t))
	target := fmt.Sprintf("upstream.example.test:%d", upstreamPort)
	info, err := a.Create(context.Background(), trialspec.Request{ID: "agt-limit", Allow: []string{target}, Limits: &trialspec.Limits{ProxyLimits: trialspec.ProxyLimits{MaxTunnels: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	tunnelFrom(t, info, target)
	tunnelFrom(t, info, target)
	if code, out := through(t, a, info.ID, "http://"+target+"/"); code == 0 || !strings.Contains(out, "429") {
		t.Fatalf("third tunnel: curl exit %d: %s", code, out)
	}
	// The refusal is counted as its record is written, after the answer.
	waitStats(t, a, info.ID, func(st client.Stats) bool { return st.Proxy.ByReason["tunnel_limit"] == 1 })
}

// bpffs unmounted under a running agent: the programs stay attached (the
// agent holds them) and the agent goes on. A new agent that cannot pin
// refuses to start, and once bpffs is back it starts, finds the old
// Trial's policy gone and removes the Trial rather than adopt it open.
func TestPrivilegedFaultBPFFSUnmounted(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 232, "upstream.example.test")
	cfg := w.config(t)
	mnt := t.TempDir()
	if err := syscall.Mount("bpf", mnt, "bpf", 0, "mode=0700"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(mnt, syscall.MNT_DETACH) })
	cfg.Host.PinDir = filepath.Join(mnt, "pins")
	// Before the unmount (cleanups run last first): the pins, and the
	// install lock file that goes with them.
	t.Cleanup(func() { _ = bpf.Uninstall(cfg.Host.PinDir) })
	a, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	target := fmt.Sprintf("upstream.example.test:%d", upstreamPort)
	info, err := a.Create(context.Background(), trialspec.Request{ID: "agt-bpffs", Allow: []string{target}})
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Unmount(mnt, syscall.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if code, _ := curl(t, a, info.ID, "--noproxy", "*", fmt.Sprintf("http://%s:%d/", w.host.Addr4, upstreamPort)); code == 0 {
		t.Fatal("a direct connection succeeded with bpffs unmounted")
	}
	if code, out := through(t, a, info.ID, "http://"+target+"/"); code != 0 {
		t.Fatalf("the proxy stopped with bpffs unmounted: %d %s", code, out)
	}
	if _, err := a.Create(context.Background(), trialspec.Request{ID: "agt-bpffs2"}); err != nil {
		t.Fatalf("create with bpffs unmounted: %v", err)
	}
	a.Close(false)

	if b, err := Start(cfg); err == nil {
		b.Close(true)
		t.Fatal("an agent started without bpffs under its pin directory")
	} else {
		t.Logf("without bpffs: %v", err)
	}
	if err := syscall.Mount("bpf", mnt, "bpf", 0, "mode=0700"); err != nil {
		t.Fatal(err)
	}
	b := startAgent(t, cfg)
	if l := b.list(); len(l) != 0 {
		t.Fatalf("Trials adopted without their policy: %v", l)
	}
	if _, err := os.Stat(info.Netns); !os.IsNotExist(err) {
		t.Fatalf("the unadoptable Trial's namespace is still there: %v", err)
	}
}
