package procstat

import (
	"os"
	"os/exec"
	"testing"
)

// A process started later has a later (or equal) start time than this
// one; a process that is gone has none.
func TestStartTime(t *testing.T) {
	self, err := StartTime(os.Getpid())
	if err != nil || self == 0 {
		t.Fatalf("this process: %d, %v", self, err)
	}
	cmd := exec.Command("sleep", "5")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	child, err := StartTime(cmd.Process.Pid)
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if err != nil || child < self {
		t.Fatalf("a child: %d (this process %d), %v", child, self, err)
	}
	if _, err := StartTime(cmd.Process.Pid); err == nil {
		t.Fatal("a reaped process still has a start time")
	}
}
