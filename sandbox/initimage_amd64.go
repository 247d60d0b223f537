//go:build linux && amd64

package sandbox

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// initELF is the Trial's init: init_early.c's set-up and reaper with
// init_main.c, a static binary of its own (68 KB, `make generate`), so
// that a Trial's PID 1 loads neither this 20 MB binary nor a dynamic
// loader, for its set-up and again for its reaper. It holds nothing of
// the host's: only the code and the tables it mounts with.
//
//go:embed init_amd64.elf
var initELF []byte

// sharedImage is the sealed memfd every Trial's init is executed from,
// made once per process. A Trial's PID 1 is uid 0: its /proc/1/exe is
// this memfd, never the trialnet binary on the host (runc's
// CVE-2019-5736 was a container writing through its init's
// /proc/self/exe), and the seals keep anyone from changing what the next
// Trial's init runs. It is nil where the kernel cannot seal its mode
// (initImage).
var sharedImage = sync.OnceValues(newSharedImage)

func newSharedImage() (*os.File, error) {
	f, err := initMemfd()
	if errors.Is(err, errMemfdNoexec) {
		return initTmpfs(err)
	}
	if err != nil {
		return nil, err
	}
	if seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0); err != nil || seals&unix.F_SEAL_EXEC == 0 {
		_ = f.Close()
		return nil, nil
	}
	return f, nil
}

// initImage is the sealed memfd a Trial's init is executed from: the
// shared one, or, where the kernel cannot seal its mode (no F_SEAL_EXEC,
// before 6.3), one of its own (own), which the caller closes once the
// init has started. There its owner, uid 0, may chmod it, as a Trial's
// uid-0 command can through /proc/1/exe wherever nothing scopes ptrace
// to its own domain (no Landlock; a nested Trial below Landlock ABI 6):
// a shared image made unexecutable would stop every later Trial's init.
// Its own init has exec'd its reaper before any command runs, and
// nothing execs the image after.
func initImage() (f *os.File, own bool, err error) {
	if f, err = sharedImage(); f != nil || err != nil {
		return f, false, err
	}
	f, err = initMemfd()
	return f, true, err
}

// initSeals: no write, no resize, no further change to the seals.
const initSeals = unix.F_SEAL_WRITE | unix.F_SEAL_GROW | unix.F_SEAL_SHRINK | unix.F_SEAL_SEAL

// initSealExec is F_SEAL_EXEC, asked for where the kernel has it (6.3+);
// a test sets it to 0 to be a kernel without it.
var initSealExec = unix.F_SEAL_EXEC

func initMemfd() (*os.File, error) {
	if !bytes.HasPrefix(initELF, []byte("\x7fELF")) {
		return nil, errors.New("the Trial's init is missing from this build (sandbox/init_amd64.elf is empty or not an ELF binary): " +
			"run `make generate` (it needs musl-gcc: `make deps`) and build trialnet again")
	}
	// MFD_EXEC (Linux 6.3+) asks for an executable memfd where
	// vm.memfd_noexec would make it not; older kernels refuse the flag
	// and make every memfd executable.
	fd, err := unix.MemfdCreate("trialnet-init", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_EXEC)
	if errors.Is(err, unix.EINVAL) {
		fd, err = unix.MemfdCreate("trialnet-init", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if errors.Is(err, unix.EACCES) {
		return nil, fmt.Errorf("%w (%v)", errMemfdNoexec, err)
	}
	if err != nil {
		return nil, fmt.Errorf("make the memfd a Trial's init is executed from: %w", err)
	}
	f := os.NewFile(uintptr(fd), "trialnet-init")
	if _, err := f.Write(initELF); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("write the Trial's init into its memfd: %w", err)
	}
	// F_SEAL_EXEC (6.3+) keeps its mode too: its owner, uid 0, needs no
	// capability to chmod it.
	_, err = unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, initSeals|initSealExec)
	if errors.Is(err, unix.EINVAL) {
		_, err = unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, initSeals)
	}
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("seal the memfd a Trial's init is executed from: %w", err)
	}
	return f, nil
}

// errMemfdNoexec is memfd_create refusing an executable memfd: only
// vm.memfd_noexec does (2, in this PID namespace or one above it).
var errMemfdNoexec = errors.New("vm.memfd_noexec is 2 in this PID namespace, which forbids executing any memfd")

// initTmpfs is the image where no memfd may be executed: a file on a
// tmpfs of its own, mounted nowhere (a detached mount, which only the
// descriptors to it reach), whose superblock is made read-only once the
// file is written. Writing it, changing its mode or making the file
// system writable again all need CAP_SYS_ADMIN (EROFS otherwise, to
// root too), which no Trial's command has: like the sealed memfd, it can
// be shared by every Trial's init. vm.memfd_noexec is kept as meant: no
// memfd becomes executable, and this takes the mount capability that the
// sysctl's target, an unprivileged process loading code without a file,
// does not have. noexec is the memfd's refusal, for the error.
func initTmpfs(noexec error) (*os.File, error) {
	fail := func(step string, err error) (*os.File, error) {
		return nil, fmt.Errorf("make the image a Trial's init is executed from: %w, and the fall-back, a read-only tmpfs of "+
			"trialnet's own, failed to %s: %w: set vm.memfd_noexec to 1 or 0 where the agent runs (sysctl -w vm.memfd_noexec=1, "+
			"on the host or in the PID namespace that set 2; 1 still makes memfds unexecutable unless asked), "+
			"or let the agent mount a tmpfs (CAP_SYS_ADMIN)", noexec, step, err)
	}
	fs, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fail("open a tmpfs", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigCreate(fs); err != nil {
		return fail("create it", err)
	}
	mnt, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOSUID)
	if err != nil {
		return fail("mount it", err)
	}
	defer unix.Close(mnt)
	w, err := unix.Openat(mnt, "init", unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o500)
	if err != nil {
		return fail("create the init in it", err)
	}
	wf := os.NewFile(uintptr(w), "trialnet-init")
	_, err = wf.Write(initELF)
	if cerr := wf.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fail("write the init", err)
	}
	// No open writable descriptor is left: the superblock may turn
	// read-only.
	ro, err := unix.Fspick(mnt, "", unix.FSPICK_EMPTY_PATH|unix.FSPICK_CLOEXEC)
	if err != nil {
		return fail("reopen it", err)
	}
	defer unix.Close(ro)
	if err := unix.FsconfigSetFlag(ro, "ro"); err != nil {
		return fail("make it read-only", err)
	}
	if err := unix.FsconfigReconfigure(ro); err != nil {
		return fail("make it read-only", err)
	}
	r, err := unix.Openat(mnt, "init", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail("open the init", err)
	}
	return os.NewFile(uintptr(r), "trialnet-init"), nil
}

// CheckInitImage makes the image a Trial's init is executed from, as the
// first Trial would, and says from what: the doctor's check.
func CheckInitImage() (string, error) {
	f, own, err := initImage()
	if err != nil {
		return "", err
	}
	if own {
		defer f.Close()
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err == nil && st.Type == unix.TMPFS_MAGIC && st.Flags&unix.ST_RDONLY != 0 {
		return "a read-only tmpfs of its own (vm.memfd_noexec is 2: no memfd may be executed)", nil
	}
	if own {
		return "a sealed memfd per Trial (no F_SEAL_EXEC before Linux 6.3)", nil
	}
	return "a sealed memfd", nil
}

// initCommand is the Trial's init with args and, from fd 3 on, files: the
// sealed image, passed as the descriptor after them and executed through
// it (an exec.Cmd cannot execveat). Like every descriptor past 3, it is
// closed as the set-up execs the reaper, from /proc/self/exe: the same
// memfd. The caller calls release once the command has started (or will
// not: release is never nil, as the launcher defers it before it looks
// at the error).
func initCommand(args []string, files ...*os.File) (_ *exec.Cmd, release func(), _ error) {
	release = func() {}
	image, own, err := initImage()
	if err != nil {
		return nil, release, err
	}
	if own {
		release = func() { _ = image.Close() }
	}
	files = append(slices.Clip(files), image)
	return &exec.Cmd{Path: "/proc/self/fd/" + strconv.Itoa(2+len(files)), Args: args, ExtraFiles: files}, release, nil
}
