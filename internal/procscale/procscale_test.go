//go:build linux

package procscale

import (
	"context"
	"os"
	"runtime"
	"testing"
	"time"
)

func TestNext(t *testing.T) {
	crowd := Load{Busy: 0.4, Scheds: 200, Late: 120}
	for _, tc := range []struct {
		name        string
		procs, max  int
		l           Load
		quiet, want int
	}{
		{"light load stays on one P", 1, 2, Load{Busy: 0.6, Scheds: 200, Late: 8}, 0, 1},
		{"one P nearly full takes every CPU", 1, 4, Load{Busy: Up}, 0, 4},
		{"a crowd for one P takes every CPU, however little CPU it got", 1, 2, crowd, 0, 2},
		{"a few late among a few scheduled is no crowd", 1, 2, Load{Busy: 0.1, Scheds: MinScheds - 1, Late: MinScheds - 1}, 0, 1},
		{"busy on every P stays", 2, 2, Load{Busy: 1.5}, 0, 2},
		{"a quiet window alone does not drop", 2, 2, Load{Busy: 0.2}, 0, 2},
		{"quiet long enough drops to one P", 2, 2, Load{Busy: 0.2}, DownWindows - 1, 1},
		{"a crowd is not quiet, whatever the CPU", 2, 2, crowd, DownWindows, 2},
		{"an eighth late on every P is not quiet", 2, 2, Load{Busy: 0.2, Scheds: 160, Late: 20}, DownWindows, 2},
		{"between Down and Up keeps every P", 2, 2, Load{Busy: (Down + Up) / 2}, DownWindows, 2},
		{"between Down and Up keeps one P", 1, 2, Load{Busy: (Down + Up) / 2}, DownWindows, 1},
		{"one CPU: nothing to take", 1, 1, Load{Busy: 1}, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Next(tc.procs, tc.max, tc.l, tc.quiet); got != tc.want {
				t.Errorf("Next(%d, %d, %+v, %d) = %d, want %d", tc.procs, tc.max, tc.l, tc.quiet, got, tc.want)
			}
		})
	}
}

// The meter reads the runtime's scheduling latencies (a sample of the
// goroutines): one made to wait behind a busy one on a single P is
// counted late.
func TestMeterCountsLateGoroutines(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var m meter
	m.read()
	done := make(chan struct{})
	for range 400 {
		go func() {
			for t0 := time.Now(); time.Since(t0) < 2*Late; { // holds the P, so the next one waits
			}
			done <- struct{}{}
		}()
	}
	for range 400 {
		<-done
	}
	l := m.read()
	if l.Scheds == 0 || l.Late == 0 {
		t.Fatalf("after 400 goroutines queued on one P: %+v, want some of them sampled, and late", l)
	}
}

func TestRunStartsOnOnePAndGivesEveryCPUBack(t *testing.T) {
	max := runtime.GOMAXPROCS(0)
	if max < 2 {
		t.Skip("one CPU: Run leaves GOMAXPROCS alone")
	}
	if _, set := os.LookupEnv("GOMAXPROCS"); set {
		t.Skip("GOMAXPROCS is set in the environment: Run leaves it alone")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { Run(ctx); close(done) }()
	for runtime.GOMAXPROCS(0) != 1 {
		runtime.Gosched()
	}
	cancel()
	<-done
	if got := runtime.GOMAXPROCS(0); got != max {
		t.Fatalf("after Run: GOMAXPROCS %d, want %d back", got, max)
	}
}

func TestRunLeavesAnOperatorsGOMAXPROCS(t *testing.T) {
	t.Setenv("GOMAXPROCS", "2")
	if _, ok := adapts(); ok {
		t.Fatal("GOMAXPROCS is set in the environment, and Run would change it")
	}
}
