//go:build linux

package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/trialnet/trialnet/internal/privtest"
	"golang.org/x/sys/unix"
)

// TestPrivilegedKillCgroupWaitsUntilEmpty: killCgroup returns only once
// every process of the cgroup is gone (it waits on cgroup.events), and a
// cgroup already removed is not an error.
func TestPrivilegedKillCgroupWaitsUntilEmpty(t *testing.T) {
	privtest.Require(t)
	mount, err := Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(mount, "trialnet-killcg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = killCgroup(dir, killWait); _ = unix.Rmdir(dir) })
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var cmds []*exec.Cmd
	for range 4 {
		c := exec.Command("sleep", "100")
		c.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, c)
	}
	if p, err := cgroupPopulated(dir); err != nil || !p {
		t.Fatalf("cgroup.events before the kill: populated %v, %v; want populated", p, err)
	}
	if err := killCgroup(dir, killWait); err != nil {
		t.Fatal(err)
	}
	// Read before reaping: populated falls as each process exits, so a
	// return before the last exit shows here.
	if p, err := cgroupPopulated(dir); err != nil || p {
		t.Fatalf("cgroup.events after killCgroup returned: populated %v, %v; want empty", p, err)
	}
	for _, c := range cmds {
		if err := c.Wait(); err == nil || c.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Errorf("a process of the cgroup ended with %v, want killed by SIGKILL", err)
		}
	}
	if err := unix.Rmdir(dir); err != nil {
		t.Fatal(err)
	}
	if err := killCgroup(dir, killWait); err != nil {
		t.Errorf("killCgroup of a removed cgroup: %v, want nil", err)
	}
	if err := killCgroup(filepath.Join(dir, "never"), killWait); err != nil {
		t.Errorf("killCgroup of a cgroup never made: %v, want nil", err)
	}
}
