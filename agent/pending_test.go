//go:build linux

package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/netns"
	"github.com/trialnet/trialnet/sandbox"
	trialspec "github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

const (
	// preparerEnv makes the test binary a runtime wrapper's stand-in: it
	// prepares a container through the agent at that socket, says so,
	// and exits when its stdin closes.
	preparerEnv = "TRIALNET_TEST_PREPARER_SOCKET"
	preparerReq = "TRIALNET_TEST_PREPARER_PATH"
	// probeEnv makes it a container's init stand-in: for each line on
	// stdin it tries the sockets a runtime's init uses and says how each
	// went (probeMain).
	probeEnv = "TRIALNET_TEST_PENDING_PROBE"
)

// preparerMain prepares container "ctr-caller" with profile pend at the
// cgroups path in preparerReq, then waits for stdin to close.
func preparerMain(sock string) int {
	_, err := client.NewClient(sock).PrepareContainer(context.Background(), client.ContainerPrepare{
		Container: "ctr-caller", Profile: "pend", CgroupsPath: os.Getenv(preparerReq)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("prepared")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// probeMain answers each line of stdin with what a task here may do: an
// IPv4 socket (which every cgroup hook refuses a pending cgroup's task)
// and a write on a unix socket pair (what runc's init does on its sync
// socket, which the BPF LSM layer refuses a task in a cgroup without a
// policy entry). It leaves no socket open: the agent adopts only a
// namespace without any.
func probeMain() int {
	fmt.Println("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		inet := "ok"
		if fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0); err != nil {
			inet = err.Error()
		} else {
			_ = unix.Close(fd)
		}
		pair := "ok"
		if fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0); err != nil {
			pair = err.Error()
		} else {
			if _, err := unix.Write(fds[0], []byte("x")); err != nil {
				pair = err.Error()
			}
			_ = unix.Close(fds[0])
			_ = unix.Close(fds[1])
		}
		fmt.Printf("inet=%s unix=%s\n", inet, pair)
	}
	return 0
}

// pendWorld is an agent with profile "pend", and its cgroups path of
// name (relative to the cgroup2 mount, as a bundle names it).
type pendWorld struct {
	a   *Agent
	cfg AgentConfig
}

func newPendWorld(t *testing.T, pendFor time.Duration) *pendWorld {
	t.Helper()
	privtest.Require(t)
	w := newWorld(t, 91, "allowed.test")
	cfg := w.config(t)
	file, err := config.ParseFile([]byte("profiles:\n  pend:\n    allow: [\"allowed.test:8081\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.File, cfg.PendingFor = file, pendFor
	return &pendWorld{a: startAgent(t, cfg), cfg: cfg}
}

func (w *pendWorld) path(t *testing.T, name string) string {
	t.Helper()
	mount, err := sandbox.Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimPrefix(w.a.host.Parent, mount) + "/" + name
}

func (w *pendWorld) prepare(t *testing.T, cid, name string) (client.PreparedContainer, uint64) {
	t.Helper()
	pc, err := w.a.PrepareContainer(context.Background(), client.ContainerPrepare{Container: cid, Profile: "pend", CgroupsPath: w.path(t, name)})
	if err != nil {
		t.Fatalf("prepare %s: %v", cid, err)
	}
	t.Cleanup(func() { _ = unix.Rmdir(pc.Cgroup) })
	id, err := bpf.CgroupID(pc.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	if !w.a.host.BPF.IsPending(id) {
		t.Fatalf("prepared cgroup %s has no pending entry", pc.Cgroup)
	}
	return pc, id
}

// waitDropped waits, bounded, until cgroup (id) has neither a directory
// nor an entry.
func (w *pendWorld) waitDropped(t *testing.T, cgroup string, id uint64, why string) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, err := os.Stat(cgroup)
		if errors.Is(err, os.ErrNotExist) && !w.a.host.BPF.HasTrial(id) {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s: the prepared cgroup %s is still there (%v) or keeps an entry (%v)", why, cgroup, err, w.a.host.BPF.HasTrial(id))
		}
	}
}

// probe is a container init's stand-in in cgroup, in a network namespace
// of its own, as a runtime places one before its hooks run.
type probe struct {
	pid int
	in  io.WriteCloser
	out *bufio.Reader
}

func startProbe(t testing.TB, cgroup string) *probe {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cg, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), probeEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	p := &probe{}
	if p.in, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	p.pid, p.out = cmd.Process.Pid, bufio.NewReader(out)
	if line, err := p.out.ReadString('\n'); line != "ready\n" {
		t.Fatalf("the probe did not start: %q %v", line, err)
	}
	return p
}

func (p *probe) try(t *testing.T) string {
	t.Helper()
	if _, err := io.WriteString(p.in, "go\n"); err != nil {
		t.Fatal(err)
	}
	line, err := p.out.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(line)
}

// A prepared cgroup is the agent's new one with a pending entry: a task
// in it may use a unix socket pair (on a kernel with the BPF LSM layer,
// where a cgroup without an entry may not) and make no IPv4 socket. The
// hook's adoption takes it for its container only: another container's
// init there is refused and leaves it pending; its own becomes the
// Trial's, whose entry replaces the pending one.
func TestPrivilegedPreparedContainerAdopted(t *testing.T) {
	w := newPendWorld(t, time.Hour)
	pc, id := w.prepare(t, "ctr-a", "ctr-a")
	p := startProbe(t, pc.Cgroup)
	got := p.try(t)
	t.Logf("in a pending cgroup (BPF LSM layer %v): %s", w.a.host.BPF.LSM(), got)
	if !strings.Contains(got, "inet=operation not permitted") || !strings.Contains(got, "unix=ok") {
		t.Errorf("in a pending cgroup: %s; want no IPv4 socket and the unix pair usable", got)
	}
	ctx := context.Background()
	_, err := w.a.ContainerTrial(ctx, client.ContainerTrial{Profile: "pend", Container: client.Container{ID: "ctr-b", PID: p.pid}})
	if err == nil || !strings.Contains(err.Error(), "prepared for another container") {
		t.Errorf("another container's init in the prepared cgroup: %v", err)
	}
	if !w.a.host.BPF.IsPending(id) {
		t.Fatal("a refused adoption took another container's pending entry")
	}
	// Until a container comes for a Trial, no files made ahead hold a
	// steer program: a create's shell has its own steering.
	if sets, steered := preparedSteers(w.a); sets == 0 || steered != 0 {
		t.Errorf("before any adoption: %d of %d file sets made ahead hold a steer program; want none of at least one", steered, sets)
	}
	logs, ledgers := preparedInodes(t, w.a)
	info, err := w.a.ContainerTrial(ctx, client.ContainerTrial{Profile: "pend", Container: client.Container{ID: "ctr-a", PID: p.pid}})
	if err != nil {
		t.Fatalf("adopt the prepared container: %v", err)
	}
	// The adoption takes a Trial's files made ahead, as a create does.
	if _, ok := logs[inode(t, filepath.Join(w.cfg.DataDir, info.ID, decisionsFile))]; !ok {
		t.Error("the adopted Trial's decision log is not a prepared one")
	}
	if _, ok := ledgers[inode(t, filepath.Join(w.cfg.Host.StateDir, info.ID+".ledgers", fmt.Sprint(os.Getpid())))]; !ok {
		t.Error("the adopted Trial's ledger is not a prepared one")
	}
	if info.Cgroup != pc.Cgroup || w.a.host.BPF.IsPending(id) || !w.a.host.BPF.HasTrial(id) {
		t.Errorf("adopted: cgroup %s (prepared %s), pending %v, entry %v", info.Cgroup, pc.Cgroup, w.a.host.BPF.IsPending(id), w.a.host.BPF.HasTrial(id))
	}
	if got := p.try(t); !strings.Contains(got, "unix=ok") {
		t.Errorf("in the adopted Trial: %s", got)
	}
	// Its steering, attached from the program the files held loaded,
	// takes a connection to the pool's addresses in its namespace, which
	// nothing listens on: refused, it steers nothing. (Steered, this one,
	// from the test's process outside the Trial, is reset.)
	if !info.Transparent {
		t.Fatal("the adopted Trial is not transparent")
	}
	err = netns.Do(info.Netns, func() error {
		c, err := net.DialTimeout("tcp", "127.100.0.1:443", 5*time.Second)
		if err == nil {
			_ = c.Close()
		}
		return err
	})
	if errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("a connection to a pool address in the adopted Trial: %v; want it steered to the proxy", err)
	}
	if _, err := w.a.Destroy(ctx, info.ID); err != nil {
		t.Fatal(err)
	}
	// Once one has, the refill's file sets hold one for the next.
	deadline := time.Now().Add(10 * time.Second)
	for {
		sets, steered := preparedSteers(w.a)
		if steered > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after an adoption: %d file sets made ahead, none holding a steer program", sets)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// preparedSteers counts a's Trial file sets made ahead, and those of them
// holding a steer program loaded ahead.
func preparedSteers(a *Agent) (sets, steered int) {
	a.shells.mu.Lock()
	defer a.shells.mu.Unlock()
	for _, f := range a.shells.files {
		sets++
		if f.steer != nil {
			steered++
		}
	}
	return sets, steered
}

// A prepared cgroup that no hook adopts goes, with its entry: when it
// expires, when the process that prepared it exits (its runtime's create
// failed), when the hook refuses its container (another profile, or its
// init in another cgroup), and when the agent stops. A task in it after
// that is refused what the pending entry allowed.
func TestPrivilegedPreparedContainerDropped(t *testing.T) {
	t.Run("expired", func(t *testing.T) {
		w := newPendWorld(t, 200*time.Millisecond)
		pc, id := w.prepare(t, "ctr-exp", "ctr-exp")
		w.waitDropped(t, pc.Cgroup, id, "past its bound")
		if _, id2 := w.prepare(t, "ctr-exp", "ctr-exp"); id2 == id {
			t.Error("prepared again, the cgroup has the old one's id")
		}
	})
	t.Run("kept while a task is in it, then refused everything", func(t *testing.T) {
		w := newPendWorld(t, 300*time.Millisecond)
		pc, id := w.prepare(t, "ctr-task", "ctr-task")
		p := startProbe(t, pc.Cgroup)
		for end := time.Now().Add(20 * time.Second); w.a.host.BPF.HasTrial(id); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatal("the pending entry did not expire")
			}
		}
		got := p.try(t)
		t.Logf("after the pending entry went (BPF LSM layer %v): %s", w.a.host.BPF.LSM(), got)
		if w.a.host.BPF.LSM() && !strings.Contains(got, "unix=operation not permitted") {
			t.Errorf("a task left in a dropped pending cgroup: %s; want the unix pair refused", got)
		}
		if !strings.Contains(got, "inet=operation not permitted") {
			t.Errorf("a task left in a dropped pending cgroup: %s; want no IPv4 socket", got)
		}
	})
	t.Run("its caller exited", func(t *testing.T) {
		w := newPendWorld(t, time.Hour)
		sock := filepath.Join(t.TempDir(), "agent.sock")
		ln, err := ListenSocket(sock)
		if err != nil {
			t.Fatal(err)
		}
		srv := w.a.Server()
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close() })
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), preparerEnv+"="+sock, preparerReq+"="+w.path(t, "ctr-caller"))
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		if line, err := bufio.NewReader(stdout).ReadString('\n'); line != "prepared\n" {
			t.Fatalf("the preparer: %q %v", line, err)
		}
		cgroup := filepath.Join(w.a.host.Parent, "ctr-caller")
		id, err := bpf.CgroupID(cgroup)
		if err != nil || !w.a.host.BPF.IsPending(id) {
			t.Fatalf("prepared by a caller: %v, pending %v", err, w.a.host.BPF.IsPending(id))
		}
		_ = stdin.Close()
		_ = cmd.Wait()
		w.waitDropped(t, cgroup, id, "its caller exited")
	})
	t.Run("refused by its hook", func(t *testing.T) {
		w := newPendWorld(t, time.Hour)
		ctx := context.Background()
		pc, id := w.prepare(t, "ctr-prof", "ctr-prof")
		p := startProbe(t, pc.Cgroup)
		_, err := w.a.ContainerTrial(ctx, client.ContainerTrial{Profile: "other", Container: client.Container{ID: "ctr-prof", PID: p.pid}})
		if err == nil || !strings.Contains(err.Error(), "was prepared with profile pend") {
			t.Errorf("another profile at the hook: %v", err)
		}
		if w.a.host.BPF.HasTrial(id) {
			t.Error("a refused container's pending entry stayed")
		}
		pc, id = w.prepare(t, "ctr-else", "ctr-else")
		elsewhere := filepath.Join(w.a.host.Parent, "elsewhere")
		if err := os.Mkdir(elsewhere, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Rmdir(elsewhere) })
		p = startProbe(t, elsewhere)
		_, err = w.a.ContainerTrial(ctx, client.ContainerTrial{Profile: "pend", Container: client.Container{ID: "ctr-else", PID: p.pid}})
		if err == nil || !strings.Contains(err.Error(), "is not the one prepared for it") {
			t.Errorf("its init in another cgroup: %v", err)
		}
		w.waitDropped(t, pc.Cgroup, id, "its hook refused it")
	})
	t.Run("the agent stops", func(t *testing.T) {
		w := newPendWorld(t, time.Hour)
		pc, id := w.prepare(t, "ctr-stop", "ctr-stop")
		w.a.Close(false)
		if _, err := os.Stat(pc.Cgroup); !errors.Is(err, os.ErrNotExist) || w.a.host.BPF.HasTrial(id) {
			t.Errorf("after the agent stopped: cgroup %v, entry %v", err, w.a.host.BPF.HasTrial(id))
		}
	})
}

// An agent that starts removes the pending entries an earlier one left
// (it died between a prepare and its hook), with their empty cgroups.
func TestPrivilegedPendingLeftIsSwept(t *testing.T) {
	w := newPendWorld(t, time.Hour)
	pc, id := w.prepare(t, "ctr-left", "ctr-left")
	w.a.pend.takeAll() // as if the process had died: nothing of it is dropped
	w.a.Close(false)
	if _, err := os.Stat(pc.Cgroup); err != nil {
		t.Fatalf("the pending cgroup went with the agent that lost it: %v", err)
	}
	// One it died making: the cgroup made, its entry not yet (the crash
	// test's kills found this), named only by its mark.
	midway := filepath.Join(w.a.host.Parent, "ctr-midway")
	if err := os.Mkdir(midway, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Rmdir(midway) })
	mark := w.a.pendingMark(midway)
	if err := os.WriteFile(mark, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	a := startAgent(t, w.cfg)
	if _, err := os.Stat(pc.Cgroup); !errors.Is(err, os.ErrNotExist) || a.host.BPF.HasTrial(id) {
		t.Errorf("the next agent left the pending cgroup (%v) or its entry (%v)", err, a.host.BPF.HasTrial(id))
	}
	for _, p := range []string{midway, mark} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the next agent left %s of a prepared cgroup an agent died making: %v", p, err)
		}
	}
}

// Only a new cgroup directly under the Trial parent is prepared, for a
// known profile, once per container: never a live Trial's cgroup, a
// leftover one (a task in it would gain the entry), a deeper or
// escaping path, or a control file's name.
func TestPrivilegedPrepareRefusals(t *testing.T) {
	w := newPendWorld(t, time.Hour)
	ctx := context.Background()
	live, err := w.a.Create(ctx, trialspec.Request{ID: "pend-live"})
	if err != nil {
		t.Fatal(err)
	}
	liveID, err := bpf.CgroupID(live.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	leftover := filepath.Join(w.a.host.Parent, "leftover")
	if err := os.Mkdir(leftover, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Rmdir(leftover) })
	w.prepare(t, "ctr-once", "ctr-once")
	for _, tc := range []struct{ name, cid, profile, path, want string }{
		{"a live Trial's cgroup", "c1", "pend", w.path(t, "pend-live"), "exists already"},
		{"a leftover cgroup", "c2", "pend", w.path(t, "leftover"), "exists already"},
		{"deeper", "c3", "pend", w.path(t, "pend-live/x"), "not a cgroup directly under"},
		{"escaping", "c4", "pend", w.path(t, "../x"), "not a cgroup directly under"},
		{"relative", "c5", "pend", "x", "not a cgroup directly under"},
		{"a control file's name", "c6", "pend", w.path(t, "cgroup.procs"), "not one the agent makes"},
		{"a controller file's name", "c10", "pend", w.path(t, "memory.max"), "not one the agent makes"},
		{"another controller's", "c11", "pend", w.path(t, "pids.x"), "not one the agent makes"},
		{"a terminal escape", "c12", "pend", w.path(t, "ctr\x1b]0;owned\x07"), "not one the agent makes"},
		{"a right-to-left override", "c13", "pend", w.path(t, "ctr\u202egnp.x"), "not one the agent makes"},
		{"a space", "c14", "pend", w.path(t, "ctr x"), "not one the agent makes"},
		{"too long", "c15", "pend", w.path(t, strings.Repeat("x", 256)), "not one the agent makes"},
		{"systemd's form", "c7", "pend", "machine.slice:libpod:x", "not a cgroup directly under"},
		{"an unknown profile", "c8", "nope", w.path(t, "c8"), "unknown profile"},
		{"no profile", "c9", "", w.path(t, "c9"), "profile"},
		{"the same container twice", "ctr-once", "pend", w.path(t, "ctr-once2"), "prepared already"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := w.a.PrepareContainer(ctx, client.ContainerPrepare{Container: tc.cid, Profile: tc.profile, CgroupsPath: tc.path})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("prepare %q: %v; want refused, saying %q", tc.path, err, tc.want)
			}
		})
	}
	// The second wall, below the mkdir: no pending entry over a Trial's.
	if err := w.a.host.BPF.AddPending(liveID, 0); err == nil {
		t.Error("a pending entry was written over a live Trial's")
	}
	if w.a.host.BPF.IsPending(liveID) || !w.a.host.BPF.HasTrial(liveID) {
		t.Error("the live Trial's entry changed")
	}
	for _, name := range []string{"c8", "c9", "ctr-once2", "memory.max", "pids.x", "ctr\x1b]0;owned\x07", "ctr\u202egnp.x", "ctr x"} {
		// A directory: where the parent's controllers are on, memory.max
		// and pids.max are its interface files.
		if fi, err := os.Stat(filepath.Join(w.a.host.Parent, name)); err == nil && fi.IsDir() {
			t.Errorf("a refused prepare left cgroup %s", name)
		} else if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Errorf("look for cgroup %s: %v", name, err)
		}
	}
}

// A prepared cgroup that its runtime removed (runc and crun remove the
// cgroup of a create that failed) leaves its path free, and a live
// Trial, or another container's cgroup, may stand there before the
// pending entry goes: the drop removes its own cgroup, never what
// stands at its path now.
func TestPrivilegedPendingDropSparesItsPathReused(t *testing.T) {
	w := newPendWorld(t, time.Hour)
	ctx := context.Background()
	pc, id := w.prepare(t, "ctr-reuse", "pend-reuse")
	if err := unix.Rmdir(pc.Cgroup); err != nil {
		t.Fatal(err)
	}
	live, err := w.a.Create(ctx, trialspec.Request{ID: "pend-reuse"})
	if err != nil {
		t.Fatal(err)
	}
	liveID, err := bpf.CgroupID(live.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	// Its hook refuses the container (another profile): the entry goes,
	// at once.
	_, err = w.a.ContainerTrial(ctx, client.ContainerTrial{Profile: "other", Container: client.Container{ID: "ctr-reuse", PID: os.Getpid()}})
	if err == nil {
		t.Fatal("a container prepared with another profile was adopted")
	}
	if w.a.host.BPF.HasTrial(id) {
		t.Error("the refused container's pending entry stayed")
	}
	if _, err := os.Stat(live.Cgroup); err != nil || !w.a.host.BPF.HasTrial(liveID) {
		t.Errorf("dropping a pending entry took the live Trial's cgroup at its path (%v), or its entry (%v)", err, w.a.host.BPF.HasTrial(liveID))
	}
}

// An entry prepared with no container id (podman's precreate stage) is
// for the container whose init is in its cgroup: a container whose id
// spells the entry's key takes nothing of it, nor does a prepare under
// that id stand in its way.
func TestPrivilegedPreparedWithoutIDKeyedApart(t *testing.T) {
	w := newPendWorld(t, time.Hour)
	ctx := context.Background()
	pc, err := w.a.PrepareContainer(ctx, client.ContainerPrepare{Profile: "pend", CgroupsPath: w.path(t, "pend-noid")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Rmdir(pc.Cgroup) })
	id, err := bpf.CgroupID(pc.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.a.ContainerTrial(ctx, client.ContainerTrial{Profile: "pend", Container: client.Container{ID: "cgroup:" + pc.Cgroup, PID: os.Getpid()}})
	if err == nil {
		t.Fatal("a container outside the Trial parent was adopted")
	}
	if !w.a.host.BPF.IsPending(id) {
		t.Errorf("a container whose id spells an id-less entry's key took it: %v", err)
	}
	other := w.path(t, "pend-noid2")
	if _, err := w.a.PrepareContainer(ctx, client.ContainerPrepare{Container: "cgroup:" + filepath.Join(filepath.Dir(pc.Cgroup), "pend-noid2"), Profile: "pend", CgroupsPath: w.path(t, "pend-noid3")}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Rmdir(filepath.Join(w.a.host.Parent, "pend-noid3")) })
	pc2, err := w.a.PrepareContainer(ctx, client.ContainerPrepare{Profile: "pend", CgroupsPath: other})
	if err != nil {
		t.Errorf("a prepare under an id that spells an id-less key stood in the way of one: %v", err)
	} else {
		_ = unix.Rmdir(pc2.Cgroup)
	}
}
