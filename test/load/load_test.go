//go:build linux

// Package load runs trialnet under load, bounded in time: 100 Trials,
// each with 20 concurrent tunnels moving checksummed data for 30 s, then
// all destroyed, with nothing left behind.
package load

import (
	"bufio"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/internal/testhost"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/keeper"
	"github.com/trialnet/trialnet/netns"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/trial"
)

const (
	trials   = 100
	tunnels  = 20 // per Trial
	duration = 30 * time.Second
	echoPort = 9100
	name     = "upstream.load.test"
)

func fds(pid int) int {
	e, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	return len(e)
}

// settledFDs is pid's descriptor count once it has held for half a
// second (at most 10 s): an agent fills its pool of Trial shells (their
// namespaces and sockets) just after it starts and again after creates,
// so a count taken mid-refill is no baseline.
func settledFDs(pid int) int {
	n := fds(pid)
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); {
		time.Sleep(500 * time.Millisecond)
		m := fds(pid)
		if m == n {
			break
		}
		n = m
	}
	return n
}

func TestPrivilegedLoad(t *testing.T) {
	privtest.Require(t)
	th := testhost.NewT(t, 241)
	ln, err := th.NS.Listen(context.Background(), "tcp", netip.AddrPortFrom(th.Addr4, echoPort).String())
	if err != nil {
		t.Fatal(err)
	}
	var upWG sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); upWG.Wait() })
	upWG.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			upWG.Go(func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
				_ = c.(*net.TCPConn).CloseWrite()
			})
		}
	})
	dnsAddr, stopDNS, err := testhost.ServeDNS(th.Addr4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopDNS)
	// The agent runs as its own process, as in production: its
	// descriptors (six per tunnel) and memory are its own to measure.
	host := testenv.IsolatedHost(t, "load")
	dir := t.TempDir()
	bin := filepath.Join(dir, "trialnet")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/trialnet").CombinedOutput(); err != nil {
		t.Fatalf("build trialnet: %v\n%s", err, out)
	}
	sock := filepath.Join(dir, "agent.sock")
	cfgFile := filepath.Join(dir, "trialnet.yaml")
	if err := os.WriteFile(cfgFile, []byte(fmt.Sprintf("paths:\n  socket: %s\n  state_dir: %s/state\n  data_dir: %s/data\n  pin_dir: %s\n  netns_dir: %s\n  cgroup_parent: %s\n",
		sock, dir, dir, host.PinDir, host.NetnsDir, host.Parent)), 0o600); err != nil {
		t.Fatal(err)
	}
	var agentErr privtest.SyncBuffer // read while the agent writes it
	proc := exec.Command(bin, "agent", "--config", cfgFile, "--resolver", dnsAddr, "--allow-cidr", "198.18.0.0/15", "--teardown-on-exit")
	proc.Stderr = &agentErr
	if err := proc.Start(); err != nil {
		t.Fatal(err)
	}
	// --teardown-on-exit: a test that fails half-way still leaves no Trial
	// (and the agent's keeper quits with it; a killed agent's is stopped).
	t.Cleanup(func() {
		_ = proc.Process.Signal(syscall.SIGTERM)
		_ = proc.Wait()
		_ = keeper.Stop(keeper.DefaultSocket(sock))
	})
	a := client.NewClient(sock)
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := a.List(context.Background()); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent did not start: %s", agentErr.String())
		}
	}
	pid := proc.Process.Pid

	fd0, mem0 := settledFDs(pid), testkit.RSSBytes(pid)
	target := fmt.Sprintf("%s:%d", name, echoPort)
	var infos []client.TrialInfo
	for i := range trials {
		info, err := a.Create(context.Background(), trial.Request{ID: "load-" + strconv.Itoa(i), Allow: []string{target}})
		if err != nil {
			t.Fatal(err)
		}
		infos = append(infos, info)
	}
	deadline := time.Now().Add(duration)
	var moved atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, trials*tunnels)
	for i, info := range infos {
		ns, err := netns.Open(filepath.Dir(info.Netns), filepath.Base(info.Netns))
		if err != nil {
			t.Fatal(err)
		}
		for j := range tunnels {
			wg.Go(func() {
				n, err := tunnel(ns, target, uint64(i*tunnels+j), deadline)
				moved.Add(n)
				if err != nil {
					errs <- fmt.Errorf("Trial %s tunnel %d: %w", info.ID, j, err)
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	memPeak := testkit.RSSBytes(pid)
	for _, info := range infos {
		st, err := a.Destroy(context.Background(), info.ID)
		if err != nil {
			t.Fatal(err)
		}
		if recs, _ := a.Audit(context.Background(), info.ID); len(recs) > 0 { // kept after destroy
			for _, r := range recs {
				if strings.Contains(r.Detail, "tunnel cut") || r.Decision == record.DecisionDeny {
					t.Errorf("%s: %+v", info.ID, r)
				}
			}
		}
		if st.Egress != 0 || st.Proxy.Allowed != tunnels {
			t.Errorf("%s: direct egress %d, tunnels allowed %d", info.ID, st.Egress, st.Proxy.Allowed)
		}
	}
	t.Logf("%d Trials x %d tunnels for %v: %d MiB checksummed each way; agent RSS %d MiB before, %d MiB under load",
		trials, tunnels, duration, moved.Load()>>20, mem0>>20, memPeak>>20)

	if n, _ := netns.List(host.NetnsDir); len(n) != 0 {
		t.Errorf("namespaces left: %v", n)
	}
	entries, _ := os.ReadDir(host.Parent)
	for _, e := range entries {
		if e.IsDir() {
			t.Errorf("cgroup left: %s", e.Name())
		}
	}
	settle := time.Now().Add(10 * time.Second)
	for (fds(pid) > fd0 || testkit.RSSBytes(pid) > mem0+16<<20) && time.Now().Before(settle) {
		time.Sleep(100 * time.Millisecond)
	}
	if n := fds(pid); n > fd0 {
		t.Errorf("agent file descriptors: %d before, %d after", fd0, n)
	}
	if mem := testkit.RSSBytes(pid); mem > mem0+16<<20 {
		t.Errorf("agent RSS %d MiB after, %d MiB before: not back near the start", mem>>20, mem0>>20)
	} else {
		t.Logf("agent RSS back to %d MiB", mem>>20)
	}
	if n := strings.Count(agentErr.String(), "level=ERROR"); n > 0 {
		t.Errorf("agent logged %d errors:\n%s", n, agentErr.String())
	}
}

// tunnel opens a CONNECT from inside ns, then until deadline writes
// pseudo-random chunks and reads them echoed, checksumming both ways.
func tunnel(ns *netns.Namespace, target string, seed uint64, deadline time.Time) (int64, error) {
	var c net.Conn
	// Each ns.Do runs on an OS thread of its own that Go keeps afterwards:
	// a few at a time, so the test's threads do not swamp the agent's RSS.
	dialSem <- struct{}{}
	err := ns.Do(func() (err error) { c, err = net.Dial("tcp", agent.ProxyEndpoints[0].String()); return })
	<-dialSem
	if err != nil {
		return 0, err
	}
	defer c.Close()
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		return 0, fmt.Errorf("CONNECT: %v %v", resp, err)
	}
	sent, recv := sha256.New(), sha256.New()
	r := rand.New(rand.NewPCG(seed, seed))
	buf := make([]byte, 16<<10)
	back := make([]byte, len(buf))
	var n int64
	for first := true; time.Now().Before(deadline); first = false {
		for i := range buf {
			buf[i] = byte(r.Uint32())
		}
		if first {
			buf[0] = 'L' // a first byte of 0x16 would announce TLS, and the proxy would check it
		}
		if _, err := c.Write(buf); err != nil {
			return n, err
		}
		sent.Write(buf)
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		if _, err := io.ReadFull(br, back); err != nil {
			return n, err
		}
		recv.Write(back)
		n += int64(len(buf))
	}
	_ = c.(*net.TCPConn).CloseWrite()
	if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
		return n, fmt.Errorf("after half-close: %d stray bytes, %v", len(rest), err)
	}
	if string(sent.Sum(nil)) != string(recv.Sum(nil)) {
		return n, fmt.Errorf("checksum mismatch after %d bytes", n)
	}
	return n, nil
}

var dialSem = make(chan struct{}, 8)
