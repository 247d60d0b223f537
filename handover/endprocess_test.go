//go:build linux

package handover

import (
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// A signal this process gets while endProcess waits for a successor to
// exit (a child's SIGCHLD, the runtime's own) does not cut the wait
// short: the successor that exits by itself is not killed, and one that
// is killed has exited by the time endProcess returns.
func TestEndProcessWaitsThroughSignals(t *testing.T) {
	defer func(g int) { endGrace = g }(endGrace)
	endGrace = -1 // the successor exits when the test says, not by a clock
	cmd := exec.Command("/bin/sh", "-c", "read x; exit 3")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	tid, ended := make(chan int), make(chan bool)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid <- unix.Gettid()
		ended <- endProcess(pidfd)
	}()
	waiter := <-tid
	for range 50 {
		if err := unix.Tgkill(os.Getpid(), waiter, unix.SIGURG); err != nil {
			t.Fatal(err)
		}
		runtime.Gosched()
	}
	_ = in.Close()
	if !<-ended {
		t.Fatal("endProcess says the successor has not exited")
	}
	_ = cmd.Wait()
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() || ws.ExitStatus() != 3 {
		t.Fatalf("the successor ended with %v; want its own exit (3), not a kill while endProcess waited", cmd.ProcessState)
	}
}
