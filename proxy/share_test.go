//go:build linux

package proxy

import (
	"sync"
	"testing"

	trialspec "github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/internal/counts"
	"github.com/trialnet/trialnet/record"
)

// sharedPair is one Trial served by two proxies, as two agent processes
// serve it during a hand-over: each maps the Trial's counts and the
// proxy-wide ones from one memfd, in a slot of its own, and counts the
// other's (Share).
func sharedPair(t *testing.T, lim *trialspec.ProxyLimits, maxConns int) [2]*testProxy {
	t.Helper()
	var pair [2]*testProxy
	trial, proxy := sharedRegions(t), sharedRegions(t)
	for i := range pair {
		pair[i] = newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, limits: lim, counts: trial[i], slot: i,
			configure: func(c *Config) { c.Counts, c.Slot, c.MaxConnections = proxy[i], i, maxConns }})
		pair[i].dns.set("api.example.com", 60, "93.184.216.34")
	}
	pair[0].Share(true) // the old agent, at its offer
	pair[1].Share(false)
	return pair
}

// sharedRegions are two mappings of one counts page, as two processes
// have them.
func sharedRegions(t *testing.T) [2]*counts.Region {
	t.Helper()
	r, err := counts.New("test")
	if err != nil {
		t.Fatal(err)
	}
	f, err := r.Dup()
	if err != nil {
		t.Fatal(err)
	}
	other, err := counts.Open(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(); _ = other.Close() }) // after the proxies close
	return [2]*counts.Region{r, other}
}

// held opens n tunnels, one at a time and alternately through each proxy
// of pair, keeping those answered 200 open, and counts the answers by
// reason ("200": allowed).
func held(t *testing.T, pair [2]*testProxy, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for i := range n {
		resp, c, _ := pair[i%2].connect(t, connectHead("api.example.com:443"))
		if resp.StatusCode != 200 {
			_ = c.Close()
			got[resp.Header.Get("Trialnet-Reason")]++
			continue
		}
		got["200"]++
	}
	return got
}

// Two processes serving one Trial keep each limit together, as one
// process would: its tunnels, its client connections, the proxy-wide
// connections, its CONNECT rate and its decision-log bytes.
func TestSharedCountsTwoProxies(t *testing.T) {
	const n = 4
	for _, tc := range []struct {
		name     string
		lim      trialspec.ProxyLimits
		maxConns int
		want     record.Reason
	}{
		{"max_tunnels", trialspec.ProxyLimits{MaxTunnels: n}, 0, record.ReasonTunnelLimit},
		{"max_client_connections", trialspec.ProxyLimits{MaxClientConns: n}, 0, record.ReasonTrialConnLimit},
		{"max_connections", trialspec.ProxyLimits{}, n, record.ReasonGlobalLimit},
		{"connect_burst", trialspec.ProxyLimits{ConnectRate: 1e-6, ConnectBurst: n}, 0, record.ReasonRateLimited},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := held(t, sharedPair(t, &tc.lim, tc.maxConns), 3*n)
			if got["200"] != n || got[string(tc.want)] != 2*n {
				t.Errorf("%d CONNECTs through two processes, a limit of %d: %v; want %d allowed and the rest refused %s", 3*n, n, got, n, tc.want)
			}
		})
	}
	t.Run("max_log_bytes", func(t *testing.T) {
		const limit = 4000
		pair := sharedPair(t, &trialspec.ProxyLimits{MaxLogBytes: limit}, 0)
		for i := range 30 {
			pair[i%2].sendRefused(t, floodHead, 1)
		}
		size := 0
		for _, tp := range pair {
			_, recs := tp.finish(t)
			for _, r := range recs {
				if r.Decision != record.DecisionSuppressed {
					b, _ := r.AppendJSON(nil)
					size += len(b) + 1
				}
			}
		}
		if size > limit || size < limit-1000 {
			t.Errorf("two processes wrote %d bytes of records to one log, for a limit of %d", size, limit)
		}
	})
}

// Unshare ends the counting of the other slot: a successor that died
// leaves nothing this process must count.
func TestUnshareForgetsTheOtherSlot(t *testing.T) {
	pair := sharedPair(t, &trialspec.ProxyLimits{MaxTunnels: 2}, 0)
	for range 2 { // held open: connect closes them as the test ends
		if resp, _, _ := pair[1].connect(t, connectHead("api.example.com:443")); resp.StatusCode != 200 {
			t.Fatal(resp.Status)
		}
	}
	if resp, _, _ := pair[0].connect(t, connectHead("api.example.com:443")); resp.StatusCode != 429 {
		t.Fatalf("with the other's 2 tunnels open under max_tunnels 2: %s", resp.Status)
	}
	pair[0].Unshare()
	if resp, _, _ := pair[0].connect(t, connectHead("api.example.com:443")); resp.StatusCode != 200 {
		t.Fatalf("once the other is no longer counted: %s", resp.Status)
	}
}

// Under load, racing CONNECTs at both processes at once: the tunnels held
// open never pass the limit together.
func TestSharedCountsUnderLoad(t *testing.T) {
	const limit, workers, each = 8, 32, 8
	pair := sharedPair(t, &trialspec.ProxyLimits{MaxTunnels: limit, ConnectBurst: workers * each}, 0)
	var mu sync.Mutex
	allowed := 0
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range each {
				resp, c, _ := pair[w%2].connect(t, connectHead("api.example.com:443"))
				if resp.StatusCode == 200 {
					mu.Lock()
					allowed++
					mu.Unlock()
					continue // held open until the test ends
				}
				_ = c.Close()
			}
		})
	}
	wg.Wait()
	if allowed > limit || allowed == 0 {
		t.Errorf("%d tunnels held open through two processes at once, under max_tunnels %d", allowed, limit)
	}
}
