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

// startRunReady starts cmd with its output kept (what it printed before
// "ready" too) and waits for its "ready" line; a failed test shows its
// stderr.
func startRunReady(t *testing.T, cmd *exec.Cmd) (out, errOut *privtest.SyncBuffer) {
	t.Helper()
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, errOut = &privtest.SyncBuffer{}, &privtest.SyncBuffer{}
	cmd.Stderr = errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("trialnet's stderr:\n%.2000s", errOut.String())
		}
	})
	waitLine(t, io.TeeReader(pipe, out), "ready", 60*time.Second)
	return out, errOut
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
	_, errOut := startRunReady(t, cmd)
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	code, ok, err := exitWithin(cmd, 20*time.Second)
	if !ok {
		t.Fatal("SIGINT did not end the command")
	}
	if code != 42 {
		t.Fatalf("trialnet run after SIGINT: %v, want exit 42 (the command's INT trap)\n%s", err, errOut.String())
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
	expectLine(t, lines, "ready", 60*time.Second)
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
	code, ok, err := exitWithin(cmd, 20*time.Second)
	if !ok {
		t.Fatal("^C did not end the command")
	}
	if code != 128+int(syscall.SIGINT) {
		t.Fatalf("after ^C: %v, want exit 130", err)
	}
}

// exitWithin waits at most d for cmd, started, to exit: its exit code (0
// when Wait returned nil, -1 for an error that is no exit), whether it
// exited in time, and Wait's error.
func exitWithin(cmd *exec.Cmd, d time.Duration) (int, bool, error) {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		switch {
		case err == nil:
			return 0, true, nil
		case errors.As(err, &ee):
			return ee.ExitCode(), true, err
		}
		return -1, true, err
	case <-time.After(d):
		return 0, false, nil
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
	// pinned steering; and, as a run of an earlier build left them, a
	// names file and a tunnel ledger (this build's runs make neither:
	// no agent after them reads them).
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(parent, gone), &st); err != nil {
		t.Fatal(err)
	}
	stateDir := agent.DefaultStateDir + "-ephemeral"
	pin := filepath.Join(bpf.DefaultPinDir, fmt.Sprintf("steer_%d_link", st.Ino))
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, err := os.Stat(pin)
		if err == nil {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the run's Trial has no steering pin (%v): the test cannot tell", err)
		}
	}
	names, ledgers := filepath.Join(stateDir, gone+".names"), filepath.Join(stateDir, gone+".ledgers")
	if err := os.WriteFile(names, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(ledgers, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ledgers, "1"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	kept2 := []string{pin, names}
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
	for _, p := range append(kept2, ledgers) {
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

// A pipe of the Trial's uid given as stdout (sudo trialnet run ... |
// head: the pipe is the caller's shell's) is copied through a pipe of
// trialnet's. When the reader has gone, the copy's write fails with
// EPIPE: on run's own stdout, Go raised SIGPIPE in trialnet itself, which
// died of it, the Trial not torn down and no summary said, where the
// command handed the pipe would have had the signal. The command's exit
// is reported, and trialnet lives on.
func TestPrivilegedRunOutlivesItsStdoutReader(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fchown(int(w.Fd()), 65534, 65534); err != nil {
		t.Fatal(err)
	}
	_ = r.Close() // the reader has gone
	cmd := trialnetProcess(t, "run", "--socket", filepath.Join(t.TempDir(), "none.sock"), "--uid", "65534", "--gid", "65534", "--",
		"sh", "-c", "echo the-reader-has-gone")
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = w, &stderr
	err = cmd.Run()
	_ = w.Close()
	if ws := cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signaled() || !strings.Contains(stderr.String(), "trialnet: Trial ") {
		t.Fatalf("trialnet run with its stdout's reader gone: %v; stderr:\n%s", err, stderr.String())
	}
	if err != nil {
		t.Errorf("the command wrote its line and exited 0; run: %v; stderr:\n%s", err, stderr.String())
	}
}

// A command started with SIGHUP or SIGINT ignored (nohup; a script's
// `cmd &`, which ignores SIGINT) keeps them ignored through run, as a
// plain exec would, and run does not forward them: caught to be
// forwarded, they reached the command with their defaults, and a hang-up
// of the terminal killed a `nohup trialnet run` job that nohup alone kept.
// What run was never told to ignore (SIGTERM) still reaches the command.
func TestPrivilegedRunKeepsSignalsIgnoredAtStart(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "nohup")
	installedByTest(t)
	// nohup ignores SIGHUP; the shell's trap '' ignores SIGINT for what it execs.
	cmd := wrappedTrialnet(t, []string{"nohup", "sh", "-c", `trap '' INT; exec "$0" "$@"`}, "run", "--uid", "65534", "--",
		"sh", "-c", `trap 'echo got-term; exit 7' TERM; grep SigIgn /proc/self/status; echo ready; while :; do sleep 0.05; done`)
	rest, errOut := startRunReady(t, cmd)
	var ignored uint64
	for line := range strings.Lines(rest.String()) {
		if v, ok := strings.CutPrefix(line, "SigIgn:"); ok {
			fmt.Sscanf(strings.TrimSpace(v), "%x", &ignored)
		}
	}
	if want := uint64(1)<<(syscall.SIGHUP-1) | 1<<(syscall.SIGINT-1); ignored&want != want {
		t.Errorf("the command started with ignored signals %#x, want SIGHUP and SIGINT among them, as trialnet run was started", ignored)
	}
	for _, s := range []syscall.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM} {
		if err := cmd.Process.Signal(s); err != nil {
			t.Fatal(err)
		}
	}
	code, ok, err := exitWithin(cmd, 20*time.Second)
	if !ok {
		t.Fatal("SIGTERM did not end the command")
	}
	if code != 7 {
		t.Errorf("trialnet run after SIGHUP, SIGINT, SIGTERM: %v, want exit 7 (the command's TERM trap; the others ignored)\n%s%s", err, rest.String(), errOut.String())
	}
}

// SIGQUIT, SIGUSR1 and SIGUSR2 sent to trialnet run reach the command, as
// they reach a command run plainly (a JVM's thread dump, dd's progress,
// timeout -s QUIT): the Go runtime's defaults had SIGQUIT end run with a
// goroutine dump, leaving the command untouched and its Trial behind until
// the next run, and swallow the other two.
func TestPrivilegedRunForwardsQuitAndUserSignals(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	for i, s := range []syscall.Signal{syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2} {
		name := strings.TrimPrefix(unix.SignalName(s), "SIG")
		code := 50 + i
		cmd := trialnetProcess(t, "run", "--uid", "65534", "--", "sh", "-c",
			fmt.Sprintf("trap 'exit %d' %s; echo ready; while :; do sleep 0.05; done", code, name))
		_, errOut := startRunReady(t, cmd)
		if err := cmd.Process.Signal(s); err != nil {
			t.Fatal(err)
		}
		got, ok, err := exitWithin(cmd, 20*time.Second)
		if !ok {
			t.Errorf("%v did not reach the command", s)
		} else if got != code {
			t.Errorf("trialnet run after %v: %v, want exit %d (the command's trap)\n%.2000s", s, err, code, errOut.String())
		}
	}
}

// Signals that reach run or exec before the relay passes them on (while
// the command starts) wait as the kernel keeps them pending: one of each
// kind, none displacing another. The relay's queue held four of any kind
// and dropped what came next: with SIGUSR1 forwarded (dd's progress,
// asked for again and again), a SIGTERM sent after four of them was lost
// and the command ran on.
func TestForwardedSignalsKeepOneOfEachPending(t *testing.T) {
	in := make(chan os.Signal) // each send returns once the relay has it
	out := make(chan os.Signal, 4)
	done := make(chan struct{})
	defer close(done)
	go relayPending(in, out, done)
	sent := []os.Signal{syscall.SIGUSR1, syscall.SIGUSR1, syscall.SIGUSR1, syscall.SIGUSR1, syscall.SIGUSR1, syscall.SIGTERM, syscall.SIGUSR1}
	for _, s := range sent {
		in <- s
	}
	// The last send returned: the relay is done with the SIGTERM before.
	var got []os.Signal
	guard := time.After(10 * time.Second) // ends the wait for one dropped
	for !slices.Contains(got, os.Signal(syscall.SIGTERM)) {
		select {
		case s := <-out:
			got = append(got, s)
		case <-guard:
			t.Fatalf("the relay was given %v before anything was taken from it, and passed on %v: the SIGTERM was dropped", sent, got)
		}
	}
}
