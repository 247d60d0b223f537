//go:build linux

package proxy

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	trialspec "github.com/trialnet/trialnet/trial"
)

// TestConnectionFloodBounded: a Trial connecting as fast as it can, past
// its caps, holds no more of the proxy's connections (each a descriptor
// and a goroutine of the agent's) than its pending-head cap and the
// fixed bounds on connections being admitted (maxAdmitting) and being
// refused (maxClosing), and another Trial's CONNECTs go on. Half of the
// flood is idle connections (refused at admission), half CONNECTs to a
// name off the list (admitted, then refused); none reads its answer.
func TestConnectionFloodBounded(t *testing.T) {
	lim := &trialspec.ProxyLimits{MaxClientConns: 16, MaxPendingHeads: 8}
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, limits: lim,
		configure: func(c *Config) { c.OnEvent = nil }}) // thousands of records: none is read here
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	t2 := tp.addTrial(t, "t2", "api.example.com:443")
	tp.mu.Lock()
	t1 := tp.trials["t1"]
	tp.mu.Unlock()

	stop := make(chan struct{})
	var flood sync.WaitGroup
	var made atomic.Int64
	for i := range 4 {
		flood.Go(func() {
			var held []net.Conn
			defer func() {
				for _, c := range held {
					_ = c.Close()
				}
			}()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.Dial("tcp", tp.addr)
				if err != nil {
					continue
				}
				made.Add(1)
				if i%2 == 1 {
					_, _ = io.WriteString(c, connectHead("denied.example.com:443"))
				}
				held = append(held, c)
				if len(held) > 500 {
					_ = held[0].Close()
					held = held[1:]
				}
			}
		})
	}
	var peak atomic.Int64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			t1.mu.Lock()
			n := int64(len(t1.conns))
			t1.mu.Unlock()
			if n > peak.Load() {
				peak.Store(n)
			}
		}
	}()
	for range 40 {
		resp, c, _ := t2.connect(t, connectHead("api.example.com:443"))
		if resp.StatusCode != 200 {
			t.Errorf("t2's CONNECT during t1's flood: %s %s", resp.Status, resp.Header.Get("Trialnet-Detail"))
		}
		_ = c.Close()
		time.Sleep(25 * time.Millisecond)
	}
	close(stop)
	flood.Wait()
	<-sampled
	// The accept loop's own connection, waiting for a token, and the
	// refused ones between their token and their reset, are the slack.
	bound := int64(lim.MaxPendingHeads + maxAdmitting + maxClosing + 32)
	t.Logf("t1 made %d connections; the proxy held at most %d of them at once (bound %d)", made.Load(), peak.Load(), bound)
	if peak.Load() > bound {
		t.Fatalf("the proxy held %d of t1's connections at once, past %d", peak.Load(), bound)
	}
}
