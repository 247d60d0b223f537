//go:build linux

package systembench

import (
	"context"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/sandbox"
	"github.com/trialnet/trialnet/trial"
)

// BenchmarkNextCommand: a later command (`true` as uid 65534) in a live
// Trial, its init already running, against fork+exec of `true` on the
// host, alternated in one loop so that both meet the same load. The
// Trial's command goes through every layer a command gets: cloned into
// the cgroup and the init's namespaces, trialnet-exec's capability drop,
// process limit, Landlock domain and seccomp filter. The issue asks for
// next/fork+exec ≤ 3.
func BenchmarkNextCommand(b *testing.B) {
	e := setup(b)
	truePath, err := exec.LookPath("true")
	if err != nil {
		b.Fatal(err)
	}
	info, err := e.a.Create(context.Background(), trial.Request{ID: "next-command", Allow: []string{target}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _, _ = e.a.Destroy(context.Background(), info.ID) })
	tr, err := agent.Attach(info)
	if err != nil {
		b.Fatal(err)
	}
	inTrial := func() {
		code, err := tr.Exec(context.Background(), sandbox.Command{Args: []string{truePath}, UID: 65534, GID: 65534}, nil)
		if err != nil || code != 0 {
			b.Fatalf("true in a Trial: %d %v", code, err)
		}
	}
	inTrial() // starts the Trial's init
	var ref, next []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := exec.Command(truePath).Run(); err != nil {
			b.Fatal(err)
		}
		ref = append(ref, time.Since(t0))
		t0 = time.Now()
		inTrial()
		next = append(next, time.Since(t0))
	}
	q := func(d []time.Duration, q float64) float64 {
		slices.Sort(d)
		return float64(d[int(q*float64(len(d)-1))].Microseconds()) / 1000
	}
	b.ReportMetric(q(ref, 0.5), "fork+exec-p50-ms")
	b.ReportMetric(q(next, 0.5), "next-p50-ms")
	b.ReportMetric(q(next, 0.99), "next-p99-ms")
	b.ReportMetric(q(next, 0.5)/q(ref, 0.5), "next/fork+exec")
}
