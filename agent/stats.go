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
	"github.com/trialnet/trialnet/dnsstub"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/sandbox"
)

// Stats are a Trial's kernel and proxy counters with the egress verdict.
type Stats struct {
	Trial string `json:"trial"`
	// Learning: the Trial let names off its allowlist through; always
	// written, and said in the verdict.
	Learning bool              `json:"learning"`
	Kernel   map[string]uint64 `json:"kernel"`
	Proxy    record.TrialStats `json:"proxy"`
	Egress   uint64            `json:"direct_egress_packets"`
	Foreign  uint64            `json:"foreign_socket_uses"`
	Layers   Layers            `json:"layers"`
	// Receipt is the signed receipt of a destroyed Trial (Destroy's stats
	// only): what an evaluation attaches, not the terminal's text.
	Receipt *SignedReceipt `json:"receipt,omitempty"`
	// Pools are the Trial's use of the host's tasks and memory: now (at
	// destroy: as the teardown found it), at the peak, and the events at
	// the bound (forks refused, OOM kills).
	Pools   []sandbox.PoolUse `json:"pools"`
	Verdict string            `json:"verdict"`
	// DNS are the counts of the Trial's DNS stub (transparent mode; absent
	// without it), since this agent process started it: a restart starts
	// them again, except names, which the Trial keeps.
	DNS *dnsstub.Stats `json:"dns,omitempty"`
	// TopRefused are the most refused targets (host:port as asked for).
	TopRefused []record.TargetCount `json:"top_refused"`
	At         time.Time            `json:"at"`
}

func (a *Agent) makeStats(lt *trial, k bpf.Counters, p record.TrialStats) Stats {
	info := a.info(lt)
	if p.ByReason == nil {
		p.ByReason = map[record.Reason]uint64{} // {} in JSON, never null
	}
	l := a.host.Layers()
	l.Nested = info.Nested
	l.Transparent = info.Transparent
	v := verdictOf(k, l)
	if info.Learning {
		v += fmt.Sprintf("; LEARNING: the allowlist was not enforced, %d requests to names off it were let through (would_deny); the kernel layers and the address guard were", p.WouldDeny)
	}
	var pools []sandbox.PoolUse
	if lt.tr != nil {
		pools = lt.tr.PoolUse()
	}
	return Stats{Trial: info.ID, Learning: info.Learning, Kernel: k.Map(), Proxy: p, Egress: k.EgressOtherPackets, Foreign: k.ForeignSocketDenied,
		Layers: l, Pools: pools, Verdict: v, DNS: lt.dnsStats(), TopRefused: p.TopRefused(topRefused), At: time.Now().UTC()}
}

// Stats reads a live Trial's counters; of a destroyed one, the final
// stats kept in its data directory (its receipt among them).
func (a *Agent) Stats(_ context.Context, id string) (Stats, error) {
	lt, err := a.lookup(id)
	if err != nil {
		if st, ok := a.finalStats(id); ok {
			return st, nil
		}
		return Stats{}, err
	}
	k, err := lt.tr.Counters()
	if err != nil {
		return Stats{}, errf(CodeInternal, "read counters of %s: %v", id, err)
	}
	p, _ := a.proxy.Stats(id)
	return a.makeStats(lt, k, p), nil
}

// finalStats reads the stats a destroy kept for Trial id.
func (a *Agent) finalStats(id string) (Stats, bool) {
	if a.cfg.DataDir == "" || sandbox.ValidID(id) != nil {
		return Stats{}, false
	}
	b, err := os.ReadFile(filepath.Join(a.cfg.DataDir, id, "stats.json"))
	if err != nil {
		return Stats{}, false
	}
	var st Stats
	if json.Unmarshal(b, &st) != nil || st.Trial != id {
		return Stats{}, false
	}
	return st, true
}
