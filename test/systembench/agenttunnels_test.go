//go:build linux

package systembench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/sandbox"
	"github.com/trialnet/trialnet/trial"
)

// oneEchoPort is the test host's service that echoes one byte and closes:
// the upstream closes first, so thousands of short tunnels leave no
// TIME_WAIT on the agent's side of the test host.
const oneEchoPort = 9002

var oneEchoTarget = fmt.Sprintf("%s:%d", upstreamName, oneEchoPort)

// What BenchmarkAgentTunnels does per build and round.
const (
	agentSeqTunnels  = 2000 // one client: CPU ticks enough to divide
	agentConcClients = 64
	agentConcTunnels = 4000
)

// BenchmarkAgentTunnels: what a Trial's CONNECTs cost a `trialnet agent`
// process (as deployed, with its keeper), for this tree's build and for
// TRIALNET_BASELINE_BIN's, in one run. In each build's agent one Trial
// runs the tunnels helper as a process of its own (uid 65534), which
// opens tunnels to the test host's one-byte echo: 2,000 one at a time
// (the agent's CPU per tunnel from its /proc/PID/stat, its threads'
// context switches per tunnel, handshake p50), then 4,000 over 64
// clients (tunnels/s, CPU per tunnel); then, while the helper floods the
// agent with 64 clients, another Trial's create → command → first byte
// → destroy, four times. Each iteration is one round with both builds,
// the order alternated round by round; every round's figures and this
// tree's ratio to the baseline are printed, the metrics are medians.
// Run with -benchtime Nx for N rounds.
func BenchmarkAgentTunnels(b *testing.B) {
	e := setupHost(b)
	serveOneEcho(b, e)
	helper := buildTunnels(b, e)
	bin := filepath.Join(b.TempDir(), "trialnet")
	testkit.BuildTrialnet(b, filepath.Join("..", ".."), bin)
	builds := []*tunnelBench{{name: "this tree", bin: bin}}
	if base := os.Getenv("TRIALNET_BASELINE_BIN"); base != "" {
		builds = append(builds, &tunnelBench{name: "baseline", bin: base})
	}
	for _, t := range builds {
		t.start(b, e, helper)
		t.tunnels(b, 50, 1) // warm: the agent's DNS cache, first-use allocations
	}
	load0 := loadavg()
	round := 0
	for b.Loop() {
		for i := range builds {
			t := builds[(i+round)%len(builds)]
			seq, conc := t.measure(b, agentSeqTunnels, 1), t.measure(b, agentConcTunnels, agentConcClients)
			t.rounds = append(t.rounds, [2]tunnelRun{seq, conc})
			t.cycles = append(t.cycles, t.cyclesUnderFlood(b, round))
		}
		round++
	}
	// Printed, not logged: a benchmark's log is cut at a few lines.
	fmt.Printf("agent tunnels: %d rounds, load average %s before, %s after\n", round, load0, loadavg())
	for r := range round {
		line := fmt.Sprintf("round %d:", r+1)
		for _, t := range builds {
			s, c := t.rounds[r][0], t.rounds[r][1]
			line += fmt.Sprintf(" | %s: seq %.0f µs CPU/tunnel, %.1f switches/tunnel, p50 %.0f µs; 64 clients %.0f tunnels/s, %.0f µs CPU/tunnel",
				t.name, s.cpuPer, s.switches, s.p50, c.rate, c.cpuPer)
		}
		if len(builds) == 2 {
			n, o := builds[0].rounds[r], builds[1].rounds[r]
			line += fmt.Sprintf(" | ratio: seq CPU %.2f×, switches %.2f×, p50 %.2f×; 64 clients rate %.2f×, CPU %.2f×",
				n[0].cpuPer/o[0].cpuPer, n[0].switches/o[0].switches, n[0].p50/o[0].p50, n[1].rate/o[1].rate, n[1].cpuPer/o[1].cpuPer)
		}
		fmt.Println(line)
	}
	// Another Trial's cycle during a flood: each build's median per
	// round, and over all rounds.
	roundMedian := func(d []time.Duration) float64 {
		ms := make([]float64, len(d))
		for i, v := range d {
			ms[i] = float64(v.Microseconds()) / 1000
		}
		return testkit.Median(ms)
	}
	var cycleRatios []float64
	for r := range round {
		line := fmt.Sprintf("round %d, another Trial's cycle during a 64-client flood, median:", r+1)
		for _, t := range builds {
			line += fmt.Sprintf(" %s %.1f ms;", t.name, roundMedian(t.cycles[r]))
		}
		if len(builds) == 2 {
			cycleRatios = append(cycleRatios, roundMedian(builds[0].cycles[r])/roundMedian(builds[1].cycles[r]))
			line += fmt.Sprintf(" ratio %.2f×", cycleRatios[r])
		}
		fmt.Println(line)
	}
	for _, t := range builds {
		prefix := ""
		if t.name == "baseline" {
			prefix = "baseline-"
		}
		b.ReportMetric(roundMedian(slices.Concat(t.cycles...)), prefix+"flood-cycle-p50-ms")
	}
	if len(builds) == 2 {
		b.ReportMetric(testkit.Median(cycleRatios), "ratio-flood-cycle-p50-ms")
	}
	figures := []struct {
		unit string
		of   func(r [2]tunnelRun) float64
	}{
		{"seq-cpu-µs/tunnel", func(r [2]tunnelRun) float64 { return r[0].cpuPer }},
		{"seq-switches/tunnel", func(r [2]tunnelRun) float64 { return r[0].switches }},
		{"seq-p50-µs", func(r [2]tunnelRun) float64 { return r[0].p50 }},
		{"conc64-tunnels/s", func(r [2]tunnelRun) float64 { return r[1].rate }},
		{"conc64-cpu-µs/tunnel", func(r [2]tunnelRun) float64 { return r[1].cpuPer }},
	}
	for _, f := range figures {
		for _, t := range builds {
			prefix := ""
			if t.name == "baseline" {
				prefix = "baseline-"
			}
			var v []float64
			for _, r := range t.rounds {
				v = append(v, f.of(r))
			}
			b.ReportMetric(testkit.Median(v), prefix+f.unit)
		}
		if len(builds) == 2 {
			var ratios []float64
			for r := range round {
				ratios = append(ratios, f.of(builds[0].rounds[r])/f.of(builds[1].rounds[r]))
			}
			b.ReportMetric(testkit.Median(ratios), "ratio-"+f.unit)
		}
	}
}

// tunnelBench is one build's agent and the Trial whose process makes
// the tunnels.
type tunnelBench struct {
	name, bin, helper string
	a                 *servedAgent
	tr                *sandbox.Launcher
	rounds            [][2]tunnelRun    // sequential, concurrent
	cycles            [][]time.Duration // per round
}

// floodCycles is how many other Trials' cycles are timed per round
// during a flood.
const floodCycles = 4

// cyclesUnderFlood times create → command → first byte → destroy of
// other Trials (BenchmarkScale's cycle) while the tunnels helper floods
// the agent from t's Trial with 64 clients: the agent's own work under
// a Trial's load.
func (t *tunnelBench) cyclesUnderFlood(b *testing.B, round int) []time.Duration {
	flood, err := t.tr.Start(sandbox.Command{Args: []string{t.helper, agent.ProxyEndpoints[0].String(), oneEchoTarget, "10000000", strconv.Itoa(agentConcClients)},
		UID: 65534, GID: 65534, Stderr: io.Discard})
	if err != nil {
		b.Fatal(err)
	}
	ended := make(chan struct{})
	go func() { _, _ = flood.Wait(); close(ended) }()
	time.Sleep(200 * time.Millisecond) // the flood under way
	var out []time.Duration
	for i := range floodCycles {
		var took [4]time.Duration
		t0 := time.Now()
		if err := cycle(t.a, fmt.Sprintf("flood-%d-%d", round, i), &took); err != nil {
			b.Fatalf("%s: a Trial's cycle during the flood: %v", t.name, err)
		}
		out = append(out, time.Since(t0))
	}
	select {
	case <-ended:
		b.Fatalf("%s: the flood ended before the cycles did", t.name)
	default:
	}
	_ = flood.Signal(syscall.SIGKILL)
	<-ended
	return out
}

// tunnelRun is one batch of tunnels: the agent's CPU per tunnel, the
// handshake p50 (connect to echoed byte) and the rate.
type tunnelRun struct{ cpuPer, switches, p50, rate float64 }

func (t *tunnelBench) start(b *testing.B, e *env, helper string) {
	t.helper = helper
	t.a = startServedAgentBin(b, e, t.bin)
	info, err := t.a.Create(context.Background(), trial.Request{ID: "tunnels", Allow: []string{oneEchoTarget}})
	if err != nil {
		b.Fatalf("%s: %v", t.name, err)
	}
	b.Cleanup(func() { _, _ = t.a.Destroy(context.Background(), info.ID) })
	if t.tr, err = agent.Attach(info); err != nil {
		b.Fatal(err)
	}
}

// tunnels runs the helper in the Trial and returns its output's fields.
func (t *tunnelBench) tunnels(b *testing.B, n, clients int) map[string]float64 {
	var out, errOut bytes.Buffer
	code, err := t.tr.Exec(context.Background(), sandbox.Command{
		Args: []string{t.helper, agent.ProxyEndpoints[0].String(), oneEchoTarget, strconv.Itoa(n), strconv.Itoa(clients)},
		UID:  65534, GID: 65534, Stdout: &out, Stderr: &errOut}, nil)
	if err != nil || code != 0 {
		b.Fatalf("%s: tunnels: %d %v\n%s", t.name, code, err, errOut.String())
	}
	f := map[string]float64{}
	for _, kv := range strings.Fields(out.String()) {
		k, v, _ := strings.Cut(kv, "=")
		f[k], _ = strconv.ParseFloat(v, 64)
	}
	if f["n"] != float64(n) {
		b.Fatalf("%s: tunnels said %q", t.name, out.String())
	}
	return f
}

func (t *tunnelBench) measure(b *testing.B, n, clients int) tunnelRun {
	pid := t.a.cmd.Process.Pid
	cpu0, sw0 := procCPU(b, pid), contextSwitches(pid)
	f := t.tunnels(b, n, clients)
	cpu, sw := procCPU(b, pid)-cpu0, contextSwitches(pid)-sw0
	return tunnelRun{cpuPer: float64(cpu.Microseconds()) / float64(n), switches: float64(sw) / float64(n),
		p50: f["p50us"], rate: float64(n) / f["secs"]}
}

// contextSwitches sums the context switches of process pid's threads
// (the Go runtime's threads live as long as the process).
func contextSwitches(pid int) int64 {
	var n int64
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	for _, t := range tasks {
		data, _ := os.ReadFile(t)
		for line := range strings.Lines(string(data)) {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.HasSuffix(k, "ctxt_switches") {
				c, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				n += c
			}
		}
	}
	return n
}

// procCPU is process pid's own user and system time (its threads', not
// its children's: the Trial's processes are not the agent's work).
func procCPU(b *testing.B, pid int) time.Duration {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// After "pid (comm) " the fields start at field 3 (state); utime
	// and stime are fields 14 and 15.
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
	var ticks int64
	for _, i := range []int{14, 15} {
		n, err := strconv.ParseInt(f[i-3], 10, 64)
		if err != nil {
			b.Fatalf("/proc/%d/stat: %v", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ: always 100 in /proc
}

// buildTunnels builds the tunnels helper beside firstbyte (static,
// readable by everyone) and returns its path.
func buildTunnels(tb testing.TB, e *env) string {
	helper := filepath.Join(filepath.Dir(e.bin), "tunnels")
	build := exec.Command("go", "build", "-o", helper, "./tunnels")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		tb.Fatalf("build tunnels: %v\n%s", err, out)
	}
	return helper
}

// serveOneEcho serves oneEchoPort on the test host.
func serveOneEcho(b testing.TB, e *env) {
	ln, err := e.host.NS.Listen(context.Background(), "tcp", netip.AddrPortFrom(e.host.Addr4, oneEchoPort).String())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				var one [1]byte
				if _, err := io.ReadFull(c, one[:]); err == nil {
					_, _ = c.Write(one[:])
				}
			}()
		}
	}()
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
