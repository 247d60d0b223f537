//go:build linux

package sandbox

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The host's pty pool: one Trial that takes every pty it can gets
// MaxPtys, and while it holds them another Trial still gets its own, and
// so does a host process. (Unbounded, one Trial took all 3,071 and the
// next could not start with a terminal.)
func TestPrivilegedTrialPtysBounded(t *testing.T) {
	h := newHost(t)
	greedy := newTrial(t, h, Spec{})
	stdin, hold, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer outR.Close()
	p, err := greedy.Start(Command{Args: []string{probeExe(t), "ptys", fmt.Sprint(MaxPtys + 50), "hold"},
		Env: []string{"TRIALNET_PROBE=1"}, UID: nobody, GID: nobody, Stdin: stdin, Stdout: outW, Stderr: outW})
	_ = outW.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hold.Close(); _, _ = p.Wait() })
	line, err := bufio.NewReader(outR).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%d ENOSPC", MaxPtys); strings.TrimSpace(line) != want {
		t.Fatalf("a Trial opening ptys without end: %q, want %q", line, want)
	}
	other := newTrial(t, h, Spec{})
	if _, out := runProbeAs(t, other, nobody, Command{}, "ptys", "4"); out != "4 ok" {
		t.Fatalf("another Trial, while the first holds its ptys: %q", out)
	}
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("a host process, while the Trial holds its ptys: %v", err)
	}
	_ = unix.Close(fd)
	_ = hold.Close()
	if _, err := io.ReadAll(outR); err != nil {
		t.Fatal(err)
	}
}

// /dev/shm in a Trial is the host's memory: bounded at ShmBytes.
func TestPrivilegedTrialShmBounded(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, Spec{})
	want := fmt.Sprintf("%d ENOSPC", ShmBytes>>20)
	if _, out := runProbeAs(t, tr, nobody, Command{}, "fill", "/dev/shm/fill"); out != want {
		t.Fatalf("filling the Trial's /dev/shm: %q, want %q", out, want)
	}
}

// A Trial's processes dump no core, and cannot raise the limit: a
// core_pattern helper runs as root outside the Trial.
func TestPrivilegedTrialNoCoreDumps(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, Spec{})
	var b strings.Builder
	p, err := tr.Start(Command{Args: []string{"cat", "/proc/self/limits"}, Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody, Stdout: &b, Stderr: &b})
	if err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(); err != nil || code != 0 {
		t.Fatalf("cat /proc/self/limits: exit %d, %v: %s", code, err, b.String())
	}
	for line := range strings.Lines(b.String()) {
		if f := strings.Fields(line); len(f) >= 6 && f[0] == "Max" && f[1] == "core" {
			if f[4] != "0" || f[5] != "0" {
				t.Fatalf("core limit in the Trial: %q, want 0 0", line)
			}
			return
		}
	}
	t.Fatalf("no core limit in:\n%s", b.String())
}

// No process joins a Trial whose teardown has begun: the teardown waits
// for a launch under way (in this process or another) to have its process
// in the cgroup, where cgroup.kill reaches it, and a launch after the
// teardown marked the Trial closing is refused.
func TestPrivilegedNoJoinAfterTeardownBegins(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, Spec{})
	cg, err := os.Open(tr.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	end, err := beginJoin(cg) // a launch under way
	if err != nil {
		t.Fatal(err)
	}
	marked := make(chan error, 1)
	go func() { marked <- markClosing(tr.Cgroup) }() // the teardown's first step
	select {
	case err := <-marked:
		t.Fatalf("the teardown began while a launch was under way (%v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	end()
	if err := <-marked; err != nil {
		t.Fatal(err)
	}
	if _, err := beginJoin(cg); !errors.Is(err, ErrClosing) {
		t.Fatalf("a launch into a Trial being torn down: %v, want ErrClosing", err)
	}
	_, err = tr.Start(Command{Args: []string{"true"}, Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody})
	if !errors.Is(err, ErrClosing) {
		t.Fatalf("a command started in a Trial being torn down: %v, want ErrClosing", err)
	}
}
