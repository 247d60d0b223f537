// Package ratelimit is the token bucket behind the proxy's per-Trial
// CONNECT rate and its record rate.
package ratelimit

import (
	"sync"
	"time"
)

// Bucket holds up to burst tokens, refilled at rate per second. The zero
// Bucket refuses everything; make one with New.
type Bucket struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

// New returns a full bucket.
func New(rate float64, burst int) *Bucket {
	return &Bucket{rate: rate, burst: float64(burst), tokens: float64(burst)}
}

// Take takes one token at now, reporting false when none is left.
func (b *Bucket) Take(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.last.IsZero() {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
