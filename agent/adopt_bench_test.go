//go:build linux

package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/privtest"
	"golang.org/x/sys/unix"
)

// BenchmarkContainerTrial: the agent's adoption of a container as a
// Trial from a profile (ContainerTrial, as trialnet oci-hook asks for it
// at createRuntime), in process: a container init's stand-in in a
// network namespace and cgroup of its own under the Trial parent, as a
// runtime leaves them. Each adoption is followed by its destroy and a
// pause that lets the agent refill what it keeps ready; the figure is
// the adoptions' p50.
func BenchmarkContainerTrial(b *testing.B) {
	privtest.Require(b)
	w := newWorld(b, 235)
	cfg := w.config(b)
	file, err := config.ParseFile([]byte("profiles:\n  bench:\n    allow: [\"api.example.test:443\"]\n"))
	if err != nil {
		b.Fatal(err)
	}
	cfg.File = file
	a := startAgent(b, cfg)
	ctx := context.Background()
	var took []time.Duration
	n := 0
	for b.Loop() {
		b.StopTimer()
		n++
		cg := filepath.Join(a.host.Parent, fmt.Sprintf("bench-ctr-%d", n))
		if err := os.Mkdir(cg, 0o755); err != nil {
			b.Fatal(err)
		}
		p := startProbe(b, cg)
		b.StartTimer()
		start := time.Now()
		info, err := a.ContainerTrial(ctx, client.ContainerTrial{Profile: "bench", Container: client.Container{ID: fmt.Sprintf("bench-ctr-%d", n), PID: p.pid}})
		took = append(took, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if _, err := a.Destroy(ctx, info.ID); err != nil {
			b.Fatal(err)
		}
		for end := time.Now().Add(10 * time.Second); unix.Rmdir(cg) != nil; time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				b.Fatalf("the container's cgroup %s is not removable", cg)
			}
		}
		time.Sleep(30 * time.Millisecond)
		b.StartTimer()
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "adopt-p50-ms")
}
