//go:build linux

package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/trial"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testhost"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/netns"
)

// The main goroutine keeps the main thread: several tests unshare their
// mount namespace on a locked thread that ends with its goroutine, and
// Go keeps the main thread when such a goroutine ends on it, so it would
// stay in that namespace, and /proc/self (the main thread's view) with
// it, for every later test.
func init() { runtime.LockOSThread() }

func TestMain(m *testing.M) {
	Init()
	if os.Getenv("TRIALNET_PROBE") == "1" {
		os.Exit(probe(os.Args[1:]))
	}
	if os.Getenv("TRIALNET_LOADER") != "" {
		os.Exit(loaderHelper())
	}
	if os.Getenv("TRIALNET_RESOLV") != "" {
		os.Exit(resolvHelper())
	}
	if parent := os.Getenv("TRIALNET_SHELL_HELPER"); parent != "" {
		os.Exit(shellHelper(parent))
	}
	var err error
	if hostNS, err = os.Open("/proc/thread-self/ns/net"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	for _, f := range cleanups {
		f()
	}
	os.Exit(code)
}

// cleanups run once every test has ended.
var cleanups []func()

func randSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// newHost loads the eBPF layer onto a parent cgroup of this test's own,
// pinned in a pin directory of its own; cleanup removes all of it.
func newHost(t testing.TB) *Host {
	t.Helper()
	privtest.Require(t)
	root, err := Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	suffix := randSuffix()
	parent := filepath.Join(root, "trialnet-test-"+suffix)
	if err := os.Mkdir(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = removeCgroup(parent) })
	pins := bpf.DefaultPinDir + "-test-" + suffix
	t.Cleanup(func() { _ = bpf.Uninstall(pins) })
	l, err := bpf.Load(bpf.Options{Cgroup: parent, PinDir: pins})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	// Not under /tmp, which a Trial has its own of: the tests show the
	// init hiding this directory.
	return &Host{Parent: parent, NetnsDir: privtest.SharedDir(t, "netns-"), BPF: l}
}

func newTrial(t testing.TB, h *Host, spec trial.Spec) *Trial {
	t.Helper()
	if spec.ID == "" {
		spec.ID = "t-" + randSuffix()
	}
	create := h.Create
	if viaShells {
		create = func(spec trial.Spec, ep Endpoint) (*Trial, error) { return createViaShell(t, h, spec, ep) }
	}
	tr, err := create(spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	closeAtCleanup(t, tr)
	return tr
}

// closeAtCleanup closes tr when the test ends (after a Close of the
// test's own, Close returns what that one did).
func closeAtCleanup(t testing.TB, tr *Trial) {
	t.Cleanup(func() {
		if _, err := tr.Close(); err != nil {
			t.Error(err)
		}
	})
}

// runProbe runs one probe inside tr as uid 0 with every capability dropped
// (the strongest Trial user trialnet allows) and returns its exit code.
// removePoolsAtCleanup removes the pool groups that a launch into a Trial
// made by hand (no Create, so no Close) makes on cgroup v1 hosts, once
// its processes are killed.
func removePoolsAtCleanup(t testing.TB, tr *Launcher) {
	t.Cleanup(func() {
		_ = killCgroup(tr.Cgroup, killWait)
		if err := tr.removePools(); err != nil {
			t.Error(err)
		}
	})
}

func runProbe(t testing.TB, tr *Trial, args ...string) (int, string) {
	t.Helper()
	exe := probeExe(t) // the build directory is under /tmp, which the Trial has its own of
	var out bytes.Buffer
	p, err := tr.Start(Command{
		Args:   append([]string{exe}, args...),
		Env:    []string{"TRIALNET_PROBE=1", "PATH=/usr/bin:/bin"},
		Stdout: &out,
		Stderr: &out,
	})
	if err != nil {
		t.Fatalf("probe %v: %v", args, err)
	}
	code, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	return code, strings.TrimSpace(out.String())
}

// listenIn opens a TCP listener inside ns that accepts and closes.
func listenIn(t testing.TB, ns *netns.Namespace, network, addr string) netip.AddrPort {
	t.Helper()
	ln, err := ns.Listen(context.Background(), network, addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go testhost.CountAccepts(ln, nil)
	return netip.MustParseAddrPort(ln.Addr().String())
}

// listenUnixIn opens a pathname (or abstract, "@name") unix listener in the
// caller's namespace; a dgram one when dgram is set.
func listenUnixIn(t testing.TB, ns *netns.Namespace, name string, dgram bool) {
	t.Helper()
	var closer func() error
	err := ns.Do(func() error {
		if dgram {
			pc, err := net.ListenPacket("unixgram", name)
			if err == nil {
				closer = pc.Close
			}
			return err
		}
		ln, err := net.Listen("unix", name)
		if err == nil {
			closer = ln.Close
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = closer() })
}

type attempt struct {
	name    string
	args    []string
	want    int    // probe exit code
	counter string // counter that must grow
}

func counterDelta(t testing.TB, tr *Trial, before bpf.Counters, name string) uint64 {
	t.Helper()
	after, err := tr.Counters()
	if err != nil {
		t.Fatal(err)
	}
	return after.Map()[name] - before.Map()[name]
}

func checkAttempts(t *testing.T, tr *Trial, attempts []attempt) {
	t.Helper()
	for _, a := range attempts {
		t.Run(a.name, func(t *testing.T) {
			before, err := tr.Counters()
			if err != nil {
				t.Fatal(err)
			}
			code, out := runProbe(t, tr, a.args...)
			if code != a.want {
				t.Fatalf("probe %v: exit %d (%s), want %d", a.args, code, out, a.want)
			}
			if a.counter != "" {
				if d := counterDelta(t, tr, before, a.counter); d == 0 {
					t.Fatalf("probe %v: counter %s did not grow", a.args, a.counter)
				}
			}
		})
	}
}

func TestPrivilegedTrialRefusesEveryWayOut(t *testing.T) {
	h := newHost(t)
	th := testhost.NewT(t, 61)
	dir := privtest.SharedDir(t, "wayout-")
	hostSock := filepath.Join(dir, "host.sock")
	hostDgram := filepath.Join(dir, "host.dgram")
	// Under the host's /tmp, which the Trial has its own of: the init binds
	// an allowed socket there into it.
	allowedSock := filepath.Join(t.TempDir(), "allowed.sock")
	self, err := netns.Open(filepath.Dir(selfNetns()), filepath.Base(selfNetns()))
	if err != nil {
		t.Fatal(err)
	}
	listenUnixIn(t, self, hostSock, false)
	listenUnixIn(t, self, hostDgram, true)
	listenUnixIn(t, self, allowedSock, false)

	tr := newTrial(t, h, trial.Spec{UnixAllow: []string{allowedSock}})
	allowPing(t, tr.Netns)
	lo4 := listenIn(t, tr.Netns, "tcp4", "127.0.0.1:0")
	lo6 := listenIn(t, tr.Netns, "tcp6", "[::1]:0")
	abstract := "@trialnet-test-" + randSuffix()
	listenUnixIn(t, tr.Netns, abstract, false)

	mapped := netip.AddrPortFrom(netip.AddrFrom16(th.Addr4.As16()), testhost.Port)
	// Where the LSM layer runs, its peer check judges every unix path (the
	// hooks leave them to it) and counts the refusals. Before Linux 6.7
	// there are no unix sock_addr hooks to count what is allowed.
	unixDenied, unixSendDenied, unixAllowed := "unix_connect_denied", "unix_sendmsg_denied", "unix_connect_allowed"
	if h.BPF.LSM() {
		unixDenied, unixSendDenied = "unix_identity_denied", "unix_identity_denied"
	}
	if !h.BPF.UnixHooks() {
		unixAllowed = ""
	}
	checkAttempts(t, tr, []attempt{
		{"tcp4 test host", []string{"tcp", th.AddrPort4().String()}, probeRefused, "connect4_denied"},
		{"udp4 connect test host", []string{"udp-connect", th.AddrPort4().String()}, probeRefused, "connect4_denied"},
		{"udp4 sendto test host", []string{"udp-sendto", th.AddrPort4().String()}, probeRefused, "sendmsg4_denied"},
		{"tcp6 test host", []string{"tcp", th.AddrPort6().String()}, probeRefused, "connect6_denied"},
		{"udp6 sendto test host", []string{"udp-sendto", th.AddrPort6().String()}, probeRefused, "sendmsg6_denied"},
		{"tcp6 ipv4-mapped test host", []string{"tcp", mapped.String()}, probeRefused, "connect6_denied"},
		{"tcp4 host's own address", []string{"tcp", netip.AddrPortFrom(th.Local4, 22).String()}, probeRefused, "connect4_denied"},
		{"tcp4 0.0.0.0", []string{"tcp", "0.0.0.0:22"}, probeRefused, "connect4_denied"},
		// Without CAP_NET_RAW the kernel refuses raw sockets before the hook
		// runs; the eBPF-alone test covers a Trial process that has it.
		{"raw4 socket", []string{"raw4"}, probeRefused, ""},
		{"raw6 socket", []string{"raw6"}, probeRefused, ""},
		{"ping4 socket", []string{"ping4"}, probeRefused, "sock_create_denied"},
		{"ping6 socket", []string{"ping6"}, probeRefused, "sock_create_denied"},
		{"unix pathname socket on the host", []string{"unix", hostSock}, probeRefused, unixDenied},
		{"unix dgram sendto on the host", []string{"unix-sendto", hostDgram}, probeRefused, unixSendDenied},
		{"loopback tcp4", []string{"tcp", lo4.String()}, probeOK, "connect4_allowed"},
		{"loopback tcp6", []string{"tcp", lo6.String()}, probeOK, "connect6_allowed"},
		{"loopback ipv4-mapped", []string{"tcp", netip.AddrPortFrom(netip.MustParseAddr("::ffff:127.0.0.1"), lo4.Port()).String()}, probeOK, "connect6_allowed"},
		{"loopback udp sendto", []string{"udp-sendto", "127.0.0.1:9"}, probeOK, "sendmsg4_allowed"},
		{"abstract unix socket in the Trial", []string{"unix", abstract}, probeOK, unixAllowed},
		{"allowed unix path", []string{"unix", allowedSock}, probeOK, unixAllowed},
	})
	if th.WaitArrivals(1, 200*time.Millisecond) {
		t.Fatalf("the test host saw %d arrivals from the Trial", th.Arrivals())
	}
	c, err := tr.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if c.EgressOtherPackets != 0 {
		t.Fatalf("direct egress packets = %d, want 0", c.EgressOtherPackets)
	}
	if c.EgressLoopbackPackets == 0 {
		t.Fatal("egress hook counted no loopback packets")
	}
}

func TestPrivilegedStrictModeOnlyProxy(t *testing.T) {
	h := newHost(t)
	// The "proxy" listens inside the Trial, as the agent's listener will.
	h.Proxy = []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:3128"), netip.MustParseAddrPort("[::1]:3128")}
	tr := newTrial(t, h, trial.Spec{Strict: true, UnixOpen: true})
	listenIn(t, tr.Netns, "tcp4", "127.0.0.1:3128")
	listenIn(t, tr.Netns, "tcp6", "[::1]:3128")
	other := listenIn(t, tr.Netns, "tcp4", "127.0.0.1:0")
	checkAttempts(t, tr, []attempt{
		{"proxy v4", []string{"tcp", "127.0.0.1:3128"}, probeOK, "connect4_allowed"},
		{"proxy v6", []string{"tcp", "[::1]:3128"}, probeOK, "connect6_allowed"},
		{"proxy v4-mapped", []string{"tcp", "[::ffff:127.0.0.1]:3128"}, probeOK, "connect6_allowed"},
		{"other loopback port", []string{"tcp", other.String()}, probeRefused, "connect4_denied"},
		{"proxy port on another loopback address", []string{"tcp", "127.0.0.2:3128"}, probeRefused, "connect4_denied"},
		{"udp to loopback", []string{"udp-sendto", "127.0.0.1:3128"}, probeRefused, "sendmsg4_denied"},
	})
}

// hostNS holds the test's own (host) network namespace open from before
// any thread switched. /proc/<pid>/ns/net would not do: it is the main
// thread's, which the runtime may lend to a goroutine that is inside a
// test host's namespace at that moment.
var hostNS *os.File

func selfNetns() string {
	return fmt.Sprintf("/proc/self/fd/%d", hostNS.Fd())
}

// hostNetnsTrial is tr with its processes started in the test's own
// (host) namespace: only the eBPF layer stands between them and the world.
func hostNetnsTrial(tr *Trial) *Trial {
	return &Trial{Launcher: Launcher{ID: tr.ID, Cgroup: tr.Cgroup, CgroupID: tr.CgroupID, Spec: tr.Spec,
		Netns: &netns.Namespace{ID: "host", Path: selfNetns()}}, host: tr.host}
}

func TestPrivilegedEBPFAloneRefusesInHostNetns(t *testing.T) {
	h := newHost(t)
	th := testhost.NewT(t, 62)
	tr := newTrial(t, h, trial.Spec{UnixOpen: true})
	hostTrial := hostNetnsTrial(tr)
	self := &netns.Namespace{ID: "host", Path: selfNetns()}
	hostLo := listenIn(t, self, "tcp4", "127.0.0.1:0")

	// Outside its own namespace a Trial cannot even create an inet socket.
	checkAttempts(t, hostTrial, []attempt{
		{"tcp4 test host", []string{"tcp", th.AddrPort4().String()}, probeRefused, "netns_mismatch"},
		{"tcp6 test host", []string{"tcp", th.AddrPort6().String()}, probeRefused, "sock_create_denied"},
		{"udp4 sendto test host", []string{"udp-sendto", th.AddrPort4().String()}, probeRefused, "sock_create_denied"},
		{"host's own 127.0.0.1 listener", []string{"tcp", hostLo.String()}, probeRefused, "sock_create_denied"},
	})
	// A root process with every capability, in the Trial's cgroup and the
	// host's namespace: raw sockets reach the hook and are refused there.
	for _, kind := range []string{"raw4", "raw6"} {
		before, _ := tr.Counters()
		if code, out := runPrivilegedProbe(t, tr.Cgroup, kind); code != probeRefused {
			t.Fatalf("%s as full root in the Trial cgroup: exit %d (%s), want refused", kind, code, out)
		}
		if counterDelta(t, tr, before, "sock_create_denied") == 0 {
			t.Fatalf("%s: sock_create_denied did not grow", kind)
		}
	}
	if code, out := runPrivilegedProbe(t, tr.Cgroup, "tcp", th.AddrPort4().String()); code != probeRefused {
		t.Fatalf("tcp4 as full root in the Trial cgroup: exit %d (%s), want refused", code, out)
	}
	if th.WaitArrivals(1, 200*time.Millisecond) {
		t.Fatalf("the test host saw %d arrivals", th.Arrivals())
	}

	// The control: the same probe from a cgroup without the hooks, in the
	// same namespace, does reach the test host, so the test above can fail.
	control := unhookedTrial(t, h, self)
	if code, out := runProbe(t, control, "tcp", th.AddrPort4().String()); code != probeOK {
		t.Fatalf("control probe without eBPF hooks could not reach the test host: %d %s", code, out)
	}
	if !th.WaitArrivals(1, 5*time.Second) {
		t.Fatal("control probe succeeded but the test host saw nothing")
	}
}

// TestPrivilegedEgressLastWall reaches the egress hook past every other
// one: the Trial's policy names the host's namespace (as if the netns layer
// had failed), so a Trial process may bind and listen there; a test host
// connects in, and the listener's SYN-ACK must be dropped and counted.
func TestPrivilegedEgressLastWall(t *testing.T) {
	h := newHost(t)
	th := testhost.NewT(t, 64)
	host, err := netns.Open(filepath.Dir(selfNetns()), filepath.Base(selfNetns()))
	if err != nil {
		t.Fatal(err)
	}
	cg := filepath.Join(h.Parent, "lastwall")
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = killCgroup(cg, killWait); _ = removeCgroup(cg) })
	cgid, err := bpf.CgroupID(cg)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.BPF.AddTrial(cgid, bpf.Policy{NetnsCookie: host.Cookie, UnixOpen: true}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.BPF.RemoveTrial(cgid) })

	free, err := net.Listen("tcp", netip.AddrPortFrom(th.Local4, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	addr := free.Addr().String() // a port nobody else on this host uses
	_ = free.Close()
	exe, _ := os.Executable()
	cmd := exec.Command(exe, "listen", addr)
	cmd.Env = []string{"TRIALNET_PROBE=1"}
	cgf, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer cgf.Close()
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cgf.Fd())}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(stdout)
	if line, _ := r.ReadString('\n'); strings.TrimSpace(line) != "listening" {
		_ = cmd.Wait()
		t.Fatalf("the Trial process could not listen: %q", line)
	}
	dialErr := th.NS.Do(func() error {
		c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
		if err == nil {
			_ = c.Close()
		}
		return err
	})
	rest, _ := io.ReadAll(r)
	_ = cmd.Wait()
	if dialErr == nil || strings.Contains(string(rest), "accepted") {
		t.Fatalf("an inbound connection to a Trial listener completed; probe said %q", rest)
	}
	c, err := h.BPF.Counters(cgid)
	if err != nil {
		t.Fatal(err)
	}
	if c.EgressOtherPackets == 0 {
		t.Fatal("the dropped SYN-ACK was not counted as direct egress")
	}
}

func TestPrivilegedNoPolicyDeniesEverything(t *testing.T) {
	h := newHost(t)
	cg := filepath.Join(h.Parent, "nopolicy")
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	id, err := bpf.CgroupID(cg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = killCgroup(cg, killWait); _ = removeCgroup(cg); RemoveLaunchLock(id) })
	ns, err := netns.Create(t.TempDir(), "nopolicy")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Delete() })
	tr := &Trial{Launcher: Launcher{ID: "nopolicy", Cgroup: cg, Netns: ns}, host: h}
	removePoolsAtCleanup(t, &tr.Launcher)
	lo := listenIn(t, ns, "tcp4", "127.0.0.1:0")
	before, err := h.BPF.Counters(0)
	if err != nil {
		t.Fatal(err)
	}
	if code, out := runProbe(t, tr, "tcp", lo.String()); code != probeRefused {
		t.Fatalf("loopback from a cgroup with no policy: exit %d (%s), want refused", code, out)
	}
	after, _ := h.BPF.Counters(0)
	if after.NoPolicy <= before.NoPolicy {
		t.Fatal("no_policy counter of the unattributed entry did not grow")
	}
}

func TestPrivilegedProcessIsConfined(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{UnixOpen: true})
	// An inherited descriptor without close-on-exec must not reach the Trial.
	leak, err := os.Create(filepath.Join(t.TempDir(), "leak-canary"))
	if err != nil {
		t.Fatal(err)
	}
	defer leak.Close()
	if err := clearCloexec(leak); err != nil {
		t.Fatal(err)
	}
	code, out := runProbe(t, tr, "status")
	if code != probeOK {
		t.Fatalf("status probe: %d %s", code, out)
	}
	for _, want := range []string{
		"CapInh: 0000000000000000", "CapPrm: 0000000000000000", "CapEff: 0000000000000000",
		"CapBnd: 0000000000000000", "CapAmb: 0000000000000000", "NoNewPrivs: 1",
		"cgroup 0::/\n", // its own cgroup namespace: it sees its cgroup as the root
	} {
		if !strings.Contains(out+"\n", want) {
			t.Errorf("Trial process status lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "leak-canary") {
		t.Errorf("an inherited descriptor reached the Trial:\n%s", out)
	}
	// Nor its init, a uid-0 process of the Trial that lives as long.
	init, err := findInit(tr.Cgroup)
	if err != nil || init.pid == 0 {
		t.Fatalf("the Trial's init: %+v, %v", init, err)
	}
	_ = unix.Close(init.pidfd)
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", init.pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", init.pid, fd.Name())); strings.Contains(target, "leak-canary") {
			t.Errorf("the Trial's init holds the inherited descriptor %s: %s", fd.Name(), target)
		}
	}

	var id bytes.Buffer
	p, err := tr.Start(Command{Args: []string{"sh", "-c", "id -u; id -g"}, Env: []string{"PATH=/usr/bin:/bin"}, UID: 65534, GID: 65534, Stdout: &id})
	if err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(); err != nil || code != 0 {
		t.Fatalf("id: %d %v", code, err)
	}
	if got := strings.Fields(id.String()); len(got) != 2 || got[0] != "65534" || got[1] != "65534" {
		t.Fatalf("uid/gid inside the Trial: %q, want 65534 65534", id.String())
	}
}

func TestPrivilegedStartFailures(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{UnixOpen: true})
	_, err := tr.Start(Command{Args: []string{"no-such-command-trialnet"}, Env: []string{"PATH=/usr/bin:/bin"}})
	var se *StartError
	if !errors.As(err, &se) || se.Code != ExitNotFound {
		t.Fatalf("missing command: got %v, want a StartError with code 127", err)
	}
	if procs := trialProcs(t, tr); len(procs) != 0 {
		t.Fatalf("a failed start left processes in the Trial besides its init: %v", procs)
	}
}

func TestPrivilegedExecKillsTheCommandOnTimeout(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{UnixOpen: true})
	ctx, cancel := context.WithTimeout(context.Background(), 300e6)
	defer cancel()
	// The shell backgrounds a sleeper that ignores SIGTERM and then waits:
	// both are in the command's process group.
	code, err := tr.Exec(ctx, Command{
		Args: []string{"sh", "-c", "trap '' TERM; sleep 60 & sleep 60"},
		Env:  []string{"PATH=/usr/bin:/bin"},
	}, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Exec: code %d, err %v; want the deadline", code, err)
	}
	waitNoProcs(t, tr)
}

// Started is called once, after the command started and before Exec
// waits for it; never for a command that did not start.
func TestPrivilegedExecCallsStartedOnceStarted(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{UnixOpen: true})
	env := []string{"PATH=/usr/bin:/bin"}
	// The command ends only once Started has closed its input.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	calls := 0
	// Bounded: without the call, the command would wait for ever.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code, err := tr.Exec(ctx, Command{Args: []string{"sh", "-c", "read -r x; exit 3"}, Env: env, Stdin: r,
		Started: func() { calls++; _ = w.Close() }}, nil)
	if err != nil || code != 3 || calls != 1 {
		t.Fatalf("Exec: code %d, err %v, Started called %d times; want 3, nil, once", code, err, calls)
	}
	calls = 0
	if _, err := tr.Exec(context.Background(), Command{Args: []string{"trialnet-no-such-command"}, Env: env,
		Started: func() { calls++ }}, nil); err == nil || calls != 0 {
		t.Fatalf("Exec of a missing command: err %v, Started called %d times; want an error, never", err, calls)
	}
}

// waitNoProcs waits, bounded, until the Trial has no process but its init.
func waitNoProcs(t *testing.T, tr *Trial) {
	t.Helper()
	for range 200 {
		if len(trialProcs(t, tr)) == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("processes survived: %v", trialProcs(t, tr))
}

func TestPrivilegedExecForwardsSignalsAndReportsCrashes(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{UnixOpen: true})
	env := []string{"PATH=/usr/bin:/bin"}
	code, err := tr.Exec(context.Background(), Command{Args: []string{"sh", "-c", "kill -SEGV $$"}, Env: env}, nil)
	if err != nil || code != 128+int(syscall.SIGSEGV) {
		t.Fatalf("crashing command: code %d, err %v; want 139", code, err)
	}
	// The signal is sent once the command says it has set its trap (a
	// signal racing an execve is turned into SIGKILL by the kernel). It
	// reaches the whole process group: the child's trap fires too.
	sigs := make(chan os.Signal, 1)
	pr, pw := io.Pipe()
	var out bytes.Buffer
	read := make(chan struct{})
	go func() {
		defer close(read)
		br := bufio.NewReader(pr)
		for range 2 {
			line, _ := br.ReadString('\n')
			out.WriteString(line)
		}
		sigs <- syscall.SIGTERM
		_, _ = io.Copy(&out, br)
	}()
	code, err = tr.Exec(context.Background(), Command{Args: []string{"sh", "-c",
		"sh -c 'trap \"echo child-term; exit 0\" TERM; echo ready; while :; do sleep 0.05; done' & trap 'wait; exit 143' TERM; echo ready; while :; do sleep 0.05; done"},
		Env: env, Stdout: pw}, sigs)
	_ = pw.Close()
	if err != nil || code != 128+int(syscall.SIGTERM) {
		t.Fatalf("forwarded SIGTERM: code %d, err %v; want 143", code, err)
	}
	<-read
	if !strings.Contains(out.String(), "child-term") {
		t.Errorf("SIGTERM did not reach the command's child: %q", out.String())
	}
	// A command that leaves a child behind: the child stays until the
	// Trial ends, and the next command in the same Trial still runs.
	code, err = tr.Exec(context.Background(), Command{Args: []string{"sh", "-c", "sleep 30 & exit 4"}, Env: env}, nil)
	if err != nil || code != 4 {
		t.Fatalf("leftover child: code %d, err %v; want 4", code, err)
	}
	if code, err = tr.Exec(context.Background(), Command{Args: []string{"sh", "-c", "exit 5"}, Env: env}, nil); err != nil || code != 5 {
		t.Fatalf("next command in the same Trial: code %d, err %v; want 5", code, err)
	}
	if _, err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tr.Cgroup); !os.IsNotExist(err) {
		t.Fatal("the Trial's cgroup, with the leftover child, survived Close")
	}
}

func TestPrivilegedCreateIsAllOrNothing(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{ID: "dup", UnixOpen: true})
	if _, err := h.Create(trial.Spec{ID: "dup", UnixOpen: true}, nil); err == nil {
		t.Fatal("a second Trial with the same id was created")
	}
	if !h.BPF.HasTrial(tr.CgroupID) {
		t.Fatal("the failed duplicate create removed the live Trial's policy")
	}
	// A bad policy fails after the cgroup and netns exist: both must go.
	_, err := h.Create(trial.Spec{ID: "badpolicy", Strict: true, UnixOpen: true}, nil)
	if err == nil {
		t.Fatal("strict mode without a proxy was accepted")
	}
	if _, err := os.Stat(filepath.Join(h.Parent, "badpolicy")); !os.IsNotExist(err) {
		t.Fatal("failed create left its cgroup")
	}
	if ids, _ := netns.List(h.NetnsDir); len(ids) != 1 {
		t.Fatalf("failed create left namespaces: %v", ids)
	}
	if _, err := h.Create(trial.Spec{ID: "../escape", UnixOpen: true}, nil); err == nil {
		t.Fatal("a path-like id was accepted")
	}
}

func TestPrivilegedNoLeaks(t *testing.T) {
	h := newHost(t)
	sock := filepath.Join(t.TempDir(), "x.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// One Trial first: what a process opens once for all its launches
	// (the sealed seccomp filter's memfd) is not a leak.
	fdsBefore := -1
	for i := range 51 {
		if i == 1 {
			fdsBefore = testkit.CountFDs(t)
		}
		tr, err := h.Create(trial.Spec{ID: fmt.Sprintf("leak-%d", i), UnixAllow: []string{sock}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = tr.Close() })
		if code, out := runProbe(t, tr, "udp-sendto", "127.0.0.1:9"); code != probeOK {
			t.Fatalf("probe %d: %d %s", i, code, out)
		}
		if _, err := tr.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if ids, _ := netns.List(h.NetnsDir); len(ids) != 0 {
		t.Fatalf("namespaces left: %v", ids)
	}
	entries, _ := os.ReadDir(h.Parent)
	for _, e := range entries {
		if e.IsDir() {
			t.Fatalf("cgroup left: %s", e.Name())
		}
	}
	if n := h.BPF.TrialCount(); n != 0 {
		t.Fatalf("%d map entries left", n)
	}
	// What the last Trial's goroutines close as they end may lag its
	// Close on a slow guest: a leak stays.
	after := testkit.CountFDs(t)
	for end := time.Now().Add(5 * time.Second); after > fdsBefore && time.Now().Before(end); after = testkit.CountFDs(t) {
		time.Sleep(20 * time.Millisecond)
	}
	if after > fdsBefore {
		t.Fatalf("fds grew from %d to %d", fdsBefore, after)
	}
}

// allowPing lets every group open ping sockets in ns, as several
// distributions do by default, so that only the eBPF hook stands in the way.
func allowPing(t testing.TB, ns *netns.Namespace) {
	t.Helper()
	err := ns.Do(func() error {
		return os.WriteFile("/proc/sys/net/ipv4/ping_group_range", []byte("0 2147483647"), 0)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// runPrivilegedProbe runs a probe as full root (every capability) placed
// in cgroup, in the test's own namespace, without trialnet-init.
func runPrivilegedProbe(t testing.TB, cgroup string, args ...string) (int, string) {
	t.Helper()
	cg, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	exe, _ := os.Executable()
	cmd := exec.Command(exe, args...)
	cmd.Env = []string{"TRIALNET_PROBE=1"}
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	out, _ := cmd.CombinedOutput()
	return cmd.ProcessState.ExitCode(), strings.TrimSpace(string(out))
}

// unhookedTrial is a "Trial" whose cgroup sits outside the parent, so no
// hook runs for it: the control that shows a test can fail.
func unhookedTrial(t testing.TB, h *Host, ns *netns.Namespace) *Trial {
	t.Helper()
	root, err := Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	unhooked := filepath.Join(root, "trialnet-unhooked-"+randSuffix())
	if err := os.Mkdir(unhooked, 0o755); err != nil {
		t.Fatal(err)
	}
	id, err := bpf.CgroupID(unhooked)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = killCgroup(unhooked, killWait); _ = removeCgroup(unhooked); RemoveLaunchLock(id) })
	tr := &Trial{Launcher: Launcher{ID: "control", Cgroup: unhooked, Netns: ns}, host: h}
	removePoolsAtCleanup(t, &tr.Launcher)
	return tr
}

// trialProcs lists the Trial's processes other than its init.
func trialProcs(t testing.TB, tr *Trial) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(tr.Cgroup, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range strings.Fields(string(b)) {
		if pid, _ := strconv.Atoi(p); !isChildNSInit(pid) {
			out = append(out, p)
		}
	}
	return out
}
