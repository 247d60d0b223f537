//go:build linux

package ratelimit

import (
	"sync/atomic"
	"testing"
	"time"
)

// A bucket gives its burst at once, then one token per 1/rate; two
// buckets on one word (as two processes mapping it) give that together,
// not each.
func TestBucket(t *testing.T) {
	now := time.Now()
	take := func(bs []*Bucket, at time.Time, n int) int {
		got := 0
		for i := range n {
			if bs[i%len(bs)].Take(at) {
				got++
			}
		}
		return got
	}
	for _, tc := range []struct {
		name    string
		buckets func(*atomic.Int64) []*Bucket
	}{
		{"one", func(*atomic.Int64) []*Bucket { return []*Bucket{New(10, 5)} }},
		{"two sharing a word", func(w *atomic.Int64) []*Bucket { return []*Bucket{NewShared(10, 5, w), NewShared(10, 5, w)} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs := tc.buckets(new(atomic.Int64))
			if got := take(bs, now, 20); got != 5 {
				t.Errorf("a burst of 20 at once: %d taken, want the burst, 5", got)
			}
			if got := take(bs, now.Add(time.Second), 20); got != 5 {
				t.Errorf("a second later, at 10/s with burst 5: %d taken, want 5 (full again)", got)
			}
			if got := take(bs, now.Add(1300*time.Millisecond), 20); got != 3 {
				t.Errorf("0.3 s later: %d taken, want 3", got)
			}
		})
	}
	if New(0, 2).Take(now) != true || New(0, 0).Take(now) {
		t.Error("rate 0: want the burst only")
	}
}
