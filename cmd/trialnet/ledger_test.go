//go:build linux

package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testhost"
	"github.com/trialnet/trialnet/record"
	trialspec "github.com/trialnet/trialnet/trial"
)

// holdPort is where the test host of TestPrivilegedAgentKilledLongTarget
// accepts connections and never answers: a forwarded request to it stays
// open.
const holdPort = 9001

// openScript runs in the Trial: it opens a tunnel to argv[1] (echoing a
// line through it) and sends a forwarded request for argv[2], which the
// upstream never answers, prints "open", and waits until the agent
// serving both goes away.
const openScript = `
import os, socket, sys
proxy = os.environ["HTTPS_PROXY"].split("//", 1)[1].rstrip("/")
host, port = proxy.rsplit(":", 1)
P = (host, int(port))
t = socket.create_connection(P, timeout=60)
t.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (sys.argv[1], sys.argv[1])).encode())
buf = b""
while b"\r\n\r\n" not in buf:
    buf += t.recv(4096)
assert buf.startswith(b"HTTP/1.1 200"), buf
t.sendall(b"ping\n")
got = buf.split(b"\r\n\r\n", 1)[1]
while len(got) < 5:
    got += t.recv(16)
r = socket.create_connection(P, timeout=60)
r.sendall(("GET %s HTTP/1.1\r\nHost: echo.test:%s\r\n\r\n" % (sys.argv[2], sys.argv[3])).encode())
print("open", flush=True)
try:
    t.recv(16)
except OSError:
    pass
`

// An agent killed outright while a Trial has a tunnel and a forwarded
// request open, the request's target nearly a request line of '<'
// (which the parser takes): its record is six times longer as JSON than
// the target, and more than a ledger slot holds. The next agent records
// both as cut; the request's record is trimmed, not lost.
func TestPrivilegedAgentKilledLongTarget(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "python3")
	held := holdWorld(t)
	a := newAgentWithConfig(t, "killedlong", held.config)
	a.start(t)
	hold := fmt.Sprintf("echo.test:%d", holdPort)
	if code, out, errOut := trialnet("create", "--socket", a.sock, "--id", "klong", "--allow", echoTarget, "--allow", hold); code != exitOK {
		t.Fatalf("create: exit %d: %s %s", code, out, errOut)
	}
	prefix := "http://" + hold + "/"
	target := prefix + strings.Repeat("<", 1000-len(prefix))
	cmd := trialnetProcess(t, "exec", "--socket", a.sock, "--trial", "klong", "--uid", "65534", "--gid", "65534", "--",
		"/usr/bin/python3", "-c", openScript, echoTarget, target, strconv.Itoa(holdPort))
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Both are open: the tunnel echoed, the request reached the upstream
	// (after its ledger slot was taken).
	waitActiveAtLeast(t, a.sock, "klong", 2)
	for end := time.Now().Add(30 * time.Second); held.accepted.Load() == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the forwarded request never reached the upstream:\n%s\n%s", out.String(), a.events())
		}
	}
	a.stop(t, syscall.SIGKILL)
	a.start(t)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil || !strings.Contains(out.String(), "open") {
			t.Errorf("the Trial's script: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-done
		t.Errorf("the Trial's tunnel outlived the agent serving it:\n%s", out.String())
	}
	a.stop(t, syscall.SIGTERM)
	lost := recordsWith(auditAll(t, a, "klong"), "ended without closing it")
	var tunnel, request int
	for _, ev := range lost {
		switch {
		case ev.Target == echoTarget && ev.Decision == record.DecisionAllow:
			tunnel++
		case strings.HasPrefix(ev.Target, prefix+"<<<<<<<<") && strings.HasSuffix(ev.Target, fmt.Sprintf("…[%d bytes]", len(target))) &&
			ev.Decision == record.DecisionAllow && ev.Rule == hold && strings.Contains(ev.Detail, "trimmed to fit the ledger"):
			request++
		}
	}
	if tunnel != 1 || request != 1 || len(lost) != 2 {
		t.Errorf("recorded as lost with the agent: %d records, %d of the tunnel, %d of the request; want one each: %+v", len(lost), tunnel, request, lost)
	}
}

// heldWorld is a test host with an echo server on echoPort and, on
// holdPort, a server that accepts and never answers, named echo.test.
type heldWorld struct {
	config   string // the agent's resolver and allowed CIDRs
	accepted atomic.Int64
}

func holdWorld(t *testing.T) *heldWorld {
	t.Helper()
	th := testhost.NewT(t, 211)
	w := &heldWorld{}
	listen := func(port int) net.Listener {
		ln, err := th.NS.Listen(context.Background(), "tcp", netip.AddrPortFrom(th.Addr4, uint16(port)).String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		return ln
	}
	go testhost.Echo(listen(echoPort))
	ln := listen(holdPort)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			w.accepted.Add(1)
		}
	}()
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	dnsAddr, stop, err := testhost.ServeDNS(th.Addr4, "echo.test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	w.config = fmt.Sprintf("resolvers: [%q]\nallow_cidrs: [\"198.18.0.0/15\"]\n", dnsAddr)
	return w
}

// countScript runs in the Trial: argv[1] CONNECTs to argv[2], each
// echoing a line and closed, then argv[3] to argv[4], each refused.
const countScript = `
import os, socket, sys
host, port = os.environ["HTTPS_PROXY"].split("//", 1)[1].rstrip("/").rsplit(":", 1)
P = (host, int(port))
def connect(t):
    s = socket.create_connection(P, timeout=60)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (t, t)).encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(4096)
        if not d:
            break
        buf += d
    return s, buf
for _ in range(int(sys.argv[1])):
    s, buf = connect(sys.argv[2])
    assert buf.startswith(b"HTTP/1.1 200"), buf
    s.sendall(b"ping\n")
    got = buf.split(b"\r\n\r\n", 1)[1]
    while len(got) < 5:
        got += s.recv(16)
    s.close()
for _ in range(int(sys.argv[3])):
    s, buf = connect(sys.argv[4])
    assert buf.startswith(b"HTTP/1.1 403"), buf
    s.close()
print("done", flush=True)
`

// An agent killed outright while a Trial's decisions are counted only in
// its pending summary (its log full): the next agent writes that summary
// from the dead one's ledger, and the log counts every decision, as do
// the counters it rebuilds from it. Red with the gate's copy into the
// ledger taken out: the log then counted none of the ten decisions.
func TestPrivilegedAgentKilledPendingSummary(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "python3")
	a := newAgentWithConfig(t, "killedsum", echoWorld(t))
	a.start(t)
	c := client.NewClient(a.sock)
	lim := trialspec.ProxyLimits{MaxLogBytes: 1, ConnectRate: 1000, ConnectBurst: 1000}
	if _, err := c.Create(context.Background(), trialspec.Request{ID: "ksum", Allow: []string{echoTarget}, Limits: &trialspec.Limits{ProxyLimits: lim}}); err != nil {
		t.Fatal(err)
	}
	const allowed, refused = 5, 5
	out, err := trialnetProcess(t, "exec", "--socket", a.sock, "--trial", "ksum", "--uid", "65534", "--gid", "65534", "--",
		"/usr/bin/python3", "-c", countScript, strconv.Itoa(allowed), echoTarget, strconv.Itoa(refused), "denied.test:443").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "done") {
		t.Fatalf("the Trial's script: %v\n%s", err, out)
	}
	// Within record.SummaryEvery of the first decision: the log holds only
	// the summary written when it filled.
	before := countDecisions(auditAll(t, a, "ksum"))
	if before.Allowed+before.Denied >= allowed+refused {
		t.Fatalf("the log counted all %d decisions before the agent was killed (the machine took longer than the summaries' 10 s); the test wants some pending", allowed+refused)
	}
	a.stop(t, syscall.SIGKILL)
	a.start(t)
	a.stop(t, syscall.SIGTERM)
	recs := auditAll(t, a, "ksum")
	after := countDecisions(recs)
	if after.Allowed != allowed || after.Denied != refused || after.ByReason[record.ReasonPolicyDenied] != refused {
		t.Errorf("after the agent was killed and restarted, the log counts %d allowed and %d refused (%v); want %d and %d (before the kill: %d and %d)",
			after.Allowed, after.Denied, after.ByReason, allowed, refused, before.Allowed, before.Denied)
	}
	if n := len(recordsWith(recs, "had not written when it ended")); n != 1 {
		t.Errorf("%d summaries written from the dead agent's ledger, want 1", n)
	}
}

// countDecisions counts recs as a replay of the log does.
func countDecisions(recs []record.Event) record.TrialStats {
	var st record.TrialStats
	for i := range recs {
		st.Add(&recs[i])
	}
	return st
}
