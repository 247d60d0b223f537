//go:build linux

package testpty

import (
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The master stays non-blocking, so that a test's deadline on it holds:
// a read with nothing to read ends at its deadline, not never.
func TestMasterKeepsDeadlines(t *testing.T) {
	m, _ := Open(t, 24, 80)
	rc, err := m.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fl int
	if cerr := rc.Control(func(fd uintptr) { fl, err = unix.FcntlInt(fd, unix.F_GETFL, 0) }); cerr != nil || err != nil {
		t.Fatal(cerr, err)
	}
	if fl&unix.O_NONBLOCK == 0 {
		t.Fatal("the master is blocking: a deadline on it is ignored, and a read of a terminal that never answers hangs")
	}
	if err := m.SetReadDeadline(time.Now().Add(10 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a read of a silent terminal past its deadline: %v", err)
	}
}
