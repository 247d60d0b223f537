//go:build linux

package proxy

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	trialspec "github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/internal/counts"
	"github.com/trialnet/trialnet/record"
)

// A Trial may be removed twice at once (a draining agent removes it for
// its successor, and again as its drain ends), or while the proxy closes.
// The call that does not do the removal returns only once it is done: its
// caller then unmaps the Trial's counts page, which the removal's
// handlers and last records still write to until it ends.
func TestRemoveWaitsForTheRemovalInProgress(t *testing.T) {
	// Where the removal is held: a handler writing the record of the
	// tunnel the removal cut, or the summary of the suppressed records
	// that the removal writes last.
	for _, held := range []struct {
		name string
		held func(*record.Event) bool
		load func(t *testing.T, tp *testProxy)
	}{
		{"handler", func(*record.Event) bool { return true }, func(t *testing.T, tp *testProxy) {
			if resp, _, _ := tp.connect(t, connectHead("api.example.com:443")); resp.StatusCode != 200 {
				t.Fatal(resp.Status)
			}
		}},
		{"last records", func(ev *record.Event) bool { return ev.Decision == record.DecisionSuppressed }, func(t *testing.T, tp *testProxy) {
			tp.sendRefused(t, floodHead, 2) // one record, one suppressed
		}},
	} {
		for _, second := range []struct {
			name string
			call func(p *Proxy)
		}{
			{"RemoveTrial", func(p *Proxy) { p.RemoveTrial("t1") }},
			{"Close", func(p *Proxy) { _ = p.Close() }},
		} {
			t.Run(held.name+"/"+second.name, func(t *testing.T) {
				page, err := counts.New("remove")
				if err != nil {
					t.Fatal(err)
				}
				entered, release := make(chan struct{}), make(chan struct{})
				var once sync.Once
				tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, counts: page,
					limits: &trialspec.ProxyLimits{RecordRate: 1e-6, RecordBurst: 1, ConnectRate: 1000, ConnectBurst: 1000},
					configure: func(c *Config) {
						c.OnEvent = func(ev *record.Event, _ []byte) {
							if held.held(ev) {
								once.Do(func() { close(entered); <-release })
							}
						}
					}})
				tp.dns.set("api.example.com", 60, "93.184.216.34")
				held.load(t, tp)
				var firstDone atomic.Bool
				first := make(chan struct{})
				go func() {
					defer close(first)
					if _, ok := tp.RemoveTrial("t1"); !ok {
						t.Error("the first RemoveTrial did not find the Trial")
					}
					firstDone.Store(true)
				}()
				<-entered
				secondDone := make(chan struct{})
				go func() {
					defer close(secondDone)
					second.call(tp.Proxy)
					if !firstDone.Load() {
						// Unmapping now would crash the test binary.
						t.Errorf("%s returned while the removal in progress was still writing (%s)", second.name, held.name)
						return
					}
					_ = page.Close() // as the agent's release does once the proxy is done with the Trial
				}()
				// A second call that does not wait returns at once; one
				// that waits holds until the removal is let go, a moment
				// later.
				select {
				case <-secondDone:
				case <-time.After(200 * time.Millisecond):
				}
				close(release)
				<-first
				<-secondDone
			})
		}
	}
}
