//go:build linux

package main

import (
	"runtime/debug"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// vsockArgs are socket's arguments for socketcall: AF_VSOCK,
// SOCK_STREAM, 0, in static data, whose address fits in 32 bits.
var vsockArgs = [3]uint32{unix.AF_VSOCK, unix.SOCK_STREAM, 0}

func socketcallI386(call uint32, args uint32) int64

// vsockI386 makes an AF_VSOCK socket through the i386 entry's
// socketcall(SYS_SOCKET, args).
func vsockI386() (err error) {
	p := uintptr(unsafe.Pointer(&vsockArgs))
	if p >= 1<<32 {
		return errSkip("the arguments are not below 4 GiB (a position-independent build)")
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if recover() != nil {
			err = errNoI386Entry
		}
	}()
	r := socketcallI386(1, uint32(p))
	if r < 0 {
		return syscall.Errno(-r)
	}
	_ = unix.Close(int(r))
	return nil
}
