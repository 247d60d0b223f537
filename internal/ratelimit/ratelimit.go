//go:build linux

// Package ratelimit is the token bucket behind the proxy's per-Trial
// CONNECT rate and its record rate.
package ratelimit

import (
	"math"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Bucket holds up to burst tokens, refilled at rate per second. It is
// kept as one word, the time at which it will be full again (the generic
// cell rate algorithm), changed by compare-and-swap: the word may be in
// memory that another process maps and takes from too (NewShared), and
// the two then take from one bucket. The zero Bucket is not usable;
// make one with New or NewShared.
type Bucket struct {
	full     *atomic.Int64 // when the bucket is full, in CLOCK_MONOTONIC ns; earlier: it is
	interval int64         // ns per token
	window   int64         // burst tokens' worth of ns
	// base and mono map a caller's time.Time onto CLOCK_MONOTONIC, which
	// every process of the host reads alike.
	base time.Time
	mono int64
}

// New returns a full bucket.
func New(rate float64, burst int) *Bucket { return NewShared(rate, burst, new(atomic.Int64)) }

// NewShared returns a bucket kept in word, which starts full at zero;
// every Bucket on the same word, in any process of the host, takes from
// the same tokens.
func NewShared(rate float64, burst int, word *atomic.Int64) *Bucket {
	// At most so long that a burst of intervals, and a time added to it,
	// do not overflow: a rate of zero never refills.
	interval := int64(math.MaxInt64/4) / int64(max(burst, 1))
	if rate > 0 {
		interval = int64(min(float64(time.Second)/rate, float64(interval)))
	}
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return &Bucket{full: word, interval: interval, window: interval * int64(max(burst, 0)),
		base: time.Now(), mono: ts.Nano()}
}

// Take takes one token at now, reporting false when none is left.
func (b *Bucket) Take(now time.Time) bool {
	t := b.mono + int64(now.Sub(b.base))
	for {
		full := b.full.Load()
		next := max(full, t) + b.interval
		if next-t > b.window {
			return false
		}
		if b.full.CompareAndSwap(full, next) {
			return true
		}
	}
}
