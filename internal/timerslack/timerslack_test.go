//go:build linux

package timerslack

import (
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

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
	var wg sync.WaitGroup
	release := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			<-release
		}()
	}
	time.Sleep(50 * time.Millisecond)
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
