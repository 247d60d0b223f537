//go:build linux && !cgo

package sandbox

import "os/exec"

// startCommand starts cmd as exec.Cmd does: trialnet-exec is executed, and
// its Go path (trialExec) execs the command.
func startCommand(cmd *exec.Cmd) (*launchIO, error) { return nil, cmd.Start() }
