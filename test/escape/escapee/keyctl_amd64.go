//go:build linux

package main

import "syscall"

func keyctlI386GetUserKeyring() int64

// keyctlI386 asks for the user keyring's serial through the i386 system
// call entry: a filter that names keyctl for x86-64 only, or lets a
// foreign ABI through, leaves it open. Any answer but ENOSYS or EPERM
// means the key service took it.
func keyctlI386() error {
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
