//go:build linux

package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/sandbox"
	trialspec "github.com/trialnet/trialnet/trial"
)

// makeStats is lt's stats over counters k and proxy counts p. unsure,
// at a destroy, says why k may not hold all the Trial did (nil: it does).
func (a *Agent) makeStats(lt *trial, k bpf.Counters, p record.TrialStats, unsure error) client.Stats {
	info := a.info(lt)
	if p.ByReason == nil {
		p.ByReason = map[record.Reason]uint64{} // {} in JSON, never null
	}
	l := a.host.Layers()
	l.Nested = info.Nested
	l.Transparent = info.Transparent
	l.Containers = a.containers(lt, info.ID)
	if l.Container = info.Container; l.Container != "" {
		for i := range l.Pools {
			l.Pools[i] = trialspec.PoolBound{Pool: l.Pools[i].Pool, Bound: "the container runtime's (--pids-limit, --memory)"}
		}
	}
	var pools []trialspec.PoolUse
	if lt.tr != nil {
		pools = lt.tr.PoolUse()
	}
	st := client.Stats{Trial: info.ID, Learning: info.Learning, Kernel: k.Map(), Proxy: p, Egress: k.EgressOtherPackets, Foreign: k.ForeignSocketDenied,
		Layers: l, Pools: pools, Verdict: trialVerdict(k, l, unsure, info.Learning, p.WouldDeny), DNS: lt.dnsStats(), TopRefused: p.TopRefused(topRefused), At: time.Now().UTC()}
	if unsure != nil {
		st.Unsure = unsure.Error()
	}
	return st
}

// trialVerdict is the verdict over counters k (unsureVerdict's when
// unsure), with what a learning Trial let through after it: the
// receipt says LEARNING whatever else it says.
func trialVerdict(k bpf.Counters, l client.Layers, unsure error, learning bool, wouldDeny uint64) string {
	v := verdictOf(k, l)
	if unsure != nil {
		v = unsureVerdict(k, l, unsure)
	}
	if learning {
		v += fmt.Sprintf("; LEARNING: the allowlist was not enforced, %d requests to names off it were let through (would_deny); the kernel layers and the address guard were", wouldDeny)
	}
	return v
}

// Stats reads a live Trial's counters; of a destroyed one, the final
// stats kept in its data directory (its receipt among them).
func (a *Agent) Stats(_ context.Context, id string) (client.Stats, error) {
	lt, err := a.lookup(id)
	if err != nil {
		if st, ok := a.finalStats(id); ok {
			return st, nil
		}
		return client.Stats{}, err
	}
	k, err := lt.tr.Counters()
	if err != nil {
		return client.Stats{}, errf(client.CodeInternal, "read counters of %s: %v", id, err)
	}
	p, _ := a.proxy.Stats(id)
	return a.makeStats(lt, k, p, nil), nil
}

// finalStats reads the stats a destroy kept for Trial id.
func (a *Agent) finalStats(id string) (client.Stats, bool) {
	if a.cfg.DataDir == "" || sandbox.ValidID(id) != nil {
		return client.Stats{}, false
	}
	b, err := os.ReadFile(filepath.Join(a.cfg.DataDir, id, "stats.json"))
	if err != nil {
		return client.Stats{}, false
	}
	var st client.Stats
	if json.Unmarshal(b, &st) != nil || st.Trial != id {
		return client.Stats{}, false
	}
	return st, true
}
