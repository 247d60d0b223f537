//go:build linux

package timerslack

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/internal/privtest"
)

// slacks reads every thread's timer slack.
func slacks(t *testing.T) map[string]string {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/" + task.Name() + "/timerslack_ns")
		if err == nil {
			out[task.Name()] = strings.TrimSpace(string(b))
		}
	}
	return out
}

// Every thread has the slack after Set, threads started afterwards too.
// Setting another thread's slack needs CAP_SYS_NICE: a privileged test.
func TestPrivilegedSetEveryThread(t *testing.T) {
	privtest.Require(t)
	// Back to the kernel's default for the rest of this test binary.
	t.Cleanup(func() { _ = Set(50 * time.Microsecond) })
	if err := Set(2 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// Force new OS threads: locked goroutines each hold one.
	var wg, locked sync.WaitGroup
	release := make(chan struct{})
	for range 4 {
		wg.Add(1)
		locked.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			locked.Done()
			<-release
		}()
	}
	locked.Wait()
	got := slacks(t)
	close(release)
	wg.Wait()
	if len(got) < 2 {
		t.Fatalf("read %d threads' slack: want several", len(got))
	}
	for tid, s := range got {
		if s != "2000000" {
			t.Errorf("thread %s has timer slack %s ns, want 2000000", tid, s)
		}
	}
}

// SetMonitor changes one thread's slack, the first the runtime started
// after the main one (sysmon), and leaves every other thread's.
func TestPrivilegedSetMonitorOneThread(t *testing.T) {
	privtest.Require(t)
	t.Cleanup(func() { _ = Set(50 * time.Microsecond) })
	if err := Set(time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if err := SetMonitor(10 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	got := slacks(t)
	first := 0
	for tid := range got {
		if n, _ := strconv.Atoi(tid); n != os.Getpid() && (first == 0 || n < first) {
			first = n
		}
	}
	for tid, s := range got {
		want := "1000000"
		if tid == strconv.Itoa(first) {
			want = "10000000"
		}
		if s != want {
			t.Errorf("thread %s (the monitor: %d) has timer slack %s ns, want %s", tid, first, s, want)
		}
	}
}

// A process whose parent gave it the slack (systemd's TimerSlackNSec)
// needs no privilege: Set finds every thread already so. Without that,
// an unprivileged process cannot change its other threads.
func TestPrivilegedInheritedSlackNeedsNoPrivilege(t *testing.T) {
	privtest.Require(t)
	if os.Getenv("TIMERSLACK_CHILD") != "" {
		t.Skip("the child's own run")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// t.TempDir's parent is private; nobody must reach the binary.
	dir, err := os.MkdirTemp("", "timerslack-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "timerslack.test")
	data, err := os.ReadFile(self)
	if err == nil {
		err = os.WriteFile(bin, data, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, inherited := range []bool{true, false} {
		out, err := childSet(t, bin, inherited)
		if inherited && err != nil {
			t.Errorf("with the slack inherited, as nobody: %v\n%s", err, out)
		}
		if !inherited && err == nil {
			t.Errorf("without it, as nobody, Set succeeded: the test cannot tell the two apart\n%s", out)
		}
	}
}

// childSet runs TestChildSet in bin as uid 65534, forked from a thread
// whose slack is 1 ms when inherited (a child inherits its forking
// thread's slack).
func childSet(t *testing.T, bin string, inherited bool) ([]byte, error) {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	slack := 50 * time.Microsecond
	if inherited {
		slack = Proxy
	}
	// Restored to the value it had, not with 0: 0 means the thread's
	// default, which is its creator's slack (2 ms if an earlier test's Set
	// made it), and would leave this thread unlike the others.
	prev, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(slack), 0, 0, 0); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(prev), 0, 0, 0) }()
	cmd := exec.Command(bin, "-test.run", "^TestChildSet$", "-test.count=1")
	cmd.Env = append(os.Environ(), "TIMERSLACK_CHILD=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	return cmd.CombinedOutput()
}

// TestChildSet is childSet's child: Set, as whoever it runs as.
func TestChildSet(t *testing.T) {
	if os.Getenv("TIMERSLACK_CHILD") == "" {
		t.Skip("run by TestPrivilegedInheritedSlackNeedsNoPrivilege")
	}
	if err := Set(Proxy); err != nil {
		t.Fatal(err)
	}
}

// The monitor is the thread started next after the main one, also when
// thread ids wrapped at pid_max between its start and later threads'.
func TestMonitorThreadAcrossTheWrap(t *testing.T) {
	for _, c := range []struct {
		pid  int
		tids []int
		want int
	}{
		{pid: 100, tids: []int{100, 101, 102, 140}, want: 101},
		{pid: 100, tids: []int{140, 100, 103}, want: 103},
		{pid: 32766, tids: []int{32766, 32767, 300, 301}, want: 32767},
		{pid: 4194303, tids: []int{4194303, 2, 5}, want: 2},
		{pid: 100, tids: []int{100}, want: 0},
	} {
		dir := t.TempDir()
		for _, tid := range c.tids {
			if err := os.WriteFile(filepath.Join(dir, strconv.Itoa(tid)), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		tasks, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if got := monitorThread(c.pid, tasks); got != c.want {
			t.Errorf("process %d with threads %v: monitor %d, want %d", c.pid, c.tids, got, c.want)
		}
	}
}
