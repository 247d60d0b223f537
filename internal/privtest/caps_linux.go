//go:build linux

package privtest

import (
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// WithoutCap runs f on a thread of its own whose effective capabilities
// lack c (unix.CAP_...), as in a process whose bounding set lacks it
// (the agent under deploy/trialnet.service). The thread stays locked, so
// it ends with f's goroutine instead of going back to the scheduler
// without c. f must not call t's Fatal or Skip: it runs on another
// goroutine.
func WithoutCap(t testing.TB, c int, f func()) {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		err := unix.Capget(&hdr, &data[0])
		if err == nil {
			data[c/32].Effective &^= 1 << (c % 32)
			err = unix.Capset(&hdr, &data[0])
		}
		if err == nil {
			f()
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatalf("drop capability %d from a thread: %v", c, err)
	}
}
