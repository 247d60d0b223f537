//go:build linux

package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"testing"

	"github.com/trialnet/trialnet/internal/privtest"
	"golang.org/x/sys/unix"
)

// A task whose namespace file the adoption scan may not read is not
// skipped. The agent as deploy/trialnet.service bounds it has no
// CAP_SYS_PTRACE, and the kernel shows it no other user's process's
// namespace file: a process of another uid in a container's namespace
// passed unseen. The scan here runs without CAP_SYS_PTRACE, and a
// process of uid 65534 is alone in a new network namespace.
func TestPrivilegedAdoptScanSeesUnreadable(t *testing.T) {
	privtest.Require(t)
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := strconv.Itoa(cmd.Process.Pid)
	id, err := nsIDOf(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	var pids []string
	var hidden error
	privtest.WithoutCap(t, unix.CAP_SYS_PTRACE, func() {
		var st unix.Stat_t
		hidden = unix.Stat("/proc/"+pid+"/ns/net", &st)
		pids, err = pidsIn(id)
	})
	if hidden == nil {
		t.Fatal("without CAP_SYS_PTRACE the kernel still shows another user's namespace file: the test shows nothing")
	}
	if err != nil || !slices.Contains(pids, pid) {
		t.Fatalf("without CAP_SYS_PTRACE (its namespace file: %v) the scan found %v, %v; want process %s, of uid 65534, in it", hidden, pids, err, pid)
	}
}

// nsIDOf is the identity of process pid's network namespace.
func nsIDOf(pid int) (netnsID, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return netnsID{}, err
	}
	defer f.Close()
	return readNetnsID(f, pid)
}
