package testkit

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// RSSBytes counts bytes: a Go test binary holds several MiB resident,
// which in KiB would read as a few thousand. A reaped process has none.
func TestRSSBytes(t *testing.T) {
	if n := RSSBytes(os.Getpid()); n < 1<<20 {
		t.Fatalf("this process's RSS is %d: not bytes", n)
	}
	if n := RSSBytes(reaped(t)); n != 0 {
		t.Fatalf("a reaped process's RSS is %d, want 0", n)
	}
}

// ProcState reads the letter after the command name, even a name with
// ") S (" in it, and 0 for a process that is gone.
func TestProcState(t *testing.T) {
	// The reading thread's own state: the process's is its main
	// thread's, which may sleep while this goroutine runs elsewhere.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if st := ProcState(unix.Gettid()); st != 'R' {
		t.Fatalf("this thread's state %q, want 'R' (it is reading)", st)
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	named := filepath.Join(t.TempDir(), "x) R (y") // the kernel's comm is this name
	if err := os.Symlink(sleep, named); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(named, "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for end := time.Now().Add(10 * time.Second); ProcState(cmd.Process.Pid) != 'S' && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond) // until it has started and sleeps
	}
	if st := ProcState(cmd.Process.Pid); st != 'S' {
		t.Fatalf("a sleeping process named \"x) R (y\": state %q, want 'S'", st)
	}
	if st := ProcState(reaped(t)); st != 0 {
		t.Fatalf("a reaped process's state %q, want 0", st)
	}
}

func TestCountFDs(t *testing.T) {
	before := CountFDs(t)
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if n := CountFDs(t); n != before+1 {
		t.Fatalf("%d descriptors after opening one more than %d", n, before)
	}
}

// reaped is the pid of a process that has exited and been waited for.
func reaped(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}
