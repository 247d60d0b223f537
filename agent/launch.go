//go:build linux

package agent

import (
	"context"
	"os"
	"time"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/sandbox"
)

// Launch is client.Run's Launcher on this host: it runs Command in the
// Trial through the sandbox, and enforces a run's deadline with the
// sandbox's watchdog.
type Launch struct {
	Command sandbox.Command
}

var (
	_ client.Launcher   = Launch{}
	_ client.StartError = (*sandbox.StartError)(nil) // so Run sees a command that never ran
)

// Exec runs l.Command in the Trial info describes (ExecIn).
func (l Launch) Exec(ctx context.Context, info client.TrialInfo, sigs <-chan os.Signal) (int, error) {
	return ExecIn(ctx, info, l.Command, sigs)
}

// WatchDeadline starts the sandbox's watchdog on the Trial's cgroup.
func (Launch) WatchDeadline(info client.TrialInfo, deadline time.Time) (func(), error) {
	wd, err := sandbox.WatchDeadline(info.Cgroup, deadline)
	if err != nil {
		return nil, err
	}
	return wd.Release, nil
}

// ExecIn runs c in the Trial info describes, with the Trial's proxy
// variables, socket rule and process limit, forwarding sigs to it.
func ExecIn(ctx context.Context, info client.TrialInfo, c sandbox.Command, sigs <-chan os.Signal) (int, error) {
	tr, err := Attach(info)
	if err != nil {
		return -1, err
	}
	c.ProxyURL, c.GatewayURL = info.ProxyURL, info.GatewayURL // the unix rule and process limit are the launcher's, from info.Spec
	return tr.Exec(ctx, c, sigs)
}
