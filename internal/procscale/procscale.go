//go:build linux

// Package procscale runs a serving process on one P (GOMAXPROCS=1) while
// its load fits on one CPU, and on every CPU once it does not.
//
// Why: a proxy that serves a few CONNECTs at a time goes idle and busy
// several times per CONNECT, and with a second P idle the Go scheduler
// wakes another thread to spin for work at every new or woken goroutine
// (wakep), finds nothing there, and puts it back to sleep: futex calls,
// context switches and a VM exit each. On the 2-core VM of the
// benchmark, GOMAXPROCS=1 takes a fifth of the CPU per sequential tunnel
// away (docs/performance.md), but caps a busy proxy at one CPU. So the
// process starts on one P and takes every CPU while one is not enough,
// judged over short windows by its CPU time and by how long its
// goroutines wait for a P.
package procscale

import (
	"context"
	"os"
	"runtime"
	"runtime/metrics"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// Window is how often the load is read; a load one P cannot carry
	// gets every CPU within about one window.
	Window = 50 * time.Millisecond
	// Up is the share of one CPU, used over a window on one P, from
	// which one P is taken to be too few.
	Up = 0.85
	// Late is how long a goroutine may wait to run before it counts as
	// late. Measured in `trialnet proxy` on one P: with 64 clients 60–75 %
	// of the windows' goroutines waited that long; serving one CONNECT
	// at a time, under 5 %, and none 1 ms.
	Late = 100 * time.Microsecond
	// MinScheds is how many schedulings the runtime must have sampled
	// in a window (it times about one in eight) for the share of late
	// ones to count.
	MinScheds = 20
	// Down is the share of one CPU below which, over DownWindows windows
	// in a row on every P without a crowd, one P is enough again. It
	// sits below Up by more than the spinning costs (work on two Ps
	// takes ~1.25× the CPU it takes on one), so that a steady load does
	// not flip between them.
	Down = 0.7
	// DownWindows is how many quiet windows in a row go back to one P:
	// a burst's gaps do not. Short, as a spell on every P with one
	// CONNECT at a time costs a fifth more CPU, while one P too few for
	// a crowd lasts one window.
	DownWindows = 10
)

// Load is what one window saw.
type Load struct {
	Busy   float64 // the CPUs used (1 = one CPU all of the window)
	Scheds uint64  // goroutines scheduled (the runtime's sample of them)
	Late   uint64  // of which waited Late or longer to run
}

// crowded reports goroutines queueing for a P: a quarter or more of
// them waited Late. Unlike Busy, this shows on a machine whose other
// processes leave this one less than a CPU.
func (l Load) crowded() bool { return l.Scheds >= MinScheds && 4*l.Late >= l.Scheds }

// quiet reports a window that one P would carry: little CPU, and hardly
// a goroutine kept waiting (an eighth; a crowd on every P of a machine
// shared with other work uses little CPU too).
func (l Load) quiet() bool { return l.Busy <= Down && 8*l.Late < max(l.Scheds, MinScheds) }

// Next returns the Ps for the next window: procs now, max the most, l
// the window just ended, and quiet how many quiet windows in a row came
// before it.
func Next(procs, max int, l Load, quiet int) int {
	switch {
	case procs < max && (l.Busy >= Up || l.crowded()):
		return max
	case procs > 1 && l.quiet() && quiet+1 >= DownWindows:
		return 1
	}
	return procs
}

// Run adapts GOMAXPROCS until ctx ends, then gives the process every CPU
// back. It does nothing when GOMAXPROCS was set in the environment (an
// operator's choice) or there is one CPU. "Every CPU" is the runtime's
// default at the start (the cgroup's CPU limit, if lower); setting
// GOMAXPROCS stops the runtime from following a later change of that
// limit, which a restart picks up.
func Run(ctx context.Context) {
	max, ok := adapts()
	if !ok {
		return
	}
	procs := 1
	runtime.GOMAXPROCS(procs)
	defer runtime.GOMAXPROCS(max)
	tick := time.NewTicker(Window)
	defer tick.Stop()
	var m meter
	m.read()
	quiet := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		l := m.read()
		if next := Next(procs, max, l, quiet); next != procs {
			procs = next
			runtime.GOMAXPROCS(procs)
			quiet = 0
			continue
		}
		if l.quiet() {
			quiet++
		} else {
			quiet = 0
		}
	}
}

// adapts returns the Ps the process has, and whether Run may change
// them: not when GOMAXPROCS is set in the environment, nor on one CPU.
func adapts() (int, bool) {
	max := runtime.GOMAXPROCS(0)
	_, set := os.LookupEnv("GOMAXPROCS")
	return max, !set && max > 1
}

// meter reads the process's load since its last read.
type meter struct {
	cpu          time.Duration
	at           time.Time
	scheds, late uint64
	sample       [1]metrics.Sample
}

func (m *meter) read() Load {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts) // cannot fail for this clock on Linux
	cpu, now := time.Duration(ts.Nano()), time.Now()
	m.sample[0].Name = "/sched/latencies:seconds"
	metrics.Read(m.sample[:])
	var scheds, late uint64
	if m.sample[0].Value.Kind() == metrics.KindFloat64Histogram {
		h := m.sample[0].Value.Float64Histogram()
		for i, c := range h.Counts { // bucket i is [Buckets[i], Buckets[i+1])
			scheds += c
			if h.Buckets[i] >= Late.Seconds() {
				late += c
			}
		}
	}
	l := Load{Scheds: scheds - m.scheds, Late: late - m.late}
	if d := now.Sub(m.at); !m.at.IsZero() && d > 0 {
		l.Busy = float64(cpu-m.cpu) / float64(d)
	}
	m.cpu, m.at, m.scheds, m.late = cpu, now, scheds, late
	return l
}
