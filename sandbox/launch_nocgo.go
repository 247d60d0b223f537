//go:build linux && !cgo

package sandbox

import (
	"os"
	"os/exec"
)

// initFiles are the Trial's init's descriptors from 3 on: the ready pipe.
// Its set-up (runInit) assembles the seccomp filter itself.
func initFiles(ready *os.File) ([]*os.File, error) { return []*os.File{ready}, nil }

// startCommand starts cmd as exec.Cmd does, on the thread enter runs it
// on: trialnet-exec is executed, and its Go path (trialExec) execs the
// command.
func startCommand(cmd *exec.Cmd, enter func(func() error) error) (*launchIO, error) {
	return nil, enter(cmd.Start)
}
