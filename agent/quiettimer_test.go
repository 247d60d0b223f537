//go:build linux

package agent

import (
	"sync"
	"testing"
	"time"
)

// The destroy's forced collections wait for destroys to stop coming: a
// run d after the first of a stream of calls would mark the whole heap
// in the middle of it, every d, however many Trials are live.
func TestQuietTimerRunsAfterTheLastCall(t *testing.T) {
	const d = 200 * time.Millisecond
	var q quietTimer
	var mu sync.Mutex
	var runs []time.Time
	fn := func() {
		mu.Lock()
		runs = append(runs, time.Now())
		mu.Unlock()
	}
	// before[i] is taken before call i, after[i] once it returned: a run
	// later than after[i] is one that call i or a later one set.
	var before, after []time.Time
	for range 50 { // a second of calls, 20 ms apart
		before = append(before, time.Now())
		q.after(d, fn)
		after = append(after, time.Now())
		time.Sleep(20 * time.Millisecond)
	}
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := len(runs)
		mu.Unlock()
		if n > 0 && time.Since(after[len(after)-1]) > d+50*time.Millisecond {
			break
		}
		if time.Now().After(end) {
			t.Fatal("no run 10 s after the last call")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, r := range runs {
		last := -1
		for i := range after {
			if after[i].Before(r) {
				last = i
			}
		}
		if last < 0 || r.Sub(before[last]) < d {
			t.Fatalf("a run %v after the call before it, want %v or more: it ran while calls kept coming", r.Sub(before[max(last, 0)]), d)
		}
	}
	if !runs[len(runs)-1].After(after[len(after)-1]) {
		t.Fatal("no run after the last call")
	}
}
