package proxy

import (
	"sync"
	"time"
)

// Per-Trial limit defaults.
const (
	DefaultMaxTunnels   = 256 // concurrent CONNECTs per Trial
	DefaultConnectRate  = 50  // CONNECTs per second per Trial, sustained
	DefaultConnectBurst = 200 // CONNECTs per Trial in a burst
)

// Limits bound what one Trial may use. Zero fields take the defaults.
type Limits struct {
	MaxTunnels   int     `yaml:"max_tunnels" json:"max_tunnels"`
	ConnectRate  float64 `yaml:"connects_per_second" json:"connects_per_second"`
	ConnectBurst int     `yaml:"connect_burst" json:"connect_burst"`
}

func (l Limits) withDefaults() Limits {
	if l.MaxTunnels <= 0 {
		l.MaxTunnels = DefaultMaxTunnels
	}
	if l.ConnectRate <= 0 {
		l.ConnectRate = DefaultConnectRate
	}
	if l.ConnectBurst <= 0 {
		l.ConnectBurst = DefaultConnectBurst
	}
	return l
}

// bucket is a token bucket: burst tokens, refilled at rate per second.
type bucket struct {
	mu     sync.Mutex
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

func newBucket(rate float64, burst int) bucket {
	return bucket{rate: rate, burst: float64(burst), tokens: float64(burst)}
}

func (b *bucket) take(now time.Time) bool {
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
