//go:build linux

package sandbox

import (
	"bytes"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"
)

// An init's reaper waits for its exit on the poller, not in a system call:
// one that blocks holds a P until the runtime's monitor takes it back
// (milliseconds), which delayed the command's go-ahead (reapExited). With
// cmd.Wait alone the goroutine waits in state "syscall".
func TestReapExitedWaitsOnThePoller(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	cmd := exec.Command("cat") // runs until its stdin ends
	cmd.Stdin = r
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = r.Close()
	done := make(chan struct{})
	go func() {
		reapExited(cmd)
		close(done)
	}()
	var state string
	for end := time.Now().Add(10 * time.Second); state == "" && time.Now().Before(end); time.Sleep(time.Millisecond) {
		state = reaperState()
	}
	_ = w.Close() // cat exits
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("reapExited did not return 10 s after its process exited")
	}
	if cmd.ProcessState == nil || !cmd.ProcessState.Exited() {
		t.Fatalf("the process was not reaped: %v", cmd.ProcessState)
	}
	if state != "IO wait" {
		t.Fatalf("reapExited waited in state %q, want \"IO wait\" (the poller)", state)
	}
}

// reaperState is the state reapExited's goroutine waits in ("IO wait",
// "syscall"), or "" while it runs or has not started.
func reaperState() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for g := range bytes.SplitSeq(buf, []byte("\n\n")) {
		if !bytes.Contains(g, []byte("sandbox.reapExited(")) {
			continue
		}
		_, head, _ := bytes.Cut(g, []byte("["))
		head, _, _ = bytes.Cut(head, []byte("]"))
		state, _, _ := bytes.Cut(head, []byte(","))
		switch s := string(state); s {
		case "running", "runnable":
			return ""
		default:
			return s
		}
	}
	return ""
}
