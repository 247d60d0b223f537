//go:build linux

package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/sandbox"
	"golang.org/x/sys/unix"
)

// trialnetProcess is this test binary started as the trialnet command.
func trialnetProcess(t testing.TB, args ...string) *exec.Cmd {
	t.Helper()
	return wrappedTrialnet(t, nil, args...)
}

// wrappedTrialnet is trialnetProcess started through wrapper, a command
// that execs the rest of its arguments (setpriv ... --).
func wrappedTrialnet(t testing.TB, wrapper []string, args ...string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	argv := append(append(slices.Clone(wrapper), self), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "TRIALNET_CLI_MAIN=1")
	// Ended gently if a test fails midway: a SIGKILLed run cannot tear
	// down its Trial.
	t.Cleanup(func() {
		if cmd.Process == nil || cmd.ProcessState != nil {
			return
		}
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _, _ = cmd.Process.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
		}
	})
	return cmd
}

// waitLine reads r until a line equal to want, bounded by d.
func waitLine(t *testing.T, r io.Reader, want string, d time.Duration) {
	t.Helper()
	found := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == want {
				found <- true
				_, _ = io.Copy(io.Discard, r)
				return
			}
		}
		found <- false
	}()
	select {
	case ok := <-found:
		if !ok {
			t.Fatalf("output ended before %q", want)
		}
	case <-time.After(d):
		t.Fatalf("no %q within %v", want, d)
	}
}

// SIGINT to trialnet run reaches the command (and its children: it is
// sent to the command's process group), and run exits with its code.
func TestPrivilegedRunForwardsSIGINT(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	cmd := trialnetProcess(t, "run", "--uid", "65534", "--", "sh", "-c",
		"trap 'echo got-int; exit 42' INT; echo ready; while :; do sleep 0.05; done")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	rest := &bytes.Buffer{}
	r := io.TeeReader(out, rest)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("trialnet run's stderr:\n%s", errOut.String())
		}
	})
	waitLine(t, r, "ready", 20*time.Second)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 42 {
			t.Fatalf("trialnet run after SIGINT: %v, want exit 42 (the command's INT trap)\n%s", err, errOut.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("SIGINT did not end the command")
	}
}

// A command that leaves a child behind: run returns when the command
// exits, and the child dies with the Trial.
func TestPrivilegedRunLeavesNothingBehind(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	const marker = "100.123"
	cmd := trialnetProcess(t, "run", "--uid", "65534", "--", "sh", "-c", "sleep "+marker+" & exit 0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v\n%s", err, out.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not return after its command exited: the background child held it")
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		if bytes.Equal(b, []byte("sleep\x00"+marker+"\x00")) {
			t.Errorf("the background child outlived its Trial: %s", p)
		}
	}
}

// On a terminal, ^Z stops the command and trialnet with it (the caller's
// shell sees a stopped job), SIGCONT (fg) continues both, and ^C reaches
// the command through the Trial's own pty.
func TestPrivilegedRunOnATerminalStopsAndContinues(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	cmd := trialnetProcess(t, "run", "--uid", "65534", "--", "sh", "-c", "echo ready; while :; do echo tick; sleep 0.1; done")
	m, lines := onTerminal(t, cmd)
	expectLine(t, lines, "ready", 20*time.Second)
	if _, err := m.Write([]byte{0x1a}); err != nil { // ^Z
		t.Fatal(err)
	}
	if !waitStopped(cmd.Process.Pid, 10*time.Second) {
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
		t.Fatalf("^Z did not stop trialnet with its command (trialnet: %s)", st)
	}
	// Stopped: no more ticks once what was in flight has drained.
	time.Sleep(300 * time.Millisecond)
	for len(lines) > 0 {
		<-lines
	}
	time.Sleep(500 * time.Millisecond)
	if n := len(lines); n > 0 {
		t.Errorf("%d lines arrived while the job was stopped", n)
	}
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	expectLine(t, lines, "tick", 10*time.Second)
	if _, err := m.Write([]byte{3}); err != nil { // ^C
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 128+int(syscall.SIGINT) {
			t.Fatalf("after ^C: %v, want exit 130", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("^C did not end the command")
	}
}

// waitStopped waits, bounded, until child pid is stopped.
func waitStopped(pid int, d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		var ws unix.WaitStatus
		got, err := unix.Wait4(pid, &ws, unix.WUNTRACED|unix.WNOHANG, nil)
		if err != nil {
			return false
		}
		if got == pid && ws.Stopped() {
			return true
		}
	}
	return false
}

// A run killed outright cannot tear its Trial down; the next run removes
// it (its record names an owner that is gone), and leaves live runs'
// Trials alone.
func TestPrivilegedRunKilledIsCleanedUpByTheNext(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	parent, err := sandbox.EnsureParent()
	if err != nil {
		t.Fatal(err)
	}
	trials := func() map[string]bool {
		entries, _ := os.ReadDir(parent)
		m := map[string]bool{}
		for _, e := range entries {
			if e.IsDir() && strings.HasPrefix(e.Name(), "run-") {
				m[e.Name()] = true
			}
		}
		return m
	}
	before := trials()
	start := func() (*exec.Cmd, string) {
		cmd := trialnetProcess(t, "run", "--uid", "65534", "--", "sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		for range 500 {
			for id := range trials() {
				if !before[id] {
					before[id] = true
					return cmd, id
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatal("the run's Trial did not appear")
		return nil, ""
	}
	killed, gone := start()
	live, kept := start()
	// What the agent keeps beside the sandbox's: the transparent mode's
	// pinned steering and names file, the tunnel ledger.
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(parent, gone), &st); err != nil {
		t.Fatal(err)
	}
	stateDir := agent.DefaultStateDir + "-ephemeral"
	kept2 := []string{filepath.Join(bpf.DefaultPinDir, fmt.Sprintf("steer_%d_link", st.Ino)), filepath.Join(stateDir, gone+".names")}
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, err1 := os.Stat(kept2[0])
		_, err2 := os.Stat(kept2[1])
		if err1 == nil && err2 == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the run's Trial has no steering pin or names file (%v, %v): the test cannot tell", err1, err2)
		}
	}
	_ = killed.Process.Kill()
	_, _ = killed.Process.Wait()
	if !trials()[gone] {
		t.Fatal("the killed run's Trial vanished by itself: the test cannot tell")
	}
	if code, _, errOut := trialnet("run", "--uid", "65534", "--", "true"); code != 0 {
		t.Fatalf("the next run: exit %d %s", code, errOut)
	}
	now := trials()
	if now[gone] {
		t.Errorf("the killed run's Trial %s is still there after the next run", gone)
	}
	if !now[kept] {
		t.Errorf("the next run removed a live run's Trial %s", kept)
	}
	for _, p := range append(kept2, filepath.Join(stateDir, gone+".ledgers")) {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("the killed run's %s is still there after the next run removed its Trial", p)
		}
	}
	_ = live.Process.Signal(syscall.SIGTERM)
	_, _ = live.Process.Wait()
}

// execWithSessionKey gives this process a session keyring holding a key
// described desc, then execs itself again without the variable: a keyring
// belongs to one thread's credentials, and only after exec is that thread
// the one every other descends from.
func execWithSessionKey(desc string) {
	runtime.LockOSThread()
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "session key:", err)
		os.Exit(2)
	}
	if _, _, errno := unix.RawSyscall(unix.SYS_KEYCTL, unix.KEYCTL_JOIN_SESSION_KEYRING, 0, 0); errno != 0 {
		fail(errno)
	}
	if _, err := unix.AddKey("user", desc, []byte("launcher secret"), unix.KEY_SPEC_SESSION_KEYRING); err != nil {
		fail(err)
	}
	self, err := os.Executable()
	if err != nil {
		fail(err)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TRIALNET_CLI_SESSION_KEY=") {
			env = append(env, kv)
		}
	}
	fail(unix.Exec(self, os.Args, env))
}

// The launcher's session keyring (root's keys, with their descriptions
// and payloads) is not the Trial's: a Trial process that inherited it
// would possess its keys, and see them in /proc/keys even with every key
// call refused.
func TestPrivilegedRunHasItsOwnSessionKeyring(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	desc := fmt.Sprintf("trialnet-launcher-key-%d", time.Now().UnixNano())
	cmd := trialnetProcess(t, "run", "--uid", "65534", "--", "cat", "/proc/keys")
	cmd.Env = append(cmd.Env, "TRIALNET_CLI_SESSION_KEY="+desc)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	if strings.Contains(string(out), desc) {
		t.Fatalf("the Trial possesses the launcher's session key:\n%s", out)
	}
}
