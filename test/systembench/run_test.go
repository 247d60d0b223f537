//go:build linux

package systembench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testenv"
)

// BenchmarkRunTrue: `trialnet run -- true` as a process with no agent
// running (it embeds one), with the pins of an earlier run present and as
// the first install (no pins), and through an agent already running (as
// on a host with trialnet deployed), against `unshare --net --pid --fork
// --mount-proc true`, interleaved in one loop. Each host is isolated: a
// --config whose paths point at the benchmark's own pins, cgroup parent
// and namespace directory, and a --socket where no agent listens, or
// where the benchmark's own agent does. TRIALNET_BASELINE_BIN names
// another build of trialnet (an earlier commit's) to time in the same
// loop, on isolated hosts of its own: a before/after comparison under the
// same load.
func BenchmarkRunTrue(b *testing.B) {
	privtest.Require(b)
	privtest.RequireTool(b, "unshare")
	dir := b.TempDir()
	bin := filepath.Join(dir, "trialnet")
	build := exec.Command("go", "build", "-o", bin, "../../cmd/trialnet")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build trialnet: %v\n%s", err, out)
	}
	timed := func(argv []string) time.Duration {
		start := time.Now()
		if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
			b.Fatalf("%v: %v\n%s", argv, err, out)
		}
		return time.Since(start)
	}
	builds := []*runBench{newRunBench(b, "", bin)}
	if base := os.Getenv("TRIALNET_BASELINE_BIN"); base != "" {
		builds = append(builds, newRunBench(b, "baseline-", base))
	}
	ref := []string{"unshare", "--net", "--pid", "--fork", "--mount-proc", "true"}
	for _, r := range builds {
		timed(r.run) // install, so that the first "pins present" run adopts
		timed(r.agentRun)
	}
	var unshare []time.Duration
	for i := 0; b.Loop(); i++ {
		// Every other round in the other order: a build's run that follows
		// the other's run through its agent shares the cores with that
		// agent's shell refill (20 ms after its create), which slowed the
		// second build's embedded run by a tenth when both were the same.
		order := slices.Clone(builds)
		if i%2 == 1 {
			slices.Reverse(order)
		}
		unshare = append(unshare, timed(ref))
		for _, r := range order {
			r.pinned = append(r.pinned, timed(r.run))
			r.agent = append(r.agent, timed(r.agentRun))
		}
		for _, r := range order {
			b.StopTimer()
			if err := bpf.Uninstall(r.host.PinDir); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			r.first = append(r.first, timed(r.run))
		}
	}
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	u := p50(unshare)
	b.ReportMetric(u, "unshare-p50-ms")
	for _, r := range builds {
		pinned, first, agent := p50(r.pinned), p50(r.first), p50(r.agent)
		b.ReportMetric(pinned, r.prefix+"run-p50-ms")
		b.ReportMetric(first, r.prefix+"first-install-p50-ms")
		b.ReportMetric(agent, r.prefix+"agent-run-p50-ms")
		b.ReportMetric(pinned/u, r.prefix+"run/unshare")
		b.ReportMetric(first/u, r.prefix+"first/unshare")
		b.ReportMetric(agent/u, r.prefix+"agent-run/unshare")
	}
}

// runBench is one build of trialnet timed by BenchmarkRunTrue, on its
// own isolated hosts (builds may pin different programs): one where each
// run embeds an agent, one where an agent runs.
type runBench struct {
	prefix               string
	host                 agent.Config
	run, agentRun        []string
	pinned, first, agent []time.Duration
}

func newRunBench(b *testing.B, prefix, bin string) *runBench {
	host := testenv.IsolatedHost(b, "runbench")
	dir := b.TempDir()
	config := filepath.Join(dir, "trialnet.yaml")
	yaml := fmt.Sprintf("paths:\n  pin_dir: %s\n  cgroup_parent: %s\n  netns_dir: %s\n", host.PinDir, host.Parent, host.NetnsDir)
	if err := os.WriteFile(config, []byte(yaml), 0o600); err != nil {
		b.Fatal(err)
	}
	sock := startBenchAgent(b, bin)
	return &runBench{prefix: prefix, host: host,
		run:      []string{bin, "run", "--socket", filepath.Join(dir, "no-agent.sock"), "--config", config, "--uid", "65534", "--", "true"},
		agentRun: []string{bin, "run", "--socket", sock, "--uid", "65534", "--", "true"}}
}

// startBenchAgent starts bin's agent on an isolated host of its own (no
// keeper: nothing outlives the benchmark) and waits until it is ready.
// It returns the agent's control socket.
func startBenchAgent(b *testing.B, bin string) (sock string) {
	host := testenv.IsolatedHost(b, "runbench-agent")
	dir := b.TempDir()
	sock = filepath.Join(dir, "agent.sock")
	config := filepath.Join(dir, "trialnet.yaml")
	yaml := fmt.Sprintf("paths:\n  socket: %s\n  state_dir: %s\n  data_dir: %s\n  pin_dir: %s\n  netns_dir: %s\n  cgroup_parent: %s\n",
		sock, host.StateDir, filepath.Join(dir, "data"), host.PinDir, host.NetnsDir, host.Parent)
	if err := os.WriteFile(config, []byte(yaml), 0o600); err != nil {
		b.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(bin, "agent", "--config", config, "--keeper", "off", "--teardown-on-exit")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	// Registered after IsolatedHost's sweep, so run before it.
	b.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	for end := time.Now().Add(30 * time.Second); exec.Command(bin, "health", "--socket", sock).Run() != nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			out, _ := os.ReadFile(log.Name())
			b.Fatalf("the agent did not become ready on %s:\n%s", sock, out)
		}
	}
	return sock
}
