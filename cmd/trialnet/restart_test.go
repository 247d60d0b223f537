//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testhost"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/keeper"
	"github.com/trialnet/trialnet/record"
	"golang.org/x/sys/unix"
)

// Agent restarts under load: a Trial streams through long tunnels and
// opens new CONNECTs all the time, while its agent is replaced, upgraded
// or killed. The load runs in the Trial, as nobody, in Python.

const echoPort = 9000

// echoTarget is what the Trials of these tests may reach: an echo server
// on a test host.
var echoTarget = fmt.Sprintf("echo.test:%d", echoPort)

// echoWorld serves an echo on a test host and names it echo.test; it
// returns the config lines that point an agent at it.
func echoWorld(t testing.TB) string {
	t.Helper()
	th := testhost.NewT(t, 211)
	ln, err := th.NS.Listen(context.Background(), "tcp", netip.AddrPortFrom(th.Addr4, echoPort).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go testhost.Echo(ln)
	dnsAddr, stop, err := testhost.ServeDNS(th.Addr4, "echo.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return fmt.Sprintf("resolvers: [%q]\nallow_cidrs: [\"198.18.0.0/15\"]\n", dnsAddr)
}

// loadScript runs in the Trial: argv[1] seconds of load, argv[2] long
// tunnels to argv[3] each echoing a 1 KiB line every 50 ms (checked byte
// for byte, and checksummed both ways), and argv[4] loops that open a new
// CONNECT every 50 ms, echo one line and close. It prints what happened
// as JSON; a CONNECT refused (no listener, or an answer other than 200)
// counts as refused, one cut after it was accepted as failed only.
const loadScript = `
import hashlib, json, os, socket, sys, threading, time
proxy = os.environ["HTTPS_PROXY"].split("//", 1)[1].rstrip("/")
host, port = proxy.rsplit(":", 1)
P = (host, int(port))
T = sys.argv[3]
D, NT, NC = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[4])
res = {"connects": 0, "failed": 0, "refused": 0, "errors": [], "tunnels": [], "max_wait_ms": 0}

class Refused(Exception):
    pass
lock = threading.Lock()
stop = time.time() + D

def connect():
    try:
        s = socket.create_connection(P, timeout=60)
    except ConnectionRefusedError as e:
        raise Refused(repr(e))
    s.settimeout(60)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (T, T)).encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(4096)
        if not d:
            raise Exception("closed before the answer: %r" % buf[:80])
        buf += d
    if not buf.startswith(b"HTTP/1.1 200"):
        raise Refused("refused: %r" % buf[:120])
    return s, buf.split(b"\r\n\r\n", 1)[1]

def readn(s, n, got):
    while len(got) < n:
        d = s.recv(65536)
        if not d:
            raise Exception("cut after %d of %d bytes" % (len(got), n))
        got += d
    return got

def tunnel(i):
    r = {"sent": 0, "recv": 0, "ok": False, "err": "", "sha_sent": "", "sha_recv": ""}
    hs, hr = hashlib.sha256(), hashlib.sha256()
    try:
        s, got = connect()
        n = 0
        # One line at least: on a slow machine the CONNECT may be
        # answered after the window has passed.
        while n == 0 or time.time() < stop:
            line = ("t%d-%d-" % (i, n) + "x" * 1000 + "\n").encode()
            s.sendall(line)
            hs.update(line)
            r["sent"] += len(line)
            got = readn(s, len(line), got)
            hr.update(got[:len(line)])
            r["recv"] += len(line)
            got = got[len(line):]
            n += 1
            time.sleep(0.05)
        s.shutdown(socket.SHUT_WR)
        rest = got
        while True:
            d = s.recv(65536)
            if not d:
                break
            rest += d
        if rest:
            raise Exception("%d bytes more than sent" % len(rest))
        s.close()
        r["ok"] = True
    except Exception as e:
        r["err"] = repr(e)
    r["sha_sent"], r["sha_recv"] = hs.hexdigest(), hr.hexdigest()
    with lock:
        res["tunnels"].append(r)

def churn():
    while time.time() < stop:
        t0 = time.time()
        try:
            s, got = connect()
            s.sendall(b"ping\n")
            got = readn(s, 5, got)
            if got != b"ping\n":
                raise Exception("bad echo %r" % got)
            s.close()
            with lock:
                res["connects"] += 1
        except Exception as e:
            with lock:
                res["failed"] += 1
                res["refused"] += isinstance(e, Refused)
                res["errors"].append(repr(e)[:200])
        with lock:
            res["max_wait_ms"] = max(res["max_wait_ms"], int((time.time() - t0) * 1000))
        time.sleep(0.05)

ths = [threading.Thread(target=tunnel, args=(i,)) for i in range(NT)]
ths += [threading.Thread(target=churn) for _ in range(NC)]
for t in ths:
    t.start()
for t in ths:
    t.join()
print(json.dumps(res))
`

type loadResult struct {
	Connects  int      `json:"connects"`
	Failed    int      `json:"failed"`
	Refused   int      `json:"refused"`
	Errors    []string `json:"errors"`
	MaxWaitMS int      `json:"max_wait_ms"`
	Tunnels   []struct {
		Sent    int64  `json:"sent"`
		Recv    int64  `json:"recv"`
		OK      bool   `json:"ok"`
		Err     string `json:"err"`
		SHASent string `json:"sha_sent"`
		SHARecv string `json:"sha_recv"`
	} `json:"tunnels"`
}

// longTunnel is how long (seconds) a tunnel lasts that a test expects to
// be cut: a cut one ends at once, one that is not fails the test late.
const longTunnel = 90

// load is the load script running in a Trial.
type load struct {
	cmd *exec.Cmd
	out bytes.Buffer
}

func startLoad(t *testing.T, sock, id string, seconds float64, tunnels, churns int) *load {
	t.Helper()
	l := &load{}
	l.cmd = trialnetProcess(t, "exec", "--socket", sock, "--trial", id, "--uid", "65534", "--gid", "65534", "--",
		"/usr/bin/python3", "-c", loadScript, strconv.FormatFloat(seconds, 'f', 1, 64), strconv.Itoa(tunnels), echoTarget, strconv.Itoa(churns))
	l.cmd.Stdout, l.cmd.Stderr = &l.out, &l.out
	if err := l.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return l
}

func (l *load) wait(t *testing.T) loadResult {
	t.Helper()
	err := l.cmd.Wait()
	var r loadResult
	out := l.out.String()
	if i := strings.LastIndex(out, "{\"connects\""); err != nil || i < 0 || json.Unmarshal([]byte(out[i:]), &r) != nil {
		t.Fatalf("the load in the Trial: %v\n%s", err, out)
	}
	return r
}

// check fails the test unless every CONNECT was answered and every
// tunnel carried its bytes intact, end to end.
func (r loadResult) check(t *testing.T, what string) {
	t.Helper()
	if r.Failed != 0 || r.Connects == 0 {
		t.Errorf("%s: %d CONNECTs failed of %d: %v", what, r.Failed, r.Failed+r.Connects, r.Errors)
	}
	for i, tu := range r.Tunnels {
		if !tu.OK || tu.Sent != tu.Recv || tu.SHASent != tu.SHARecv || tu.Sent == 0 {
			t.Errorf("%s: tunnel %d cut or corrupted: sent %d, echoed %d, sha %s/%s: %s", what, i, tu.Sent, tu.Recv, tu.SHASent, tu.SHARecv, tu.Err)
		}
	}
	t.Logf("%s: %d CONNECTs (%d failed), longest %d ms; %d tunnels", what, r.Connects, r.Failed, r.MaxWaitMS, len(r.Tunnels))
}

// createTrial makes a Trial that may reach the echo server.
func createTrial(t testing.TB, sock, id string) {
	t.Helper()
	if code, out, errOut := trialnet("create", "--socket", sock, "--id", id, "--allow", echoTarget); code != exitOK {
		t.Fatalf("create: exit %d: %s %s", code, out, errOut)
	}
}

// startNext starts a second agent, which takes over from the running
// one, and waits until it serves the control socket.
func (a *agentUnderTest) startNext(t testing.TB, wrapper ...string) {
	t.Helper()
	a.start(t, wrapper...)
	for end := time.Now().Add(30 * time.Second); agentPID(t, a.sock) != a.cmd.Process.Pid; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) || exited(a.cmd.Process.Pid) {
			b, _ := os.ReadFile(a.log)
			t.Fatalf("the new agent did not take over:\n%s", b)
		}
	}
}

// agentPID is the pid of the process serving the control socket.
func agentPID(t testing.TB, sock string) int {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	raw, _ := c.(*net.UnixConn).SyscallConn()
	var pid int
	_ = raw.Control(func(fd uintptr) {
		if cr, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			pid = int(cr.Pid)
		}
	})
	return pid
}

// waitExit waits for a child to exit, bounded.
func waitExit(t *testing.T, a *agentUnderTest, cmd *exec.Cmd, d time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		_ = cmd.Process.Signal(syscall.SIGQUIT) // its goroutines, into the log
		<-done
		t.Fatalf("pid %d did not exit within %s:\n%s", cmd.Process.Pid, d, a.events())
		return nil
	}
}

// events is the agents' log without the decision records.
func (a *agentUnderTest) events() string {
	b, _ := os.ReadFile(a.log)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, "msg=connect") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// auditAll reads a Trial's decision log; it must read whole.
func auditAll(t *testing.T, a *agentUnderTest, id string) []record.Event {
	t.Helper()
	recs, err := record.ReadFile(filepath.Join(a.data, id, "decisions.jsonl"))
	if err != nil {
		t.Fatalf("the decision log does not read whole (a torn or interleaved line?): %v", err)
	}
	return recs
}

// Restart by hand-over, under load: a new agent started while the old
// one serves takes every listener over; not one CONNECT is refused, not
// one tunnel is cut, and every byte arrives. Before that, a successor
// that dies in the middle of a hand-over changes nothing: the old agent
// serves on. The records of both processes are all in the Trial's log,
// whole, and the counters add up across them.
func TestPrivilegedAgentHandover(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "python3")
	a := newAgentWithConfig(t, "handover", echoWorld(t))
	a.start(t)
	createTrial(t, a.sock, "ho")
	// A Trial's process cannot reach the hand-over or keeper sockets: it
	// would take its own proxy's listeners, or everyone's.
	for _, path := range []string{agent.HandoverSocket(a.sock), keeper.DefaultSocket(a.sock)} {
		var out bytes.Buffer
		probe := trialnetProcess(t, "exec", "--socket", a.sock, "--trial", "ho", "--uid", "65534", "--gid", "65534", "--",
			"/usr/bin/python3", "-c", `import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sys.argv[1])
s.send(b'{"type":"hello","version":1}')
print("connected", s.recv(1 << 20)[:40])`, path)
		probe.Stdout, probe.Stderr = &out, &out
		if err := probe.Run(); err == nil || strings.Contains(out.String(), "connected") {
			t.Errorf("a Trial's process reached %s: %v %q", path, err, out.String())
		}
		t.Logf("a Trial's process at %s: %s", filepath.Base(path), lastLine(out.String()))
	}
	l := startLoad(t, a.sock, "ho", 8, 4, 2)
	waitActiveAtLeast(t, a.sock, "ho", 4)

	// A successor that takes the listeners and dies.
	if err := abortedHandover(t, a); err != nil {
		t.Fatal(err)
	}
	// A new agent with other paths (another state directory): it would
	// adopt none of these Trials. It is refused, and changes nothing.
	other := filepath.Join(t.TempDir(), "other.yaml")
	cfg, _ := os.ReadFile(a.config)
	if err := os.WriteFile(other, []byte(strings.Replace(string(cfg), a.host.StateDir, t.TempDir(), 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := trialnet("agent", "--config", other); code == exitOK || !strings.Contains(errOut, "only from one with the same paths") {
		t.Errorf("an agent with other paths beside the running one: exit %d, %q; want a refusal naming the paths", code, errOut)
	}
	time.Sleep(500 * time.Millisecond)
	if exited(a.cmd.Process.Pid) {
		b, _ := os.ReadFile(a.log)
		t.Fatalf("the agent exited after a failed hand-over:\n%s", b)
	}
	// The real one.
	old := a.cmd
	a.startNext(t)
	if code, out, errOut := trialnet("list", "--socket", a.sock); code != exitOK || !strings.Contains(out, "ho") {
		t.Fatalf("list on the new agent: exit %d %s %s", code, out, errOut)
	}
	// A probe of the new agent's readiness hears the new agent only.
	pidFile := filepath.Join(t.TempDir(), "agent.pid")
	for pid, want := range map[int]int{a.cmd.Process.Pid: exitOK, old.Process.Pid: exitFailure} {
		_ = os.WriteFile(pidFile, []byte(strconv.Itoa(pid)+"\n"), 0o600)
		if code, out, _ := trialnet("health", "--socket", a.sock, "--pid-file", pidFile); code != want {
			t.Errorf("health --pid-file naming pid %d: exit %d, want %d: %s", pid, code, want, out)
		}
	}
	r := l.wait(t)
	t.Logf("load done: %+v", r)
	if err := waitExit(t, a, old, 30*time.Second); err != nil {
		t.Errorf("the old agent after its drain: %v", err)
	}
	r.check(t, "hand-over")
	logged, _ := os.ReadFile(a.log)
	for _, want := range []string{"hand-over to a new agent failed; this agent keeps serving", "took over every listener", "drained; this agent exits"} {
		if !bytes.Contains(logged, []byte(want)) {
			t.Errorf("the agents' log says nothing like %q:\n%s", want, logged)
		}
	}
	// Every CONNECT and tunnel has its record, from whichever process
	// served it, and the new agent's counters count them all: once it has
	// taken what the old one sent, which its exit does not wait for.
	waitFollowed(t, a)
	recs := auditAll(t, a, "ho")
	allowed := 0
	for _, ev := range recs {
		if ev.Decision == record.DecisionAllow && ev.Target == echoTarget {
			allowed++
		}
	}
	if want := r.Connects + len(r.Tunnels); allowed != want {
		t.Errorf("the log has %d allowed records, want %d (every CONNECT and tunnel once)", allowed, want)
	}
	var st client.Stats
	code, out, _ := trialnet("stats", "--socket", a.sock, "-j", "--trial", "ho")
	if code != exitOK || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("stats: exit %d %s", code, out)
	}
	if st.Proxy.Allowed != uint64(allowed) || st.Proxy.Active != 0 {
		t.Errorf("the new agent counts %d allowed, %d active; the log has %d allowed, and nothing is open", st.Proxy.Allowed, st.Proxy.Active, allowed)
	}
	a.stop(t, syscall.SIGTERM)
}

// waitFollowed waits (bounded) until the new agent has taken everything
// the old one sent it, up to its Drained, which it logs: its counters
// hold every record the old agent wrote.
func waitFollowed(t *testing.T, a *agentUnderTest) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if b, _ := os.ReadFile(a.log); bytes.Contains(b, []byte("the agent this one took over from has drained and exits")) {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("the new agent did not hear the old one drain:\n%s", a.events())
		}
	}
}

// abortedHandover is a successor, a process of its own, that takes an
// agent's listeners and exits before it serves them.
func abortedHandover(t *testing.T, a *agentUnderTest) error {
	t.Helper()
	paths, _ := json.Marshal(map[string]string{"socket": a.sock, "state_dir": a.host.StateDir, "data_dir": a.data,
		"pin_dir": a.host.PinDir, "netns_dir": a.host.NetnsDir, "cgroup_parent": a.host.Parent})
	out, err := exec.Command("/usr/bin/python3", "-c", takeAndDie, agent.HandoverSocket(a.sock), string(paths)).CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"offer"`) || strings.Contains(string(out), `"fds": 0`) {
		return fmt.Errorf("a successor that dies: %v: %s", err, out)
	}
	return nil
}

// takeAndDie says hello on the hand-over socket argv[1] with the paths
// argv[2], takes the offer and its listeners, and exits.
const takeAndDie = `
import array, json, os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sys.argv[1])
s.send(json.dumps({"type": "hello", "version": 1, "pid": os.getpid(), "paths": json.loads(sys.argv[2])}).encode())
msg, anc, flags, addr = s.recvmsg(1 << 20, socket.CMSG_SPACE(250 * 4))
fds = array.array("i")
for level, kind, data in anc:
    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
        fds.frombytes(data[:len(data) - len(data) % 4])
print(json.dumps({"got": json.loads(msg)["type"], "fds": len(fds)}))
for fd in fds:
    os.close(fd)
`

// waitActiveAtLeast waits until the agent counts at least n open tunnels of
// Trial id.
func waitActiveAtLeast(t *testing.T, sock, id string, n int64) {
	t.Helper()
	waitProxy(t, sock, id, fmt.Sprintf("%d tunnels or more open", n), func(p record.TrialStats) bool { return p.Active >= n })
}

// waitProxy waits (a minute at most) until the Trial's proxy counters
// satisfy ok.
func waitProxy(t *testing.T, sock, id, want string, ok func(record.TrialStats) bool) {
	t.Helper()
	var st client.Stats
	for end := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if code, out, _ := trialnet("stats", "--socket", sock, "-j", "--trial", id); code == exitOK && json.Unmarshal([]byte(out), &st) == nil && ok(st.Proxy) {
			return
		}
		if time.Now().After(end) {
			// What the proxy did instead (refusals by reason), for a
			// failure seen only under load.
			t.Fatalf("Trial %s: want %s; its proxy counters: %+v", id, want, st.Proxy)
		}
	}
}

// lastLine is s's last non-empty line.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// recordsWith are a Trial's records whose detail contains s.
func recordsWith(recs []record.Event, s string) []record.Event {
	var out []record.Event
	for _, ev := range recs {
		if strings.Contains(ev.Detail, s) {
			out = append(out, ev)
		}
	}
	return out
}

// An agent killed outright: its listeners live on in the keeper, so the
// CONNECTs made while no agent runs wait, and the next agent serves them:
// none is refused. The tunnels the dead agent served die with it; the
// next agent records each of them as cut, from the dead one's ledger.
func TestPrivilegedAgentKilledListenersWait(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "python3")
	a := newAgentWithConfig(t, "killed", echoWorld(t))
	a.start(t)
	createTrial(t, a.sock, "kill")
	// The long tunnels first, alone, so that all three are open at the
	// kill (under TCG they can take a while); then the new CONNECTs. The
	// tunnels would last far longer than a loaded guest takes to reach the
	// kill: they end there, cut, not on their own before it.
	lt := startLoad(t, a.sock, "kill", longTunnel, 3, 0)
	waitActiveAtLeast(t, a.sock, "kill", 3)
	lc := startLoad(t, a.sock, "kill", 6, 0, 2)
	// Killed only once the churn runs in the Trial (one of its tunnels
	// closed; the held ones close only at their end): its exec must not
	// be what meets the dead agent.
	waitProxy(t, a.sock, "kill", "a tunnel of the churn closed", func(p record.TrialStats) bool { return p.Allowed > 0 })
	a.stop(t, syscall.SIGKILL)
	time.Sleep(time.Second) // CONNECTs queue meanwhile
	a.start(t)
	r, rt := lc.wait(t), lt.wait(t)
	r.Tunnels = rt.Tunnels
	if r.Refused != 0 || r.Connects == 0 {
		t.Errorf("%d of %d CONNECTs refused while the agent was down: %v", r.Refused, r.Connects+r.Failed, r.Errors)
	}
	cut := 0
	for _, tu := range r.Tunnels {
		if !tu.OK {
			cut++
		}
	}
	if cut != len(r.Tunnels) {
		t.Errorf("%d of %d long tunnels were cut; the agent serving them was killed", cut, len(r.Tunnels))
	}
	t.Logf("killed: %d CONNECTs waited or were served, %d cut in flight, longest %d ms", r.Connects, r.Failed-r.Refused, r.MaxWaitMS)
	lost := recordsWith(auditAll(t, a, "kill"), "ended without closing it")
	// The long tunnels that were answered before the kill (one still being
	// dialed was not allowed yet: no record is owed), and the CONNECT each
	// of the two loops may have had open (cut, or echoed but not yet
	// closed by the agent).
	answered := 0
	for _, tu := range r.Tunnels {
		if tu.Sent > 0 {
			answered++
		}
	}
	if answered == 0 || len(lost) < answered || len(lost) > len(r.Tunnels)+2 {
		t.Errorf("%d tunnels recorded as lost with the agent, want %d to %d: %+v", len(lost), answered, len(r.Tunnels)+2, lost)
	}
	for _, ev := range lost {
		if ev.Decision != record.DecisionAllow || ev.Target != echoTarget {
			t.Errorf("a lost tunnel's record: %+v", ev)
		}
	}
	a.stop(t, syscall.SIGTERM)
}

// A drain that outlasts drain_timeout: the old agent cuts what it still
// serves, each with a record that says why, and exits. New CONNECTs are
// not disturbed.
func TestPrivilegedAgentDrainTimeout(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "python3")
	a := newAgentWithConfig(t, "draintime", echoWorld(t)+"drain_timeout: 2s\n")
	a.start(t)
	createTrial(t, a.sock, "dt")
	// Tunnels that outlast any slow hand-over, so that the timeout is what
	// ends them; new CONNECTs meanwhile.
	lt := startLoad(t, a.sock, "dt", longTunnel, 3, 0)
	waitActiveAtLeast(t, a.sock, "dt", 3)
	lc := startLoad(t, a.sock, "dt", 8, 0, 2)
	old := a.cmd
	a.startNext(t)
	if err := waitExit(t, a, old, 20*time.Second); err != nil {
		t.Errorf("the old agent after its drain: %v", err)
	}
	r, rt := lc.wait(t), lt.wait(t)
	r.Tunnels = rt.Tunnels
	if r.Failed != 0 {
		t.Errorf("%d CONNECTs failed: %v", r.Failed, r.Errors)
	}
	for i, tu := range r.Tunnels {
		if tu.OK { // cut: an EOF or a reset, as what was in flight decides
			t.Errorf("tunnel %d outlived the drain timeout: %+v", i, tu)
		}
	}
	cut := recordsWith(auditAll(t, a, "dt"), "drain_timeout (2s) passed")
	if len(cut) != len(r.Tunnels) {
		t.Errorf("%d records of tunnels cut at the drain timeout, want %d: %+v", len(cut), len(r.Tunnels), cut)
	}
	a.stop(t, syscall.SIGTERM)
}

// During a drain, the Trial's policy is one: the old agent's tunnels
// count against max_tunnels on the new one, and a live deny --cut ends
// them too.
func TestPrivilegedAgentDrainFollowsPolicy(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "python3")
	a := newAgentWithConfig(t, "drainpolicy", echoWorld(t)+"limits:\n  max_tunnels: 5\n")
	a.start(t)
	createTrial(t, a.sock, "dp")
	l := startLoad(t, a.sock, "dp", 30, 4, 0)
	waitActiveAtLeast(t, a.sock, "dp", 4)
	old := a.cmd
	a.startNext(t)
	var st client.Stats
	if code, out, _ := trialnet("stats", "--socket", a.sock, "-j", "--trial", "dp"); code != exitOK || json.Unmarshal([]byte(out), &st) != nil || st.Proxy.Active != 4 {
		t.Errorf("the new agent counts %d open tunnels (exit %d), want the old agent's 4: %s", st.Proxy.Active, code, out)
	}
	if d := st.Proxy.Allowed; d != 0 {
		t.Errorf("%d tunnels counted as ended; none has", d)
	}
	// One more tunnel fits under max_tunnels 5, a second does not.
	var out bytes.Buffer
	probe := trialnetProcess(t, "exec", "--socket", a.sock, "--trial", "dp", "--uid", "65534", "--gid", "65534", "--",
		"/usr/bin/python3", "-c", twoConnects, echoTarget)
	probe.Stdout, probe.Stderr = &out, &out
	if err := probe.Run(); err != nil || !strings.Contains(out.String(), "first 200, second 429") {
		t.Errorf("two more CONNECTs under max_tunnels 5 with 4 open in the old agent: %v %q, want the first allowed and the second refused", err, out.String())
	}
	code, dout, derr := trialnet("deny", "--socket", a.sock, "--trial", "dp", "--cut", echoTarget)
	if code != exitOK || !regexp.MustCompile(`tunnels_cut\s+4\n`).MatchString(dout) {
		t.Errorf("deny --cut during the drain: exit %d, %q %q; want the old agent's 4 tunnels cut", code, dout, derr)
	}
	if err := waitExit(t, a, old, 20*time.Second); err != nil {
		t.Errorf("the old agent, its tunnels cut: %v", err)
	}
	r := l.wait(t)
	for i, tu := range r.Tunnels {
		if tu.OK {
			t.Errorf("tunnel %d outlived deny --cut: %+v", i, tu)
		}
	}
	if cut := recordsWith(auditAll(t, a, "dp"), "tunnel cut by a policy change"); len(cut) != 4 {
		t.Errorf("%d records of tunnels cut by the policy change, want 4: %+v", len(cut), cut)
	}
	a.stop(t, syscall.SIGTERM)
}

// A profile reload (reload --reprofile) during a drain reaches the old
// agent too: a CONNECT whose head it reads after the reload is decided by
// the profile's new list. The connection was accepted by the old agent
// before the hand-over, and its head is sent only after the reload.
func TestPrivilegedAgentDrainFollowsReload(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "python3")
	a := newAgentWithConfig(t, "drainreload", echoWorld(t)+fmt.Sprintf("profiles:\n  echo: [%q]\n", echoTarget))
	a.start(t)
	if code, out, errOut := trialnet("create", "--socket", a.sock, "--id", "dr", "--profile", "echo"); code != exitOK {
		t.Fatalf("create: exit %d: %s %s", code, out, errOut)
	}
	held := trialnetProcess(t, "exec", "--socket", a.sock, "--trial", "dr", "--uid", "65534", "--gid", "65534", "--",
		"/usr/bin/python3", "-c", heldConnect, echoTarget)
	in, err := held.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := held.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	held.Stderr = os.Stderr
	if err := held.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = held.Process.Kill(); _ = held.Wait() })
	lines := bufio.NewScanner(out)
	if !lines.Scan() || lines.Text() != "connected" {
		t.Fatalf("the held connection: %q %v", lines.Text(), lines.Err())
	}
	old := a.cmd
	a.startNext(t)
	cfg, _ := os.ReadFile(a.config)
	cfg = bytes.Replace(cfg, []byte(strconv.Quote(echoTarget)), []byte(`"other.test:9000"`), 1)
	if err := os.WriteFile(a.config, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	code, rout, rerr := trialnet("reload", "--socket", a.sock, "--reprofile")
	if code != exitOK || !strings.Contains(rout, "dr") || strings.Contains(rout, "note") {
		t.Fatalf("reload --reprofile during the drain: exit %d %q %q; want dr reprofiled, confirmed by the draining agent", code, rout, rerr)
	}
	if _, err := io.WriteString(in, "go\n"); err != nil {
		t.Fatal(err)
	}
	if !lines.Scan() || !strings.HasPrefix(lines.Text(), "answer HTTP/1.1 403") {
		t.Errorf("a CONNECT the draining agent read after the profile lost its target: %q; want 403 (policy_denied)", lines.Text())
	}
	if err := waitExit(t, a, old, 30*time.Second); err != nil {
		t.Errorf("the old agent after its drain: %v", err)
	}
	a.stop(t, syscall.SIGTERM)
}

// heldConnect connects to the Trial's proxy, says so, and sends a CONNECT
// to argv[1] only once a line arrives on its stdin; it prints the answer.
const heldConnect = `
import os, socket, sys
host, port = os.environ["HTTPS_PROXY"].split("//", 1)[1].rstrip("/").rsplit(":", 1)
s = socket.create_connection((host, int(port)), timeout=30)
print("connected", flush=True)
sys.stdin.readline()
s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (sys.argv[1], sys.argv[1])).encode())
print("answer", s.recv(4096).split(b"\r\n")[0].decode(), flush=True)
`

// twoConnects opens two tunnels to argv[1] and says how each was
// answered.
const twoConnects = `
import os, socket, sys
host, port = os.environ["HTTPS_PROXY"].split("//", 1)[1].rstrip("/").rsplit(":", 1)
codes, socks = [], []
for _ in range(2):
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (sys.argv[1], sys.argv[1])).encode())
    codes.append(s.recv(4096).split(b" ")[1].decode())
    socks.append(s)
print("first %s, second %s" % tuple(codes))
`

// An upgrade: the agent runs from a binary at a path; a new build is
// installed at that path, and SIGUSR2 (systemctl reload) makes the agent
// start it to take over. The new binary serves, and the load sees
// nothing: no CONNECT refused, no tunnel cut, every byte intact.
func TestPrivilegedAgentUpgrade(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "python3")
	dir := t.TempDir()
	installed := filepath.Join(dir, "trialnet")
	// The running build: this test binary, which runs as trialnet in the
	// agent's environment (TRIALNET_CLI_MAIN).
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(installed, b, 0o755); err != nil {
		t.Fatal(err)
	}
	// The new build, passed in as a binary (TRIALNET_UPGRADE_TO), else
	// built from this tree.
	next := os.Getenv("TRIALNET_UPGRADE_TO")
	if next == "" {
		privtest.RequireTool(t, "go")
		next = filepath.Join(t.TempDir(), "trialnet-next")
		testkit.BuildTrialnet(t, "../..", next)
	}
	a := newAgentWithConfig(t, "upgrade", echoWorld(t))
	cmd := exec.Command(installed, "agent", "--config", a.config)
	cmd.Env = append(os.Environ(), "TRIALNET_CLI_MAIN=1")
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			_ = cmd.Wait()
		}
	})
	a.startCmd(t, cmd)
	createTrial(t, a.sock, "up")
	l := startLoad(t, a.sock, "up", 8, 4, 2)
	waitActiveAtLeast(t, a.sock, "up", 4)
	// Installed as a package manager does: a new file renamed over the
	// path, while the old one runs on.
	nb, err := os.ReadFile(next)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(installed+".new", nb, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(installed+".new", installed); err != nil {
		t.Fatal(err)
	}
	old := a.cmd
	if err := old.Process.Signal(syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	var pid int
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if pid = agentPID(t, a.sock); pid != old.Process.Pid && pid != 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("no new agent took over after SIGUSR2:\n%s", a.events())
		}
	}
	// Ended when the test ends: it is not this test's child.
	t.Cleanup(func() {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		for end := time.Now().Add(10 * time.Second); syscall.Kill(pid, 0) == nil && time.Now().Before(end); {
			time.Sleep(20 * time.Millisecond)
		}
	})
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil || exe != installed {
		t.Errorf("the new agent runs %q (%v), want the installed %s", exe, err, installed)
	}
	var st1, st2 syscall.Stat_t
	if syscall.Stat(fmt.Sprintf("/proc/%d/exe", pid), &st1) != nil || syscall.Stat(next, &st2) != nil || st1.Size != st2.Size {
		t.Errorf("the new agent does not run the new build (%d bytes, the new build %d)", st1.Size, st2.Size)
	}
	r := l.wait(t)
	if err := waitExit(t, a, old, 30*time.Second); err != nil {
		t.Errorf("the old agent after its drain: %v", err)
	}
	r.check(t, "upgrade")
	if code, out, errOut := trialnet("destroy", "--socket", a.sock, "up"); code != exitOK {
		t.Errorf("destroy on the upgraded agent: exit %d %s %s", code, out, errOut)
	}
}

// previousBuild is the last commit before agents handed over: an agent
// of it runs on hosts that upgrade to this one. test/vmtest builds it
// from the same file.
func previousBuild(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("testdata/previous-build")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// An agent of a build from before hand-overs (passed in as a binary,
// TRIALNET_PREVIOUS_AGENT, else built from git): a new agent started
// beside it says that it cannot take over and why, and changes nothing:
// the old one serves its load on untouched. Stopped and replaced, its
// Trial is re-adopted by this build, and serves.
func TestPrivilegedAgentOlderThanHandover(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "python3")
	prev := os.Getenv("TRIALNET_PREVIOUS_AGENT")
	if prev == "" {
		privtest.RequireTool(t, "git")
		privtest.RequireTool(t, "go")
		src := t.TempDir()
		rev := previousBuild(t)
		archive := exec.Command("sh", "-c", `git archive --format=tar "$0" | tar -x -C "$1"`, rev, src)
		archive.Dir = "../.."
		if b, err := archive.CombinedOutput(); err != nil {
			t.Fatalf("the previous build's source (git %s; or pass its binary as TRIALNET_PREVIOUS_AGENT): %v\n%s", rev, err, b)
		}
		prev = filepath.Join(t.TempDir(), "trialnet-previous")
		testkit.BuildTrialnet(t, src, prev)
	}
	a := newAgentWithConfig(t, "older", echoWorld(t))
	old := exec.Command(prev, "agent", "--config", a.config)
	t.Cleanup(func() {
		if old.ProcessState == nil {
			_ = old.Process.Signal(syscall.SIGTERM)
			_ = old.Wait()
		}
	})
	a.startCmd(t, old)
	createTrial(t, a.sock, "older")
	l := startLoad(t, a.sock, "older", 5, 2, 2)
	time.Sleep(1500 * time.Millisecond)

	var out bytes.Buffer
	next := trialnetProcess(t, "agent", "--config", a.config)
	next.Stdout, next.Stderr = &out, &out
	if err := next.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- next.Wait() }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(out.String(), "offers no hand-over (an older trialnet") {
			t.Errorf("a new agent beside one from before hand-overs: %v, %q; want a refusal that says so", err, out.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the new agent neither took over nor gave up:\n%s", out.String())
	}
	if pid := agentPID(t, a.sock); pid != old.Process.Pid {
		t.Errorf("the control socket is served by pid %d, not the old agent %d", pid, old.Process.Pid)
	}
	l.wait(t).check(t, "beside an older agent")

	// The way from an older build: stop it, start this one.
	a.stop(t, syscall.SIGTERM)
	a.start(t)
	if code, lout, _ := trialnet("list", "--socket", a.sock); code != exitOK || !strings.Contains(lout, "older") {
		t.Fatalf("this build did not re-adopt the older build's Trial: exit %d %q\n%s", code, lout, a.events())
	}
	startLoad(t, a.sock, "older", 1, 1, 1).wait(t).check(t, "re-adopted from an older build")
	a.stop(t, syscall.SIGTERM)
}
