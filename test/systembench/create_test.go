//go:build linux

package systembench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/trial"
)

// BenchmarkAgentCreate: a create through a running agent's socket as a
// client sees it (the request, the agent's create, the answer), each
// followed by its destroy and a pause of createPause, which lets the
// agent refill what it keeps ready (its shells wait 20 ms of quiet).
// TRIALNET_BASELINE_BIN names another build of trialnet to time in the
// same loop, round by round, with an agent of its own.
func BenchmarkAgentCreate(b *testing.B) {
	privtest.Require(b)
	bin := filepath.Join(b.TempDir(), "trialnet")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/trialnet").CombinedOutput(); err != nil {
		b.Fatalf("build trialnet: %v\n%s", err, out)
	}
	type agentBench struct {
		prefix string
		c      *client.Client
		create []time.Duration
	}
	agents := []*agentBench{{prefix: "", c: client.NewClient(startBenchAgent(b, bin))}}
	if base := os.Getenv("TRIALNET_BASELINE_BIN"); base != "" {
		agents = append(agents, &agentBench{prefix: "baseline-", c: client.NewClient(startBenchAgent(b, base))})
	}
	ctx := context.Background()
	n := 0
	cycle := func(a *agentBench) time.Duration {
		n++
		id := fmt.Sprintf("bench-create-%d", n)
		start := time.Now()
		if _, err := a.c.Create(ctx, trial.Request{ID: id}); err != nil {
			b.Fatal(err)
		}
		d := time.Since(start)
		if _, err := a.c.Destroy(ctx, id); err != nil {
			b.Fatal(err)
		}
		time.Sleep(createPause)
		return d
	}
	for _, a := range agents {
		cycle(a) // the first create of an agent makes its lazily made parts
	}
	for b.Loop() {
		for _, a := range agents {
			a.create = append(a.create, cycle(a))
		}
	}
	for _, a := range agents {
		slices.Sort(a.create)
		b.ReportMetric(float64(a.create[len(a.create)/2].Microseconds())/1000, a.prefix+"create-p50-ms")
	}
	if len(agents) == 2 {
		b.ReportMetric(float64(agents[0].create[len(agents[0].create)/2])/float64(agents[1].create[len(agents[1].create)/2]), "create/baseline")
	}
}

// createPause follows each destroy in BenchmarkAgentCreate.
const createPause = 30 * time.Millisecond
