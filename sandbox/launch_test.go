//go:build linux

package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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

// early.c ends a message with a NUL and the errno (and the init's set-up
// may add a NUL and more text); the launcher spells the errno as the Go
// path would.
func TestExecMessage(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"trialnet-exec: bad arguments", "trialnet-exec: bad arguments"},
		{"trialnet-exec: setuid 65534\x001", "trialnet-exec: setuid 65534: operation not permitted"},
		{"exec /bin/x\x0013", "exec /bin/x: permission denied"},
		{"exec /bin/x\x00\x1b[2J", "exec /bin/x: errno ?[2J"},
		// The init's set-up: the rest of the Go error's text after the errno.
		{"trialnet-init: hide /x (why)\x001\x00; more", "trialnet-init: hide /x (why): operation not permitted; more"},
	} {
		if got := execMessage([]byte(tc.in)); got != tc.want {
			t.Errorf("execMessage(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// The init takes back each list initArgs gives it, empty ones too: the
// Trial's v1 groups are shown it, and no hidden directory is taken for
// one. Seen red with the --v1 split left out of splitInitArgs (the groups
// were hidden directories, and none were shown).
func TestInitArgsSplitBack(t *testing.T) {
	for _, c := range []struct{ hide, v1, keep []string }{
		{[]string{"/run/trialnet"}, []string{"/sys/fs/cgroup/pids/trialnet/trialnet-1", "/sys/fs/cgroup/memory/trialnet/trialnet-1"}, []string{"/a.sock"}},
		{nil, nil, nil},
		{[]string{"/run/trialnet", "/netns"}, nil, []string{"/a.sock", "/b.sock"}},
	} {
		args := initArgs(true, true, "/netns/x", c.hide, c.v1, c.keep)
		nested, transparent, ns, hide, v1, keep := splitInitArgs(args[1:])
		if !nested || !transparent || ns != "/netns/x" || !slices.Equal(hide, c.hide) || !slices.Equal(v1, c.v1) || !slices.Equal(keep, c.keep) {
			t.Errorf("%q split back into %v %v %q %q %q %q", args, nested, transparent, ns, hide, v1, keep)
		}
	}
}

// writerFunc is a func as an io.Writer.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// Output copied through a pipe (a caller's pipe the Trial could read
// back, run's ... | less) is copied in full once the command has exited,
// however slowly its reader takes it: cut at the delay, the tail still in
// the pipe was lost and the run reported as whole. Only a pipe that
// something the command left running still holds is cut at the delay.
func TestLaunchIOWaitCopiesWhatTheCommandLeft(t *testing.T) {
	const delay = time.Nanosecond
	for _, held := range []bool{false, true} {
		release := make(chan struct{})
		var got bytes.Buffer
		slow := writerFunc(func(p []byte) (int, error) {
			<-release // a reader that takes its time: less, paged by hand
			return got.Write(p)
		})
		l, err := newLaunchIO(&exec.Cmd{Stdout: slow})
		if err != nil {
			t.Fatal(err)
		}
		// More than one copy's buffer (32 KiB), less than the pipe holds.
		want := bytes.Repeat([]byte("output line\n"), 4<<10)
		if _, err := l.child[1].Write(want); err != nil {
			t.Fatal(err)
		}
		if held {
			// What the command left running holds the pipe.
			l.closeAfterStart = slices.DeleteFunc(l.closeAfterStart, func(f *os.File) bool {
				if f == l.child[1] {
					t.Cleanup(func() { _ = f.Close() })
					return true
				}
				return false
			})
		}
		l.started() // the command's ends closed: it has exited
		// Long past the delay, the reader takes what it is given.
		time.AfterFunc(100*time.Millisecond, func() { close(release) })
		err = l.wait(delay, nil)
		switch {
		case held && !errors.Is(err, exec.ErrWaitDelay):
			t.Errorf("a pipe still held: wait returned %v, want it cut at the delay (%v)", err, exec.ErrWaitDelay)
		case !held && got.Len() != len(want):
			t.Errorf("the command's output, its pipe held by no one: %d bytes of %d copied (%v)", got.Len(), len(want), err)
		}
	}
}

// A copy blocked on a reader that never takes what it is given (a pipe
// of the Trial's uid that nobody reads) ends the wait once giveUp closes,
// as the command's deadline does: waited for in full, it held trialnet
// run past --timeout, and past SIGTERM, for ever (seen: a Trial writing
// 3 MB to such a pipe; trialnet still running 30 s after a 4 s timeout,
// and a SIGKILL left the Trial's cgroup and namespace behind).
func TestLaunchIOWaitGivesUpOnAStuckReader(t *testing.T) {
	stuck := make(chan struct{})
	defer close(stuck)
	blocked := writerFunc(func(p []byte) (int, error) {
		<-stuck // a reader that never reads
		return len(p), nil
	})
	l, err := newLaunchIO(&exec.Cmd{Stdout: blocked})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.child[1].Write([]byte("output the reader never takes\n")); err != nil {
		t.Fatal(err)
	}
	l.started() // the command's ends closed: it has exited
	giveUp := make(chan struct{})
	time.AfterFunc(50*time.Millisecond, func() { close(giveUp) })
	done := make(chan error, 1)
	go func() { done <- l.wait(time.Millisecond, giveUp) }()
	select {
	case err := <-done:
		if !errors.Is(err, exec.ErrWaitDelay) {
			t.Errorf("wait = %v, want %v", err, exec.ErrWaitDelay)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("wait still waits for a copy blocked on its reader 10 s after giveUp closed")
	}
}

// The init starts where the command's chdir lands (from /, ".." after a
// symlink taken physically): cleaned first, "LINK/.." was LINK's parent,
// so the init kept the mounts of a directory the command is not in and
// detached the one it is (hideRemoteFS).
func TestInitDirIsWhereTheCommandLands(t *testing.T) {
	top := t.TempDir()
	for _, d := range []string{"here/sub", "there/sub"} {
		if err := os.MkdirAll(filepath.Join(top, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(top, "there/sub"), filepath.Join(top, "here/link")); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{top + "/here/link/..", strings.TrimPrefix(top, "/") + "/here/link/..", top + "/here/sub"} {
		got, err := os.Stat(initDir(dir))
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.Stat("/" + strings.TrimPrefix(dir, "/")) // not cleaned
		if err != nil {
			t.Fatal(err)
		}
		if !os.SameFile(got, want) {
			t.Errorf("initDir(%q) = %s: not where the command's chdir lands", dir, initDir(dir))
		}
	}
	if got := initDir(top + "/missing"); got != "/" {
		t.Errorf("initDir of a directory the host does not have = %s, want /", got)
	}
}

// A SIGTERM, SIGINT or SIGHUP forwarded to the command also gives up the
// copy of its output to a reader that does not take it: without
// --timeout, trialnet run blocked on such a copy ignored them (the
// command they went to had exited), and only SIGKILL ended it.
func TestRelayedEndSignalGivesUpOutput(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1} {
		cmd := exec.Command("sleep", "30")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		p := &Process{cmd: cmd, giveUp: make(chan struct{})}
		sigs := make(chan os.Signal, 1)
		stop := relaySignals(context.Background(), p, sigs, func() {})
		sigs <- sig
		gaveUp := false
		select {
		case <-p.giveUp:
			gaveUp = true
		case <-time.After(time.Second):
		}
		stop()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if want := sig != syscall.SIGUSR1; gaveUp != want {
			t.Errorf("%v forwarded: gave up the output %v, want %v", sig, gaveUp, want)
		}
	}
}

// Once Wait has reaped the command, Signal sends nothing: the group's
// number was the command's pid, free for the kernel to give another
// process (a host's one) once the group empties. Here a process the
// command left in its group stands for whoever holds the number: before,
// the forwarded SIGTERM reached it.
func TestSignalAfterReapSendsNothing(t *testing.T) {
	var out bytes.Buffer
	cmd := exec.Command("sh", "-c", "sleep 30 >/dev/null & echo $!")
	cmd.Stdout = &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Process{cmd: cmd, free: func() {}, giveUp: make(chan struct{})}
	if code, err := p.Wait(); code != 0 || err != nil {
		t.Fatalf("Wait: %d %v", code, err)
	}
	left, err := strconv.Atoi(strings.TrimSpace(out.String()))
	if err != nil {
		t.Fatalf("the pid the command printed: %q", out.String())
	}
	t.Cleanup(func() { _ = syscall.Kill(left, syscall.SIGKILL) })
	if err := p.Signal(syscall.SIGTERM); !errors.Is(err, os.ErrProcessDone) {
		t.Errorf("Signal after the reap: %v, want %v", err, os.ErrProcessDone)
	}
	for end := time.Now().Add(500 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", left)); err != nil || strings.Contains(string(b), ") Z ") {
			t.Fatalf("the process left in the group was signalled after the reap: %v", err)
		}
	}
}
