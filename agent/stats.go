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

func (a *Agent) makeStats(lt *trial, k bpf.Counters, p record.TrialStats) client.Stats {
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
	v := verdictOf(k, l)
	if info.Learning {
		v += fmt.Sprintf("; LEARNING: the allowlist was not enforced, %d requests to names off it were let through (would_deny); the kernel layers and the address guard were", p.WouldDeny)
	}
	var pools []trialspec.PoolUse
	if lt.tr != nil {
		pools = lt.tr.PoolUse()
	}
	return client.Stats{Trial: info.ID, Learning: info.Learning, Kernel: k.Map(), Proxy: p, Egress: k.EgressOtherPackets, Foreign: k.ForeignSocketDenied,
		Layers: l, Pools: pools, Verdict: v, DNS: lt.dnsStats(), TopRefused: p.TopRefused(topRefused), At: time.Now().UTC()}
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
	return a.makeStats(lt, k, p), nil
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
