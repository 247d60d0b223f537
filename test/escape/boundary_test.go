//go:build linux

package escape

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/internal/testpty"
	"github.com/trialnet/trialnet/netns"
	"github.com/trialnet/trialnet/sandbox"
	"golang.org/x/sys/unix"
)

// The process-boundary attempts: around the network layers rather than
// through them. Each is confirmed at a receiver outside the Trial: a
// listener in the host's namespace for the stolen socket and for the
// victim made to connect (ptrace, /proc/PID/mem); the operator's
// terminal's input for TIOCSTI; the forbidden unix socket's listener for
// the bind mount. Socket families are confirmed by socket() itself: a
// vsock or other socket is the way out, there is nothing to send to.
var boundaryAttempts = []string{"steal-socket-pidfd", "victim-ptrace-poke", "victim-proc-mem", "tiocsti",
	"steal-via-stdio-peer", "steal-via-allowed-unix-peer", "signal-via-allowed-unix-peer", "handed-socket-connect", "socket-vsock", "userns-bind-mount-unix",
	"ipc-sysv-shm", "ipc-posix-shm", "ipc-mqueue", "keyring-read", "keyctl-i386", "request-key-upcall", "shared-dir-file"}

// unixSpellings are the forbidden socket's path spelled otherwise by
// escapee (procfs, relative, an O_PATH descriptor, the Trial's own /tmp).
// A connect that succeeds reached that socket's listener, the only one
// at its inode: the escapee's own word is the receiver.
var unixSpellings = []string{"unix-via-proc-root", "unix-via-proc-cwd", "unix-relative", "unix-via-opath-dir",
	"unix-via-opath-socket", "unix-tmp-symlink", "unix-tmp-dir-symlink", "unix-tmp-dotdot"}

// beyondLSM are the attempts the BPF LSM layer does not claim: the
// Trial's IPC namespace, its own /dev/shm, the seccomp filter (no key
// calls) and its PID namespace (pidfd_send_signal reaches only that
// namespace and those below it: EINVAL; the layer has no task_kill
// program) stop them, and the LSM-only configuration has none of those.
var beyondLSM = map[string]bool{"signal-via-allowed-unix-peer": true, "ipc-sysv-shm": true, "ipc-posix-shm": true, "ipc-mqueue": true,
	"keyring-read": true, "keyctl-i386": true, "request-key-upcall": true, "shared-dir-file": true}

// needLSM are the attempts only the BPF LSM layer refuses: a socket made
// outside the Trial, handed in over an allowed unix socket, is judged by
// no cgroup hook (they run for the socket's cgroup, not the task's), and
// passing it is no syscall seccomp can tell apart. Without the layer it
// gets out, and SECURITY.md says so.
var needLSM = map[string]bool{"handed-socket-connect": true}

// noI386Entry is keyctl-i386 where there is no i386 entry to try: a
// kernel whose int $0x80 faults, or another architecture. The kernel
// matrix's guests have the entry.
func noI386Entry(r Result) bool { return r.Name == "keyctl-i386" && r.Result == "skipped" }

// victimSockets matches escapee's: one TCP socket, and one host listener,
// per attempt that takes one.
const victimSockets = 7

// boundaryWorld is what the attempts aim at, all outside any Trial.
type boundaryWorld struct {
	targets     []string       // listeners on the host's 127.0.0.1, one per victim socket
	arrived     []atomic.Int64 // connections each listener saw
	victim      *exec.Cmd
	pid         int
	fds         string
	boxes       string
	allowed     string   // a unix socket the Trial may use, served by the victim
	forbidden   string   // and one it may not
	peer        *os.File // a connection to the victim's socket: the Trial's stdin
	reachedUnix atomic.Int64
	operator    *os.File // the operator's terminal (pty master)
	opSlave     *os.File
	// The victim's IPC objects: a System V segment, a /dev/shm file, a
	// message queue and a user key, whose payload is keySecret.
	ipc             string
	shmID           int
	shmFile, mqName string
	keySecret       string
	// shared is a file the Trial makes in the host's /run/lock, where
	// every user may write and another Trial would read it.
	shared string
}

func newBoundaryWorld(t *testing.T) *boundaryWorld {
	t.Helper()
	w := &boundaryWorld{arrived: make([]atomic.Int64, victimSockets)}
	for i := range victimSockets {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		w.targets = append(w.targets, ln.Addr().String())
		go countAccepts(ln, &w.arrived[i])
	}
	// Sockets a uid-65534 process can reach, in directories only root
	// can change (the rule without the BPF LSM layer).
	dir := privtest.SharedDir(t, "boundary-")
	w.allowed, w.forbidden = filepath.Join(dir, "allowed.sock"), filepath.Join(dir, "forbidden.sock")
	ln, err := net.Listen("unix", w.forbidden)
	if err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(w.forbidden, 0o777)
	t.Cleanup(func() { _ = ln.Close() })
	go countAccepts(ln, &w.reachedUnix)
	w.startVictim(t, dir)
	w.operator, w.opSlave = testpty.Open(t, 24, 80)
	w.shared = sharedLockFile(t)
	return w
}

// sharedLockFile names a file, not made, in the host's /run/lock (made
// 1777 where the host has none, as a VM guest's initramfs), removed at
// cleanup.
func sharedLockFile(t *testing.T) string {
	t.Helper()
	const dir = "/run/lock"
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		if err := os.Chmod(dir, 0o1777); err != nil {
			t.Fatal(err)
		}
	}
	p := filepath.Join(dir, fmt.Sprintf("trialnet-escape-%d", time.Now().UnixNano()))
	t.Cleanup(func() { _ = os.Remove(p) })
	return p
}

func countAccepts(ln net.Listener, n *atomic.Int64) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		n.Add(1)
		_ = c.Close()
	}
}

// startVictim runs escapee -mode victim as uid 65534 in the host's
// namespaces and a cgroup outside trialnet: the operator's own process, and
// the server of the Trial's allowed unix socket. It binds that socket in a
// directory of its own; the socket is then moved into dir and given to
// root, so that the path is one only root can change, as the rule without
// the BPF LSM layer wants: the server's uid is what matters here.
func (w *boundaryWorld) startVictim(t *testing.T, dir string) {
	t.Helper()
	own, err := os.MkdirTemp(privtest.SharedParent, "victim-")
	if err == nil {
		err = os.Chown(own, 65534, 65534)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(own) })
	bound := filepath.Join(own, "victim.sock")
	w.keySecret = fmt.Sprintf("victim-secret-%d", time.Now().UnixNano())
	cmd := exec.Command(escapee(t), "-mode", "victim", "-targets", strings.Join(w.targets, ","), "-listen-unix", bound,
		"-key-secret", w.keySecret)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	f := strings.Fields(line)
	if err != nil || len(f) != 4 {
		t.Fatalf("victim: %q %v", line, err)
	}
	w.victim, w.fds, w.boxes, w.ipc = cmd, f[1], f[2], f[3]
	w.pid, _ = strconv.Atoi(f[0])
	ipc := strings.Split(w.ipc, ",")
	w.shmID, _ = strconv.Atoi(ipc[0])
	w.shmFile, w.mqName = ipc[1], ipc[2]
	t.Cleanup(func() {
		_ = os.Remove(w.shmFile)
		_ = mqUnlink(w.mqName)
	})
	if err := os.Rename(bound, w.allowed); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(w.allowed, 0, 0); err != nil {
		t.Fatal(err)
	}
	_ = os.Chmod(w.allowed, 0o777)
	c, err := net.Dial("unix", w.allowed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if w.peer, err = c.(*net.UnixConn).File(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.peer.Close() })
}

func (w *boundaryWorld) args(t *testing.T) []string {
	return []string{escapee(t), "-mode", "boundary", "-victim-pid", strconv.Itoa(w.pid), "-victim-fds", w.fds,
		"-victim-boxes", w.boxes, "-targets", strings.Join(w.targets, ","),
		"-allowed-unix", w.allowed, "-forbidden-unix", w.forbidden, "-victim-ipc", w.ipc, "-shared-file", w.shared}
}

// ipcMarked says whether the Trial's mark reached the victim's segment,
// its /dev/shm file, or its queue; each read here, in the host's IPC
// namespace.
func (w *boundaryWorld) ipcMarked() (shm, file, mq bool) {
	if b, err := unix.SysvShmAttach(w.shmID, 0, unix.SHM_RDONLY); err == nil {
		shm = bytes.HasPrefix(b, []byte(ipcMark))
		_ = unix.SysvShmDetach(b)
	}
	if b, err := os.ReadFile(w.shmFile); err == nil {
		file = string(b) == ipcMark
	}
	if fd, err := mqOpen(w.mqName, unix.O_RDONLY|unix.O_NONBLOCK); err == nil {
		var attr [8]int64 // struct mq_attr: flags, maxmsg, msgsize, curmsgs, reserved
		_, _, errno := unix.Syscall(unix.SYS_MQ_GETSETATTR, uintptr(fd), 0, uintptr(unsafe.Pointer(&attr[0])))
		mq = errno == 0 && attr[3] > 0
		_ = unix.Close(fd)
	}
	return shm, file, mq
}

// ipcMark matches escapee's.
const ipcMark = "trialnet-pwned"

func mqOpen(name string, flags int) (int, error) {
	p, err := unix.BytePtrFromString(strings.TrimPrefix(name, "/"))
	if err != nil {
		return -1, err
	}
	fd, _, errno := unix.Syscall(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(p)), uintptr(flags), 0)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}

func mqUnlink(name string) error {
	p, err := unix.BytePtrFromString(strings.TrimPrefix(name, "/"))
	if err != nil {
		return err
	}
	if _, _, errno := unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(p)), 0, 0); errno != 0 {
		return errno
	}
	return nil
}

// operatorTyped is what is waiting in the operator's terminal input: what
// its shell would read, and run, once the Trial is over.
func (w *boundaryWorld) operatorTyped() string {
	n, err := unix.IoctlGetInt(int(w.opSlave.Fd()), unix.TIOCINQ)
	if err != nil || n == 0 {
		return ""
	}
	buf := make([]byte, n)
	got, _ := w.opSlave.Read(buf)
	return string(buf[:got])
}

// receivers says, per attempt, whether something arrived outside.
func (w *boundaryWorld) receivers(res map[string]Result) map[string]bool {
	time.Sleep(300 * time.Millisecond) // the victim polls its mailboxes every 5 ms
	shm, file, mq := w.ipcMarked()
	left, _ := os.ReadFile(w.shared)
	arrived := map[string]bool{
		"shared-dir-file":              bytes.Contains(left, []byte(ipcMark)),
		"ipc-sysv-shm":                 shm,
		"ipc-posix-shm":                file,
		"ipc-mqueue":                   mq,
		"keyring-read":                 strings.Contains(res["keyring-read"].Reason, w.keySecret),
		"keyctl-i386":                  res["keyctl-i386"].Result == "escaped",
		"request-key-upcall":           res["request-key-upcall"].Result == "escaped",
		"steal-socket-pidfd":           w.arrived[0].Load() > 0,
		"victim-ptrace-poke":           w.arrived[1].Load() > 0,
		"victim-proc-mem":              w.arrived[2].Load() > 0,
		"steal-via-stdio-peer":         w.arrived[3].Load() > 0,
		"steal-via-allowed-unix-peer":  w.arrived[4].Load() > 0,
		"handed-socket-connect":        w.arrived[5].Load() > 0,
		"signal-via-allowed-unix-peer": w.arrived[6].Load() > 0,
		"tiocsti":                      strings.Contains(w.operatorTyped(), "trialnet-pwned"),
		"socket-vsock":                 res["socket-vsock"].Result == "escaped",
		"userns-bind-mount-unix":       w.reachedUnix.Load() > 0,
	}
	for _, name := range unixSpellings {
		arrived[name] = res[name].Result == "escaped"
	}
	return arrived
}

func parseResults(t *testing.T, out []byte) map[string]Result {
	t.Helper()
	res := map[string]Result{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var r Result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("escapee output %q: %v", sc.Text(), err)
		}
		res[r.Name] = r
		t.Logf("%-26s %-8s %s", r.Name, r.Result, r.Reason)
	}
	for _, name := range append(boundaryAttempts, unixSpellings...) {
		if _, ok := res[name]; !ok {
			t.Fatalf("escapee did not report %s:\n%s", name, out)
		}
	}
	return res
}

// requireNoneArrived fails for every attempt whose receiver saw it, and
// for every other socket family that was created.
func requireNoneArrived(t *testing.T, w *boundaryWorld, res map[string]Result, skip map[string]bool) {
	t.Helper()
	for name, arrived := range w.receivers(res) {
		if arrived && !skip[name] {
			t.Errorf("ESCAPE: %s reached its receiver outside the Trial (%s: %s)", name, res[name].Result, res[name].Reason)
		}
	}
	for name, r := range res {
		if strings.HasPrefix(name, "socket-") && r.Result == "escaped" && !skip[name] {
			t.Errorf("ESCAPE: %s: a socket of that family was created", name)
		}
	}
}

// boundaryTrial is a Trial allowed the one unix socket, on a host of the
// test's own.
func boundaryTrial(t *testing.T, w *boundaryWorld) (*agent.Host, *sandbox.Trial) {
	t.Helper()
	h, err := agent.OpenHost(testenv.IsolatedHost(t, "boundary"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	tr, err := h.Create(trial.Spec{ID: "boundary", UnixAllow: []string{w.allowed}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = tr.Close() })
	return h, tr
}

// runInTrial runs the boundary escapee through trialnet's one launch path
// as uid 65534, with the operator's terminal as its stderr.
func runInTrial(t *testing.T, w *boundaryWorld, tr *sandbox.Trial) map[string]Result {
	t.Helper()
	return runInTrialIn(t, w, tr, nil)
}

// runInTrialIn is runInTrial with the escapee run by wrap (a nested
// sandbox's command line, ending in "--").
func runInTrialIn(t *testing.T, w *boundaryWorld, tr *sandbox.Trial, wrap []string) map[string]Result {
	t.Helper()
	return runBoundary(t, w, launched(&tr.Launcher, wrap))
}

// runPlain runs the boundary escapee as uid 65534 without trialnet's
// launch path: no PID namespace, no seccomp, the operator's terminal as
// its controlling terminal (as when a Trial shared the caller's session),
// in cgroup, and in the namespace at netnsPath.
func runPlain(t *testing.T, w *boundaryWorld, cgroup, netnsPath string) map[string]Result {
	t.Helper()
	cg, err := os.Open(cgroup)
	if err != nil {
		t.Fatal(err)
	}
	defer cg.Close()
	var out bytes.Buffer
	cmd := exec.Command(w.args(t)[0], w.args(t)[1:]...)
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = w.peer, &out, w.opSlave
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534},
		Setsid: true, Setctty: true, Ctty: 2, UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	if err := netns.Do(netnsPath, cmd.Run); err != nil {
		t.Fatalf("escapee: %v", err)
	}
	return parseResults(t, out.Bytes())
}

// In a Trial every process-boundary attempt is refused, whichever layers
// this kernel has.
func TestPrivilegedEscapeBoundaryTrial(t *testing.T) {
	privtest.Require(t)
	w := newBoundaryWorld(t)
	h, tr := boundaryTrial(t, w)
	res := runInTrial(t, w, tr)
	var skip map[string]bool
	if !h.BPF.LSM() {
		skip = needLSM
		t.Logf("no BPF LSM layer (%v): a socket handed in over an allowed unix socket is not judged: %+v", h.BPF.LSMError(), res["handed-socket-connect"])
	}
	requireNoneArrived(t, w, res, skip)
	if r := res["allowed-unix-connect"]; r.Result != "escaped" {
		t.Errorf("the allowed unix socket was not reachable from the Trial: %+v", r)
	}
	// The layers in front of the LSM layer (seccomp at syscall entry, the
	// PID namespace, Landlock, which runs before bpf in the LSM list)
	// refuse every other attempt first; the handed socket reaches it.
	k, err := tr.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if h.BPF.LSM() && k.ForeignSocketDenied == 0 {
		t.Errorf("the handed socket was refused, but foreign_socket_denied did not count it: %+v", k)
	}
	t.Logf("layers: %s", h.Layers())
}

// With the LSM layer detached, the PID namespace, the seccomp filter and
// the Trial's own session refuse everything on their own.
func TestPrivilegedEscapeBoundaryWithoutLSM(t *testing.T) {
	privtest.Require(t)
	w := newBoundaryWorld(t)
	h, tr := boundaryTrial(t, w)
	if err := h.BPF.DetachLSM(); err != nil {
		t.Fatal(err)
	}
	if h.BPF.LSM() {
		t.Fatal("the LSM layer is still attached")
	}
	skip := needLSM
	res := runInTrial(t, w, tr)
	if !h.BPF.UnixHooks() {
		// Before Linux 6.7 no cgroup hook sees a pathname unix connect:
		// only the LSM layer judges it, detached here (where neither is,
		// run and create need unix_open). The unix spellings reach the
		// forbidden socket, whose receiver the bind-mount attempt shares:
		// that one is judged by its own result.
		skip = maps.Clone(needLSM)
		for _, name := range append(unixSpellings, "userns-bind-mount-unix") {
			skip[name] = true
		}
		if r := res["userns-bind-mount-unix"]; r.Result == "escaped" {
			t.Errorf("ESCAPE: userns-bind-mount-unix: %s", r.Reason)
		}
	}
	requireNoneArrived(t, w, res, skip)
}

// With the LSM layer alone (the escapee placed in the Trial's cgroup and
// namespace, but in the host's PID namespace, without seccomp, sharing
// the operator's terminal), the task-keyed hooks refuse everything.
func TestPrivilegedEscapeBoundaryLSMOnly(t *testing.T) {
	privtest.Require(t)
	w := newBoundaryWorld(t)
	h, tr := boundaryTrial(t, w)
	// The layer is optional and feature-detected; where the kernel refuses
	// BPF LSM programs this configuration does not exist. The Trial and
	// without-LSM runs above still hold.
	privtest.RequireLSM(t, h.BPF.LSM(), h.BPF.LSMError())
	res := runPlain(t, w, tr.Cgroup, tr.Netns.Path)
	requireNoneArrived(t, w, res, beyondLSM)
	k, err := tr.Counters()
	if err != nil {
		t.Fatal(err)
	}
	for name, n := range map[string]uint64{"foreign_socket_denied": k.ForeignSocketDenied, "ptrace_denied": k.PtraceDenied,
		"sock_family_denied": k.SockFamilyDenied, "ioctl_denied": k.IoctlDenied, "unix_identity_denied": k.UnixIdentityDenied} {
		if n == 0 {
			t.Errorf("%s did not count its refusal", name)
		}
	}
}

// Unconfined (same uid, same terminal, no trialnet), every attempt gets
// out and its receiver sees it: the suite can tell.
func TestPrivilegedEscapeBoundaryUnconfinedIsSeen(t *testing.T) {
	privtest.Require(t)
	w := newBoundaryWorld(t)
	res := runPlain(t, w, testenv.PlainCgroup(t, "boundary"), "/proc/self/fd/"+strconv.Itoa(int(hostNS.Fd())))
	// Linux 6.2+ can refuse TIOCSTI to everyone without CAP_SYS_ADMIN
	// (dev.tty.legacy_tiocsti=0, Debian's default): then there is no such
	// way out to see. The kernel matrix's guests turn it on.
	legacy, err := os.ReadFile("/proc/sys/dev/tty/legacy_tiocsti")
	noTIOCSTI := err == nil && strings.TrimSpace(string(legacy)) == "0"
	// Before Linux 6.5 there is no SO_PEERPIDFD, the way these three find
	// their victim.
	pidfd, perr := unix.GetsockoptInt(int(w.peer.Fd()), unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	if perr == nil {
		_ = unix.Close(pidfd)
	}
	noPeerPidfd := errors.Is(perr, unix.ENOPROTOOPT)
	for name, arrived := range w.receivers(res) {
		if name == "tiocsti" && noTIOCSTI {
			t.Logf("dev.tty.legacy_tiocsti=0: this kernel refuses TIOCSTI to every unprivileged process")
			continue
		}
		if noI386Entry(res[name]) {
			t.Logf("%s: %s", name, res[name].Reason)
			continue
		}
		if strings.Contains(name, "-via-") && strings.HasSuffix(name, "-peer") && noPeerPidfd {
			t.Logf("%s: this kernel has no SO_PEERPIDFD (Linux 6.5+)", name)
			continue
		}
		if !arrived {
			t.Errorf("unconfined %s did not reach its receiver (%+v): the suite could not see this escape", name, res[name])
		}
	}
}
