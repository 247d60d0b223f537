//go:build linux

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// vsockAttempts makes an AF_VSOCK socket each way a seccomp profile has
// to refuse: socket(40, …); socket(0x1_00000028, …), which the kernel
// reads as 40 and a rule comparing all 64 bits ("!= 40") lets through;
// and i386's socketcall(SYS_SOCKET, {40, …}), whose family is behind a
// pointer seccomp cannot read. The last runs in a child process of its
// own (-mode vsock-i386): a profile that leaves out the i386 ABI meets
// libseccomp's bad-architecture action, which kills.
func vsockAttempts(enc *json.Encoder) {
	report(enc, "socket-vsock", anySocket(unix.AF_VSOCK))
	report(enc, "socket-vsock-high-bits", func() error {
		fd, _, errno := unix.RawSyscall(unix.SYS_SOCKET, 1<<32|unix.AF_VSOCK, unix.SOCK_STREAM, 0)
		if errno != 0 {
			return errno
		}
		_ = unix.Close(int(fd))
		return nil
	}())
	report(enc, "socketcall-vsock-i386", func() error {
		self, err := os.Executable()
		if err != nil {
			return errSkip(err.Error())
		}
		out, err := exec.Command(self, "-mode", "vsock-i386").CombinedOutput()
		var exit *exec.ExitError
		switch {
		case errors.As(err, &exit) && exit.ProcessState.Sys().(syscall.WaitStatus).Signal() == syscall.SIGSYS:
			return errors.New("killed by SIGSYS (the bad-architecture action)")
		case err != nil:
			return fmt.Errorf("%v: %s", err, out)
		}
		var r Result
		if err := json.Unmarshal(out, &r); err != nil {
			return fmt.Errorf("%q: %v", out, err)
		}
		switch r.Result {
		case "skipped":
			return errSkip(r.Reason)
		case "blocked":
			return errors.New(r.Reason)
		}
		return errEscaped(r.Reason)
	}())
}
