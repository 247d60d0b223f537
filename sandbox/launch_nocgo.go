//go:build linux && !cgo

package sandbox

import (
	"fmt"
	"os/exec"

	"golang.org/x/sys/unix"
)

// startCommand starts cmd as exec.Cmd does, on the thread enter runs it
// on: trialnet-exec is executed, and its Go path (trialExec) execs the
// command.
//
// Its stdio is copied as the cgo path's is (launchIO), exec.Cmd given
// only files: exec.Cmd's own copying waits, after WaitDelay, for a copy
// blocked writing to a reader that does not read, without end, where
// launchIO.wait gives up at the deadline (Process.abandonOutput).
func startCommand(cmd *exec.Cmd, enter func(func() error) error) (*launchIO, error) {
	stdio, err := newLaunchIO(cmd)
	if err != nil {
		return nil, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdio.child[0], stdio.child[1], stdio.child[2]
	err = enter(func() error {
		err := cmd.Start()
		if err != nil && cmd.Dir != "" {
			if derr := workdirError(cmd.Dir); derr != nil {
				return derr
			}
		}
		return err
	})
	if err != nil {
		stdio.abort()
		return nil, err
	}
	stdio.started()
	return stdio, nil
}

// workdirError is why dir, where a failed cmd.Start was to chdir, cannot
// be a working directory, in early.c's words, or nil. exec.Cmd reports
// its child's failed chdir as "fork/exec /proc/self/exe" (the file it
// ran), so the directory is looked up again, on the same thread (in the
// Trial's mount namespace), as its chdir did.
func workdirError(dir string) error {
	var st unix.Stat_t
	err := unix.Stat(dir, &st)
	if err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
		err = unix.ENOTDIR
	}
	if err == nil {
		return nil
	}
	return &StartError{Code: ExitCannotExecute, Msg: fmt.Sprintf("trialnet-exec: enter the working directory %q (run/exec --workdir: a directory in the Trial's view of files, where /tmp is the Trial's own): %v", dir, err)}
}
