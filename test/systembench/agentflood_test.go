//go:build linux

package systembench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/sandbox"
	"github.com/trialnet/trialnet/trial"
)

// A `trialnet agent` process runs on one P while it is idle
// (internal/procscale), and a Trial that floods it with CONNECTs (64
// clients in the Trial, as many tunnels as they can) gets it every CPU.
// While the flood lasts, the agent's own work goes on: another Trial is
// created, runs a command, makes a CONNECT through its proxy and is
// destroyed, and the control socket answers. Once the flood ends, the
// agent goes back to one P. The agent's Ps are read from its metrics
// (go_sched_gomaxprocs_threads).
func TestPrivilegedAgentTakesEveryCPUUnderAFlood(t *testing.T) {
	max := runtime.GOMAXPROCS(0) // the agent's too: same machine, cgroup and environment
	if max < 2 {
		t.Skip("one CPU: the agent has no other P to take")
	}
	if _, set := os.LookupEnv("GOMAXPROCS"); set {
		t.Skip("GOMAXPROCS is set in the environment, which the agent inherits: it keeps that setting")
	}
	e := setupHost(t)
	serveOneEcho(t, e)
	helper := buildTunnels(t, e)
	bin := filepath.Join(t.TempDir(), "trialnet")
	testkit.BuildTrialnet(t, filepath.Join("..", ".."), bin)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metrics := ln.Addr().String()
	_ = ln.Close()
	a := startServedAgentBin(t, e, bin, "--metrics-addr", metrics)
	waitGOMAXPROCS(t, metrics, 1, "while idle")

	info, err := a.Create(context.Background(), trial.Request{ID: "flood", Allow: []string{oneEchoTarget}})
	if err != nil {
		t.Fatal(err)
	}
	destroyed := false
	t.Cleanup(func() {
		if !destroyed {
			_, _ = a.Destroy(context.Background(), info.ID)
		}
	})
	tr, err := agent.Attach(info)
	if err != nil {
		t.Fatal(err)
	}
	// Bounded by the Trial's destruction below, long before its count.
	// Its stderr says why, should it end early: a flood that failed would
	// otherwise show only as an agent left on one P.
	var floodErr bytes.Buffer
	flood, err := tr.Start(sandbox.Command{Args: []string{helper, agent.ProxyEndpoints[0].String(), oneEchoTarget, "10000000", "64"},
		UID: 65534, GID: 65534, Stderr: &floodErr})
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{})
	go func() { _, _ = flood.Wait(); close(ended) }()
	for end := time.Now().Add(20 * time.Second); gomaxprocs(t, metrics) != max; time.Sleep(20 * time.Millisecond) {
		select {
		case <-ended:
			t.Fatalf("the flood ended before the agent took every CPU: %s", floodErr.Bytes())
		default:
		}
		if time.Now().After(end) {
			t.Fatalf("under the flood the agent had %d Ps for 20 s, want %d", gomaxprocs(t, metrics), max)
		}
	}

	var took [4]time.Duration
	if err := cycle(a, "beside-the-flood", &took); err != nil {
		t.Fatalf("a Trial made, used and destroyed during the flood: %v", err)
	}
	if h, err := a.Health(context.Background()); err != nil || !h.OK {
		t.Fatalf("health during the flood: %+v %v", h, err)
	}
	select {
	case <-ended:
		t.Fatal("the flood ended before the other Trial's cycle did, so the test shows nothing")
	default:
	}
	t.Logf("during the flood: create %v, command %v, first byte %v, destroy %v", took[0], took[1], took[2], took[3])

	destroyed = true
	if _, err := a.Destroy(context.Background(), info.ID); err != nil {
		t.Fatal(err)
	}
	<-ended
	waitGOMAXPROCS(t, metrics, 1, "after the flood")
}

// waitGOMAXPROCS waits up to 20 s (400 of procscale's windows) for the
// agent's metrics at addr to report want Ps.
func waitGOMAXPROCS(t *testing.T, addr string, want int, when string) {
	t.Helper()
	got := -1
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if got = gomaxprocs(t, addr); got == want {
			return
		}
	}
	t.Fatalf("%s the agent had %d Ps for 20 s, want %d", when, got, want)
}

// gomaxprocs reads go_sched_gomaxprocs_threads from the agent's metrics.
func gomaxprocs(t *testing.T, addr string) int {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(line, "go_sched_gomaxprocs_threads "); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatalf("go_sched_gomaxprocs_threads %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatal(fmt.Errorf("no go_sched_gomaxprocs_threads in the agent's metrics:\n%s", body))
	return 0
}
