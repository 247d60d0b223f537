//go:build linux

package main

import (
	"encoding/json"

	"golang.org/x/sys/unix"
)

// vsockAttempts makes an AF_VSOCK socket each way a seccomp profile has
// to refuse: socket(40, …); socket(0x1_00000028, …), which the kernel
// reads as 40 and a rule comparing all 64 bits ("!= 40") lets through;
// and i386's socketcall(SYS_SOCKET, {40, …}), whose family is behind a
// pointer seccomp cannot read (in a child: i386Attempts).
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
	report(enc, "socketcall-vsock-i386", inChild("socketcall-vsock-i386"))
}
