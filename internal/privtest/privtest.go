// Package privtest decides, in one place, whether a privileged test runs.
package privtest

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
)

// Require skips t when it cannot run privileged tests here, and fails it
// instead when CI=true: in CI a privileged test never skips silently.
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	msg := "privileged test: needs root (real cgroups, namespaces and eBPF)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg + "; CI=true, so this is a failure, not a skip")
	}
	t.Skip(msg)
}

// RequireLSM skips t when the BPF LSM layer is not active (why says why),
// even under CI=true: whether the kernel runs BPF LSM programs is the
// machine's property, and the machines this is developed and tested on
// refuse them. TRIALNET_REQUIRE_LSM=1, set where the kernel has them,
// turns the skip into a failure.
func RequireLSM(t testing.TB, active bool, why error) {
	t.Helper()
	if active {
		return
	}
	if os.Getenv("TRIALNET_REQUIRE_LSM") == "1" {
		t.Fatalf("TRIALNET_REQUIRE_LSM=1 and no BPF LSM layer: %v", why)
	}
	t.Skipf("no BPF LSM layer on this kernel (TRIALNET_REQUIRE_LSM=1 makes this a failure): %v", why)
}

// RequireTool skips t when the program name is not on the PATH, and
// fails it under CI=true, where make test has installed it.
func RequireTool(t testing.TB, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not installed, and CI=true ('make test-deps' installs it): %v", name, err)
		}
		t.Skipf("%s is not installed ('make test-deps' installs it)", name)
	}
}

// RequireKernel skips t where this kernel lacks a feature (err says
// which), even under CI=true, as RequireLSM does: the feature is the
// machine's property. The kernel matrix (make vmtest) runs the test on
// kernels that have it and shows the fallback on those that do not.
func RequireKernel(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Skipf("this kernel lacks what the test needs: %v", err)
	}
}

// SharedParent holds the directories that a test and its Trials both
// see: a Trial's /tmp, /var/tmp and /dev/shm are its own, so t.TempDir's
// files are not there for it.
const SharedParent = "/var/lib/trialnet-test"

// MakeSharedDir makes a directory beneath SharedParent, readable and
// searchable by every uid; the caller removes it.
func MakeSharedDir(prefix string) (string, error) {
	if err := os.MkdirAll(SharedParent, 0o755); err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp(SharedParent, prefix)
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	return dir, err
}

// SharedDir is MakeSharedDir for one test, removed when it ends.
func SharedDir(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := MakeSharedDir(prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// SyncBuffer is a buffer a process's output is copied into while the
// test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// ServeUnix listens on a unix stream socket at path that any uid may
// open (mode 0666), writes greeting to each connection, and counts the
// connections it accepts; it closes when the test ends.
func ServeUnix(t testing.TB, path, greeting string) *atomic.Int64 {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			_, _ = c.Write([]byte(greeting))
			_ = c.Close()
		}
	}()
	return &n
}
