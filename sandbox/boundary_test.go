//go:build linux

package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/internal/testpty"
	"golang.org/x/sys/unix"
)

// nobody is the uid the boundary tests run both sides as: same-uid access
// (ptrace, pidfd_getfd, /proc/PID/mem) is what the PID namespace must stop.
const nobody = 65534

// runProbeAs runs one probe inside tr as uid with stdio c gives, and
// returns its exit code and output.
func runProbeAs(t testing.TB, tr *Trial, uid uint32, c Command, args ...string) (int, string) {
	t.Helper()
	exe := probeExe(t)
	var out bytes.Buffer
	c.Args = append([]string{exe}, args...)
	c.Env = []string{"TRIALNET_PROBE=1", "PATH=/usr/bin:/bin"}
	c.UID, c.GID = uid, uid
	if c.Stdout == nil {
		c.Stdout, c.Stderr = &out, &out
	}
	p, err := tr.Start(c)
	if err != nil {
		t.Fatalf("probe %v: %v", args, err)
	}
	code, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	return code, strings.TrimSpace(out.String())
}

// victim starts a process outside any Trial, as uid nobody, that a Trial
// process of the same uid will try to reach; it is killed at cleanup.
func victim(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd.Process.Pid
}

func TestPrivilegedPIDNamespaceHidesTheHost(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{UnixOpen: true})
	pid := strconv.Itoa(victim(t))
	// The same attempts from a process of the same uid outside any Trial
	// succeed: that is what makes them attacks.
	for _, how := range []string{"kill0", "pidfd-getfd", "ptrace", "procmem"} {
		if code, out := unconfinedProbe(t, nobody, how, pid); code != probeOK {
			t.Fatalf("unconfined %s of a same-uid process: %d %s (the test cannot tell)", how, code, out)
		}
		code, out := runProbeAs(t, tr, nobody, Command{}, how, pid)
		if code == probeOK || !strings.Contains(out, "ESRCH") && !strings.Contains(out, "ENOENT") {
			t.Errorf("%s of a process outside the Trial: %d %q, want ESRCH or ENOENT (it must not exist for the Trial)", how, code, out)
		}
	}
	code, out := runProbeAs(t, tr, nobody, Command{}, "procs")
	var n, self int
	var pid1 string
	if _, err := fmt.Sscanf(out, "procs %d pid1 %s self %d", &n, &pid1, &self); err != nil || code != probeOK {
		t.Fatalf("procs: %d %q %v", code, out, err)
	}
	if pid1 != initArg0 || n > 2 || self == 0 {
		t.Errorf("inside the Trial: %d processes, PID 1 is %q, own pid %d; want only the Trial's own (trialnet-init and the probe)", n, pid1, self)
	}
	// The init holds nothing worth taking over: no capability, and the
	// commands' seccomp filter on every thread.
	init, err := findInit(tr.Cgroup)
	if err != nil || init.pidfd < 0 {
		t.Fatalf("the Trial's init: %v", err)
	}
	defer unix.Close(init.pidfd)
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", init.pid))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("the init's threads: %v %v", tasks, err)
	}
	for _, task := range tasks {
		st, err := os.ReadFile(task)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"CapPrm:\t0000000000000000", "CapEff:\t0000000000000000", "CapBnd:\t0000000000000000",
			"CapAmb:\t0000000000000000", "NoNewPrivs:\t1", "Seccomp:\t2"} {
			if !strings.Contains(string(st), want) {
				t.Errorf("thread %s of the Trial's init lacks %q", task, want)
			}
		}
	}
}

// An init whose launcher died before it was ready (killed, OOM, a
// timeout) is still setting the Trial up: the next launcher must not run
// a command in it, which would see the host's /proc and devpts, but end
// it and start another.
func TestPrivilegedOrphanedInitIsReplaced(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{UnixOpen: true})
	cg, err := os.Open(tr.Cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	var orphan initProc
	for try := 0; ; try++ {
		p, ready, err := tr.startInit(cg, "")
		if err != nil {
			t.Fatal(err)
		}
		// Frozen mid set-up, as a launcher that died leaves it for good.
		_ = unix.PidfdSendSignal(p.pidfd, unix.SIGSTOP, nil, 0)
		time.Sleep(20 * time.Millisecond)
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.pid))
		t.Cleanup(func() {
			_ = unix.PidfdSendSignal(p.pidfd, unix.SIGKILL, nil, 0)
			_ = ready() // reaps it
			_ = unix.Close(p.pidfd)
		})
		if strings.HasPrefix(string(cmd), initSetupArg0+"\x00") {
			orphan = p
			break
		}
		if try == 5 {
			t.Fatalf("the init was never caught setting up (cmdline %q)", cmd)
		}
		_ = unix.PidfdSendSignal(p.pidfd, unix.SIGKILL, nil, 0)
	}
	code, out := runProbeAs(t, tr, nobody, Command{}, "procs")
	var n, self int
	var pid1 string
	if _, err := fmt.Sscanf(out, "procs %d pid1 %s self %d", &n, &pid1, &self); err != nil || code != probeOK {
		t.Fatalf("procs: %d %q %v", code, out, err)
	}
	if pid1 != initArg0 || n > 2 {
		t.Errorf("a command joined the orphaned init: %d processes, PID 1 is %q; want a new init's /proc", n, pid1)
	}
	var st unix.Stat_t
	for deadline := time.Now().Add(5 * time.Second); unix.Stat(fmt.Sprintf("/proc/%d/task", orphan.pid), &st) == nil && testkit.ProcState(orphan.pid) != 'Z'; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the orphaned init %d still runs (state %c)", orphan.pid, testkit.ProcState(orphan.pid))
		}
	}
}

// A Trial's init that crashes takes every process of the Trial with it;
// the launch that started it says so, with what the init said, instead
// of a bare 137.
func TestPrivilegedInitCrashIsReported(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{UnixOpen: true})
	p, err := tr.Start(Command{Args: []string{"/bin/sleep", "30"}, Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody})
	if err != nil {
		t.Fatal(err)
	}
	init, err := findInit(tr.Cgroup)
	if err != nil || init.pidfd < 0 {
		t.Fatalf("the Trial's init: %v", err)
	}
	// SIGABRT is one signal the reaper does not ignore: it says so and
	// dies of it, as a crash would (the Go reaper of a CGO_ENABLED=0
	// build dumps its goroutines). A PID 1 gets only
	// signals it handles, so wait until the reaper runs (it ignores
	// SIGTERM then, and handles the rest).
	for deadline := time.Now().Add(5 * time.Second); !ignores(init.pid, unix.SIGTERM); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the Trial's init never ran its reaper")
		}
	}
	_ = unix.PidfdSendSignal(init.pidfd, unix.SIGABRT, nil, 0)
	_ = unix.Close(init.pidfd)
	code, err := p.Wait()
	if code != 128+int(unix.SIGKILL) || err == nil || !strings.Contains(err.Error(), "init (its PID 1) crashed") || !strings.Contains(err.Error(), "SIGABRT") {
		t.Fatalf("exit %d, %v; want 137 and the init's crash", code, err)
	}
}

// A fresh Trial's first command with a working directory under /proc is
// forked only once the init has mounted the Trial's /proc: the directory
// is resolved at the fork, and would otherwise be the host's.
func TestPrivilegedFirstCommandDirIsTheTrials(t *testing.T) {
	for i := range 5 {
		h := newHost(t)
		tr := newTrial(t, h, trial.Spec{UnixOpen: true})
		var out bytes.Buffer
		code, err := tr.Exec(context.Background(), Command{Args: []string{"/bin/cat", "cmdline"}, Dir: "/proc/1",
			Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody, Stdout: &out, Stderr: &out}, nil)
		if err != nil || code != 0 || out.String() != initArg0+"\x00" {
			t.Fatalf("try %d: cat /proc/1/cmdline from the first command's working directory: exit %d, %v, %q; want the Trial's init", i, code, err, out.String())
		}
	}
}

// ignores reports whether pid ignores sig (SigIgn in its status).
func ignores(pid int, sig unix.Signal) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "SigIgn:\t"); ok {
			mask, err := strconv.ParseUint(v, 16, 64)
			return err == nil && mask&(1<<(uint(sig)-1)) != 0
		}
	}
	return false
}

// execStarts are the two ways a trialnet-exec starts: an exec of
// trialnet, whose constructor (or trialExec) does its steps, and
// startCommand's one clone, whose child does them (the first again in a
// CGO_ENABLED=0 build).
var execStarts = []struct {
	name  string
	start func(*exec.Cmd) error
}{
	{"exec of trialnet", (*exec.Cmd).Start},
	{"one clone", func(cmd *exec.Cmd) error {
		_, err := startCommand(cmd, func(fn func() error) error { return fn() })
		return err
	}},
}

// trialnet-exec starts while a new Trial's init still sets the Trial up:
// it must run nothing of the command until the launcher's byte says the
// init is ready, and nothing at all when the launcher gives up instead.
func TestPrivilegedExecWaitsForTheReadyInit(t *testing.T) {
	privtest.Require(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, start := range execStarts {
		for _, ready := range []bool{false, true} {
			ran := filepath.Join(t.TempDir(), "ran")
			errR, errW, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			goR, goW, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			filter, err := seccompFile(false)
			if err != nil {
				t.Fatal(err)
			}
			cmd := &exec.Cmd{Path: exe, Args: []string{execArg0, "0", "0", "64", socketsAnywhere, "--", "touch", ran},
				Env: []string{"PATH=/usr/bin:/bin"}, ExtraFiles: []*os.File{errW, goR, filter}}
			if err := start.start(cmd); err != nil {
				t.Fatal(err)
			}
			_ = errW.Close()
			_ = goR.Close()
			if ready {
				_, _ = goW.Write([]byte{0})
			}
			_ = goW.Close()
			msg, _ := io.ReadAll(errR)
			_ = errR.Close()
			_ = cmd.Wait()
			_, statErr := os.Stat(ran)
			if ready && (statErr != nil || len(msg) > 0) {
				t.Errorf("%s, with the byte: the command did not run (%v; %q)", start.name, statErr, msg)
			}
			if !ready && (statErr == nil || cmd.ProcessState.ExitCode() != ExitCannotExecute || !strings.Contains(string(msg), "did not become ready")) {
				t.Errorf("%s, without the byte: the command ran (%v), exit %d, %q; want exit %d and nothing run",
					start.name, statErr == nil, cmd.ProcessState.ExitCode(), msg, ExitCannotExecute)
			}
		}
	}
}

// (uid_t)-1 and (gid_t)-1 mean "no change" to setresuid and setresgid:
// trialnet-exec handed either must refuse it, not run the command as the
// root it starts as.
func TestPrivilegedExecRefusesNoChangeIDs(t *testing.T) {
	privtest.Require(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	filter, err := seccompFile(false)
	if err != nil {
		t.Fatal(err)
	}
	for _, start := range execStarts {
		for _, ids := range [][2]string{{"4294967295", "0"}, {"65534", "4294967295"}} {
			dir := t.TempDir()
			if err := os.Chmod(dir, 0o777); err != nil {
				t.Fatal(err)
			}
			ran := filepath.Join(dir, "ran")
			errR, errW, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			goR, goW, err := os.Pipe()
			if err != nil {
				t.Fatal(err)
			}
			cmd := &exec.Cmd{Path: exe, Args: []string{execArg0, ids[0], ids[1], "64", socketsAnywhere, "--", "touch", ran},
				Env: []string{"PATH=/usr/bin:/bin"}, ExtraFiles: []*os.File{errW, goR, filter}}
			if err := start.start(cmd); err != nil {
				t.Fatal(err)
			}
			_ = errW.Close()
			_ = goR.Close()
			_, _ = goW.Write([]byte{0})
			_ = goW.Close()
			msg, _ := io.ReadAll(errR)
			_ = errR.Close()
			_ = cmd.Wait()
			var st unix.Stat_t
			statErr := unix.Stat(ran, &st)
			if statErr == nil || cmd.ProcessState.ExitCode() != ExitCannotExecute || !strings.Contains(string(msg), "bad arguments") {
				t.Errorf("%s, uid %s gid %s: exit %d, %q, command ran: %v (as uid %d); want exit %d, bad arguments, nothing run",
					start.name, ids[0], ids[1], cmd.ProcessState.ExitCode(), msg, statErr == nil, st.Uid, ExitCannotExecute)
			}
		}
	}
}

// unconfinedProbe runs the probe as uid outside any Trial.
func unconfinedProbe(t testing.TB, uid uint32, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(probeExe(t), args...)
	cmd.Env = []string{"TRIALNET_PROBE=1"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	out, err := cmd.CombinedOutput()
	if err != nil && cmd.ProcessState == nil {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), strings.TrimSpace(string(out))
}

func TestPrivilegedCommandsShareTheTrialPIDNamespace(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{UnixOpen: true})
	env := []string{"PATH=/usr/bin:/bin"}
	first, err := tr.Start(Command{Args: []string{"sleep", "30"}, Env: env})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = first.Signal(syscall.SIGKILL)
		_, _ = first.Wait()
	}()
	var out bytes.Buffer
	p, err := tr.Start(Command{Args: []string{"sh", "-c", "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done"}, Env: env, Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if code, err := p.Wait(); err != nil || code != 0 {
		t.Fatalf("list: %d %v", code, err)
	}
	if !strings.Contains(out.String(), "sleep 30") || !strings.Contains(out.String(), initArg0) {
		t.Errorf("a second command does not see the first one and the Trial's init:\n%s", out.String())
	}
}

func TestPrivilegedSeccompFamiliesAndIoctls(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{UnixOpen: true})
	for _, tc := range []struct {
		name string
		args []string
		want string // the errno name, or "ok"
	}{
		{"unix", []string{"socket", "1"}, "ok"},
		{"inet", []string{"socket", "2"}, "ok"},
		{"inet6", []string{"socket", "10"}, "ok"},
		{"vsock", []string{"socket", "40"}, "EAFNOSUPPORT"},
		{"vsock with high bits the kernel drops", []string{"socket", "0x100000028"}, "EAFNOSUPPORT"},
		{"packet", []string{"socket", "17"}, "EAFNOSUPPORT"},
		// The kernel makes inet's SOCK_PACKET as AF_PACKET, whose own
		// refusal (no CAP_NET_RAW) is EPERM: only EAFNOSUPPORT is the filter.
		{"packet through inet's SOCK_PACKET", []string{"socket", "2", "10", "0"}, "EAFNOSUPPORT"},
		{"SOCK_PACKET with high bits the kernel drops", []string{"socket", "2", "0x10008080a", "0"}, "EAFNOSUPPORT"},
		{"bluetooth", []string{"socket", "31"}, "EAFNOSUPPORT"},
		{"alg", []string{"socket", "38"}, "EAFNOSUPPORT"},
		{"a family no kernel has yet", []string{"socket", "50"}, "EAFNOSUPPORT"},
		{"tcp by protocol number", []string{"socket", "2", "1", "6"}, "ok"},
		{"udp6 by protocol number", []string{"socket", "10", "2", "17"}, "ok"},
		{"route netlink (getifaddrs)", []string{"socket", "16", "3", "0"}, "ok"},
		// Protocols this kernel has built in, so that only the filter
		// refuses them; those it would load a module for (SCTP, DCCP)
		// are TestSeccompProgram's.
		{"mptcp", []string{"socket", "2", "1", "262"}, "EPROTONOSUPPORT"},
		{"mptcp with high bits the kernel drops", []string{"socket", "2", "1", "0x100000106"}, "EPROTONOSUPPORT"},
		{"generic netlink (built in)", []string{"socket", "16", "3", "16"}, "EPROTONOSUPPORT"},
		{"sock_diag netlink", []string{"socket", "16", "3", "4"}, "EPROTONOSUPPORT"},
		{"io_uring (IORING_OP_SOCKET takes any family)", []string{"io_uring"}, "ENOSYS"},
		{"a user namespace through unshare", []string{"userns"}, "EPERM"},
		{"a user namespace through clone", []string{"clone-userns"}, "EPERM"},
		// The key service (request_key runs a helper as root outside the
		// Trial), and calls whose reach depends on host sysctls. Called
		// with zero arguments, each fails otherwise with EINVAL, EFAULT,
		// EPERM or ENOKEY: only ENOSYS is the filter.
		{"add_key", []string{"syscall", strconv.Itoa(unix.SYS_ADD_KEY)}, "ENOSYS"},
		{"request_key", []string{"syscall", strconv.Itoa(unix.SYS_REQUEST_KEY)}, "ENOSYS"},
		{"keyctl", []string{"syscall", strconv.Itoa(unix.SYS_KEYCTL)}, "ENOSYS"},
		{"bpf", []string{"syscall", strconv.Itoa(unix.SYS_BPF)}, "ENOSYS"},
		{"perf_event_open", []string{"syscall", strconv.Itoa(unix.SYS_PERF_EVENT_OPEN)}, "ENOSYS"},
		{"userfaultfd", []string{"syscall", strconv.Itoa(unix.SYS_USERFAULTFD)}, "ENOSYS"},
		{"io_setup", []string{"syscall", strconv.Itoa(unix.SYS_IO_SETUP)}, "ENOSYS"},
		// fd 0 is no pidfd: EBADF, but for the filter.
		{"pidfd_getfd", []string{"syscall", strconv.Itoa(unix.SYS_PIDFD_GETFD)}, "ENOSYS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, out := runProbeAs(t, tr, 0, Command{}, tc.args...)
			if out != tc.want {
				t.Errorf("%v: %q, want %q", tc.args, out, tc.want)
			}
		})
	}
	// TIOCSTI, TIOCLINUX and TIOCSETD on the command's own terminal: the
	// kernel would allow TIOCSTI there, and TIOCSETD (EINVAL with a null
	// argument); the filter does not.
	_, userSlave := testpty.Open(t, 24, 80)
	for _, cmd := range []string{"0x5412", "0x100005412", "0x541c", "0x5423"} {
		_, out := runProbeAs(t, tr, nobody, Command{Stdin: userSlave}, "ioctl0", cmd)
		if out != "EPERM" {
			t.Errorf("ioctl %s on the Trial's terminal: %q, want EPERM", cmd, out)
		}
	}
}

// A Trial is the OOM killer's first choice, its init too: memory it
// allocates without end costs the Trial, not the agent or the host's
// services. (A Trial may lower its own score back to 0, the default; not
// below, which needs CAP_SYS_RESOURCE.)
func TestPrivilegedTrialIsOOMFirst(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	for _, pid := range []string{"self", "1"} {
		var out bytes.Buffer
		p, err := tr.Start(Command{Args: []string{"cat", "/proc/" + pid + "/oom_score_adj"}, Env: []string{"PATH=/usr/bin:/bin"},
			UID: nobody, GID: nobody, Stdout: &out, Stderr: &out})
		if err != nil {
			t.Fatal(err)
		}
		if code, err := p.Wait(); err != nil || code != 0 || strings.TrimSpace(out.String()) != "1000" {
			t.Errorf("/proc/%s/oom_score_adj in the Trial: %q (exit %d, %v), want 1000", pid, out.String(), code, err)
		}
	}
}

func TestPrivilegedTerminalIsRelayed(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{UnixOpen: true})
	master, slave := testpty.Open(t, 33, 111)
	user := struct{ master, slave *os.File }{master, slave}
	userName, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", user.slave.Fd()))
	script := `stty size; tty; trap 'echo got-int; exit 7' INT; echo ready; while :; do sleep 0.05; done`
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(user.master)
		for sc.Scan() {
			lines <- strings.TrimSpace(sc.Text())
		}
		close(lines)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan int, 1)
	go func() {
		code, err := tr.Exec(ctx, Command{Args: []string{"sh", "-c", script}, Env: []string{"PATH=/usr/bin:/bin"},
			UID: nobody, GID: nobody, Stdin: user.slave, Stdout: user.slave, Stderr: user.slave}, nil)
		if err != nil {
			t.Error(err)
		}
		done <- code
	}()
	var seen []string
	for l := range lines {
		seen = append(seen, l)
		if l == "ready" {
			break
		}
	}
	if len(seen) < 3 || seen[0] != "33 111" {
		t.Errorf("window size inside the Trial: %q, want 33 111", seen)
	}
	if len(seen) >= 2 && !strings.HasPrefix(seen[1], "/dev/pts/") {
		t.Errorf("inside the Trial, tty says %q: the command's terminal must have a name there", seen[1])
	}
	// Whatever its name, it is not the caller's terminal: another devpts
	// instance (st_dev) or another device.
	var mine unix.Stat_t
	if err := unix.Fstat(int(user.slave.Fd()), &mine); err != nil {
		t.Fatal(err)
	}
	for _, pid := range trialProcs(t, tr) {
		var st unix.Stat_t
		if err := unix.Stat("/proc/"+pid+"/fd/0", &st); err == nil && st.Dev == mine.Dev && st.Rdev == mine.Rdev {
			t.Errorf("Trial process %s holds the caller's terminal (%s) as stdin", pid, userName)
		}
	}
	// ^C typed on the caller's terminal reaches the command as SIGINT.
	if _, err := user.master.Write([]byte{3}); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 7 {
			t.Errorf("after ^C: exit %d, want 7 (the INT trap)", code)
		}
	case <-ctx.Done():
		t.Fatal("^C did not reach the command")
	}
	var rest []string
	for {
		select {
		case l := <-lines:
			rest = append(rest, l)
			continue
		case <-time.After(300 * time.Millisecond):
		}
		break
	}
	if !strings.Contains(strings.Join(rest, "\n"), "got-int") {
		t.Errorf("the command's last output did not reach the caller's terminal: %q", rest)
	}
	// The caller's terminal is back in its own mode.
	tio, err := unix.IoctlGetTermios(int(user.slave.Fd()), unix.TCGETS)
	if err != nil || tio.Lflag&unix.ICANON == 0 || tio.Lflag&unix.ECHO == 0 {
		t.Errorf("the caller's terminal was left raw: %+v %v", tio, err)
	}
}

var probeCopy struct {
	sync.Once
	path string
	err  error
}

// probeExe is a copy of the test binary that any uid can run (the build
// directory is private to root), removed when the tests end.
func probeExe(t testing.TB) string {
	t.Helper()
	probeCopy.Do(func() {
		exe, err := os.Executable()
		if err != nil {
			probeCopy.err = err
			return
		}
		dir, err := privtest.MakeSharedDir("probe-")
		if err != nil {
			probeCopy.err = err
			return
		}
		cleanups = append(cleanups, func() { _ = os.RemoveAll(dir) })
		probeCopy.path = filepath.Join(dir, "probe")
		b, err := os.ReadFile(exe)
		if err == nil {
			err = os.WriteFile(probeCopy.path, b, 0o755)
		}
		probeCopy.err = err
	})
	if probeCopy.err != nil {
		t.Fatal(probeCopy.err)
	}
	return probeCopy.path
}

// Without the BPF LSM layer an allowed unix socket is known by its path:
// a path that anyone but root could point elsewhere is refused at
// create. With the layer, the socket's identity decides and any path is
// fine.
func TestPrivilegedUnixAllowPathsOnlyRootCanChange(t *testing.T) {
	h := newHost(t)
	dir := t.TempDir() // root's, 0700, under sticky /tmp
	bind := func(path string) {
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
	}
	safe := filepath.Join(dir, "safe.sock")
	bind(safe)
	open := filepath.Join(dir, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	inOpen := filepath.Join(open, "x.sock")
	bind(inOpen)
	owned := filepath.Join(dir, "owned.sock")
	bind(owned)
	if err := os.Chown(owned, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.sock")
	if err := os.Symlink(inOpen, link); err != nil {
		t.Fatal(err)
	}
	// A sticky directory outside the Trial's own ones (as /run/lock is):
	// root's socket there cannot be moved, but while it is gone (its
	// service restarting) a Trial may put a symlink to another socket at
	// its name, which the Trial then reaches by the allowed path.
	sticky, err := os.MkdirTemp("/run", "trialnet-test-sticky-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sticky) })
	if err := os.Chmod(sticky, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	inSticky := filepath.Join(sticky, "x.sock")
	bind(inSticky)
	if _, err := h.Create(trial.Spec{ID: "u-safe", UnixAllow: []string{safe}}, nil); err != nil {
		t.Fatalf("a root-only path was refused: %v", err)
	} else {
		t.Cleanup(func() { _ = h.Remove("u-safe") })
	}
	for i, p := range []string{inOpen, owned, link, inSticky} {
		tr, err := h.Create(trial.Spec{ID: fmt.Sprintf("u-%d", i), UnixAllow: []string{p}}, nil)
		if h.BPF.LSM() {
			if err != nil {
				t.Errorf("%s with the LSM layer: %v", p, err)
			} else {
				_, _ = tr.Close()
			}
			continue
		}
		if err == nil {
			_, _ = tr.Close()
			t.Errorf("%s was allowed without the LSM layer, though a non-root user can change what it leads to", p)
		} else if !strings.Contains(err.Error(), "BPF LSM") {
			t.Errorf("%s: the refusal does not say why: %v", p, err)
		}
	}
}

// A socket given as stdio never reaches the Trial: the command gets pipes
// and trialnet copies, both ways. (Its peer could be a process outside the
// Trial: SO_PEERPIDFD would give a pidfd of it.)
func TestPrivilegedSocketStdioIsCopiedNotHandedIn(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{UnixOpen: true})
	ours, theirs := streamPair(t)
	if _, err := ours.Write([]byte("from-outside\n")); err != nil {
		t.Fatal(err)
	}
	code, err := tr.Exec(context.Background(), Command{Args: []string{"sh", "-c", "read line; echo got:$line; ls -l /proc/self/fd/0 /proc/self/fd/1"},
		Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody, Stdin: theirs, Stdout: theirs}, nil)
	if err != nil || code != 0 {
		t.Fatalf("exit %d, %v", code, err)
	}
	_ = ours.SetReadDeadline(time.Now().Add(5 * time.Second))
	var out bytes.Buffer
	buf := make([]byte, 4096)
	for !strings.Contains(out.String(), "/proc/self/fd/1") {
		n, err := ours.Read(buf)
		if err != nil {
			break
		}
		out.Write(buf[:n])
	}
	if !strings.Contains(out.String(), "got:from-outside") {
		t.Errorf("the socket's data did not flow through the Trial: %q", out.String())
	}
	if strings.Contains(out.String(), "socket:[") || !strings.Contains(out.String(), "pipe:[") {
		t.Errorf("the command holds a socket as stdio, want pipes: %q", out.String())
	}
}

// Launching joins a Trial's namespaces on a thread that then ends, never
// on the main thread, which Go keeps: the process's own view (/proc/self
// is the main thread's) stays the host's, launch after launch.
func TestPrivilegedLaunchesLeaveTheMainThreadAlone(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	before, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		if code, out := runProbeAs(t, tr, nobody, Command{}, "status"); code < 0 {
			t.Fatalf("launch %d: %d %s", i, code, out)
		}
		if after, _ := os.Readlink("/proc/self/ns/mnt"); after != before {
			t.Fatalf("after %d launches the main thread is in %s, not the host's %s", i+1, after, before)
		}
	}
}

// Output to a file opened for writing alone never reaches the Trial as
// that file: opened again through /proc/self/fd, where the kernel checks
// the file's mode but no directory on its path, it gave the Trial what
// earlier runs had appended to a log in a directory its uid cannot
// enter. The command gets a pipe, and what it writes still lands in the
// file.
func TestPrivilegedWriteOnlyStdioIsNotReadBack(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	dir := t.TempDir() // root's, 0700: nobody cannot enter it
	log := filepath.Join(dir, "runs.log")
	const secret = "an-earlier-run-wrote-this"
	if err := os.WriteFile(log, []byte(secret+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := os.OpenFile(log, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	in, err := os.Open("/etc/hostname")
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var read bytes.Buffer
	code, err := tr.Exec(context.Background(), Command{Args: []string{"sh", "-c",
		"echo fds: $(readlink /proc/$$/fd/0) $(readlink /proc/$$/fd/1); exec 3</proc/self/fd/1 && cat <&3 >&2"},
		Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody, Stdin: in, Stdout: out, Stderr: &read}, nil)
	if err != nil {
		t.Fatalf("exit %d, %v", code, err)
	}
	if strings.Contains(read.String(), secret) {
		t.Errorf("the Trial read its output file back (exit %d): %q", code, read.String())
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if _, fds, _ := strings.Cut(string(b), "fds: "); !strings.HasPrefix(fds, "pipe:[") || strings.Count(fds, "pipe:[") != 2 {
		t.Errorf("want stdin and stdout pipes of trialnet's (stdin: see stdin_test.go), the output landing in the file: %q", b)
	}
}

// A pipe is its maker's (mode 0600): one the Trial's uid made, given as
// stdout, it could open again for reading through /proc/self/fd and take
// what other writers of the pipe sent (same-uid Trials sharing one
// pipe). It gets a pipe of trialnet's instead, and the reader of the
// caller's pipe gets everything.
func TestPrivilegedStdoutPipeOfTheTrialsUidIsNotReadBack(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if err := unix.Fchown(int(w.Fd()), nobody, nobody); err != nil {
		t.Fatal(err)
	}
	const other = "another-writer-sent-this"
	if _, err := w.WriteString(other); err != nil {
		t.Fatal(err)
	}
	var read bytes.Buffer
	code, err := tr.Exec(context.Background(), Command{Args: []string{"sh", "-c",
		fmt.Sprintf("exec 3</proc/self/fd/1 && head -c %d <&3 >&2", len(other))},
		Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody, Stdout: w, Stderr: &read}, nil)
	if err != nil {
		t.Fatalf("exit %d, %v", code, err)
	}
	if strings.Contains(read.String(), other) {
		t.Errorf("the Trial took another writer's output from its stdout pipe (exit %d): %q", code, read.String())
	}
	_ = w.Close()
	got, _ := io.ReadAll(r)
	if !strings.Contains(string(got), other) {
		t.Errorf("the pipe's reader lost the other writer's output: %q (the Trial: exit %d, %q)", got, code, read.String())
	}
}

// Stdout and stderr that are one file (run >log 2>&1: two descriptors,
// two *os.File) reach a command copied through one pipe, as exec.Cmd
// does for one writer: through two, each copied on its own, what the
// command wrote to the one and then the other could land in the file
// in either order.
func TestPrivilegedOneOutputFileIsOnePipe(t *testing.T) {
	h := newHost(t)
	tr := newTrial(t, h, trial.Spec{})
	log := filepath.Join(t.TempDir(), "run.log")
	out, err := os.OpenFile(log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	fd, err := unix.FcntlInt(out.Fd(), unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		t.Fatal(err)
	}
	errs := os.NewFile(uintptr(fd), log)
	defer errs.Close()
	code, err := tr.Exec(context.Background(), Command{Args: []string{"sh", "-c",
		`echo "$(readlink /proc/$$/fd/1)"; echo "$(readlink /proc/$$/fd/2)" >&2`},
		Env: []string{"PATH=/usr/bin:/bin"}, UID: nobody, GID: nobody, Stdout: out, Stderr: errs}, nil)
	if err != nil || code != 0 {
		t.Fatalf("exit %d, %v", code, err)
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(b))
	if len(lines) != 2 || lines[0] != lines[1] || !strings.HasPrefix(lines[0], "pipe:[") {
		t.Errorf("want stdout and stderr one pipe, as the one file they are: %q", b)
	}
}
