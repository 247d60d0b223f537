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
func BenchmarkRunTrue(b *testing.B) {
	privtest.Require(b)
	if _, err := exec.LookPath("unshare"); err != nil {
		b.Skip("unshare (util-linux) is not installed")
	}
	host := testenv.IsolatedHost(b, "runbench")
	dir := b.TempDir()
	bin := filepath.Join(dir, "trialnet")
	build := exec.Command("go", "build", "-o", bin, "../../cmd/trialnet")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build trialnet: %v\n%s", err, out)
	}
	config := filepath.Join(dir, "trialnet.yaml")
	yaml := fmt.Sprintf("paths:\n  pin_dir: %s\n  cgroup_parent: %s\n  netns_dir: %s\n", host.PinDir, host.Parent, host.NetnsDir)
	if err := os.WriteFile(config, []byte(yaml), 0o600); err != nil {
		b.Fatal(err)
	}
	run := []string{bin, "run", "--socket", filepath.Join(dir, "no-agent.sock"), "--config", config, "--uid", "65534", "--", "true"}
	ref := []string{"unshare", "--net", "--pid", "--fork", "--mount-proc", "true"}
	timed := func(argv []string) time.Duration {
		start := time.Now()
		if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
			b.Fatalf("%v: %v\n%s", argv, err, out)
		}
		return time.Since(start)
	}
	timed(run) // install, so that the first "pins present" run adopts
	var pinned, first, unshare []time.Duration
	for b.Loop() {
		unshare = append(unshare, timed(ref))
		pinned = append(pinned, timed(run))
		b.StopTimer()
		if err := bpf.Uninstall(host.PinDir); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		first = append(first, timed(run))
	}
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	r, f, u := p50(pinned), p50(first), p50(unshare)
	b.ReportMetric(r, "run-p50-ms")
	b.ReportMetric(f, "first-install-p50-ms")
	b.ReportMetric(u, "unshare-p50-ms")
	b.ReportMetric(r/u, "run/unshare")
	b.ReportMetric(f/u, "first/unshare")
}
