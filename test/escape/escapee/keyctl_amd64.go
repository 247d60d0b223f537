//go:build linux

package main

import (
	"runtime/debug"
	"syscall"
)

func keyctlI386GetUserKeyring() int64

// errNoI386Entry is int $0x80 faulting: a kernel with no i386 entry at
// all (ia32_emulation off, or a paravirtualized guest that lacks it)
// raises SIGSEGV instead of answering. There is no such way in to try.
const errNoI386Entry = errSkip("int $0x80 faults: this kernel has no i386 system call entry")

// keyctlI386 asks for the user keyring's serial through the i386 system
// call entry: a filter that names keyctl for x86-64 only, or lets a
// foreign ABI through, leaves it open. Any answer but ENOSYS or EPERM
// means the key service took it.
func keyctlI386() (err error) {
	// The fault is a recoverable panic only while this is set.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if recover() != nil {
			err = errNoI386Entry
		}
	}()
	r := keyctlI386GetUserKeyring()
	if r < 0 {
		errno := syscall.Errno(-r)
		if errno == syscall.ENOSYS || errno == syscall.EPERM {
			return errno
		}
		return errEscaped("the key service answered: " + errno.Error())
	}
	return errEscaped("the user keyring's serial")
}
