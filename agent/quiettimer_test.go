//go:build linux

package agent

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// The destroy's forced collections wait for destroys to stop coming: a
// run d after the first of a stream of calls would mark the whole heap
// in the middle of it, every d, however many Trials are live.
func TestQuietTimerRunsAfterTheLastCall(t *testing.T) {
	const d = 200 * time.Millisecond
	const calls = 50
	var q quietTimer
	var mu sync.Mutex
	var runs []int // the calls whose function ran, in the order they ran
	// before[i] is taken before call i, after[i] once it returned.
	var before, after [calls]time.Time
	for i := range calls { // a second of calls, 20 ms apart
		before[i] = time.Now()
		q.after(d, func() {
			mu.Lock()
			runs = append(runs, i)
			mu.Unlock()
		})
		after[i] = time.Now()
		time.Sleep(20 * time.Millisecond)
	}
	// Each run is told by the call that set it, not by when it ran: on a
	// loaded machine a timer's function can start well after it fired,
	// even after the next call returned.
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		last := slices.Contains(runs, calls-1)
		mu.Unlock()
		if last {
			break
		}
		if time.Now().After(end) {
			t.Fatal("no run 10 s after the last call")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	seen := map[int]bool{}
	for _, i := range runs {
		if seen[i] {
			t.Fatalf("call %d's function ran twice", i)
		}
		seen[i] = true
		// Call i's timer fires d after before[i] at the earliest, and
		// only a timer still to fire is stopped: if call i+1 returned
		// sooner than that, call i's function ran though the calls kept
		// coming.
		if i < calls-1 && after[i+1].Sub(before[i]) < d {
			t.Fatalf("call %d's function ran, though call %d came %v after it, want %v or more apart: it ran while calls kept coming",
				i, i+1, after[i+1].Sub(before[i]), d)
		}
	}
}
