//go:build linux

package rootdir

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// OpenRegular is given paths a Trial may have put something at, and is
// run as root: opening a device is itself an act (a watchdog is armed,
// a tape rewound, a terminal made the caller's), so what is not a regular
// file must be refused without being opened. A FIFO's opening shows as
// an inotify IN_OPEN event, as a device's does.
func TestOpenRegularOpensNothingElse(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "receipt.json")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	in, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Close(in) })
	if _, err := unix.InotifyAddWatch(in, fifo, unix.IN_OPEN); err != nil {
		t.Fatal(err)
	}
	if f, err := OpenRegular(fifo); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		if f != nil {
			_ = f.Close()
		}
		t.Fatalf("OpenRegular of a FIFO: %v, want refused as not a regular file", err)
	}
	var buf [4096]byte
	n, err := unix.Read(in, buf[:])
	if !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("the FIFO was opened (%d bytes of inotify events, %v): refused only after it was", n, err)
	}
	// A regular file is still read.
	reg := filepath.Join(dir, "log")
	if err := os.WriteFile(reg, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := OpenRegular(reg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if n, err := f.Read(buf[:]); n != 1 || err != nil {
		t.Fatalf("read the regular file: %d bytes, %v", n, err)
	}
}
