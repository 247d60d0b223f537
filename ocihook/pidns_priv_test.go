//go:build linux

package ocihook

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/cgroup2"
	"github.com/trialnet/trialnet/internal/privtest"
	"golang.org/x/sys/unix"
)

// A process in the container's PID namespace whose namespace file the
// hook may not read (a hook without CAP_SYS_PTRACE; a process of another
// user) is not skipped as if gone: it is placed by its namespace depth,
// and refused. Processes at another depth (the host's, here unreadable
// too) are let be.
func TestPrivilegedHookPIDNamespaceUnreadable(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "nsenter")
	privtest.RequireTool(t, "setpriv")
	mount, err := cgroup2.Mount()
	if err != nil {
		t.Fatal(err)
	}
	// The container's init holds no CAP_SYS_PTRACE, so that a scan
	// without it may still read its own namespace.
	ctr := startReady(t, syscall.CLONE_NEWPID, "setpriv", "--bounding-set=-sys_ptrace", "--", "sh", "-c", "echo ready; exec sleep 600")
	nsenter := startReady(t, 0, "nsenter", fmt.Sprintf("--pid=/proc/%d/ns/pid", ctr), "--",
		"setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "sh", "-c", "echo ready; exec sleep 600")
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", nsenter, nsenter))
	other, aerr := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || aerr != nil {
		t.Fatalf("nsenter's child: %q %v %v", b, err, aerr)
	}
	t.Cleanup(func() { _ = syscall.Kill(other, syscall.SIGKILL) })
	h := &Hook{CgroupMount: mount}
	info := client.TrialInfo{Cgroup: filepath.Join(mount, "trialnet-test-none")}
	want := fmt.Sprintf("process %d", other)
	if why := outsidersNow(h, ctr, info); !strings.Contains(strings.Join(why, "; "), want) {
		t.Fatalf("with CAP_SYS_PTRACE: %q; want %q refused", why, want)
	}
	var why []string
	var hidden error
	privtest.WithoutCap(t, unix.CAP_SYS_PTRACE, func() {
		var st unix.Stat_t
		hidden = unix.Stat(fmt.Sprintf("/proc/%d/ns/pid", other), &st)
		why = outsidersNow(h, ctr, info)
	})
	t.Logf("without CAP_SYS_PTRACE: %q", why)
	if hidden == nil {
		t.Fatal("without CAP_SYS_PTRACE the kernel still shows another user's namespace file: the test shows nothing")
	}
	depth, err := h.pidNSDepth(ctr)
	if err != nil {
		t.Fatal(err)
	}
	refused := false
	for _, w := range why {
		refused = refused || strings.Contains(w, want) && strings.Contains(w, "CAP_SYS_PTRACE")
		// Other Trials' processes (tests of other packages run beside
		// this one) sit at the container's depth too; none of the host's.
		var pid int
		at := strings.Index(w, "process ")
		if _, err := fmt.Sscanf(w[max(at, 0):], "process %d", &pid); at < 0 || err != nil {
			t.Fatalf("a refusal names no process: %q", w)
		}
		if d, err := h.pidNSDepth(pid); err == nil && d != depth {
			t.Errorf("without CAP_SYS_PTRACE: refused process %d, %d PID namespaces deep, not the container's depth: %q", pid, d, w)
		}
	}
	if !refused {
		t.Fatalf("without CAP_SYS_PTRACE: %q; want a refusal of %s saying what the hook needs", why, want)
	}
}

// startReady starts args with clone flags, waits for its "ready" line and
// returns its pid; it is killed with the test.
func startReady(t *testing.T, flags uintptr, args ...string) int {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		t.Fatalf("%s did not start: %q %v", args[0], line, err)
	}
	return cmd.Process.Pid
}

// outsidersNow is the hook's PID namespace check with its scan on the
// calling thread: privtest.WithoutCap drops a capability from one thread,
// where a hook's process has one set for all.
func outsidersNow(h *Hook, pid int, info client.TrialInfo) []string {
	s := &pidNSScan{done: make(chan struct{})}
	s.peers, s.why = h.pidNSPeers(pid)
	close(s.done)
	return h.outsiders(s, info)
}
