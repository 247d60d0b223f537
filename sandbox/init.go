//go:build linux

package sandbox

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/internal/cgroup2"
	"github.com/trialnet/trialnet/internal/rootdir"
)

// initArg0 marks a re-executed trialnet binary that becomes a Trial's
// PID 1: it owns the Trial's PID and mount namespaces, reaps orphans, and
// keeps the namespaces alive so that every command launched into the Trial
// (run, exec, concurrently) sees the others and nothing outside.
const initArg0 = "trialnet-init"

// initProc is a Trial's PID 1: pidfd pins it, pid is its number in the
// caller's PID namespace. lastWords, for an init this process started,
// gives what it wrote to stderr before it exited (a Go runtime crash),
// once it has exited: nil while it runs.
type initProc struct {
	pidfd, pid int
	lastWords  func() []byte
}

// alive reports whether the process pidfd pins still runs: then whatever
// was opened through /proc/<pid> before was this process's.
func (p initProc) alive() bool {
	return unix.PidfdSendSignal(p.pidfd, 0, nil, 0) == nil
}

// init returns the Trial's PID 1, starting it first if the Trial has none
// yet (its first launch, or after everything in it was killed). A lock
// keeps two launchers from starting two: a file only root can open (the
// Trial sees the host's files, and could hold a lock on anything it can
// open, such as its cgroup directory, to stall every launch). An init it
// starts may still be setting the Trial up: ready waits for that (and
// releases the lock), so that the caller can start the command's
// trialnet-exec meanwhile. The caller must call ready once on every path.
// dir is the command's working directory (initDir).
func (t *Launcher) init(cg *os.File, dir string) (_ initProc, ready func() error, _ error) {
	lock, err := lockInit(cg)
	if err != nil {
		return initProc{}, nil, err
	}
	if p, err := findInit(t.Cgroup); err != nil || p.pidfd >= 0 {
		_ = lock.Close()
		return p, func() error { return nil }, err
	}
	p, started, err := t.startInit(cg, dir)
	if err != nil {
		_ = lock.Close()
		return p, nil, err
	}
	return p, func() error {
		defer lock.Close() // releases the lock
		return started()
	}, nil
}

// errClosing is returned by Start in a Trial whose teardown has begun.
var errClosing = errors.New("the Trial is being destroyed: its processes are killed and no command starts in it any more; start the command in another Trial")

// The join lock orders launches against the teardown, across processes
// (the agent, and trialnet run or exec): a launch holds it shared from
// its check until its process is cloned into the cgroup, where
// cgroup.kill reaches it; the teardown takes it exclusive to write
// "closing" into it first. So no process joins a Trial whose teardown
// began, and none is cloned in after the kill to outlive it.
const closingMark = "closing"

func joinLockPath(cgroupID uint64) string {
	return filepath.Join(initLockDir, "join-"+strconv.FormatUint(cgroupID, 10))
}

// Closing reports whether the teardown of the Trial with cgroup id
// cgroupID began: its processes were killed, and no launch joins it. An
// agent killed in a destroy leaves it so, for its successor to finish.
func Closing(cgroupID uint64) bool {
	b, err := os.ReadFile(joinLockPath(cgroupID))
	return err == nil && strings.HasPrefix(string(b), closingMark)
}

// beginJoin takes the join lock of the cgroup cg is open on, shared, and
// fails if its Trial is closing; the returned func releases it.
func beginJoin(cg *os.File) (func(), error) {
	f, err := openTrialLock(cg, joinLockPath, unix.LOCK_SH)
	if err != nil {
		return nil, lockErr("join lock", err)
	}
	if lockMarked(f) {
		_ = f.Close()
		return nil, errClosing
	}
	return func() { _ = f.Close() }, nil
}

// openTrialLock opens (creating it if missing) and locks (how: LOCK_SH or
// LOCK_EX) the lock of the cgroup cg is open on that path names. A launch
// that opened the cgroup just before the teardown removed its locks
// (and the cgroup, unless adopted: a container's outlives its Trial)
// would make the lock again, to stay until reboot, and an adopted
// Trial's would start its command in a cgroup with no policy entry: so,
// locked, it checks that the cgroup is still there, that no teardown
// marked it closing (closingAttr, set before the locks go) and that the
// path still names the file it holds. Else the Trial is gone or going:
// it removes the lock it made (the path names its file, and no launch
// can use a lock of a removed or marked cgroup any more) and fails.
// Whoever makes a lock file checks after making it, so none is made
// after the teardown's last look.
func openTrialLock(cg *os.File, path func(uint64) string, how int) (*os.File, error) {
	var cst unix.Stat_t
	if err := unix.Fstat(int(cg.Fd()), &cst); err != nil {
		return nil, err
	}
	p := path(cst.Ino)
	f, err := rootdir.OpenLock(initLockDir, filepath.Base(p))
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		_ = f.Close()
		return nil, err
	}
	var held, named unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &held); err != nil {
		_ = f.Close()
		return nil, err
	}
	same := unix.Stat(p, &named) == nil && named.Dev == held.Dev && named.Ino == held.Ino
	// A removed cgroup's files are gone with it, even through a
	// directory opened before.
	var ignored unix.Stat_t
	if err := unix.Fstatat(int(cg.Fd()), "cgroup.procs", &ignored, 0); err != nil {
		if same {
			_ = os.Remove(p)
		}
		_ = f.Close()
		if errors.Is(err, unix.ENOENT) {
			return nil, errGone
		}
		return nil, fmt.Errorf("check the Trial's cgroup: %w", err)
	}
	if cgroupClosing(cg) {
		// The cgroup outlived its Trial (a container's: its runtime's to
		// remove). A lock made after the teardown removed the locks
		// goes; a marked one is the teardown's (or its successor's).
		if same && !lockMarked(f) {
			_ = os.Remove(p)
		}
		_ = f.Close()
		return nil, errClosing
	}
	if !same {
		_ = f.Close()
		return nil, errClosing // the teardown removed the lock meanwhile
	}
	return f, nil
}

// closingAttr marks a Trial's cgroup itself closing, for as long as the
// cgroup lives: an adopted Trial's cgroup is its runtime's and outlives
// the Trial's teardown, which removes the locks that hold the closing
// mark. A trusted xattr: only the host's root sets or removes it, never
// a process of the container.
const closingAttr = "trusted.trialnet.closing"

// cgroupClosing reports whether the cgroup cg is open on was marked
// closing by a Trial's teardown.
func cgroupClosing(cg *os.File) bool {
	var b [len(closingMark)]byte
	_, err := unix.Fgetxattr(int(cg.Fd()), closingAttr, b[:])
	return err == nil
}

// lockMarked reports whether the join lock f holds the closing mark.
func lockMarked(f *os.File) bool {
	var b [len(closingMark)]byte
	n, _ := f.ReadAt(b[:], 0)
	return n == len(b) && string(b[:]) == closingMark
}

// lockErr names the lock in an error of openTrialLock's, but for the
// Trial's end, which says all.
func lockErr(lock string, err error) error {
	if errors.Is(err, errClosing) || errors.Is(err, errGone) {
		return err
	}
	return fmt.Errorf("%s: %w", lock, err)
}

// errGone is returned by Start in a Trial whose cgroup was removed. A
// type of its own rather than fmt.Errorf's: a package-level fmt.Errorf
// runs fmt in every start of the binary.
var errGone error = goneError{}

type goneError struct{}

func (goneError) Error() string {
	return "the Trial's cgroup was removed (the Trial was destroyed, or its container's runtime ended it): " + os.ErrNotExist.Error() + "; start the command in another Trial"
}

func (goneError) Unwrap() error { return os.ErrNotExist }

// markClosing writes the closing mark into the join lock of the cgroup at
// dir (id: its inode, 0 if unknown), and onto the cgroup itself
// (closingAttr), under the lock, once every launch under way has its
// process in. A cgroup that is gone (its runtime removed it first) needs
// no mark: a launch opens it by path, which fails, and one that opened
// it before cannot clone into it (ENOENT: no live cgroup behind it). Nor
// does another cgroup made at the path since (a restarted container's):
// it is not this Trial's to close.
func markClosing(dir string, id uint64) error {
	d, err := os.Open(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	defer d.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(d.Fd()), &st); err != nil {
		return err
	}
	if id != 0 && st.Ino != id {
		return nil
	}
	f, err := rootdir.OpenLock(initLockDir, filepath.Base(joinLockPath(st.Ino)))
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return err
	}
	// Both under the lock, each whatever the other did: no launch looks
	// before the lock is released.
	_, err = f.WriteAt([]byte(closingMark), 0)
	if xerr := unix.Fsetxattr(int(d.Fd()), closingAttr, []byte(closingMark), 0); xerr != nil && !errors.Is(xerr, unix.ENOENT) {
		err = errors.Join(err, fmt.Errorf("mark its cgroup: %w", xerr))
	}
	return err
}

// initLockDir holds the launch locks, one per Trial cgroup (by its id, unique
// for the machine's uptime, as the directory is).
const initLockDir = rootdir.Locks

func initLockPath(cgroupID uint64) string {
	return filepath.Join(initLockDir, "init-"+strconv.FormatUint(cgroupID, 10))
}

// lockInit locks the launch lock of the cgroup cg is open on.
func lockInit(cg *os.File) (*os.File, error) {
	f, err := openTrialLock(cg, initLockPath, unix.LOCK_EX)
	if err != nil {
		return nil, lockErr("launch lock", err)
	}
	return f, nil
}

// RemoveLaunchLock removes the launch lock of the cgroup at dir (id: its
// inode), for whoever removes a cgroup that commands were launched into.
func RemoveLaunchLock(cgroupID uint64) {
	if cgroupID != 0 {
		_ = os.Remove(initLockPath(cgroupID))
		_ = os.Remove(joinLockPath(cgroupID))
	}
}

// findInit looks in the cgroup for the process that is PID 1 of a PID
// namespace one level below ours and runs as the reaper. A nested
// namespace a Trial made itself is two levels down, so it is never taken
// for the Trial's init. It returns a pidfd of -1 when there is none. The
// caller holds the Trial's launch lock.
func findInit(cgroup string) (initProc, error) {
	b, err := readKernfs(filepath.Join(cgroup, "cgroup.procs"))
	if err != nil {
		return initProc{-1, 0, nil}, fmt.Errorf("list Trial processes: %w", err)
	}
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.Atoi(f)
		if err != nil || !isChildNSInit(pid) {
			continue
		}
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue // gone meanwhile
		}
		// The pid may have been reused between the check and the open:
		// check again now that fd pins the process we mean.
		if !isChildNSInit(pid) || !inCgroup(pid, cgroup) {
			_ = unix.Close(fd)
			continue
		}
		// Only an init that reached the reaper has set the Trial up (its
		// own /proc and devpts). One still setting up lost its launcher,
		// whose lock the caller now holds (a launcher that fails kills
		// its init itself): commands joining it would see the host's
		// /proc. End it; the caller starts another.
		if cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && string(cmd) == initArg0+"\x00" {
			return initProc{fd, pid, nil}, nil
		}
		// Only the Trial's init can be PID 1 one level down in its
		// cgroup, so whatever state it is in (setting up, exiting), it is
		// ended rather than left beside the one the caller starts.
		_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
		_ = unix.Close(fd)
	}
	return initProc{-1, 0, nil}, nil
}

func isChildNSInit(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 0 && f[0] == "NSpid:" {
			return len(f) == 3 && f[2] == "1"
		}
	}
	return false
}

func inCgroup(pid int, cgroup string) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return false
	}
	mount, err := Cgroup2Mount()
	if err != nil {
		return false
	}
	want := "0::" + strings.TrimPrefix(cgroup, mount)
	// Hybrid hosts list their v1 hierarchies too: only the v2 line counts.
	for _, line := range strings.Split(string(b), "\n") {
		if line == want {
			return true
		}
	}
	return false
}

// initDir is where a Trial's init starts: the working directory of the
// command that starts it (dir, as the Trial resolves it: from /), where
// the host has that directory, else /. The init keeps the FUSE and
// network mounts holding it (hideRemoteFS): a command's work may be on
// one. A command run later in the Trial has what this one kept. dir is
// not cleaned: ".." after a symlink is the link target's parent, as the
// command's chdir takes it.
func initDir(dir string) string {
	if !strings.HasPrefix(dir, "/") {
		dir = "/" + dir
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return "/"
	}
	return dir
}

// startInit clones the Trial's PID 1 into its cgroup and network
// namespace, with new PID and mount namespaces. ready waits until it has
// mounted its own /proc and /dev/pts, and kills it if it failed; the
// caller owns the pidfd either way. It starts in initDir(dir).
func (t *Launcher) startInit(cg *os.File, dir string) (_ initProc, ready func() error, _ error) {
	fail := initProc{-1, 0, nil}
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return fail, nil, err
	}
	// Its stderr is read only if it fails: a Go runtime crash lands there.
	stderrR, stderrW, err := os.Pipe()
	if err != nil {
		_ = readyR.Close()
		_ = readyW.Close()
		return fail, nil, err
	}
	extra, err := initFiles(readyW)
	var cmd *exec.Cmd
	release := func() {}
	if err == nil {
		args := initArgs(t.Spec.Nested, t.Spec.Transparent, t.Netns.Path, hiddenDirs(filepath.Dir(t.Netns.Path)), t.v1Dirs(), t.Spec.UnixAllow)
		if cmd, release, err = initCommand(args, extra...); err != nil {
			err = fmt.Errorf("start the Trial's init: %w", err)
		}
	}
	defer release()
	if err != nil {
		_ = readyR.Close()
		_ = readyW.Close()
		_ = stderrR.Close()
		_ = stderrW.Close()
		return fail, nil, err
	}
	pidfd := -1
	cmd.Stderr = stderrW
	cmd.Dir = initDir(dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWPID | unix.CLONE_NEWNS | unix.CLONE_NEWIPC,
		Setsid:      true,
		UseCgroupFD: true,
		CgroupFD:    int(cg.Fd()),
		PidFD:       &pidfd,
	}
	err = t.Netns.Do(func() error {
		keepStartSlack()
		return cmd.Start()
	})
	_ = readyW.Close()
	_ = stderrW.Close()
	if err != nil {
		_ = readyR.Close()
		_ = stderrR.Close()
		return fail, nil, fmt.Errorf("start the Trial's init: %w", err)
	}
	// Reaped by whoever started it; an init outliving this process is
	// reaped by the host's init.
	go reapExited(cmd)
	// After it is ready, only the reaper holds the pipe's write end: its
	// end is the init's exit, and a crash's trace comes before it.
	var words atomic.Pointer[[]byte]
	lastWords := func() []byte {
		if w := words.Load(); w != nil {
			return *w
		}
		return nil
	}
	return initProc{pidfd, cmd.Process.Pid, lastWords}, func() error {
		defer readyR.Close()
		msg, _ := io.ReadAll(readyR)
		if len(msg) == 1 && msg[0] == 0 {
			go func() {
				w, _ := io.ReadAll(io.LimitReader(stderrR, 4096))
				_ = stderrR.Close()
				words.Store(&w)
			}()
			return nil
		}
		defer stderrR.Close()
		// init_early.c's set-up sends an errno as a number (execMessage).
		msg = []byte(execMessage(bytes.TrimPrefix(msg, []byte{0})))
		// Everything else in its PID namespace dies with it.
		_ = unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
		if len(msg) == 0 {
			crash, _ := io.ReadAll(io.LimitReader(stderrR, 4096))
			msg = fmt.Appendf(nil, "it exited before it was ready: %s", bytes.TrimSpace(crash))
		}
		return fmt.Errorf("start the Trial's init: %s", msg)
	}, nil
}

// initArgs are the init's arguments: whether the Trial is nested (its
// /proc then stays unmasked: nested.go), whose resolv.conf it reads (the
// stub's in transparent mode), where its network namespace is mounted
// (dropNsMounts), the directories to hide, "--v1" and the Trial's cgroup
// v1 groups (the only groups its v1 hierarchies show: hideV1), "--", and
// the allowed unix sockets (those beneath the Trial's own directories are
// bound into them), clean, sorted and each once, as both set-ups (Go's
// and early.c's) take them.
func initArgs(nested, transparent bool, nsPath string, hide, v1, keep []string) []string {
	clean := make([]string, 0, len(keep))
	for _, k := range keep {
		clean = append(clean, filepath.Clean(k))
	}
	keep = slices.Compact(slices.Sorted(slices.Values(clean)))
	mode, dns := initMasked, initHostDNS
	if nested {
		mode = nestedMode
	}
	if transparent {
		dns = initStubDNS
	}
	args := append([]string{initSetupArg0, mode, dns, nsPath}, hide...)
	args = append(append(args, initV1Sep), v1...)
	return append(append(args, "--"), keep...)
}

const (
	// initMasked is a Trial's init that masks /proc (initArgs).
	initMasked = "masked"
	// initStubDNS: the Trial's resolv.conf names its stub; initHostDNS:
	// it is the host's.
	initStubDNS = "stub-dns"
	initHostDNS = "host-dns"
	// initV1Sep ends the hidden directories; the Trial's cgroup v1 groups
	// follow. Those directories are absolute: none is this.
	initV1Sep = "--v1"
)

func splitInitArgs(args []string) (nested, transparent bool, nsPath string, hide, v1, keep []string) {
	if len(args) > 2 {
		nested, transparent, nsPath, args = args[0] == nestedMode, args[1] == initStubDNS, args[2], args[3:]
	}
	if i := slices.Index(args, "--"); i >= 0 {
		args, keep = args[:i], args[i+1:]
	}
	if i := slices.Index(args, initV1Sep); i >= 0 {
		args, v1 = args[:i], args[i+1:]
	}
	return nested, transparent, nsPath, args, v1, keep
}

// runInit is the Trial's PID 1 in a CGO_ENABLED=0 build off x86-64 (on
// x86-64 the init is the embedded static binary, initimage_amd64.go; with
// cgo, init_early.c in this binary); initArgs says what its arguments
// are. fd 3 reports readiness (one NUL byte, then the end of the pipe) or
// why setting up failed.
func runInit() {
	ready := os.NewFile(3, "trialnet-init-ready")
	// Capabilities, the bounding set, no_new_privs and the seccomp filter
	// are per thread, and a Go program has several: they are set on this
	// thread, which then execs the reaper, so that every thread of PID 1
	// starts from them.
	runtime.LockOSThread()
	nested, transparent, nsPath, hide, v1, keep := splitInitArgs(os.Args[1:])
	err := setupInit(nested, transparent, nsPath, hide, v1, keep)
	if err == nil {
		err = oomFirst()
	}
	if err == nil {
		err = dropCapabilities()
	}
	if err == nil {
		err = installSeccomp(false)
	}
	if err == nil {
		// The Trial is ready once the reaper's exec has begun: nothing of
		// the old image is left, and each thread the reaper makes starts
		// from this one. The launcher takes the byte as "ready" only with
		// the end of the pipe, which the exec gives (close-on-exec): a
		// failed exec writes why after it. Not waiting for the reaper's
		// own start takes a start of the binary off every Trial's first
		// command.
		_, err = unix.FcntlInt(3, unix.F_SETFD, unix.FD_CLOEXEC)
	}
	if err == nil {
		// And nothing its launcher left open (a caller's descriptor
		// without close-on-exec, a report descriptor) lives on in the
		// reaper, a uid-0 process of the Trial.
		err = unix.CloseRange(4, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	}
	if err == nil {
		_, err = ready.Write([]byte{0})
	}
	if err == nil {
		err = unix.Exec("/proc/self/exe", []string{initArg0}, reaperEnv)
	}
	_, _ = fmt.Fprintf(ready, "trialnet-init: %v", err)
	os.Exit(1)
}

// initSetupArg0 is the Trial's PID 1 while it sets the Trial up, as root;
// it then execs itself as initArg0, which only reaps.
const initSetupArg0 = "trialnet-init-setup"

// Per-Trial bounds on host pools that the Trial's mounts draw from.
const (
	// MaxPtys bounds the Trial's devpts instance (max=) and, where the
	// BPF LSM layer runs, the pty masters its tasks hold from any devpts
	// instance, those its sandboxes mount included: room for tmux, screen
	// and a test suite's terminals, while the host's default pool
	// (kernel.pty.max 4,096, less the 1,024 reserved to its own devpts)
	// holds a dozen such Trials.
	MaxPtys = 256
	// ShmBytes bounds the Trial's /dev/shm: four times Docker's 64 MiB,
	// for browsers and test runners that map large segments.
	ShmBytes = 256 << 20
)

// reaperEnv is the Go reaper's whole environment. The runtime's
// cgroup-aware GOMAXPROCS (Go 1.25) otherwise keeps its cgroup's CPU
// files open for as long as it runs: on a host with a cgroup v1 cpu
// hierarchy, the host's, held by a uid-0 process of the Trial. Off, the
// runtime reads them once at start and closes them, and PID 1 holds its
// stdio only.
var reaperEnv = []string{"GODEBUG=containermaxprocs=0"}

func runReaper() {
	// PID 1 ignores what it does not handle; a Go program handles every
	// signal, and exiting would kill the whole Trial.
	signal.Ignore(syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM, syscall.SIGUSR1,
		syscall.SIGUSR2, syscall.SIGPIPE, syscall.SIGALRM, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU)
	children := make(chan os.Signal, 1)
	signal.Notify(children, syscall.SIGCHLD)
	for range children {
		for {
			pid, err := unix.Wait4(-1, nil, unix.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

// setupInit gives the Trial its own view of processes, terminals and
// cgroups, and hides (or makes read-only) what of the host it must not
// see or change; the caller then drops every capability (PID 1 needs none to reap) and puts
// it under the commands' seccomp filter: were a command to take init over
// (a uid-0 Trial on a kernel without Landlock), it would gain nothing.
func setupInit(nested, transparent bool, nsPath string, hide, v1, keep []string) error {
	// Private: nothing made here leaks out, and nothing mounted on the
	// host later (another Trial's netns among it) leaks in.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if err := dropNsMounts(nsPath); err != nil {
		return err
	}
	// A /proc of this PID namespace: the Trial cannot name, read or open
	// /proc/PID/mem of any process outside it.
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount the Trial's /proc: %w", err)
	}
	// A devpts instance of its own: no path in the Trial leads to the
	// host's terminals (the operator's among them). Its ptys come from the
	// host's pool (kernel.pty.max, less kernel.pty.reserve for the host's
	// own instance): max= keeps one Trial from taking them all.
	if err := unix.Mount("devpts", "/dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,max="+strconv.Itoa(MaxPtys)); err != nil {
		return fmt.Errorf("mount the Trial's /dev/pts: %w", err)
	}
	if err := unix.Mount("/dev/pts/ptmx", "/dev/ptmx", "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind the Trial's /dev/ptmx: %w", err)
	}
	// The init has an IPC namespace of its own, so System V IPC and
	// POSIX message queues opened by name are the Trial's. Their files
	// are not: the host's /dev/shm (POSIX shared memory, semaphores) and
	// /dev/mqueue are mounts this namespace copied, where a same-uid
	// process's segments and queues stay open to the Trial. Fresh
	// instances cover them.
	for _, m := range []struct {
		fstype, dir, data string
		flags             uintptr
	}{
		{"mqueue", "/dev/mqueue", "", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
	} {
		if fi, err := os.Stat(m.dir); err != nil || !fi.IsDir() {
			continue // the host has none: nothing to cover
		}
		if err := unix.Mount(m.fstype, m.dir, m.fstype, m.flags, m.data); err != nil {
			return fmt.Errorf("mount the Trial's %s: %w", m.dir, err)
		}
	}
	hostShm, err := hostShmDev() // before the Trial's own covers it
	if err != nil {
		return maskErr("find the host's /dev/shm", "to detach its other mounts", err)
	}
	// /tmp, /var/tmp and /dev/shm: exec as on most hosts (JITs map from
	// /dev/shm), bounded, since what a tmpfs holds is the host's memory.
	if err := mountOwnDirs(keep); err != nil {
		return err
	}
	if err := coverSharedDirs(); err != nil {
		return err
	}
	if err := unix.Unshare(unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("unshare cgroup namespace: %w", err)
	}
	if err := ensureRunDir(); err != nil {
		return err
	}
	if transparent {
		// rootdir.Run is free until maskHost covers it.
		if err := mountResolvConf(resolvPath, rootdir.Run, slices.Contains(hide, rootdir.Run)); err != nil {
			return err
		}
	}
	return maskHost(nested, hide, v1, hostShm)
}

// dropNsMounts detaches the namespace files bind-mounted on the host (every
// Trial's netns among them): a copy here would keep a destroyed Trial's
// namespace alive for as long as this one lives, and show its id in the
// Trial's mountinfo. The agent's netns directory, a mount of its own
// (netns.MountDir), goes in one call, with every Trial's namespace in it:
// each umount2 waits out an RCU grace period, so one per live Trial would
// grow every Trial's start with the number live. Found as the directory of
// this Trial's own namespace mount; the directory is hidden from the Trial
// whatever it is (maskHost). What that detach uncovers goes one by one:
// copies under the directory on the mount below it, where a directory
// mounted before the agent's start (`ip netns`, as a peer of a shared
// parent; one mounted twice) has them. The launcher's word for the
// directory (nsPath, checked by ownNsDir) goes first, before the mount
// table is read: the kernel prints a line of it for each mount, one per
// live Trial while the directory is there.
func dropNsMounts(nsPath string) error {
	if dir, ok := ownNsDir(nsPath); ok {
		if _, err := detachNs(dir); err != nil {
			return err
		}
	}
	nsfs, points, err := nsfsMounts()
	if err != nil {
		return err
	}
	dir := ""
	if own, err := os.Readlink("/proc/thread-self/ns/net"); err == nil {
		for _, m := range nsfs {
			if m[0] == own {
				dir = filepath.Dir(m[1])
				break
			}
		}
	}
	// Each mount on the directory in turn (one mounted twice holds copies
	// beneath the top one), while the path reaches one.
	for detached := true; detached && dir != "/" && points[dir]; {
		if detached, err = detachNs(dir); err != nil {
			return err
		}
		if nsfs, points, err = nsfsMounts(); err != nil {
			return err
		}
	}
	for _, m := range nsfs {
		if _, err := detachNs(m[1]); err != nil {
			return err
		}
	}
	return nil
}

// nsfsMounts reads the root and mount point of each nsfs mount in this
// mount namespace, and every mount point.
func nsfsMounts() (nsfs [][]string, points map[string]bool, _ error) {
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, nil, fmt.Errorf("read mountinfo: %w", err)
	}
	points = map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields := strings.Fields(pre)
		if !ok || len(fields) < 5 {
			continue
		}
		point := cgroup2.UnescapeMountPath(fields[4])
		points[point] = true
		if strings.HasPrefix(post, "nsfs ") {
			nsfs = append(nsfs, []string{fields[3], point})
		}
	}
	return nsfs, points, nil
}

// detachNs detaches the mount at point, and says whether there was one:
// one gone already (with a directory detached before it) is not an error.
func detachNs(point string) (bool, error) {
	err := unix.Unmount(point, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return false, fmt.Errorf("detach %s: %w", point, err)
	}
	return err == nil, nil
}

// ownNsDir is the directory of nsPath (the launcher's word for where this
// Trial's namespace is mounted), when nsPath is this Trial's own
// namespace mount and the directory a mount of its own. Checked, not
// trusted: anything else is left to dropNsMounts's walk.
func ownNsDir(nsPath string) (string, bool) {
	var own, got unix.Stat_t
	// Lstat: a symlink there would lead to a mount in another directory.
	if nsPath == "" || unix.Stat("/proc/thread-self/ns/net", &own) != nil || unix.Lstat(nsPath, &got) != nil ||
		own.Dev != got.Dev || own.Ino != got.Ino {
		return "", false
	}
	i := strings.LastIndexByte(nsPath, '/')
	if i <= 0 {
		return "", false
	}
	dir := nsPath[:i]
	self, err := mountID(dir)
	if err != nil || self == 0 {
		return "", false
	}
	parent, err := mountID(dir + "/..")
	return dir, err == nil && parent != 0 && parent != self
}

// reapExited reaps cmd's process once it has exited, having waited for
// the exit on Go's poller (a pidfd) rather than in a blocking waitid. A
// goroutine blocked in a system call keeps its P until the runtime's
// monitor takes it back, two of the monitor's ticks later, and those
// grow to 10 ms each while it finds nothing to do. A launch's own thread
// holds a P through its cgo call until the command execs, so on two CPUs
// the init's wait took the last P, and the goroutine that the init's
// ready wakes (to let the command exec) waited for the monitor: 8-17 ms
// in 4 of 6 embedded runs, traced. Where no pidfd can be opened the
// wait is waitid's, as before.
func reapExited(cmd *exec.Cmd) {
	awaitExit(cmd.Process.Pid)
	_ = cmd.Wait()
}

// awaitExit returns once the process pid, a child not yet reaped, has
// exited (or at once, where no pidfd of it can be polled), holding no
// thread while it waits.
func awaitExit(pid int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return
	}
	// Non-blocking: os.NewFile then registers it with the poller.
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		return
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	// A pidfd reads as ready once its process has exited; the poll asks
	// without waiting, and any error but EINTR ends the wait here, where
	// cmd.Wait's blocking wait takes over.
	_ = rc.Read(func(fd uintptr) bool {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
		return (err != nil && err != unix.EINTR) || n > 0
	})
}
