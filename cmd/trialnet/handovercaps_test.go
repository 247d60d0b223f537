//go:build linux

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/client"
	trialspec "github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/record"
)

// capsScript runs in a Trial: it holds argv[6] tunnels to argv[7] open,
// then for argv[2] seconds argv[3] threads each send a CONNECT to argv[4]
// every argv[5] seconds, keeping the tunnels allowed open (argv[1]
// "hold") or closing them at once ("churn"). It prints how many were
// allowed and the reasons of the others, as JSON.
const capsScript = `
import json, os, socket, sys, threading, time
host, port = os.environ["HTTPS_PROXY"].split("//", 1)[1].rstrip("/").rsplit(":", 1)
P = (host, int(port))
mode, D, N, target, pause = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5])
first, first_target = int(sys.argv[6]), sys.argv[7]
res = {"allowed": 0, "refused": {}, "errors": [], "seconds": 0}
lock = threading.Lock()
held = []

def connect(t):
    s = socket.create_connection(P, timeout=30)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (t, t)).encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(4096)
        if not d:
            raise Exception("closed before the answer: %r" % buf[:80])
        buf += d
    if buf.startswith(b"HTTP/1.1 200"):
        return s, ""
    reason = "?"
    for line in buf.split(b"\r\n"):
        if line.lower().startswith(b"trialnet-reason:"):
            reason = line.split(b":", 1)[1].strip().decode()
    s.close()
    return None, reason

for _ in range(first):
    s, why = connect(first_target)
    if s is None:
        raise SystemExit("a first tunnel was refused: " + why)
    held.append(s)
print("ready", flush=True)
sys.stdin.readline()  # "go": every load's window starts together
start = time.time()
stop = start + D

def loop():
    while time.time() < stop:
        try:
            s, why = connect(target)
            with lock:
                if s is None:
                    res["refused"][why] = res["refused"].get(why, 0) + 1
                else:
                    res["allowed"] += 1
                    if mode == "hold":
                        held.append(s)
                    else:
                        s.close()
        except Exception as e:
            with lock:
                res["errors"].append(repr(e)[:200])
        time.sleep(pause)

ths = [threading.Thread(target=loop) for _ in range(N)]
for t in ths:
    t.start()
for t in ths:
    t.join()
res["seconds"] = time.time() - start
print(json.dumps(res), flush=True)
`

type capsResult struct {
	Allowed int            `json:"allowed"`
	Refused map[string]int `json:"refused"`
	Errors  []string       `json:"errors"`
	Seconds float64        `json:"seconds"`
}

// capsLoad is capsScript running in a Trial.
type capsLoad struct {
	out, errOut bytes.Buffer
	read        chan struct{} // closed once its output has ended
	cmd         *exec.Cmd
	in          io.WriteCloser
}

// startLoads starts the windows of loads that said they are ready, at
// once: started one by one, a load whose window is short could end while
// a slow machine (a VM under TCG) is still starting the next.
func startLoads(t *testing.T, loads ...*capsLoad) {
	t.Helper()
	for _, l := range loads {
		if _, err := io.WriteString(l.in, "go\n"); err != nil {
			t.Fatal(err)
		}
	}
}

func startCaps(t *testing.T, sock, id string, args ...string) *capsLoad {
	t.Helper()
	l := &capsLoad{read: make(chan struct{})}
	l.cmd = trialnetProcess(t, append([]string{"exec", "--socket", sock, "--trial", id, "--uid", "65534", "--gid", "65534", "--",
		"/usr/bin/python3", "-c", capsScript}, args...)...)
	out, err := l.cmd.StdoutPipe()
	if err == nil {
		l.in, err = l.cmd.StdinPipe()
	}
	if err != nil {
		t.Fatal(err)
	}
	l.cmd.Stderr = &l.errOut
	if err := l.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.cmd.Process.Kill() })
	lines := bufio.NewReader(out)
	if ready, err := lines.ReadString('\n'); ready != "ready\n" {
		_ = l.cmd.Process.Kill()
		_ = l.cmd.Wait()
		t.Fatalf("the load in Trial %s: %q %v\n%s", id, ready, err, l.errOut.String())
	}
	go func() {
		defer close(l.read)
		_, _ = l.out.ReadFrom(lines)
	}()
	return l
}

func (l *capsLoad) result(t *testing.T, id string) capsResult {
	t.Helper()
	<-l.read
	err := l.cmd.Wait()
	var r capsResult
	out := l.out.String()
	if i := strings.LastIndex(out, `{"allowed"`); err != nil || i < 0 || json.Unmarshal([]byte(out[i:]), &r) != nil {
		t.Fatalf("the load in Trial %s: %v\n%s%s", id, err, out, l.errOut.String())
	}
	if len(r.Errors) > 0 {
		t.Errorf("Trial %s: %d CONNECTs failed: %v", id, len(r.Errors), r.Errors)
	}
	return r
}

// recordBytes is how many bytes of a Trial's decision log are records
// other than summaries, the ones max_log_bytes bounds.
func recordBytes(t *testing.T, path string) (records, total int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range bytes.SplitAfter(b, []byte("\n")) {
		var ev record.Event
		if len(line) == 0 || ev.UnmarshalJSON(bytes.TrimSpace(line)) != nil {
			continue
		}
		if ev.Decision != record.DecisionSuppressed {
			records += len(line)
		}
	}
	return records, len(b)
}

// During a hand-over both agents accept for a Trial, from the offer until
// the old one stops. They keep each of its limits together, as one agent
// would: CONNECTs driven at the Trial across the hand-over never hold
// more tunnels open than max_tunnels, never pass its CONNECT rate, and
// its records never pass max_log_bytes. Twenty more Trials, adopted after
// these, keep both agents accepting for a while.
func TestPrivilegedAgentHandoverSharesCaps(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "python3")
	a := newAgentWithConfig(t, "handovercaps", echoWorld(t))
	a.start(t)
	c := client.NewClient(a.sock)
	ctx := context.Background()
	const (
		maxTunnels  = 4
		burst, rate = 20, 2.0
		maxLog      = 24 << 10
	)
	for id, lim := range map[string]trialspec.ProxyLimits{
		"capt": {MaxTunnels: maxTunnels, ConnectRate: 1000, ConnectBurst: 1000},
		"capr": {ConnectRate: rate, ConnectBurst: burst},
		"capl": {MaxLogBytes: maxLog, RecordRate: 1, RecordBurst: 1, ConnectRate: 1000, ConnectBurst: 1000},
	} {
		if _, err := c.Create(ctx, trialspec.Request{ID: id, Allow: []string{echoTarget}, Limits: &trialspec.Limits{ProxyLimits: lim}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20 {
		createTrial(t, a.sock, fmt.Sprintf("fill%02d", i))
	}
	const seconds = "10"
	tunnels := startCaps(t, a.sock, "capt", "hold", seconds, "8", echoTarget, "0.01", "0", echoTarget)
	rates := startCaps(t, a.sock, "capr", "churn", seconds, "4", echoTarget, "0.01", "0", echoTarget)
	// Refusals of a name off the list, each recorded (about 4 KiB a
	// second): the log fills after the hand-over. The two tunnels held
	// from the start are the old agent's, whose records it writes as
	// they end, in its drain.
	logs := startCaps(t, a.sock, "capl", "churn", seconds, "1", "denied.test:443", "0.1", "2", echoTarget)
	startLoads(t, tunnels, rates, logs)
	waitActiveAtLeast(t, a.sock, "capt", maxTunnels)
	if n, _ := recordBytes(t, filepath.Join(a.data, "capl", "decisions.jsonl")); n > maxLog/2 {
		t.Fatalf("Trial capl's log holds %d bytes of records before the hand-over; the test wants it filled after", n)
	}
	old := a.cmd
	a.startNext(t)
	rt, rr, rl := tunnels.result(t, "capt"), rates.result(t, "capr"), logs.result(t, "capl")
	if err := waitExit(t, a, old, 30*time.Second); err != nil {
		t.Errorf("the old agent after its drain: %v", err)
	}
	t.Logf("max_tunnels %d: %d allowed and held, refused %v", maxTunnels, rt.Allowed, rt.Refused)
	if rt.Allowed > maxTunnels || rt.Refused[string(record.ReasonTunnelLimit)] == 0 {
		t.Errorf("%d tunnels held open at once across the hand-over, under max_tunnels %d", rt.Allowed, maxTunnels)
	}
	// A burst, then one CONNECT per 1/rate; one more for the two
	// processes' clocks, read apart.
	most := burst + int(math.Ceil(rate*rr.Seconds)) + 1
	t.Logf("rate %g/s, burst %d, over %.1f s: %d allowed (at most %d), refused %v", rate, burst, rr.Seconds, rr.Allowed, most, rr.Refused)
	if rr.Allowed > most {
		t.Errorf("%d CONNECTs allowed across the hand-over in %.1f s, at %g/s with a burst of %d: at most %d", rr.Allowed, rr.Seconds, rate, burst, most)
	}
	n, total := recordBytes(t, filepath.Join(a.data, "capl", "decisions.jsonl"))
	if n < maxLog*3/4 {
		// A slow machine (TCG, a loaded host) made too few refusals
		// in the window to fill the log: more of them, now with the
		// new agent alone, which must count the old one's bytes.
		more := startCaps(t, a.sock, "capl", "churn", "15", "4", "denied.test:443", "0.05", "0", echoTarget)
		startLoads(t, more)
		more.result(t, "capl")
		n, total = recordBytes(t, filepath.Join(a.data, "capl", "decisions.jsonl"))
	}
	t.Logf("max_log_bytes %d: %d bytes of records, %d in all with summaries; refused %v", maxLog, n, total, rl.Refused)
	if n > maxLog || n < maxLog/2 {
		t.Errorf("%d bytes of records across the hand-over, under max_log_bytes %d (the test wants it reached)", n, maxLog)
	}
	b, _ := os.ReadFile(a.log)
	if !bytes.Contains(b, []byte(`"pidfd"`)) && !bytes.Contains(b, []byte("pidfd=")) {
		t.Errorf("the hand-over's log does not say how the successor's pidfd was taken:\n%s", a.events())
	}
	a.stop(t, syscall.SIGTERM)
}
