//go:build linux && !cgo

package sandbox

import "os/exec"

// startCommand starts cmd as exec.Cmd does, on the thread enter runs it
// on: trialnet-exec is executed, and its Go path (trialExec) execs the
// command.
func startCommand(cmd *exec.Cmd, enter func(func() error) error) (*launchIO, error) {
	return nil, enter(cmd.Start)
}
