//go:build linux

package agent

import (
	"net"
	"time"

	"github.com/trialnet/trialnet/internal/lname"
	"github.com/trialnet/trialnet/keeper"
)

// keep gives the keeper the endpoint listeners of Trial id, created at
// created.
func (a *Agent) keep(id string, created time.Time, lns []net.Listener) {
	if a.keeper == nil || len(lns) == 0 {
		return
	}
	names, at := make([]string, len(lns)), make([]string, len(lns))
	for i := range lns {
		names[i], at[i] = lname.EndpointName(id, i).String(), keeper.TrialCreated(created)
	}
	a.keeper.Put(names, at, lns)
}

// unkeep drops Trial id's listeners from the keeper (a destroy).
func (a *Agent) unkeep(id string) {
	if a.keeper != nil {
		a.keeper.Del(lname.TrialPrefix(id))
	}
}

// createdAt is when Trial id was created (zero: no such Trial here).
func (a *Agent) createdAt(id string) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	if lt := a.trials[id]; lt != nil {
		return lt.info.Created
	}
	return time.Time{}
}
