// Package testkit holds the helpers that tests in more than one package
// share and that need only the standard library: what /proc says about a
// process, building trialnet, a free port, a JSON round trip, a socket
// pair. Tests of
// agent, sandbox and proxy import it; internal/testenv, which imports
// agent, would be a cycle for them and a weight for the rest.
package testkit

import (
	"bytes"
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// RSSBytes is process pid's resident memory in bytes, or 0 once it is
// gone (a live process always has some).
func RSSBytes(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10 // the kernel's "kB" is KiB
		}
	}
	return 0
}

// ProcState is process pid's state letter (R, S, T, Z, ...), or 0 once
// it is gone.
func ProcState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name in parentheses may hold anything, ")" included:
	// the state follows the last one.
	if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
		return b[i+2]
	}
	return 0
}

// CountFDs is how many file descriptors this process has open.
func CountFDs(t testing.TB) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(fds)
}

// LinksNoModules fails t for each module the running test binary links
// that is one of banned or below one: a binary that starts often runs
// the init of every package it links. The test binary links package
// main's imports and the tests' own; its build info lists each module,
// so this holds where no go command is (the VM matrix).
func LinksNoModules(t testing.TB, binary string, banned ...string) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	info, err := buildinfo.ReadFile(self)
	if err != nil {
		t.Fatalf("read the test binary's build info: %v", err)
	}
	for _, m := range info.Deps {
		for _, b := range banned {
			if m.Path == b || strings.HasPrefix(m.Path, b+"/") {
				t.Errorf("%s links module %s", binary, m.Path)
			}
		}
	}
}

// BuildTrialnet builds cmd/trialnet from the source tree at dir (the
// module's top) into out.
func BuildTrialnet(t testing.TB, dir, out string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-o", out, "./cmd/trialnet")
	cmd.Dir = dir
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build trialnet in %s: %v\n%s", dir, err, b)
	}
}

// BuildTrialnetOCI builds cmd/trialnet-oci from the source tree at dir
// beside the trialnet binary at trialnet, without cgo, as the Makefile
// does: trialnet's oci-hook install and oci-runtime install write it.
func BuildTrialnetOCI(t testing.TB, dir, trialnet string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-o", filepath.Join(filepath.Dir(trialnet), "trialnet-oci"), "./cmd/trialnet-oci")
	cmd.Dir, cmd.Env = dir, append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build trialnet-oci in %s: %v\n%s", dir, err, b)
	}
}

// FreePort is a TCP port nothing on this host listens on, on any
// address, as the test starts (another may take it before the test does).
func FreePort(t testing.TB) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

// JSONRoundTrip is v as encoding/json gives it back: invalid UTF-8 in a
// string becomes U+FFFD, a time loses its monotonic reading.
func JSONRoundTrip[T any](t testing.TB, v T) T {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var back T
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	return back
}

// SeqpacketPair is a connected pair of unix SOCK_SEQPACKET sockets (as a
// hand-over and fdpass use), closed when the test ends.
func SeqpacketPair(t testing.TB) (a, b *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "seqpacket")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// Median is the middle of vs (the mean of the two middles when their
// number is even), vs left as it was.
func Median(vs []float64) float64 {
	s := slices.Sorted(slices.Values(vs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// WaitFor polls cond every 5 ms until it holds; past within the test
// fails, saying what did not come.
func WaitFor(t testing.TB, what string, within time.Duration, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(within); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("waited %v in vain for %s", within, what)
		}
	}
}
