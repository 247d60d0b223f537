//go:build linux

package systembench

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testenv"
)

// BenchmarkRunTrue: `trialnet run -- true` as a process with no agent
// running (it embeds one), with the pins of an earlier run present and as
// the first install (no pins), against `unshare --net --pid --fork
// --mount-proc true`, interleaved in one loop. The host is isolated: a
// --config whose paths point at the benchmark's own pins, cgroup parent
// and namespace directory, and a --socket where no agent listens.
// TRIALNET_BASELINE_BIN names another build of trialnet (an earlier
// commit's) to time in the same loop, on an isolated host of its own: a
// before/after comparison under the same load.
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
	}
	var unshare []time.Duration
	for b.Loop() {
		unshare = append(unshare, timed(ref))
		for _, r := range builds {
			r.pinned = append(r.pinned, timed(r.run))
		}
		for _, r := range builds {
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
		pinned, first := p50(r.pinned), p50(r.first)
		b.ReportMetric(pinned, r.prefix+"run-p50-ms")
		b.ReportMetric(first, r.prefix+"first-install-p50-ms")
		b.ReportMetric(pinned/u, r.prefix+"run/unshare")
		b.ReportMetric(first/u, r.prefix+"first/unshare")
	}
}

// runBench is one build of trialnet timed by BenchmarkRunTrue, on its
// own isolated host (builds may pin different programs).
type runBench struct {
	prefix        string
	host          agent.Config
	run           []string
	pinned, first []time.Duration
}

func newRunBench(b *testing.B, prefix, bin string) *runBench {
	host := testenv.IsolatedHost(b, "runbench")
	dir := b.TempDir()
	config := filepath.Join(dir, "trialnet.yaml")
	yaml := fmt.Sprintf("paths:\n  pin_dir: %s\n  cgroup_parent: %s\n  netns_dir: %s\n", host.PinDir, host.Parent, host.NetnsDir)
	if err := os.WriteFile(config, []byte(yaml), 0o600); err != nil {
		b.Fatal(err)
	}
	return &runBench{prefix: prefix, host: host,
		run: []string{bin, "run", "--socket", filepath.Join(dir, "no-agent.sock"), "--config", config, "--uid", "65534", "--", "true"}}
}
