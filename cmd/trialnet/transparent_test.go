//go:build linux

package main

import (
	"bufio"
	"bytes"
	"io"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/keeper"
	"github.com/trialnet/trialnet/record"
)

// acrossAKill runs in a transparent Trial with no proxy variable: it
// looks argv[1] up through the Trial's resolv.conf (glibc, the stub),
// opens a tunnel to that address on port argv[2] and says "open ADDR".
// At the first line on its stdin (the agent is dead) it says how the
// tunnel ended, then asks the stub for the name once over UDP and once
// over TCP, each a single query, never sent again, and connects to the
// address anew; it says "sent" for each as it is sent, and "answer" or
// "failed" when that is known. At the second line it looks the name up
// and connects once more, and counts the sockets on the stub's address.
const acrossAKill = `
import os, socket, struct, sys, threading
if any("proxy" in k.lower() for k in os.environ):
    sys.exit("proxy variables in the environment: %s" % sorted(os.environ))
name, port = sys.argv[1], int(sys.argv[2])
STUB = ("127.0.0.53", 53)

def out(*a):
    print(*a, flush=True)

def readn(s, n):
    got = b""
    while len(got) < n:
        d = s.recv(n - len(got))
        if not d:
            raise Exception("closed after %r" % got)
        got += d
    return got

def echo(s, line):
    s.sendall(line)
    got = readn(s, len(line))
    if got != line:
        raise Exception("echoed %r" % got)

def query(qid):
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    return q + b"\0" + struct.pack(">HH", 1, 1)

def address(msg, qid):
    rid, flags, qd, an = struct.unpack(">HHHH", msg[:8])
    if rid != qid or flags & 0xF or an != 1:
        raise Exception("answer id %d rcode %d, %d records" % (rid, flags & 0xF, an))
    i = 12
    while msg[i]:
        i += msg[i] + 1
    i += 5
    i += 2 if msg[i] & 0xC0 else len(name) + 2
    typ, cls, ttl, n = struct.unpack(">HHIH", msg[i:i + 10])
    if typ != 1 or n != 4:
        raise Exception("record type %d" % typ)
    return socket.inet_ntoa(msg[i + 10:i + 14])

def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(60)
    s.connect(STUB)  # connected: an ICMP refusal is an error here
    s.send(query(1))
    out("sent udp")
    out("answer udp", address(s.recv(512), 1))

def tcp():
    s = socket.create_connection(STUB, timeout=60)
    q = query(2)
    s.sendall(struct.pack(">H", len(q)) + q)
    out("sent tcp")
    n = struct.unpack(">H", readn(s, 2))[0]
    out("answer tcp", address(readn(s, n), 2))

def pool():
    s = socket.create_connection((addr, port), timeout=60)
    s.sendall(b"queued-while-no-agent-ran\n")
    out("sent pool")
    got = readn(s, 26)
    if got != b"queued-while-no-agent-ran\n":
        raise Exception("echoed %r" % got)
    s.close()
    out("answer pool echoed")

def run(f, what):
    try:
        f()
    except Exception as e:
        out("failed", what, repr(e))

def lookup():
    return socket.getaddrinfo(name, port, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]

def count(path, state):
    n = 0
    for line in open(path).read().splitlines()[1:]:
        f = line.split()
        n += f[1].startswith("3500007F:") and f[3] == state
    return n

addr = lookup()
t = socket.create_connection((addr, port), timeout=60)
echo(t, b"before-the-kill\n")
out("open", addr)
sys.stdin.readline()
try:
    d = t.recv(4096)
    out("tunnel", "ended" if not d else "alive %r" % d)
except OSError as e:
    out("tunnel ended", repr(e))
ths = [threading.Thread(target=run, args=(f, w)) for f, w in ((udp, "udp"), (tcp, "tcp"), (pool, "pool"))]
for th in ths:
    th.start()
for th in ths:
    th.join()
sys.stdin.readline()
again = lookup()
s = socket.create_connection((again, port), timeout=60)
echo(s, b"after-the-restart\n")
s.close()
out("after", again, "echoed")
# listening TCP (0A) and bound UDP (07) sockets on 127.0.0.53, any port
out("sockets", count("/proc/net/tcp", "0A"), count("/proc/net/udp", "07"))
`

// scriptLines are a process's output lines as they come.
func scriptLines(r io.Reader) <-chan string {
	ch := make(chan string, 64)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			ch <- sc.Text()
		}
	}()
	return ch
}

// An agent killed outright, with a transparent Trial: the stub's sockets
// and the transparent listener live on in the keeper, so a DNS query
// (UDP and TCP) and a new connection to an address handed out before the
// kill wait while no agent runs, and the next agent answers them, the
// address still meaning the same name: none is refused or reset. The
// transparent tunnel the dead agent served dies with it, and the next
// agent records it as cut, from the dead one's ledger. Nothing is left
// twice: the Trial has one stub and one listener, the keeper holds as
// many sockets as before.
func TestPrivilegedAgentKilledTransparentWaits(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "python3")
	a := newAgentWithConfig(t, "killtransp", echoWorld(t))
	a.start(t)
	createTrial(t, a.sock, "ktr")
	kc := keeper.NewClient(keeper.DefaultSocket(a.sock), a.host.StateDir, false, slog.New(slog.DiscardHandler))
	kept, err := kc.Held()
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(echoTarget)
	var errOut bytes.Buffer
	p := trialnetProcess(t, "exec", "--socket", a.sock, "--trial", "ktr", "--uid", "65534", "--gid", "65534", "--",
		"/usr/bin/env", "-i", "PATH=/usr/bin:/bin", "/usr/bin/python3", "-c", acrossAKill, host, port)
	in, err := p.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := p.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.Stderr = &errOut
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	lines := scriptLines(stdout)
	next := func() string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the script in the Trial ended early: %v\n%s\nagents:\n%s", p.Wait(), errOut.String(), a.events())
			}
			t.Logf("in the Trial: %s", l)
			return l
		case <-time.After(90 * time.Second):
			t.Fatalf("the script in the Trial said nothing for 90 s\n%s\nagents:\n%s", errOut.String(), a.events())
			return ""
		}
	}
	addr, ok := strings.CutPrefix(next(), "open ")
	if !ok {
		t.Fatalf("the script did not open its tunnel\n%s", errOut.String())
	}
	waitActiveAtLeast(t, a.sock, "ktr", 1)

	a.stop(t, syscall.SIGKILL)
	if _, err := io.WriteString(in, "killed\n"); err != nil {
		t.Fatal(err)
	}
	if l := next(); !strings.HasPrefix(l, "tunnel ended") {
		t.Errorf("the transparent tunnel open at the kill: %q; want it ended with its agent", l)
	}
	// Each waits, sent and unanswered, while no agent runs.
	state := map[string]string{}
	for len(state) < 3 {
		l := next()
		state[strings.Fields(l)[1]] = l
	}
	time.Sleep(time.Second) // no agent runs meanwhile
	select {
	case l := <-lines:
		state[strings.Fields(l)[1]] = l
	default:
	}
	answers := map[string]string{}
	for what, l := range state {
		if !strings.HasPrefix(l, "sent ") {
			t.Errorf("%s, while no agent ran: %q; want it sent and waiting", what, l)
			answers[what] = l
		}
	}
	a.start(t)
	for len(answers) < 3 {
		l := next()
		if f := strings.Fields(l); f[0] != "sent" {
			answers[f[1]] = l
		}
	}
	for what, want := range map[string]string{"udp": "answer udp " + addr, "tcp": "answer tcp " + addr, "pool": "answer pool echoed"} {
		if answers[what] != want {
			t.Errorf("%s sent while no agent ran, once the next agent started: %q; want %q", what, answers[what], want)
		}
	}
	if _, err := io.WriteString(in, "again\n"); err != nil {
		t.Fatal(err)
	}
	if l := next(); l != "after "+addr+" echoed" {
		t.Errorf("a lookup and a connection after the restart: %q; want the same address, echoed", l)
	}
	if l := next(); l != "sockets 2 1" {
		t.Errorf("on the stub's address in the Trial: %q; want 2 listeners (the stub's, the transparent one) and 1 UDP socket", l)
	}
	if err := p.Wait(); err != nil {
		t.Fatalf("the script in the Trial: %v\n%s", err, errOut.String())
	}
	if n, err := kc.Held(); err != nil || n != kept {
		t.Errorf("the keeper holds %d sockets (%v), before the kill %d", n, err, kept)
	}

	// The tunnel cut by the kill is recorded as cut, marked transparent;
	// the connections the next agent served, as allowed.
	var lost, served []record.Event
	for end := time.Now().Add(20 * time.Second); len(served) < 2 && time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		recs := auditAll(t, a, "ktr")
		lost, served = recordsWith(recs, "ended without closing it"), nil
		for _, ev := range recs {
			if ev.Decision == record.DecisionAllow && ev.Transparent && ev.Target == echoTarget && !strings.Contains(ev.Detail, "ended without closing it") {
				served = append(served, ev)
			}
		}
	}
	if len(lost) != 1 || !lost[0].Transparent || lost[0].Decision != record.DecisionAllow || lost[0].Target != echoTarget {
		t.Errorf("the records of tunnels cut with the agent: %+v; want one, of the transparent tunnel to %s", lost, echoTarget)
	}
	if len(served) != 2 {
		t.Errorf("%d allowed transparent records after the restart, want 2 (the connection that waited, and one after): %+v", len(served), served)
	}
	a.stop(t, syscall.SIGTERM)
}

// A keeper that went away while the agent runs (stopped, crashed, a
// Kubernetes container restarted) is given every listener again, the
// transparent Trial's stub sockets and listener with its endpoint's,
// by the agent's tending, which now counts them before it copies any.
func TestPrivilegedAgentRefillsARestartedKeeper(t *testing.T) {
	privtest.Require(t)
	a := newAgentWithConfig(t, "refill", echoWorld(t))
	a.start(t)
	createTrial(t, a.sock, "refill")
	path := keeper.DefaultSocket(a.sock)
	kc := keeper.NewClient(path, a.host.StateDir, false, slog.New(slog.DiscardHandler))
	kept, err := kc.Held()
	if err != nil || kept < 4 { // the endpoint, the stub's two sockets, the steered listener
		t.Fatalf("the keeper holds %d listeners (%v), want the Trial's 4 or more", kept, err)
	}
	if err := keeper.Stop(path); err != nil {
		t.Fatal(err)
	}
	// The agent tends its keeper every 10 s: one that answers none
	// starts anew and is refilled.
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		n, err := kc.Held()
		if err == nil && n == kept {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("30 s after its keeper stopped, a keeper holds %d listeners (%v), want the %d it held before", n, err, kept)
		}
	}
	a.stop(t, syscall.SIGTERM)
}
