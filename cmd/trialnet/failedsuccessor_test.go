//go:build linux

package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/record"
)

// holdScript runs in a Trial: it opens a CONNECT to argv[1] every 50 ms
// and holds each tunnel, with a refused CONNECT (to argv[2]) between,
// until its stdin ends (the test's word), it holds argv[3] or 5 minutes
// passed; then it says how many still echo and how many were cut. A
// CONNECT not answered within 5 s (its agent stopped) is given up, one
// whose connection breaks (its agent killed) counted as unanswered too.
const holdScript = `
import json, os, select, socket, sys, time
host, port = os.environ["HTTPS_PROXY"].split("//", 1)[1].rstrip("/").rsplit(":", 1)
T, X, N = sys.argv[1], sys.argv[2], int(sys.argv[3])
held, res = [], {"alive": 0, "cut": 0, "refused": 0, "unanswered": 0}
def connect(t):
    s = None
    try:
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (t, t)).encode())
        return s, s.recv(4096).startswith(b"HTTP/1.1 200")
    except OSError:
        if s is not None:
            s.close()
        res["unanswered"] += 1
        return None, False
end = time.monotonic() + 300
while len(held) < N and time.monotonic() < end:
    if select.select([sys.stdin], [], [], 0)[0] and not sys.stdin.read():
        break
    s, ok = connect(T)
    if ok:
        held.append(s)
    elif s is not None:
        res["refused"] += 1
    s, ok = connect(X)
    if s is not None:
        s.close()
    time.sleep(0.05)
for s in held:
    try:
        s.settimeout(10)
        s.sendall(b"ping\n")
        res["alive" if s.recv(16) == b"ping\n" else "cut"] += 1
    except OSError:
        res["cut"] += 1
print(json.dumps(res))
`

// ledgerInUse reports whether pid's tunnel ledger of Trial id under the
// state directory keeps a tunnel: that process serves one.
func ledgerInUse(stateDir, id string, pid int) bool {
	b, err := os.ReadFile(filepath.Join(stateDir, id+".ledgers", strconv.Itoa(pid)))
	if err != nil {
		return false
	}
	const header, slot = 64, 2048 // package ledger's layout
	if len(b) < header {
		return false
	}
	// The slots, not the pending summary's copy after them.
	end := header + int(min(binary.LittleEndian.Uint64(b[24:]), uint64((len(b)-header)/slot)))*slot
	for off := header; off+slot <= end; off += slot {
		if binary.LittleEndian.Uint32(b[off:]) == 1 {
			return true
		}
	}
	return false
}

// refusals is how many refusals Trial fs's log holds, as far as it
// reads whole while it is written.
func refusals(a *agentUnderTest) int {
	n := 0
	recs, _ := record.ReadFile(filepath.Join(a.data, "fs", "decisions.jsonl"))
	for _, ev := range recs {
		if ev.Decision == record.DecisionDeny {
			n++
		}
	}
	return n
}

// refuseOnceScript runs in a Trial: one CONNECT its allowlist refuses.
const refuseOnceScript = `
import os, socket
host, port = os.environ["HTTPS_PROXY"].split("//", 1)[1].rstrip("/").rsplit(":", 1)
s = socket.create_connection((host, int(port)), timeout=5)
s.sendall(b"CONNECT other.test:9000 HTTP/1.1\r\nHost: other.test:9000\r\n\r\n")
s.recv(4096)
`

// padDecisionLog makes Trial id's decision log at least n bytes: the
// record of one refused CONNECT, written by the agent, copied until it
// is, so that the log replays as that many refusals.
func padDecisionLog(t *testing.T, a *agentUnderTest, id string, n int) {
	t.Helper()
	if code, out, errOut := trialnet("exec", "--socket", a.sock, "--trial", id, "--uid", "65534", "--gid", "65534", "--",
		"/usr/bin/python3", "-c", refuseOnceScript); code != exitOK {
		t.Fatalf("a refused CONNECT in %s: exit %d\n%s%s", id, code, out, errOut)
	}
	path := filepath.Join(a.data, id, "decisions.jsonl")
	var line []byte
	testkit.WaitFor(t, "the refusal's record in "+id+"'s log", time.Minute, func() bool {
		b, _ := os.ReadFile(path)
		line, _, _ = bytes.Cut(b, []byte("\n"))
		return bytes.Contains(b, []byte("\n"))
	})
	line = append(line, '\n')
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(bytes.Repeat(line, n/len(line)+1)); err != nil {
		t.Fatal(err)
	}
}

// A successor that adopted a Trial, served tunnels of it beside the old
// agent, and died before it said serving: the old agent serves on, and
// the tunnels that died with the successor are in the Trial's log, each
// recorded as cut, as after a crash. Before, no later adoption read the
// successor's ledger, and a destroy swept it unread: a tunnel that
// reached its upstream had no record, and the counters one less.
func TestPrivilegedAgentFailedSuccessorsTunnelsRecorded(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "python3")
	a := newAgentWithConfig(t, "failedsucc", echoWorld(t)+"prepared: 0\n")
	a.start(t)
	createTrial(t, a.sock, "fs")
	// A Trial the successor adopts after fs, whose stub's names file it
	// cannot open, as on a stuck disk (a FIFO over it, which its open
	// for writing waits on): it serves fs and stalls there, until it is
	// killed. (Its decision log is read without blocking, and refused if
	// it is no regular file.) Trials are adopted smallest decision log
	// first: zz's is made larger than fs's will be, a record of its own
	// copied many times over.
	createTrial(t, a.sock, "zz")
	padDecisionLog(t, a, "zz", 4<<20)
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	stuck := filepath.Join(a.host.StateDir, "zz.names")
	if err := unix.Mount(fifo, stuck, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(stuck, 0) })
	hold := trialnetProcess(t, "exec", "--socket", a.sock, "--trial", "fs", "--uid", "65534", "--gid", "65534", "--",
		"/usr/bin/python3", "-c", holdScript, echoTarget, "other.test:9000", "400")
	var hout bytes.Buffer
	hold.Stdout, hold.Stderr = &hout, &hout
	stop, err := hold.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := hold.Start(); err != nil {
		t.Fatal(err)
	}
	waitActiveAtLeast(t, a.sock, "fs", 1)
	old := a.cmd.Process.Pid
	next := trialnetProcess(t, "agent", "--config", a.config)
	lf, err := os.OpenFile(a.log, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	next.Stdout, next.Stderr = lf, lf
	err = next.Start()
	_ = lf.Close()
	if err != nil {
		t.Fatal(err)
	}
	// Once it serves fs, the old agent is stopped, so that the successor
	// serves what comes (the kernel gives a connection to either): until
	// it holds a tunnel and wrote a refusal's record. Then it is killed,
	// and the old agent goes on. Bounded, as the load is.
	ledger := filepath.Join(a.host.StateDir, "fs.ledgers", strconv.Itoa(next.Process.Pid))
	testkit.WaitFor(t, "the successor to adopt fs", 2*time.Minute, func() bool { _, err := os.Stat(ledger); return err == nil || exited(next.Process.Pid) })
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) })
	before := refusals(a)
	testkit.WaitFor(t, "the successor to serve a tunnel and a refusal", 2*time.Minute, func() bool {
		return exited(next.Process.Pid) || ledgerInUse(a.host.StateDir, "fs", next.Process.Pid) && refusals(a) > before
	})
	_ = next.Process.Kill()
	_ = next.Wait()
	_ = unix.Unmount(stuck, 0)
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(a.log)
		if bytes.Contains(b, []byte("hand-over to a new agent failed")) {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the old agent did not say the hand-over failed:\n%s", a.events())
		}
	}
	_ = stop.Close()
	if err := hold.Wait(); err != nil {
		t.Fatalf("the load in the Trial: %v\n%s", err, hout.String())
	}
	var held struct{ Alive, Cut int }
	if err := json.Unmarshal(bytes.TrimSpace(hout.Bytes()), &held); err != nil || held.Cut == 0 {
		t.Fatalf("the held tunnels: %v %s; want some cut with the successor", err, hout.String())
	}
	if pid := agentPID(t, a.sock); pid != old {
		t.Fatalf("pid %d serves the control socket, not the old agent (pid %d)", pid, old)
	}
	code, out, errOut := trialnet("destroy", "--socket", a.sock, "-j", "fs")
	var st client.Stats
	if code != exitOK || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("destroy: exit %d %s %s", code, out, errOut)
	}
	var allowed, denied, lost int
	for _, ev := range auditAll(t, a, "fs") {
		switch {
		case ev.Decision == record.DecisionDeny:
			denied++
		case ev.Decision != record.DecisionAllow:
		case strings.Contains(ev.Detail, "(pid "+strconv.Itoa(next.Process.Pid)+") ended without closing it"):
			lost++
			fallthrough
		default:
			allowed++
		}
	}
	t.Logf("%d tunnels held, %d cut with the successor; log: %d allowed (%d recorded as lost with it), %d denied; receipt's counts: %d allowed, %d denied",
		held.Alive+held.Cut, held.Cut, allowed, lost, denied, st.Proxy.Allowed, st.Proxy.Denied)
	if lost != held.Cut {
		t.Errorf("%d tunnels recorded as lost with the successor, want the %d cut", lost, held.Cut)
	}
	// A CONNECT given up while its agent was stopped may have been
	// allowed once it went on: more allowed than held.
	if allowed < held.Alive+held.Cut || st.Proxy.Allowed != uint64(allowed) || st.Proxy.Denied != uint64(denied) {
		t.Errorf("the log has %d allowed and %d denied, the counts %d and %d; %d tunnels were held", allowed, denied, st.Proxy.Allowed, st.Proxy.Denied, held.Alive+held.Cut)
	}
	a.stop(t, syscall.SIGTERM)
}
