//go:build linux

package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/trial"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testpty"
)

// The host's pty pool: one Trial that takes every pty it can gets
// MaxPtys, and while it holds them another Trial still gets its own, and
// so does a host process. (Unbounded, one Trial took all 3,071 and the
// next could not start with a terminal.)
func TestPrivilegedTrialPtysBounded(t *testing.T) {
	h := newHost(t)
	greedy := newTrial(t, h, trial.Spec{})
	line, release := holdingProbe(t, greedy, []string{probeExe(t), "ptys", fmt.Sprint(MaxPtys + 50), "hold"}, "TRIALNET_PROBE=1")
	if want := fmt.Sprintf("%d ENOSPC", MaxPtys); strings.TrimSpace(line) != want {
		t.Fatalf("a Trial opening ptys without end: %q, want %q", line, want)
	}
	other := newTrial(t, h, trial.Spec{})
	if _, out := runProbeAs(t, other, nobody, Command{}, "ptys", "4"); out != "4 ok" {
		t.Fatalf("another Trial, while the first holds its ptys: %q", out)
	}
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("a host process, while the Trial holds its ptys: %v", err)
	}
	_ = unix.Close(fd)
	release()
}

// A nested Trial's sandbox mounts a devpts instance of its own, without
// max= (bwrap --dev): the BPF LSM layer still holds the Trial to MaxPtys
// masters, so that another Trial started under a terminal gets its pty
// while the first holds all it may, and closing them gives them back
// (ten times the bound, opened and closed). Without the layer, the
// sandbox took every pty of the host's pool (3,071) and the next Trial
// could not start with a terminal.
func TestPrivilegedNestedTrialPtysBounded(t *testing.T) {
	h := newHost(t)
	privtest.RequireLSM(t, h.BPF.LSM(), h.BPF.LSMError())
	privtest.RequireTool(t, "bwrap")
	b, err := os.ReadFile("/proc/sys/kernel/pty/max")
	if err != nil {
		t.Fatal(err)
	}
	pool, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	greedy := newTrial(t, h, trial.Spec{Nested: true})
	bwrap := []string{"bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-pid", "--die-with-parent", "--", probeExe(t)}
	open := func(want uint64) {
		t.Helper()
		if got, err := h.BPF.OpenPtys(greedy.CgroupID); err != nil || got != want {
			t.Errorf("the nested Trial holds %d pty masters (%v), want %d", got, err, want)
		}
	}

	line, release := holdingProbe(t, greedy, append(bwrap, "ptys", strconv.Itoa(pool+1), "hold"), "TRIALNET_PROBE=1", "PATH=/usr/bin:/bin")
	if want := fmt.Sprintf("%d ENOSPC", MaxPtys); strings.TrimSpace(line) != want {
		t.Errorf("a sandbox with its own devpts, opening ptys without end: %q, want %q", line, want)
	}
	open(MaxPtys)
	if k, err := greedy.Counters(); err != nil || k.PtyDenied != 1 {
		t.Errorf("pty_denied = %d (%v), want 1", k.PtyDenied, err)
	}

	// The relay opens the second Trial's pty in its devpts instance,
	// which draws from the pool without the host's reserve.
	other := newTrial(t, h, trial.Spec{})
	_, slave := testpty.Open(t, 24, 80)
	if _, out := runProbeAs(t, other, nobody, Command{Stdin: slave}, "ptys", "4"); out != "4 ok" {
		t.Fatalf("a Trial under a terminal, while the nested one holds its ptys: %q", out)
	}

	release()
	open(0)
	var out bytes.Buffer
	p, err := greedy.Start(Command{Args: append(bwrap, "ptycycle", strconv.Itoa(MaxPtys), "10"),
		Env: []string{"TRIALNET_PROBE=1", "PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody, Stdout: &out, Stderr: &out})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("%d ok", 10*MaxPtys); strings.TrimSpace(out.String()) != want {
		t.Fatalf("opening and closing %d ptys ten times: %q, want %q (masters closed were not given back)", MaxPtys, out.String(), want)
	}
	open(0)
}

// /dev/shm in a Trial is the host's memory: bounded at ShmBytes. While
// one Trial holds its /dev/shm full, another Trial's and the host's
// still take writes.
func TestPrivilegedTrialShmBounded(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	want := fmt.Sprintf("%d ENOSPC", ShmBytes>>20)
	if _, out := runProbeAs(t, tr, nobody, Command{}, "fill", "/dev/shm/fill"); out != want {
		t.Fatalf("filling the Trial's /dev/shm: %q, want %q", out, want)
	}
	other := newTrial(t, h, trial.Spec{})
	var b strings.Builder
	p, err := other.Start(Command{Args: []string{"sh", "-c", "head -c 1048576 /dev/zero > /dev/shm/x && echo ok"},
		Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody, Stdout: &b, Stderr: &b})
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := p.Wait(); code != 0 || strings.TrimSpace(b.String()) != "ok" {
		t.Fatalf("another Trial's /dev/shm, while the first's is full: exit %d, %q", code, b.String())
	}
	f, err := os.CreateTemp("/dev/shm", "trialnet-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if _, err := f.Write(make([]byte, 1<<20)); err != nil {
		t.Fatalf("the host's /dev/shm, while a Trial's is full: %v", err)
	}
}

// A Trial's processes dump no core, and cannot raise the limit: a
// core_pattern helper runs as root outside the Trial.
func TestPrivilegedTrialNoCoreDumps(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	var b strings.Builder
	// A limit of 0 would not do: where core_pattern pipes to a helper the
	// kernel ignores it (it refuses a dump only at 1), and the helper runs
	// as root outside the Trial. So the Trial must not lower it either.
	p, err := tr.Start(Command{Args: []string{"sh", "-c", "ulimit -c 0; ulimit -H -c 0; exec cat /proc/self/limits"},
		Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody, Stdout: &b, Stderr: &b})
	if err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(); err != nil || code != 0 {
		t.Fatalf("ulimit -c 0, then cat /proc/self/limits: exit %d, %v: %s", code, err, b.String())
	}
	want := strconv.Itoa(CoreLimit)
	for line := range strings.Lines(b.String()) {
		if f := strings.Fields(line); len(f) >= 6 && f[0] == "Max" && f[1] == "core" {
			if f[4] != want || f[5] != want {
				t.Fatalf("core limit in the Trial after ulimit -c 0: %q, want %s %s", line, want, want)
			}
			return
		}
	}
	t.Fatalf("no core limit in:\n%s", b.String())
}

// A Trial's commands take at most MsgQueueBytes of their uid's message
// queue bytes, which the kernel counts across the whole host (see
// MsgQueueBytes): the rest stays for the uid's processes outside.
func TestPrivilegedTrialMsgQueueBounded(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	var b strings.Builder
	p, err := tr.Start(Command{Args: []string{"cat", "/proc/self/limits"}, Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody, Stdout: &b, Stderr: &b})
	if err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(); err != nil || code != 0 {
		t.Fatalf("cat /proc/self/limits: exit %d, %v: %s", code, err, b.String())
	}
	want := strconv.Itoa(MsgQueueBytes)
	for line := range strings.Lines(b.String()) {
		if f := strings.Fields(line); len(f) >= 5 && f[0] == "Max" && f[1] == "msgqueue" {
			if f[3] != want || f[4] != want {
				t.Fatalf("message queue limit in the Trial: %q, want %s %s", line, want, want)
			}
			return
		}
	}
	t.Fatalf("no message queue limit in:\n%s", b.String())
}

// No process joins a Trial whose teardown has begun: the teardown waits
// for a launch under way (in this process or another) to have its process
// in the cgroup, where cgroup.kill reaches it, and a launch after the
// teardown marked the Trial closing is refused.
func TestPrivilegedNoJoinAfterTeardownBegins(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
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
	go func() { marked <- markClosing(tr.Cgroup, tr.CgroupID) }() // the teardown's first step
	select {
	case err := <-marked:
		t.Fatalf("the teardown began while a launch was under way (%v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	end()
	if err := <-marked; err != nil {
		t.Fatal(err)
	}
	if _, err := beginJoin(cg); !errors.Is(err, errClosing) {
		t.Fatalf("a launch into a Trial being torn down: %v, want ErrClosing", err)
	}
	_, err = tr.Start(Command{Args: []string{"true"}, Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody})
	if !errors.Is(err, errClosing) {
		t.Fatalf("a command started in a Trial being torn down: %v, want ErrClosing", err)
	}
}

// A Trial whose cgroup its runtime removed before the teardown (runc
// does, for a container whose init exited) takes no process any more:
// a launch opens it by path, which fails, and one that opened it before
// cannot clone into it. So the teardown has nothing to mark closing, and
// does not warn that it could not.
func TestPrivilegedGoneCgroupTakesNoLaunchAndNoWarning(t *testing.T) {
	h := newHost(t)
	var logged bytes.Buffer
	h.Logger = slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelWarn}))
	tr := newTrial(t, h, trial.Spec{})
	cg, err := os.Open(tr.Cgroup) // a launch under way
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	clone := func() error {
		c := exec.Command("/bin/true")
		c.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
		return c.Run()
	}
	if err := clone(); err != nil {
		t.Fatalf("a process cloned into the Trial's cgroup: %v", err)
	}
	if err := removeCgroup(tr.Cgroup); err != nil { // as its runtime would
		t.Fatal(err)
	}
	// The kernel finds no live cgroup behind the open directory
	// (css_tryget_online_from_dir).
	if err := clone(); !errors.Is(err, unix.ENOENT) {
		t.Fatalf("a process cloned into the Trial's cgroup once removed: %v, want ENOENT", err)
	}
	_, err = tr.Start(Command{Args: []string{"true"}, Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody})
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a command started in a Trial whose cgroup is gone: %v, want ENOENT", err)
	}
	if _, err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if logged.Len() > 0 {
		t.Errorf("the teardown of a Trial whose cgroup is gone warned:\n%s", logged.String())
	}
}

// A cgroup made at a Trial's path since its own was removed (a restarted
// container's, which a Trial of its own adopts) is not marked closing by
// the old Trial's teardown.
func TestPrivilegedNoClosingMarkOnANewCgroupAtThePath(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	if err := removeCgroup(tr.Cgroup); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(tr.Cgroup, 0o755); err != nil {
		t.Fatal(err)
	}
	cg, err := os.Open(tr.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(cg.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { RemoveLaunchLock(st.Ino) })
	if _, err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	// The old Trial's teardown removed the cgroup at its path, this one
	// too (a launch finds it gone): it must not have marked it closing.
	if Closing(st.Ino) {
		t.Fatal("the new cgroup at the path was marked closing by the old Trial's teardown")
	}
}

// The pids controller bounds the Trial's tasks, all its commands and uids
// together, where RLIMIT_NPROC (per uid, per command) would let it take
// a share of the host's pids without end: a Trial of 40 tasks forks until
// refused; its use says so; another Trial and a host process still fork.
func TestPrivilegedTrialPidsBounded(t *testing.T) {
	const python = "/usr/bin/python3"
	privtest.RequireTool(t, python)
	h := newHost(t)
	if !poolBounded(h, PoolPids) {
		requireBound(t, h, PoolPids)
	}
	const limit = 40
	tr := newTrial(t, h, trial.Spec{UnixOpen: true, Limits: &trial.Limits{PoolLimits: trial.PoolLimits{MaxPids: limit}}})
	// Two commands, two uids: the per-uid limits (high) are not the bound.
	env := []string{"PATH=/usr/bin:/bin"}
	var lines []string
	for i, uid := range []uint32{unusedUID(t), unusedUID(t)} {
		stdinR, stdinW, _ := os.Pipe()
		outR, outW, _ := os.Pipe()
		script := strings.Replace(forker, "while n < 200:", "while n < "+[]string{"15", "200"}[i]+":", 1)
		p, err := tr.Start(Command{Args: []string{python, "-c", script}, Env: env, UID: uid, GID: uid, MaxProcs: 1000,
			Stdin: stdinR, Stdout: outW, Stderr: os.Stderr})
		_ = stdinR.Close()
		_ = outW.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = stdinW.Close(); _, _ = p.Wait(); _ = outR.Close() })
		_ = outR.SetReadDeadline(time.Now().Add(30 * time.Second))
		line, err := bufio.NewReader(outR).ReadString('\n')
		if err != nil {
			t.Fatalf("forker %d: %q: %v", i, line, err)
		}
		lines = append(lines, strings.TrimSpace(line))
	}
	var total int
	for _, l := range lines {
		var n int
		var errName string
		if _, err := fmt.Sscan(l, &n, &errName); err != nil {
			t.Fatalf("forkers said %q", lines)
		}
		total += n + 1 // and the forker itself
	}
	if lines[0] != "15 none" || !strings.HasSuffix(lines[1], " EAGAIN") || total > limit {
		t.Fatalf("forkers said %q: %d tasks in a Trial bounded at %d; want the second refused with EAGAIN", lines, total, limit)
	}
	// At the bound, a new command is refused saying why, not crashed.
	if _, err := tr.Start(Command{Args: []string{"true"}, Env: env, UID: nobody, GID: nobody}); err == nil || !strings.Contains(err.Error(), "pids.max") {
		t.Fatalf("a command in a Trial at its task bound: %v, want refused naming pids.max", err)
	}
	use := poolUse(tr, PoolPids)
	if use.Max != limit || use.Current < int64(total) || use.Events < 1 {
		t.Fatalf("pids use %+v: want max %d, current at least %d, a refusal counted", use, limit, total)
	}
	other := newTrial(t, h, trial.Spec{})
	if code, out := runProbeAs(t, other, nobody, Command{}, "status"); code != probeOK {
		t.Fatalf("another Trial while the first is at its bound: %d %s", code, out)
	}
	if out, err := exec.Command("/bin/sh", "-c", "/bin/true & wait $!").CombinedOutput(); err != nil {
		t.Fatalf("a host process while the Trial is at its bound: %v: %s", err, out)
	}
}

// The memory controller bounds the Trial's memory: a process that
// allocates past it is killed, and the Trial's use counts the kill.
func TestPrivilegedTrialMemoryBounded(t *testing.T) {
	h := newHost(t)
	if !poolBounded(h, PoolMemory) {
		requireBound(t, h, PoolMemory)
	}
	const limit = 64 << 20
	tr := newTrial(t, h, trial.Spec{Limits: &trial.Limits{PoolLimits: trial.PoolLimits{MaxMemory: limit}}})
	code, out := runProbeAs(t, tr, nobody, Command{}, "alloc", "256")
	if code == probeOK {
		t.Fatalf("a Trial bounded at 64 MiB allocated 256 MiB: %s", out)
	}
	use := poolUse(tr, PoolMemory)
	if use.Max != limit || use.Events < 1 || use.Peak > limit+(1<<20) {
		t.Fatalf("memory use %+v: want max %d, an OOM kill counted, the peak within the bound", use, limit)
	}
	// The kill was the Trial's own: another Trial allocates what the
	// first could not.
	other := newTrial(t, h, trial.Spec{})
	if code, out := runProbeAs(t, other, nobody, Command{}, "alloc", "256"); code != probeOK {
		t.Fatalf("another Trial allocating 256 MiB after the first was killed at its bound: %d %s", code, out)
	}
}

// A Trial's socket buffers are within its memory bound: on cgroup v1
// they were charged only to the host's tcp_mem, and a Trial bounded at
// 64 MiB held 1.6 GiB with 440 connections over its own loopback, every
// TCP socket of the host under memory pressure.
func TestPrivilegedTrialSocketMemoryBounded(t *testing.T) {
	h := newHost(t)
	if !poolBounded(h, PoolMemory) {
		requireBound(t, h, PoolMemory)
	}
	const limit = 64 << 20
	tr := newTrial(t, h, trial.Spec{Limits: &trial.Limits{PoolLimits: trial.PoolLimits{MaxMemory: limit}}})
	// 64 connections hold about 240 MiB where nothing bounds them.
	code, out := runProbeAs(t, tr, nobody, Command{}, "tcp-hold", "64")
	if code == 128+int(unix.SIGKILL) {
		// cgroup v2 charges socket buffers to memory.max, and past it
		// the OOM killer ends the holder: bounded, if the kill was the
		// bound's.
		use := poolUse(tr, PoolMemory)
		if use.Max != limit || use.Events < 1 || use.Peak > limit+(1<<20) {
			t.Fatalf("tcp-hold killed, memory use %+v: want max %d, an OOM kill counted, the peak within the bound", use, limit)
		}
		t.Logf("killed at the bound (%+v)", use)
		return
	}
	if code != probeOK {
		t.Fatalf("tcp-hold: %d %s", code, out)
	}
	mib, err := strconv.Atoi(strings.Fields(out)[0])
	if err != nil {
		t.Fatalf("tcp-hold: %q", out)
	}
	t.Logf("queued %d MiB", mib)
	// Each socket keeps the few KiB the kernel guarantees it past a bound.
	if mib > limit>>20+8 {
		t.Fatalf("a Trial bounded at %d MiB queued %d MiB in TCP socket buffers", limit>>20, mib)
	}
}

func poolBounded(h *Host, pool string) bool {
	for _, b := range h.PoolBounds() {
		if b.Pool == pool {
			return b.Bounded
		}
	}
	return false
}

// requireBound fails (never skips) where the pool cannot be bounded: on
// these machines and in the VM matrix both controllers are there.
func requireBound(t *testing.T, h *Host, pool string) {
	t.Helper()
	for _, b := range h.PoolBounds() {
		if b.Pool == pool {
			t.Fatalf("the %s pool cannot be bounded on this host: %s", pool, b.Bound)
		}
	}
	t.Fatalf("no %s pool", pool)
}

// No way in: a Trial cannot make a unix socket (or a FIFO) at a path it
// shares with the host, where a host client looking for a server would
// connect to it and hand it a password (psql and /tmp/.s.PGSQL.5432).
// Its own /dev/shm, which no host process sees, takes them; a Trial made
// without unix confinement may make them anywhere it may write.
func TestPrivilegedNoWayIn(t *testing.T) {
	h := newHost(t)
	// A directory the Trial and the host share, that anyone may write.
	shared := privtest.SharedDir(t, "wayin-")
	if err := os.Chmod(shared, 0o1777); err != nil {
		t.Fatal(err)
	}
	pg := filepath.Join(shared, ".s.PGSQL.5432")
	tr := newTrial(t, h, trial.Spec{})
	if _, out := runProbeAs(t, tr, nobody, Command{}, "bind-unix", pg); out != "EACCES" {
		t.Fatalf("a Trial binding %s: %q, want EACCES", pg, out)
	}
	if c, err := net.Dial("unix", pg); err == nil {
		_ = c.Close()
		t.Fatalf("a host client reached a socket the Trial made at %s", pg)
	}
	if _, out := runProbeAs(t, tr, nobody, Command{}, "mkfifo", filepath.Join(shared, "fifo")); out != "EACCES" {
		t.Fatalf("a Trial making a FIFO in a shared directory: %q, want EACCES", out)
	}
	if _, out := runProbeAs(t, tr, nobody, Command{}, "bind-unix", "/dev/shm/own.sock"); out != "ok" {
		t.Fatalf("a Trial binding in its own /dev/shm: %q, want ok", out)
	}
	open := newTrial(t, h, trial.Spec{UnixOpen: true})
	if _, out := runProbeAs(t, open, nobody, Command{}, "bind-unix", filepath.Join(shared, "open.sock")); out != "ok" {
		t.Fatalf("a Trial without unix confinement binding in a shared directory: %q, want ok (its documented trade)", out)
	}
}

// holdingProbe starts args in tr as nobody, a probe that opens ptys and
// holds them while its stdin is open; it returns the probe's first line
// and a release (closing its stdin, waiting for it), also run at cleanup.
func holdingProbe(t *testing.T, tr *Trial, args []string, env ...string) (string, func()) {
	t.Helper()
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
	p, err := tr.Start(Command{Args: args, Env: env, UID: nobody, GID: nobody, Stdin: stdin, Stdout: outW, Stderr: outW})
	_ = outW.Close()
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	release := func() { once.Do(func() { _ = hold.Close(); _, _ = p.Wait() }) }
	t.Cleanup(release)
	line, err := bufio.NewReader(outR).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return line, release
}

// On a host whose pids and memory controllers are cgroup v1, a command is
// born in the Trial's groups: the launching thread moves itself there
// for the clone and back after it, so that no thread of the launcher
// stays in a Trial's group (a Trial's OOM kill or pids bound must never
// reach the launcher). A Trial one task short of its bound still starts
// a command (the thread would take that place: the command is moved the
// old way), one at its bound is refused naming pids.max, and the teardown
// removes the groups.
func TestPrivilegedCommandBornInV1Pools(t *testing.T) {
	h := newHost(t)
	const limit = 10 // room for trialnet-exec's Go runtime in a CGO_ENABLED=0 build
	tr := newTrial(t, h, trial.Spec{Limits: &trial.Limits{PoolLimits: trial.PoolLimits{MaxPids: limit}}})
	groups, err := tr.v1Groups()
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) == 0 {
		t.Skip("no cgroup v1 pids or memory controller on this host: a command's cgroup v2 clone is its group")
	}
	// The thread's own move, on a thread discarded after it as
	// netns.EnterProcess's is.
	move := newPoolMove(groups)
	if move == nil {
		t.Fatal("no move for an empty Trial")
	}
	during, after := make(chan string, 1), make(chan string, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		_ = move.around(func() error {
			b, _ := os.ReadFile("/proc/thread-self/cgroup")
			during <- string(b)
			return nil
		})()
		b, _ := os.ReadFile("/proc/thread-self/cgroup")
		after <- string(b)
	}()
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	in, out := <-during, <-after
	for _, g := range groups {
		want := trialV1Path(t, g)
		if got, _ := v1Path(in, g.name); got != want || !move.Joined() {
			t.Errorf("the launching thread in %s %q (joined %v), want the Trial's %q", g.name, got, move.Joined(), want)
		}
		home, _ := v1Path(string(own), g.name)
		if got, _ := v1Path(out, g.name); got != home {
			t.Errorf("the launching thread after the launch in %s %q, want the launcher's %q", g.name, got, home)
		}
	}

	// A command, through Start: born in the Trial's groups. It leaves the
	// Trial one task short of its bound.
	env := []string{"PATH=/usr/bin:/bin"}
	p, grow, stop := holdTasks(t, tr, limit-1)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", p.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		if got, _ := v1Path(string(b), g.name); got != trialV1Path(t, g) {
			t.Errorf("the command in %s %q, want the Trial's %q", g.name, got, trialV1Path(t, g))
		}
	}
	// One task short of the bound: the thread takes no place there (the
	// count is the one v1Groups read, as in a launch). The launch's own
	// thread, discarded after it, is counted until it has exited: seen
	// there for a moment under load (gone 0.5 s later), one task over.
	awaitNoThreadIn(t, groups)
	short, err := tr.v1Groups()
	if err != nil {
		t.Fatal(err)
	}
	if move := newPoolMove(short); move != nil {
		move.close()
		t.Error("a move into a Trial one task short of its pids bound")
	}
	// Moved the old way, it is still rooted in the Trial's groups: its
	// cgroup namespace is made once it is there, so that it names each
	// "/", as a JVM joining it with the mounts expects.
	var cgroups bytes.Buffer
	if code, err := tr.Exec(context.Background(), Command{Args: []string{"cat", "/proc/self/cgroup"}, Env: env, UID: nobody, GID: nobody, Stdout: &cgroups}, nil); code != 0 || err != nil {
		t.Fatalf("a command in a Trial one task short of its bound: exit %d, %v", code, err)
	}
	for _, g := range groups {
		if got, _ := v1Path(cgroups.String(), g.name); got != "/" {
			t.Errorf("a command moved into the Trial's %s group names it %q in its /proc/self/cgroup, want \"/\"", g.name, got)
		}
	}
	grow()
	if _, err := tr.Start(Command{Args: []string{"true"}, Env: env, UID: nobody, GID: nobody}); err == nil || !strings.Contains(err.Error(), "pids.max") {
		t.Fatalf("a command in a Trial at its task bound: %v, want refused naming pids.max", err)
	}
	stop()
	noThreadIn(t, groups)
	if _, err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		if _, err := os.Stat(g.dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the Trial's %s group after its teardown: %v, want removed", g.name, err)
		}
	}
}

// holdTasks starts a command in tr that holds n tasks of it (a shell and
// n-1 sleeps) until stop, and grow has it fork one more (the sleeps
// stay until the Trial ends).
func holdTasks(t *testing.T, tr *Trial, n int) (p *Process, grow, stop func()) {
	t.Helper()
	stdinR, stdinW, _ := os.Pipe()
	outR, outW, _ := os.Pipe()
	script := fmt.Sprintf("i=1; while [ $i -lt %d ]; do sleep 1000 & i=$((i+1)); done; echo ready; read x; sleep 1000 & echo grown; read x", n)
	p, err := tr.Start(Command{Args: []string{"/bin/sh", "-c", script}, Env: []string{"PATH=/usr/bin:/bin"},
		UID: nobody, GID: nobody, Stdin: stdinR, Stdout: outW})
	_ = stdinR.Close()
	_ = outW.Close()
	if err != nil {
		t.Fatal(err)
	}
	stop = func() { _ = stdinW.Close(); _, _ = p.Wait(); _ = outR.Close() }
	t.Cleanup(stop)
	_ = outR.SetReadDeadline(time.Now().Add(30 * time.Second))
	out := bufio.NewReader(outR)
	if line, err := out.ReadString('\n'); line != "ready\n" {
		t.Fatalf("a command holding %d tasks: %q, %v", n, line, err)
	}
	grow = func() {
		_, _ = stdinW.Write([]byte("\n"))
		if line, err := out.ReadString('\n'); line != "grown\n" {
			t.Fatalf("a command forking one more task: %q, %v", line, err)
		}
	}
	return p, grow, stop
}

// trialV1Path is g's group as /proc/PID/cgroup names it.
func trialV1Path(t *testing.T, g v1Group) string {
	mnt, err := cachedV1Mount(g.name)
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(mnt, g.dir)
	if err != nil {
		t.Fatal(err)
	}
	return "/" + rel
}

// noThreadIn fails if any thread of this process is in one of groups.
// awaitNoThreadIn waits, bounded, until no thread of this process is in
// the Trial's groups (threadsIn); then noThreadIn is sure to pass.
func awaitNoThreadIn(t *testing.T, groups []v1Group) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); len(threadsIn(t, groups)) > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			break // noThreadIn, or the count, says which
		}
	}
}

func noThreadIn(t *testing.T, groups []v1Group) {
	t.Helper()
	for _, in := range threadsIn(t, groups) {
		t.Errorf("thread %s", in)
	}
}

// threadsIn lists the threads of this process in the Trial's groups.
func threadsIn(t *testing.T, groups []v1Group) []string {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	var in []string
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/cgroup")
		if err != nil {
			continue // ended
		}
		for _, g := range groups {
			if got, _ := v1Path(string(b), g.name); got == trialV1Path(t, g) {
				in = append(in, task.Name()+" of the launcher is in the Trial's "+g.name+" group")
			}
		}
	}
	return in
}

// A pids controller kept from an earlier create (controllersFor) that is
// gone while the agent runs (on v2 disabled on the parent; on v1 the group
// that holds Trials' groups removed) is found again by the next create:
// its Trial is bounded, never made unbounded, nor refused, on a stale
// answer.
func TestPrivilegedPoolsFoundAgainWhenRemoved(t *testing.T) {
	h := newHost(t)
	if !poolBounded(h, PoolPids) {
		requireBound(t, h, PoolPids)
	}
	newTrial(t, h, trial.Spec{}) // finds and keeps the controllers
	var pids controller
	for _, c := range controllersFor(h.Parent) {
		if c.name == PoolPids {
			pids = c
		}
	}
	if _, ok := foundControllers.Load(controllerKey{filepath.Clean(h.Parent), PoolPids}); !ok {
		t.Fatal("the pids controller was not kept after a create")
	}
	if pids.v2 {
		if err := os.WriteFile(filepath.Join(h.Parent, "cgroup.subtree_control"), []byte("-pids"), 0); err != nil {
			t.Fatal(err)
		}
	} else {
		// The group that holds Trials' groups is shared by every agent
		// of the host and cannot be removed while one has a Trial: the
		// answer kept is made stale instead, as it is once an operator
		// removed the group (the kept directory is not there).
		gone := pids
		gone.dir = filepath.Join(filepath.Dir(pids.dir), "trialnet-gone-"+randSuffix())
		foundControllers.Store(controllerKey{filepath.Clean(h.Parent), PoolPids}, gone)
	}
	tr := newTrial(t, h, trial.Spec{Limits: &trial.Limits{PoolLimits: trial.PoolLimits{MaxPids: 40}}})
	dir, err := tr.poolDir(pids)
	if err != nil {
		t.Fatal(err)
	}
	if got := readCgroupInt(filepath.Join(dir, "pids.max"), ""); got != 40 {
		t.Fatalf("pids.max of a Trial made after its pids group was removed: %d, want 40", got)
	}
}

// One read of mountinfo finds every pool's cgroup v1 hierarchy, which a
// launch asks for in turn, and each as v1Mount finds it alone.
func TestCachedV1MountKeepsEveryPool(t *testing.T) {
	want := map[string]string{}
	for _, name := range poolNames {
		if m, err := v1Mount(name); err == nil {
			want[name] = m
		}
	}
	if len(want) < len(poolNames) {
		t.Skipf("pools on cgroup v1 here: %v; the test needs all of %v", want, poolNames)
	}
	forget := func() {
		for _, name := range poolNames {
			v1Mounts.Delete(name)
		}
	}
	forget()
	t.Cleanup(forget)
	if m, err := cachedV1Mount(poolNames[0]); err != nil || m != want[poolNames[0]] {
		t.Fatalf("cachedV1Mount(%s) = %q, %v; want %q", poolNames[0], m, err, want[poolNames[0]])
	}
	for _, name := range poolNames[1:] {
		if m, ok := v1Mounts.Load(name); !ok || m != want[name] {
			t.Errorf("after asking for %s, %s kept as %v (%v); want %q from the same read", poolNames[0], name, m, ok, want[name])
		}
	}
	if _, err := v1Mount("no-such-controller"); err == nil {
		t.Error("v1Mount of a controller on no hierarchy: no error")
	}
}

func BenchmarkV1MountsCold(b *testing.B) {
	for b.Loop() {
		for _, name := range poolNames {
			v1Mounts.Delete(name)
		}
		for _, name := range poolNames {
			if _, err := cachedV1Mount(name); err != nil {
				b.Skip(err)
			}
		}
	}
}

// poolUse is the Trial's use of pool (its zero value where the Trial has
// no such pool).
func poolUse(tr *Trial, pool string) trial.PoolUse {
	for _, u := range tr.PoolUse() {
		if u.Pool == pool {
			return u
		}
	}
	return trial.PoolUse{}
}
