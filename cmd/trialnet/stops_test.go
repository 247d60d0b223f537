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
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/internal/testpty"
	"github.com/trialnet/trialnet/netns"
	"github.com/trialnet/trialnet/sandbox"
	"golang.org/x/sys/unix"
)

// The --timeout every test here gives, and how long after it trialnet
// must be gone: the watchdog's kill and the teardown take well under a
// second. The timeout runs from the Trial's creation, and the command
// must be well past its first line by then: a loaded TCG guest once took
// over 3 s to launch it, and the run ended 124 before "ready".
const (
	stopTimeout = 6 * time.Second
	stopGrace   = 10 * time.Second
)

// onTerminal starts cmd on a new terminal, its stdio and controlling
// terminal, as an operator's shell would, and returns the terminal and
// its lines as they come.
func onTerminal(t *testing.T, cmd *exec.Cmd) (*os.File, <-chan string) {
	t.Helper()
	m, s := testpty.Open(t, 24, 80)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = s, s, s
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 4096)
	go func() {
		sc := bufio.NewScanner(m)
		for sc.Scan() {
			lines <- strings.TrimSpace(sc.Text())
		}
		close(lines)
	}()
	return m, lines
}

// expectLine reads lines until one equal to want, bounded by d.
func expectLine(t *testing.T, lines <-chan string, want string, d time.Duration) {
	t.Helper()
	expectLineOf(t, lines, want, d, nil, nil)
}

// expectLineOf is expectLine for the trialnet process cmd on that
// terminal, whose end comes on exited (put back when the line came
// first). Past d it is sent SIGABRT, and the goroutines it prints then
// are in the failure, with every line the terminal showed. A run that
// ends first fails at once, with its exit and those lines: the test holds
// the terminal open, so its lines never end, and a run gone is no hang (a
// launch that outlasts --timeout ends 124 before its command prints).
func expectLineOf(t *testing.T, lines <-chan string, want string, d time.Duration, cmd *exec.Cmd, exited chan error) {
	t.Helper()
	deadline := time.After(d)
	var seen []string
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("terminal closed before %q; it showed %q", want, seen)
			}
			if l == want {
				return
			}
			seen = append(seen, l)
		case err := <-exited:
			// The line may be in, unread: then the end is the caller's.
			end := time.After(time.Second)
			for {
				select {
				case l, ok := <-lines:
					if ok && l == want {
						exited <- err
						return
					}
					if ok {
						seen = append(seen, l)
						continue
					}
				case <-end:
				}
				t.Fatalf("trialnet ended (%v) before %q; the terminal showed:\n%s", err, want, strings.Join(seen, "\n"))
			}
		case <-deadline:
			if cmd != nil {
				// Not reaped: exited has not come.
				_ = cmd.Process.Signal(syscall.SIGABRT)
				seen = append(seen, drainLines(lines, 5*time.Second)...)
			}
			t.Fatalf("no %q within %v; the terminal showed:\n%s", want, d, strings.Join(seen, "\n"))
		}
	}
}

// drainLines returns the lines that come within d, or until the end.
func drainLines(lines <-chan string, d time.Duration) []string {
	var out []string
	end := time.After(d)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				return out
			}
			out = append(out, l)
		case <-end:
			return out
		}
	}
}

// trialOf finds the Trial that trialnet process pid runs, from the
// cgroup of a child of its there (the Trial's init, its command), waiting
// for one, bounded. Other tests' Trials may come and go meanwhile.
func trialOf(t *testing.T, pid int) trial {
	t.Helper()
	mount, err := sandbox.Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		// Each thread lists the children it forked.
		lists, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
		for _, l := range lists {
			b, _ := os.ReadFile(l)
			for _, child := range strings.Fields(string(b)) {
				cg, _ := os.ReadFile("/proc/" + child + "/cgroup")
				for _, line := range strings.Split(string(cg), "\n") {
					if path, ok := strings.CutPrefix(line, "0::"); ok && strings.HasPrefix(filepath.Base(path), "run-") {
						return trial{filepath.Base(path), filepath.Join(mount, path)}
					}
				}
			}
		}
	}
	t.Fatalf("found no Trial of trialnet (pid %d)", pid)
	return trial{}
}

// trial is a run's Trial, by id and cgroup directory.
type trial struct{ id, cgroup string }

// leftovers lists what is left of the Trial: its cgroup, its namespace,
// and processes running "sleep marker".
func (tr trial) leftovers(t *testing.T, marker string) []string {
	t.Helper()
	var left []string
	if _, err := os.Stat(tr.cgroup); err == nil {
		left = append(left, "cgroup "+tr.cgroup)
	}
	ids, err := netns.List(netns.DefaultDir)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(ids, tr.id) {
		left = append(left, "namespace "+tr.id)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, _ := os.ReadFile(p); bytes.Equal(b, []byte("sleep\x00"+marker+"\x00")) {
			left = append(left, "process "+p)
		}
	}
	return left
}

// sleepMarker is a sleep argument no other test's process has.
func sleepMarker(i int) string { return fmt.Sprintf("%d.%d", 4000+os.Getpid()%1000, 100+i) }

// waitTimedOut waits for trialnet run (cmd, whose exit comes on exited)
// to end with exit 124 within stopTimeout+stopGrace of start, with
// nothing of its Trial left: no SIGCONT from the test, ever.
func waitTimedOut(t *testing.T, cmd *exec.Cmd, exited <-chan error, start time.Time, tr trial, marker string) {
	t.Helper()
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitTimeout {
			t.Fatalf("trialnet run: %v, want exit %d (its --timeout)", err, exitTimeout)
		}
		if took := time.Since(start); took > stopTimeout+stopGrace {
			t.Errorf("trialnet ended %v after it started, with a --timeout of %v", took, stopTimeout)
		}
	case <-time.After(time.Until(start.Add(stopTimeout + stopGrace))):
		t.Fatalf("trialnet run did not end within %v of its %v --timeout (state %c): the deadline waited on it",
			stopGrace, stopTimeout, testkit.ProcState(cmd.Process.Pid))
	}
	if left := tr.leftovers(t, marker); len(left) > 0 {
		t.Errorf("left behind after the --timeout: %v", left)
	}
}

// A Trial that stops itself, its process group or a job of its own, in
// every way a process can, stops neither trialnet nor its --timeout:
// trialnet keeps running, kills the Trial at the deadline, exits 124 and
// leaves nothing behind. (The command leads an orphaned process group,
// so the kernel drops SIGTSTP, SIGTTIN and SIGTTOU to it: only SIGSTOP
// and a ptrace-stop stop it; its jobs can be stopped by all of them.)
func TestPrivilegedRunTimeoutWhenTheTrialStopsItself(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	// perl: a job of the command's own (a process group that is not
	// orphaned) that the terminal stops.
	const job = `perl -e 'setpgrp(0, 0); %s' & sleep 0.3; `
	for i, tc := range []struct{ name, stop string }{
		{"SIGSTOP to itself", "kill -STOP $$"},
		{"SIGSTOP to its process group", "kill -STOP 0"},
		{"SIGSTOP to itself, with a job stopped by SIGTTIN", fmt.Sprintf(job, `sysread(STDIN, $b, 1)`) + "kill -STOP $$"},
		{"SIGSTOP to itself, with a job stopped by SIGTTOU", "stty tostop; " + fmt.Sprintf(job, `print "written\n"`) + "kill -STOP $$"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			marker := sleepMarker(i)
			cmd := trialnetProcess(t, "run", "--uid", "65534", "--timeout", stopTimeout.String(), "--", "sh", "-c",
				"sleep "+marker+" </dev/null >/dev/null 2>&1 & echo ready; "+tc.stop+"; echo resumed; sleep 60")
			start := time.Now()
			_, lines := onTerminal(t, cmd)
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			expectLineOf(t, lines, "ready", 60*time.Second, cmd, exited)
			tr := trialOf(t, cmd.Process.Pid)
			// trialnet must never stop: watched until it is gone.
			stopped := make(chan byte, 1)
			go func() {
				for {
					switch st := testkit.ProcState(cmd.Process.Pid); st {
					case 'T', 't':
						stopped <- st
						return
					case 0, 'Z':
						return
					}
					time.Sleep(5 * time.Millisecond)
				}
			}()
			waitTimedOut(t, cmd, exited, start, tr, marker)
			select {
			case st := <-stopped:
				t.Errorf("trialnet was stopped (state %c) by a stop of its Trial", st)
			default:
			}
			// The control: the Trial did stop (it never said it resumed).
			for {
				select {
				case l := <-lines:
					if l == "resumed" {
						t.Fatal("the Trial's stop did not stop it: the test shows nothing")
					}
					continue
				default:
				}
				break
			}
		})
	}
}

// Stopped by the operator (a ^Z on its terminal, a SIGSTOP from a shell
// or a harness), trialnet still ends the Trial at its --timeout, tears it
// down and exits 124, continued by its watchdog: nobody has to continue
// it.
func TestPrivilegedRunTimeoutWhileTrialnetIsStopped(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	for i, tc := range []struct {
		name string
		stop func(m *os.File, pid int) error
	}{
		{"^Z", func(m *os.File, _ int) error { _, err := m.Write([]byte{0x1a}); return err }},
		{"SIGSTOP", func(_ *os.File, pid int) error { return unix.Kill(pid, unix.SIGSTOP) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			marker := sleepMarker(i)
			cmd := trialnetProcess(t, "run", "--uid", "65534", "--timeout", stopTimeout.String(), "--", "sh", "-c",
				"sleep "+marker+" </dev/null >/dev/null 2>&1 & echo ready; while :; do echo tick; sleep 0.1; done")
			start := time.Now()
			m, lines := onTerminal(t, cmd)
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			expectLineOf(t, lines, "ready", 60*time.Second, cmd, exited)
			tr := trialOf(t, cmd.Process.Pid)
			if err := tc.stop(m, cmd.Process.Pid); err != nil {
				t.Fatal(err)
			}
			for end := time.Now().Add(5 * time.Second); testkit.ProcState(cmd.Process.Pid) != 'T'; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(end) {
					t.Fatalf("trialnet did not stop (state %c)", testkit.ProcState(cmd.Process.Pid))
				}
			}
			waitTimedOut(t, cmd, exited, start, tr, marker)
		})
	}
}

// endShell ends a test's job-control shell, and the trialnet it started
// (pid, once known) if still there, gently first: a SIGKILLed run cannot
// tear its Trial down.
func endShell(sh *exec.Cmd, pid int) {
	_ = sh.Process.Kill()
	_ = sh.Wait()
	if pid == 0 || testkit.ProcState(pid) == 0 {
		return
	}
	_ = unix.Kill(pid, unix.SIGCONT)
	_ = unix.Kill(pid, unix.SIGTERM)
	for end := time.Now().Add(15 * time.Second); testkit.ProcState(pid) != 0 && time.Now().Before(end); {
		time.Sleep(50 * time.Millisecond)
	}
	if testkit.ProcState(pid) != 0 {
		_ = unix.Kill(pid, unix.SIGKILL)
	}
}

// In the background of its terminal (a job-control shell's &), trialnet
// still ends at its --timeout, with nothing left behind. With stdin the
// terminal, it waits, stopped, to be brought to the foreground before it
// makes the terminal raw, and is never brought there; with only its
// output there, under stty tostop, the Trial's output must not stop it.
func TestPrivilegedRunTimeoutInTheBackground(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct{ name, setup, redirect string }{
		{"stdin the terminal", "", ""},
		{"output only, tostop", "stty tostop; ", " </dev/null"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			marker := sleepMarker(i)
			// wait returns, 128 and more, each time the job stops; its
			// exit status is trialnet's.
			sh := exec.Command("sh", "-mc", tc.setup+`"$@"`+tc.redirect+` & echo "pid $!"; while :; do wait $!; s=$?; [ $s -ge 128 ] || break; sleep 0.1; done; echo "exit $s"`,
				"sh", self, "run", "--uid", "65534", "--timeout", stopTimeout.String(), "--", "sh", "-c",
				"sleep "+marker+" </dev/null >/dev/null 2>&1 & while :; do echo tick; sleep 0.1; done")
			sh.Env = append(os.Environ(), "TRIALNET_CLI_MAIN=1")
			start := time.Now()
			_, lines := onTerminal(t, sh)
			var pid int
			t.Cleanup(func() { endShell(sh, pid) })
			select {
			case l := <-lines:
				if _, err := fmt.Sscanf(l, "pid %d", &pid); err != nil {
					t.Fatalf("the shell said %q, not trialnet's pid", l)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the shell did not start trialnet")
			}
			tr := trialOf(t, pid)
			want := "exit " + strconv.Itoa(exitTimeout)
			deadline := time.After(time.Until(start.Add(stopTimeout + stopGrace)))
			for done := false; !done; {
				select {
				case l, ok := <-lines:
					if !ok {
						t.Fatalf("terminal closed before %q", want)
					}
					if strings.HasPrefix(l, "exit ") {
						if l != want {
							t.Fatalf("trialnet run in the background: %q, want %q", l, want)
						}
						done = true
					}
				case <-deadline:
					t.Fatalf("trialnet run in the background did not end within %v of its %v --timeout (state %c)",
						stopGrace, stopTimeout, testkit.ProcState(pid))
				}
			}
			if left := tr.leftovers(t, marker); len(left) > 0 {
				t.Errorf("left behind after the --timeout: %v", left)
			}
		})
	}
}

// Stopped by the operator and continued in the background (bg), trialnet
// reads keystrokes only once it is in the foreground again (fg): ignoring
// SIGTTIN, its reads from the background fail instead of stopping it,
// and its relay must wait, not end.
func TestPrivilegedRunContinuedInTheBackgroundKeepsItsInput(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sh := exec.Command("sh", "-mc", `"$@"; echo "stopped $?"; bg; sleep 2; fg; echo "exit $?"`,
		"sh", self, "run", "--uid", "65534", "--", "sh", "-c", `echo ready; read l; echo "got-$l"`)
	sh.Env = append(os.Environ(), "TRIALNET_CLI_MAIN=1")
	m, lines := onTerminal(t, sh)
	var pid int
	t.Cleanup(func() { endShell(sh, pid) })
	expectLine(t, lines, "ready", 60*time.Second)
	children, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", sh.Process.Pid, sh.Process.Pid))
	pid, _ = strconv.Atoi(strings.TrimSpace(string(children)))
	if err != nil || pid == 0 {
		t.Fatalf("trialnet's pid: %q %v", children, err)
	}
	if err := unix.Kill(pid, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	expectLine(t, lines, "stopped 147", 10*time.Second)
	if _, err := m.Write([]byte("hello\r")); err != nil {
		t.Fatal(err)
	}
	expectLine(t, lines, "got-hello", 10*time.Second)
	expectLine(t, lines, "exit 0", 10*time.Second)
}

// A Trial cannot hold trialnet's teardown by its terminal: keystrokes it
// never reads (held by a process of another session, which the command's
// process group kill misses), or output that the operator's terminal
// does not take. The Trial is torn down, with or without --timeout.
func TestPrivilegedRunTeardownPastABlockedTerminal(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	t.Run("keystrokes nobody reads", func(t *testing.T) {
		for i, tc := range []struct {
			name  string
			flags []string
			end   string // how the command ends after ready
			code  int
		}{
			{"at the timeout", []string{"--timeout", stopTimeout.String()}, "sleep 60", exitTimeout},
			{"when the command exits", nil, "sleep 2; exit 3", 3},
		} {
			t.Run(tc.name, func(t *testing.T) {
				marker := sleepMarker(i)
				args := append(append([]string{"run", "--uid", "65534"}, tc.flags...), "--", "sh", "-c",
					"setsid sleep "+marker+" & stty -echo; echo ready; "+tc.end)
				cmd := trialnetProcess(t, args...)
				m, lines := onTerminal(t, cmd)
				exited := make(chan error, 1)
				go func() { exited <- cmd.Wait() }()
				expectLineOf(t, lines, "ready", 60*time.Second, cmd, exited)
				tr := trialOf(t, cmd.Process.Pid)
				// Far more lines than the Trial's terminal holds.
				line := append(bytes.Repeat([]byte("x"), 1023), '\r')
				go func() {
					_ = m.SetWriteDeadline(time.Now().Add(stopTimeout + stopGrace))
					for range 1024 {
						if _, err := m.Write(line); err != nil {
							return
						}
					}
				}()
				select {
				case err := <-exited:
					code := 0
					if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
						code = ee.ExitCode()
					} else if err != nil {
						t.Fatal(err)
					}
					if code != tc.code {
						t.Fatalf("trialnet run: exit %d, want %d", code, tc.code)
					}
				case <-time.After(stopTimeout + stopGrace):
					t.Fatal("trialnet run did not end: its teardown waited on keystrokes the Trial never reads")
				}
				if left := tr.leftovers(t, marker); len(left) > 0 {
					t.Errorf("left behind: %v", left)
				}
			})
		}
	})
	t.Run("output the terminal does not take", func(t *testing.T) {
		marker := sleepMarker(9)
		cmd := trialnetProcess(t, "run", "--uid", "65534", "--timeout", stopTimeout.String(), "--", "sh", "-c",
			"sleep "+marker+" </dev/null >/dev/null 2>&1 & echo ready; exec yes")
		m, s := testpty.Open(t, 24, 80)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = s, s, s
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		// Read up to ready, then no more: the terminal fills up. The
		// master is in blocking mode (testpty takes its Fd), so no read
		// deadline: the reader stops itself at ready, the wait is bounded.
		seenc := make(chan []byte, 1)
		go func() {
			var seen []byte
			buf := make([]byte, 4096)
			for !bytes.Contains(seen, []byte("ready")) {
				n, err := m.Read(buf)
				seen = append(seen, buf[:n]...)
				select {
				case <-seenc:
				default:
				}
				seenc <- append([]byte(nil), seen...)
				if err != nil {
					return
				}
			}
		}()
		var seen []byte
		for deadline := time.After(20 * time.Second); !bytes.Contains(seen, []byte("ready")); {
			select {
			case seen = <-seenc:
			case <-deadline:
				t.Fatalf("no ready within 20s; trialnet said %q", seen[:min(len(seen), 2048)])
			}
		}
		tr := trialOf(t, cmd.Process.Pid)
		// Torn down while nobody reads; trialnet then waits to write its
		// summary.
		for end := time.Now().Add(stopTimeout + stopGrace); ; time.Sleep(50 * time.Millisecond) {
			left := tr.leftovers(t, marker)
			if len(left) == 0 {
				break
			}
			if time.Now().After(end) {
				t.Fatalf("not torn down within %v of the --timeout while the terminal was full: %v", stopGrace, left)
			}
		}
		go func() { _, _ = io.Copy(io.Discard, m) }()
		select {
		case err := <-exited:
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != exitTimeout {
				t.Fatalf("trialnet run: %v, want exit %d", err, exitTimeout)
			}
		case <-time.After(stopGrace):
			t.Fatal("trialnet run did not end once its terminal was read again")
		}
	})
}

// A run with --timeout killed outright cannot tear its Trial down, nor
// enforce its deadline: its watchdog kills the Trial at once, and the
// next run removes what is left.
func TestPrivilegedRunKilledWithATimeoutKillsItsTrial(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	marker := sleepMarker(0)
	t.Cleanup(func() {
		if t.Failed() { // a run removes what a killed one left
			_, _, _ = trialnet("run", "--uid", "65534", "--", "true")
		}
	})
	// An embedded agent (no daemon on this socket): a daemon would remove
	// the killed run's Trial itself, as its owner, and hide the watchdog.
	noAgent := filepath.Join(t.TempDir(), "no-agent.sock")
	cmd := trialnetProcess(t, "run", "--socket", noAgent, "--uid", "65534", "--timeout", "10m", "--", "sh", "-c",
		"sleep "+marker+" </dev/null >/dev/null 2>&1 & echo ready; sleep 600")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitLine(t, out, "ready", 60*time.Second)
	tr := trialOf(t, cmd.Process.Pid)
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	for end := time.Now().Add(stopGrace); ; time.Sleep(20 * time.Millisecond) {
		left := tr.leftovers(t, marker)
		if !strings.Contains(strings.Join(left, " "), "process ") {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the Trial of a killed run still runs %v later: %v", stopGrace, left)
		}
	}
	if code, _, errOut := trialnet("run", "--uid", "65534", "--", "true"); code != 0 {
		t.Fatalf("the next run: exit %d %s", code, errOut)
	}
	if left := tr.leftovers(t, marker); len(left) > 0 {
		t.Errorf("left behind after the next run: %v", left)
	}
}

// The Trial sets its own terminal's suspend character: that must not make
// an ordinary key the operator types (here q, Enter alike) a stop of
// trialnet. Only the operator's own ^Z is.
func TestPrivilegedRunTrialCannotChooseTheSuspendKey(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	cmd := trialnetProcess(t, "run", "--uid", "65534", "--", "sh", "-c",
		`stty susp q; echo ready; read l; echo "got"; sleep 0.5`)
	m, lines := onTerminal(t, cmd)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	expectLineOf(t, lines, "ready", 60*time.Second, cmd, exited)
	if _, err := m.Write([]byte("q\n")); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		select {
		case err := <-exited:
			if err != nil {
				t.Fatalf("run: %v", err)
			}
			return
		default:
		}
		if st := testkit.ProcState(cmd.Process.Pid); st == 'T' || st == 't' {
			t.Fatalf("a key the Trial made its suspend character stopped trialnet (state %c)", st)
		}
		if time.Now().After(end) {
			t.Fatal("run did not end")
		}
	}
}
