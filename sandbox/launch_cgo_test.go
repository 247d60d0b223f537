//go:build linux && cgo

package sandbox

import (
	"debug/elf"
	"errors"
	"fmt"
	"go/build"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/trialnet/trialnet/internal/privtest"
	"golang.org/x/sys/unix"
)

// startCommand hands the command the environment exec.Cmd would: the last
// of each name, and nothing with a NUL.
func TestDedupEnv(t *testing.T) {
	got, err := dedupEnv([]string{"A=1", "PATH=/x", "B", "A=2", "=C=1", "=C=2", ""})
	if want := []string{"PATH=/x", "B", "A=2", "=C=2"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("dedupEnv = %q, %v; want %q", got, err, want)
	}
	if _, err := dedupEnv([]string{"A=1\x00B=2"}); err == nil {
		t.Error("dedupEnv took a variable with a NUL")
	}
}

// What startCommand cannot do as exec.Cmd would is refused, not dropped.
func TestStartCommandRefusesWhatItCannotDo(t *testing.T) {
	for _, attr := range []*syscall.SysProcAttr{{Credential: &syscall.Credential{Uid: 1}}, {Pdeathsig: syscall.SIGKILL}, {Setpgid: true}} {
		cmd := &exec.Cmd{Args: []string{execArg0}, ExtraFiles: []*os.File{os.Stdin, os.Stdin, os.Stdin}, SysProcAttr: attr}
		if _, err := startCommand(cmd, func(fn func() error) error { return fn() }); err == nil {
			t.Errorf("startCommand took %+v", attr)
		}
	}
}

// The one clone's child shares the launcher's memory until it execs, and
// its uid change resets the memory's dumpable flag to fs.suid_dumpable:
// at 1, a process of the Trial's uid could then open /proc/PID/mem of the
// child, the launcher's memory (the agent's credentials), for good. The
// flag must be 0 once the child has its uid, which the launcher, sharing
// the memory, sees after the command ran.
func TestPrivilegedLaunchLeavesTheLauncherUndumpable(t *testing.T) {
	privtest.Require(t)
	const sysctl = "/proc/sys/fs/suid_dumpable"
	was, err := os.ReadFile(sysctl)
	if err != nil {
		t.Skipf("no %s: %v", sysctl, err)
	}
	if err := os.WriteFile(sysctl, []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = os.WriteFile(sysctl, was, 0)
		_ = unix.Prctl(unix.PR_SET_DUMPABLE, 1, 0, 0, 0)
	})
	msg, err := launchTrue(t)
	if err != nil || len(msg) > 0 {
		t.Fatalf("the command did not run: %v, %q", err, msg)
	}
	if d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); err != nil || d != 0 {
		t.Errorf("after a launch with fs.suid_dumpable=1 the launcher's memory is dumpable (%d, %v): the child's uid change made it so, and a process of uid 65534 could have read it", d, err)
	}
}

// A launch's child runs on the launcher thread's TLS (%fs), and that
// thread is discarded as soon as the launch returns (netns.offMain), its
// stack unmapped or another thread's. So nothing on the child's path may
// go through the dynamic linker's lazy binding, whose resolver writes the
// calling thread's TLS (its global scope flag): every symbol is bound at
// load.
func TestLaunchBindsAtLoad(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	flags, _ := f.DynValue(elf.DT_FLAGS)
	flags1, _ := f.DynValue(elf.DT_FLAGS_1)
	now := slices.ContainsFunc(flags, func(v uint64) bool { return v&uint64(elf.DF_BIND_NOW) != 0 }) ||
		slices.ContainsFunc(flags1, func(v uint64) bool { return v&uint64(elf.DF_1_NOW) != 0 })
	if !now {
		t.Errorf("%s binds its symbols lazily (DT_FLAGS %#x, DT_FLAGS_1 %#x): a launch's child resolving strchr would write the launcher thread's TLS", exe, flags, flags1)
	}
}

// Nor may the compiler put a stack protector's canary, read from %fs, into
// early.c, whatever the C compiler's default (Ubuntu's and Fedora's turn it
// on): the package's own flags must turn it off.
func TestEarlyHasNoStackProtector(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("no C compiler:", err)
	}
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	obj := filepath.Join(t.TempDir(), "early.o")
	args := append([]string{"-O2", "-fstack-protector-all"}, pkg.CgoCFLAGS...)
	if out, err := exec.Command(cc, append(args, "-c", "early.c", "-o", obj)...).CombinedOutput(); err != nil {
		t.Fatalf("%s %q: %v\n%s", cc, args, err, out)
	}
	f, err := elf.Open(obj)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(syms, func(s elf.Symbol) bool { return s.Name == "__stack_chk_fail" }) {
		t.Errorf("early.c built with %q has stack canaries: a launch's child would read them from the launcher thread's TLS", args)
	}
}

// A command is the OOM killer's first choice (oom_score_adj 1000), the
// agent far from it (-900). The kernel gives an oom_score_adj written by
// a process to every process that shares its memory (MMF_MULTIPROCESS),
// so the one clone's child, which shares the launcher's, must not hand
// its 1000 to the launcher.
func TestPrivilegedLaunchLeavesTheLauncherOOMScore(t *testing.T) {
	privtest.Require(t)
	const adj = "/proc/self/oom_score_adj"
	was, err := os.ReadFile(adj)
	if err != nil {
		t.Fatal(err)
	}
	// Raising needs no capability, and back down to where it was neither.
	if err := os.WriteFile(adj, []byte("500"), 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.WriteFile(adj, was, 0) })
	msg, err := launchTrue(t)
	if err != nil || len(msg) > 0 {
		t.Fatalf("the command did not run: %v, %q", err, msg)
	}
	if got, err := os.ReadFile(adj); err != nil || strings.TrimSpace(string(got)) != "500" {
		t.Errorf("after a launch the launcher's oom_score_adj is %q (%v), want 500: the command's 1000 reached the launcher", got, err)
	}
}

// launchTrue runs true as uid 65534 through the one clone and returns
// what it wrote on its error pipe and how it exited.
func launchTrue(t *testing.T) ([]byte, error) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return launch(exe, "true")
}

// launch runs args as uid 65534 through the one clone, as the Launcher
// does in a Trial, and returns what it wrote on its error pipe and how it
// exited.
func launch(exe string, args ...string) ([]byte, error) {
	cmd, errR, goW, err := launchCmd(exe, args...)
	if err != nil {
		return nil, err
	}
	defer errR.Close()
	_, err = startCommand(cmd, func(fn func() error) error { return fn() })
	_ = cmd.ExtraFiles[0].Close()
	_ = cmd.ExtraFiles[1].Close()
	if err != nil {
		_ = goW.Close()
		return nil, err
	}
	_, _ = goW.Write([]byte{0})
	_ = goW.Close()
	msg, _ := io.ReadAll(errR)
	return msg, cmd.Wait()
}

// launchCmd is the trialnet-exec that runs args as uid 65534, with the
// launcher's ends of its error and ready pipes.
func launchCmd(exe string, args ...string) (cmd *exec.Cmd, errR, goW *os.File, err error) {
	filter, err := seccompFile(false)
	if err != nil {
		return nil, nil, nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		return nil, nil, nil, err
	}
	goR, goW, err := os.Pipe()
	if err != nil {
		_ = errR.Close()
		_ = errW.Close()
		return nil, nil, nil, err
	}
	cmd = &exec.Cmd{Path: exe, Args: append([]string{execArg0, "65534", "65534", "64", socketsAnywhere, "--"}, args...),
		Env: []string{"PATH=/usr/bin:/bin"}, ExtraFiles: []*os.File{errW, goR, filter}}
	return cmd, errR, goW, nil
}

// Launches side by side each learn their own child's pid and see their
// own command run: a launch's pipe copied into another's child (cloned
// between its pipe and its clone) only delays that child's end of file.
func TestPrivilegedLaunchesSideBySide(t *testing.T) {
	privtest.Require(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error)
	const n = 16
	for i := range n {
		go func() {
			msg, err := launch(exe, "sh", "-c", "exit "+strconv.Itoa(i))
			var exit *exec.ExitError
			switch {
			case len(msg) > 0:
				err = fmt.Errorf("launch %d: %q", i, msg)
			case i == 0 && err == nil:
			case errors.As(err, &exit) && exit.ExitCode() == i:
				err = nil
			default:
				err = fmt.Errorf("launch %d: exit %v, want %d", i, err, i)
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// A launcher whose keep-caps securebit is locked (systemd's SecureBits=
// keep-caps-locked) cannot set PR_SET_KEEPCAPS: its commands run all the
// same, with the flag cleared again right after the uid change.
func TestPrivilegedLaunchUnderLockedKeepCaps(t *testing.T) {
	privtest.Require(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const keepCapsLocked = 1 << 5 // SECBIT_KEEP_CAPS_LOCKED
	cmd, errR, goW, err := launchCmd(exe, "true")
	if err != nil {
		t.Fatal(err)
	}
	defer errR.Close()
	// On a thread of its own, discarded after: the bit cannot be unset.
	_, err = startCommand(cmd, func(fn func() error) error {
		runtime.LockOSThread()
		if err := unix.Prctl(unix.PR_SET_SECUREBITS, keepCapsLocked, 0, 0, 0); err != nil {
			return err
		}
		return fn()
	})
	_ = cmd.ExtraFiles[0].Close()
	_ = cmd.ExtraFiles[1].Close()
	if err != nil {
		_ = goW.Close()
		t.Fatal(err)
	}
	_, _ = goW.Write([]byte{0})
	_ = goW.Close()
	msg, _ := io.ReadAll(errR)
	if err := cmd.Wait(); err != nil || len(msg) > 0 {
		t.Errorf("under a locked keep-caps bit: %v, %q; want the command run", err, execMessage(msg))
	}
}
