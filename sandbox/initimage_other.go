//go:build linux && !amd64

package sandbox

import (
	"os"
	"os/exec"
)

// initCommand is the Trial's init with args and, from fd 3 on, files:
// off x86-64, this binary again (early.c's constructor, or runInit); it
// holds nothing for release to close.
func initCommand(args []string, files ...*os.File) (_ *exec.Cmd, release func(), _ error) {
	return &exec.Cmd{Path: "/proc/self/exe", Args: args, ExtraFiles: files}, func() {}, nil
}

// CheckInitImage says what a Trial's init is executed from: off x86-64,
// this binary, which vm.memfd_noexec does not concern.
func CheckInitImage() (string, error) {
	return "the trialnet binary (/proc/self/exe)", nil
}
