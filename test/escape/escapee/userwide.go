//go:build linux

package main

import (
	"encoding/json"
	"os"

	"golang.org/x/sys/unix"
)

// ioprio_set(2)'s who and class, not in x/sys/unix.
const (
	ioprioWhoUser    = 3
	ioprioClassBE    = 2
	ioprioClassShift = 13
)

// userWide tries the calls that name no pid but a uid, or every process:
// each reaches every process of the caller's uid it may act on, and the
// kernel takes in only those its PID namespace shows. The receivers are
// the test's victims, processes of the same uid outside the Trial: niced
// to 19, put last in the best-effort I/O class.
func userWide() {
	enc := json.NewEncoder(os.Stdout)
	report(enc, "renice-user", unix.Setpriority(unix.PRIO_USER, 0, 19))
	report(enc, "ioprio-user", func() error {
		_, _, errno := unix.Syscall(unix.SYS_IOPRIO_SET, ioprioWhoUser, uintptr(os.Getuid()), ioprioClassBE<<ioprioClassShift|7)
		if errno != 0 {
			return errno
		}
		return nil
	}())
}

// killAll is kill(-1): every process the caller may signal but itself.
// A mode of its own, run after the others' receivers are read: it ends
// their victims too.
func killAll() {
	report(json.NewEncoder(os.Stdout), "kill-all", unix.Kill(-1, unix.SIGUSR1))
}
