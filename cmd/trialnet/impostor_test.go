//go:build linux

package main

import (
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	trialspec "github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/sandbox"
)

// listenPy binds and listens on a unix socket, then waits: what a process
// that took the agent's socket path does.
const listenPy = `import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(8)
time.sleep(60)`

// waitSocket waits, bounded, until something listens on path: the file
// appears at bind, a moment before listen (a window seen under load).
func waitSocket(t *testing.T, path string) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if c, err := net.Dial("unix", path); err == nil {
			_ = c.Close()
			return
		}
	}
	t.Fatalf("nothing listens on %s", path)
}

// A socket where the agent's should be, bound by another user or by a
// process inside a Trial (root there, in a PID namespace of its own), is
// never taken for the agent: its answers would say where a command runs.
func TestPrivilegedClientRefusesImpostors(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "/usr/bin/python3")
	dir := privtest.SharedDir(t, "impostor-")
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}

	otherUID := filepath.Join(dir, "other-uid.sock")
	cmd := exec.Command("/usr/bin/python3", "-c", listenPy, otherUID) // the system one: a uid-65534 process cannot reach root's shims
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	waitSocket(t, otherUID)

	h, err := agent.OpenHost(testenv.IsolatedHost(t, "impostor"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	// Without unix confinement: a confined Trial cannot make a socket in
	// a directory it shares with the host at all (TestPrivilegedNoWayIn).
	tr, err := h.Create(trialspec.Spec{ID: "impostor", UnixOpen: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = tr.Close() })
	inTrial := filepath.Join(dir, "in-trial.sock")
	p, err := tr.Start(sandbox.Command{Args: []string{"python3", "-c", listenPy, inTrial}, Env: []string{"PATH=/usr/bin:/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Signal(syscall.SIGKILL); _, _ = p.Wait() })
	waitSocket(t, inTrial)

	// The control: a root listener in this PID namespace passes the
	// check, and its answer (no agent's: 404) is what the client reports.
	genuine := filepath.Join(dir, "root-here.sock")
	ln, err := net.Listen("unix", genuine)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() { _ = http.Serve(ln, http.NotFoundHandler()) }()
	if code, out, errOut := trialnet("health", "--socket", genuine); code != exitFailure ||
		strings.Contains(out+errOut, "is not trialnet's agent") || !strings.Contains(out+errOut, "404") {
		t.Errorf("health on a root listener in this namespace: exit %d, %q %q; want its 404 reported, not an impostor", code, out, errOut)
	}

	for _, c := range []struct{ sock, why string }{
		{otherUID, "runs as uid 65534"},
		{inTrial, "runs in a PID namespace below this one"},
	} {
		for _, args := range [][]string{
			{"list", "--socket", c.sock},
			{"run", "--socket", c.sock, "--uid", "65534", "--", "true"},
			{"health", "--socket", c.sock},
		} {
			code, out, errOut := trialnet(args...)
			if code != exitFailure || !strings.Contains(out+errOut, "is not trialnet's agent: ") || !strings.Contains(out+errOut, c.why) {
				t.Errorf("%v: exit %d, %q %q; want exit %d, the listener named as not the agent (%s)", args, code, out, errOut, exitFailure, c.why)
			}
		}
	}
}
