//go:build linux

package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/internal/privtest"
)

// forker forks children, each waiting for its parent's pipe to close,
// until a fork fails or 200 are up; it prints how many and the errno,
// holds them until its stdin closes, then reaps them. Python, unlike a
// Go probe, is one thread: the count is exact.
const forker = `
import errno, os, sys
r, w = os.pipe()
n, err = 0, "none"
while n < 200:
    try:
        pid = os.fork()
    except OSError as e:
        err = errno.errorcode.get(e.errno, str(e.errno))
        break
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    n += 1
print(n, err, flush=True)
sys.stdin.read()
os.close(w)
for _ in range(n):
    os.wait()
`

// unusedUID is a uid no process has: RLIMIT_NPROC counts every process of
// the uid, so the test's count is its own.
func unusedUID(t *testing.T) uint32 {
	t.Helper()
	for range 10 {
		uid := 3_000_000_000 + rand.Uint32N(1_000_000)
		if uidTasks(t, uid) == 0 {
			return uid
		}
	}
	t.Fatal("no unused uid found")
	return 0
}

// uidTasks counts the host's tasks (threads too, as the kernel does for
// RLIMIT_NPROC) whose real uid is uid.
func uidTasks(t *testing.T, uid uint32) int {
	t.Helper()
	status, err := filepath.Glob("/proc/[0-9]*/task/[0-9]*/status")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("Uid:\t%d\t", uid)
	n := 0
	for _, p := range status {
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(want)) {
			n++
		}
	}
	return n
}

func TestPrivilegedProcessLimit(t *testing.T) {
	// The system's: the Trial's user cannot run a shim under /root.
	const python = "/usr/bin/python3"
	privtest.RequireTool(t, python)
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{UnixOpen: true})
	env := []string{"PATH=/usr/bin:/bin"}

	t.Run("default", func(t *testing.T) {
		var out bytes.Buffer
		code, err := tr.Exec(context.Background(), Command{Args: []string{"grep", "Max processes", "/proc/self/limits"}, Env: env,
			UID: nobody, GID: nobody, Stdout: &out}, nil)
		if err != nil || code != 0 {
			t.Fatalf("code %d, err %v", code, err)
		}
		if f := strings.Fields(out.String()); len(f) < 4 || f[2] != "4096" || f[3] != "4096" {
			t.Fatalf("limits: %q, want soft and hard %d", out.String(), DefaultMaxProcs)
		}
	})

	const limit = 30
	uid := unusedUID(t)
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdinW.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer outR.Close()
	p, err := tr.Start(Command{Args: []string{python, "-c", forker}, Env: env, UID: uid, GID: uid, MaxProcs: limit,
		Stdin: stdinR, Stdout: outW, Stderr: os.Stderr})
	_ = stdinR.Close()
	_ = outW.Close()
	if err != nil {
		t.Fatal(err)
	}
	// However the test ends, the forker and its children go.
	defer func() {
		_ = stdinW.Close()
		if code, err := p.Wait(); code != 0 || err != nil {
			t.Errorf("forker: code %d, err %v", code, err)
		}
		if n := uidTasks(t, uid); n != 0 {
			t.Errorf("uid %d still has %d tasks after the forker ended", uid, n)
		}
	}()
	_ = outR.SetReadDeadline(time.Now().Add(30 * time.Second))
	line, err := bufio.NewReader(outR).ReadString('\n')
	if err != nil {
		t.Fatalf("forker said %q: %v", line, err)
	}
	if got, want := strings.TrimSpace(line), fmt.Sprintf("%d EAGAIN", limit-1); got != want {
		t.Fatalf("forker: %q, want %q (it is one of the %d)", got, want, limit)
	}
	if n := uidTasks(t, uid); n != limit {
		t.Errorf("uid %d has %d tasks at the refusal, want the limit %d", uid, n, limit)
	}

	// The bound is each command's own: a process of the same uid outside
	// the Trial, under the host's limit, still forks.
	outside := exec.Command("/bin/sh", "-c", "/bin/true & wait $!")
	outside.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	if out, err := outside.CombinedOutput(); err != nil {
		t.Errorf("a fork outside the Trial as uid %d: %v: %s", uid, err, out)
	}

	// Another command of the same uid, whose limit the uid is over, is
	// refused at once, saying why. Over, not at: the kernel flags a uid
	// change only when the uid's count already exceeds the limit, so one
	// at exactly the limit races the Go runtime's other threads.
	second, err := tr.Start(Command{Args: []string{"true"}, Env: env, UID: uid, GID: uid, MaxProcs: limit - 1})
	if err == nil {
		_, _ = second.Wait()
	}
	var se *StartError
	if !errors.As(err, &se) || se.Code != ExitCannotExecute || !strings.Contains(err.Error(), "process limit") ||
		!strings.Contains(err.Error(), "its own uid") {
		t.Errorf("a second command over the limit: %v, want a StartError naming the process limit", err)
	}
}

func TestCheckMaxProcs(t *testing.T) {
	for _, n := range []int{0, 1, DefaultMaxProcs, MaxMaxProcs} {
		if err := CheckMaxProcs(n); err != nil {
			t.Errorf("%d: %v", n, err)
		}
	}
	for _, n := range []int{-1, MaxMaxProcs + 1} {
		if err := CheckMaxProcs(n); err == nil || !strings.Contains(err.Error(), "1 to 4194304") {
			t.Errorf("%d: %v, want refused with the range", n, err)
		}
	}
	if _, err := (&Launcher{}).Start(Command{Args: []string{"true"}, MaxProcs: -5}); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("Start with a negative limit: %v", err)
	}
}

// Start refuses (uid_t)-1 and (gid_t)-1 before it touches the Trial.
func TestCheckedRefusesNoChangeIDs(t *testing.T) {
	for _, c := range []Command{{Args: []string{"true"}, UID: 1<<32 - 1}, {Args: []string{"true"}, UID: 65534, GID: 1<<32 - 1}} {
		if _, err := c.checked(0); err == nil || !strings.Contains(err.Error(), "no change") {
			t.Errorf("uid %d gid %d: %v, want a refusal", c.UID, c.GID, err)
		}
	}
	if _, err := (Command{Args: []string{"true"}, UID: 1<<32 - 2, GID: 1<<32 - 2}).checked(0); err != nil {
		t.Errorf("uid and gid 4294967294: %v", err)
	}
}
