//go:build linux

// Package escape runs the escape suite: a static program (escapee) that
// tries every way out it knows, run inside a Trial and with each layer
// removed in turn, against canaries on a test host that record what
// actually arrives. "Blocked" is confirmed at the receiving side.
package escape

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/internal/testhost"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/netns"
	"github.com/trialnet/trialnet/sandbox"
	"github.com/trialnet/trialnet/trial"
)

// hostNS holds the host's network namespace open from before any test
// switches a thread. /proc/self/ns/net would not do: it is the namespace
// of the main thread, which the runtime may lend to a goroutine that is
// inside a test host's namespace at that very moment.
var hostNS *os.File

func TestMain(m *testing.M) {
	sandbox.Init()
	var err error
	if hostNS, err = os.Open("/proc/thread-self/ns/net"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if escDir != "" {
		_ = os.RemoveAll(escDir) // the escapee built for this run
	}
	os.Exit(code)
}

const dnsPort = 53

// network attempts: each one's refusal must be counted by the kernel
// when eBPF is in place.
var network = map[string]bool{
	"tcp4": true, "tcp6": true, "tcp-ipv4-mapped": true, "udp4-connected": true, "udp6-connected": true,
	"udp4-sendto": true, "udp6-sendto": true, "udp-ipv4-mapped-sendto": true, "udp4-sendmsg": true,
	"tcp4-fastopen": true, "tcp6-fastopen": true, "raw4-icmp": true, "raw6-icmp": true, "ping4": true, "ping6": true,
	"dns-udp": true, "dns-tcp": true, "loopback-other-port": true, "io_uring-connect": true, "tcp4-fastopen-connect": true,
	"udp6-routing-header": true,
}

// Result is one line of escapee's output.
type Result struct {
	Name, Result, Reason string
}

// canaries counts what reaches the test host: TCP and UDP on the canary
// port (testhost's own), DNS on port 53 over UDP and TCP, ICMP echo
// requests, and connections to escapee's inbound listener.
type canaries struct {
	host    *testhost.Host
	dns     atomic.Int64
	icmp    atomic.Int64
	inbound atomic.Int64
}

func (c *canaries) arrivals() int64 {
	return c.host.Arrivals() + c.dns.Load() + c.icmp.Load()
}

func newCanaries(t *testing.T, subnet uint8) *canaries {
	t.Helper()
	c := &canaries{host: testhost.NewT(t, subnet)}
	for _, a := range []netip.Addr{c.host.Addr4, c.host.Addr6} {
		ap := netip.AddrPortFrom(a, dnsPort).String()
		ln, err := c.host.NS.Listen(context.Background(), "tcp", ap)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		go testhost.CountAccepts(ln, &c.dns)
		var pc net.PacketConn
		if err := c.host.NS.Do(func() (err error) { pc, err = net.ListenPacket("udp", ap); return }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pc.Close() })
		go count(pc, &c.dns)
	}
	for _, l := range []struct{ network, addr string }{{"ip4:icmp", c.host.Addr4.String()}, {"ip6:ipv6-icmp", c.host.Addr6.String()}} {
		var pc net.PacketConn
		if err := c.host.NS.Do(func() (err error) { pc, err = net.ListenPacket(l.network, l.addr); return }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pc.Close() })
		go func() {
			buf := make([]byte, 1500)
			for {
				n, _, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				if n > 0 && (buf[0] == 8 || buf[0] == 128) { // echo requests only
					c.icmp.Add(1)
				}
			}
		}()
	}
	return c
}

func count(pc net.PacketConn, n *atomic.Int64) {
	buf := make([]byte, 1500)
	for {
		if _, _, err := pc.ReadFrom(buf); err != nil {
			return
		}
		n.Add(1)
	}
}

// knock tries, from the test host, to connect to escapee's inbound
// listener at addr until stop closes.
func (c *canaries) knock(at netip.AddrPort, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		_ = c.host.NS.Do(func() error {
			conn, err := net.DialTimeout("tcp", at.String(), 100*time.Millisecond)
			if err == nil {
				c.inbound.Add(1)
				_ = conn.Close()
			}
			return nil
		})
		time.Sleep(50 * time.Millisecond)
	}
}

var (
	buildOnce sync.Once
	escBin    string
	escDir    string // made for escBin by this run; TestMain removes it
	buildErr  error
)

// escapee builds the static escapee into a directory nobody can read.
func escapee(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		// A guest of the kernel matrix has no Go toolchain to spare: the
		// harness builds escapee on the host and names it here.
		if bin := os.Getenv("TRIALNET_TEST_ESCAPEE"); bin != "" {
			escBin = bin
			return
		}
		dir, err := privtest.MakeSharedDir("escapee-")
		if err != nil {
			buildErr = err
			return
		}
		escDir, escBin = dir, filepath.Join(dir, "escapee")
		cmd := exec.Command("go", "build", "-o", escBin, "./escapee")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build escapee: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return escBin
}

// runner runs a command in a Trial: trialnet's launch path (launched) or
// a container runtime (container_test.go).
type runner func(ctx context.Context, c sandbox.Command) (int, error)

// launched runs commands through tr's launch path, each in wrap (a nested
// sandbox's command line, ending in "--") if given.
func launched(tr *sandbox.Launcher, wrap []string) runner {
	return func(ctx context.Context, c sandbox.Command) (int, error) {
		c.Args = append(slices.Clone(wrap), c.Args...)
		return tr.Exec(ctx, c, nil)
	}
}

// runEscapee runs escapee in tr as nobody and returns its results by name.
func runEscapee(t *testing.T, c *canaries, tr *sandbox.Launcher, inboundAt netip.Addr, args ...string) map[string]Result {
	t.Helper()
	return runEscapeeWith(t, c, launched(tr, nil), inboundAt, args...)
}

// runEscapeeIn is runEscapee with the escapee run by wrap (a nested
// sandbox's command line, ending in "--").
func runEscapeeIn(t *testing.T, c *canaries, tr *sandbox.Launcher, inboundAt netip.Addr, wrap []string, args ...string) map[string]Result {
	t.Helper()
	return runEscapeeWith(t, c, launched(tr, wrap), inboundAt, args...)
}

// runEscapeeWith runs escapee as nobody by run.
func runEscapeeWith(t *testing.T, c *canaries, run runner, inboundAt netip.Addr, args ...string) map[string]Result {
	t.Helper()
	bin := escapee(t)
	// A port free on this host: in two of the runs escapee listens in the
	// host's namespace, where other tests' listeners live too.
	port := testkit.FreePort(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { c.knock(netip.AddrPortFrom(inboundAt, port), stop) })
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	all := []string{bin, "-v4", c.host.Addr4.String(), "-v6", c.host.Addr6.String(), "-port", strconv.Itoa(testhost.Port),
		"-dns-port", strconv.Itoa(dnsPort), "-inbound-port", strconv.Itoa(int(port))}
	all = append(all, args...)
	code, err := run(ctx, sandbox.Command{Args: all, Env: []string{"PATH=/usr/bin:/bin"}, UID: 65534, GID: 65534, Stdout: &out, Stderr: &errOut})
	close(stop)
	wg.Wait()
	if err != nil || code != 0 {
		t.Fatalf("escapee: exit %d, %v\n%s", code, err, errOut.String())
	}
	res := map[string]Result{}
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		var r Result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("escapee output %q: %v", sc.Text(), err)
		}
		res[r.Name] = r
		t.Logf("%-30s %-8s %s", r.Name, r.Result, r.Reason)
	}
	if len(res) < 29 {
		t.Fatalf("escapee reported %d attempts, want 29", len(res))
	}
	return res
}

// hookRefused reports whether r is a network attempt refused where the
// kernel's hooks count it. Raw and ping sockets refused at socket() by the
// kernel's own capability checks (no CAP_NET_RAW, not in
// ping_group_range), and options refused at setsockopt (by the seccomp
// filter, or the kernel's CAP_NET_RAW check for source routes), never
// reach a hook, so no counter can see them.
func hookRefused(r Result) bool {
	return network[r.Name] && r.Result == "blocked" &&
		!strings.HasPrefix(r.Reason, "socket: ") && !strings.HasPrefix(r.Reason, "setsockopt: ")
}

// requireAllBlocked fails on any escape, at the sender or the receiver.
func requireAllBlocked(t *testing.T, c *canaries, res map[string]Result) int {
	t.Helper()
	blocked := 0
	for _, r := range res {
		switch r.Result {
		case "escaped":
			t.Errorf("ESCAPE: %s: %s", r.Name, r.Reason)
		case "blocked":
			if hookRefused(r) {
				blocked++
			}
		case "skipped":
			if r.Name != "io_uring-connect" && r.Name != "loopback-other-port" && r.Name != "connect-denied-name-via-proxy" {
				t.Errorf("%s skipped: %s", r.Name, r.Reason)
			}
		}
	}
	time.Sleep(200 * time.Millisecond) // let stray packets land before counting
	if n := c.arrivals(); n != 0 {
		t.Errorf("the canaries saw %d arrivals (tcp/udp %d, dns %d, icmp %d)", n, c.host.Arrivals(), c.dns.Load(), c.icmp.Load())
	}
	if n := c.inbound.Load(); n != 0 {
		t.Errorf("the test host connected to the Trial's listener %d times", n)
	}
	return blocked
}

func hostNetns(t *testing.T) *netns.Namespace {
	t.Helper()
	ns, err := netns.Open("/proc/self/fd", strconv.Itoa(int(hostNS.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// listenLoopback is a canary on a free port of 127.0.0.1 in ns (not the
// proxy's); it returns the port.
func listenLoopback(t *testing.T, ns *netns.Namespace, n *atomic.Int64) string {
	t.Helper()
	ln, err := ns.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go testhost.CountAccepts(ln, n)
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

func deniedTotal(k map[string]uint64) uint64 {
	var c bpf.Counters
	c.Connect4Denied, c.Connect6Denied = k["connect4_denied"], k["connect6_denied"]
	c.Sendmsg4Denied, c.Sendmsg6Denied = k["sendmsg4_denied"], k["sendmsg6_denied"]
	c.SockCreateDenied, c.BindDenied, c.EgressOtherPackets = k["sock_create_denied"], k["bind_denied"], k["egress_other_packets"]
	return c.Denied()
}

// In a Trial (namespace + eBPF + proxy, strict mode) everything is blocked,
// and the kernel counted every network attempt.
func TestPrivilegedEscapeTrial(t *testing.T) {
	privtest.Require(t)
	escapeTrial(t, nil, nil)
}

// A host service widens nothing else: with one configured (a listener on
// the host's loopback), everything is still blocked, the service is not
// reached by any attempt, and it is reached through the proxy by its
// name, as the positive control.
func TestPrivilegedEscapeTrialWithHostService(t *testing.T) {
	privtest.Require(t)
	var arrivals atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go testhost.CountAccepts(ln, &arrivals)
	port := ln.Addr().(*net.TCPAddr).Port
	file, err := config.ParseFile(fmt.Appendf(nil, "profiles:\n  svc:\n    host_services:\n      - port: %d\n", port))
	if err != nil {
		t.Fatal(err)
	}
	tr := escapeTrial(t, file, []string{"svc"})
	if n := arrivals.Load(); n != 0 {
		t.Fatalf("the host service saw %d connections from the escape attempts", n)
	}
	// The positive control: the service is there, by its name, through
	// the proxy, from the Trial's namespace.
	err = tr.Netns.Do(func() error {
		c, err := net.DialTimeout("tcp", agent.ProxyEndpoints[0].String(), 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		target := fmt.Sprintf("%s:%d", trial.HostServiceName, port)
		if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target); err != nil {
			return err
		}
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || !strings.Contains(line, " 200 ") {
			return fmt.Errorf("CONNECT %s: %q %v", target, line, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); arrivals.Load() != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the host service saw %d connections, want the control's one", arrivals.Load())
		}
	}
}

// escapeTrial runs the escape suite in a strict Trial made with file's
// profiles (file may be nil) and returns the Trial.
func escapeTrial(t *testing.T, file *config.File, profiles []string) *sandbox.Launcher {
	t.Helper()
	c := newCanaries(t, 171)
	a, err := agent.Start(agent.AgentConfig{Host: testenv.IsolatedHost(t, "escape"), DataDir: t.TempDir(), File: file})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(true) })
	info, err := a.Create(context.Background(), trial.Request{ID: "escape", Strict: true, Allow: []string{"allowed.example.test:443"}, Profiles: profiles})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := agent.Attach(info)
	if err != nil {
		t.Fatal(err)
	}
	escapeNetworkTrial(t, a, c, info, launched(tr, nil))
	return tr
}

// networkTrial is the network suite's Trial: strict mode, one allowed name.
func networkTrial(t *testing.T, a *agent.Agent, id string) client.TrialInfo {
	t.Helper()
	info, err := a.Create(context.Background(), trial.Request{ID: id, Strict: true, Allow: []string{"allowed.example.test:443"}})
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// escapeNetworkTrial runs the network suite by run in the Trial info and
// checks what a Trial must show: every attempt blocked at the sender and
// at the receivers, no loopback port but the proxy's reached, the CONNECT
// to a denied name refused by policy, every blocked network attempt
// counted by the kernel and no direct egress. It returns the results and
// the Trial's kernel counters, for a comparison with another run.
func escapeNetworkTrial(t *testing.T, a *agent.Agent, c *canaries, info client.TrialInfo, run runner) (map[string]Result, map[string]uint64) {
	t.Helper()
	ns, err := netns.Open(filepath.Dir(info.Netns), filepath.Base(info.Netns))
	if err != nil {
		t.Fatal(err)
	}
	var loop atomic.Int64
	loopPort := listenLoopback(t, ns, &loop)
	res := runEscapeeWith(t, c, run, c.host.Local4, "-loopback-port", loopPort, "-proxy", agent.ProxyEndpoints[0].String())
	blocked := requireAllBlocked(t, c, res)
	if loop.Load() != 0 {
		t.Error("a loopback port other than the proxy's was reached in strict mode")
	}
	if r := res["connect-denied-name-via-proxy"]; r.Result != "blocked" || !strings.Contains(r.Reason, "policy_denied") {
		t.Errorf("CONNECT to a denied name: %+v", r)
	}
	st, err := a.Stats(context.Background(), info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d := deniedTotal(st.Kernel); d < uint64(blocked) || st.Egress != 0 {
		t.Errorf("kernel counted %d refusals for %d blocked network attempts (egress %d): %v", d, blocked, st.Egress, st.Kernel)
	}
	if st.Proxy.ByReason["policy_denied"] != 1 {
		t.Errorf("proxy decisions %v", st.Proxy.ByReason)
	}
	return res, st.Kernel
}

// With the namespace layer removed (the escapee in the host's namespace,
// its policy naming that namespace), eBPF alone blocks everything.
func TestPrivilegedEscapeEBPFOnly(t *testing.T) {
	privtest.Require(t)
	c := newCanaries(t, 172)
	h, err := agent.OpenHost(testenv.IsolatedHost(t, "escape"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	host := hostNetns(t)
	dir := filepath.Join(h.Parent, "ebpfonly")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = testenv.KillAndRemove(dir) })
	cgid, err := bpf.CgroupID(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.BPF.AddTrial(cgid, bpf.Policy{NetnsCookie: host.Cookie, Strict: true, Proxy: agent.ProxyEndpoints, UnixOpen: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.BPF.RemoveTrial(cgid) })
	tr, err := sandbox.Attach("ebpfonly", dir, host.Path)
	if err != nil {
		t.Fatal(err)
	}
	var loop atomic.Int64
	loopPort := listenLoopback(t, host, &loop)
	res := runEscapee(t, c, tr, c.host.Local4, "-loopback-port", loopPort)
	blocked := requireAllBlocked(t, c, res)
	if loop.Load() != 0 {
		t.Error("eBPF let the host's loopback port through in strict mode")
	}
	k, err := h.BPF.Counters(cgid)
	if err != nil {
		t.Fatal(err)
	}
	if d := k.Denied(); d < uint64(blocked) {
		t.Errorf("kernel counted %d refusals for %d blocked network attempts: %+v", d, blocked, k)
	}
}

// With the eBPF layer removed (a cgroup outside trialnet's), the
// namespace alone blocks everything.
func TestPrivilegedEscapeNetnsOnly(t *testing.T) {
	privtest.Require(t)
	c := newCanaries(t, 173)
	ns, err := netns.Create(t.TempDir(), "netnsonly")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Delete() })
	tr, err := sandbox.Attach("netnsonly", testenv.PlainCgroup(t, "escape"), ns.Path)
	if err != nil {
		t.Fatal(err)
	}
	// Its own loopback is the namespace's to use: not an escape here.
	res := runEscapee(t, c, tr, c.host.Local4)
	requireAllBlocked(t, c, res)
}

// Unconfined, the same escapee gets out and the canaries see it: the
// suite can tell an escape from a block.
func TestPrivilegedEscapeUnconfinedIsSeen(t *testing.T) {
	privtest.Require(t)
	c := newCanaries(t, 174)
	host := hostNetns(t)
	tr, err := sandbox.Attach("unconfined", testenv.PlainCgroup(t, "escape"), host.Path)
	if err != nil {
		t.Fatal(err)
	}
	var loop atomic.Int64
	loopPort := listenLoopback(t, host, &loop)
	res := runEscapee(t, c, tr, c.host.Local4, "-loopback-port", loopPort)
	for _, name := range []string{"tcp4", "tcp6", "tcp-ipv4-mapped", "udp4-connected", "udp6-connected", "udp4-sendto",
		"udp6-sendto", "udp4-sendmsg", "tcp4-fastopen", "tcp6-fastopen", "tcp4-fastopen-connect", "dns-udp", "dns-tcp",
		"loopback-other-port", "inbound-listener"} {
		if res[name].Result != "escaped" {
			t.Errorf("unconfined %s: %+v, want escaped", name, res[name])
		}
	}
	// Routing headers send to their first segment whatever connect6 and
	// sendmsg6 judged: here, with no hook, only the launcher's seccomp
	// filter refuses them. (IPv4's source route is the kernel's to
	// refuse, and a kernel that lets it through sends a SYN the canary
	// drops: not asserted here.)
	for _, name := range []string{"tcp6-routing-header", "udp6-routing-header"} {
		if r := res[name]; r.Result != "blocked" || !strings.HasPrefix(r.Reason, "setsockopt: ") {
			t.Errorf("unconfined %s: %+v, want refused at setsockopt", name, r)
		}
	}
	if r := res["io_uring-connect"]; r.Result != "escaped" && r.Result != "skipped" {
		t.Errorf("unconfined io_uring: %+v", r)
	}
	time.Sleep(200 * time.Millisecond)
	if c.host.Arrivals() < 8 || c.dns.Load() < 2 || loop.Load() < 1 || c.inbound.Load() < 1 {
		t.Errorf("canaries saw tcp/udp %d, dns %d, loopback %d, inbound %d: the suite cannot see escapes",
			c.host.Arrivals(), c.dns.Load(), loop.Load(), c.inbound.Load())
	}
}
