//go:build linux && cgo

package sandbox

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"unsafe"

	"github.com/trialnet/trialnet/internal/privtest"
	"golang.org/x/sys/unix"
)

// early.c keeps its own list of the Trial's directories, where a confined
// command may make sockets: it must be ownDirs'.
func TestEarlyOwnDirs(t *testing.T) {
	var want []string
	for _, d := range ownDirs {
		want = append(want, d.dir)
	}
	if got := earlyOwnDirs(); !slices.Equal(got, want) {
		t.Errorf("early.c's own directories are %q, ownDirs' %q", got, want)
	}
}

// Every launch shares the memfd early.c installs the filter from: it must
// hold the filter, and nothing may change it.
func TestSeccompFileIsTheSealedFilter(t *testing.T) {
	for _, nested := range []bool{false, true} {
		f, err := seccompFile(nested)
		if err != nil {
			t.Fatal(err)
		}
		prog, err := seccompProgram(nested)
		if err != nil {
			t.Fatal(err)
		}
		want := unsafe.Slice((*byte)(unsafe.Pointer(&prog[0])), len(prog)*int(unsafe.Sizeof(prog[0])))
		got := make([]byte, len(want)+1)
		n, _ := f.ReadAt(got, 0)
		if !bytes.Equal(got[:n], want) {
			t.Errorf("nested %v: the memfd holds %d bytes, not the %d of the filter", nested, n, len(want))
		}
		if _, err := f.WriteAt([]byte{0}, 0); err == nil {
			t.Errorf("nested %v: the filter's memfd took a write", nested)
		}
	}
}

// The init's C set-up reports a failure on fd 3 as runInit does, and
// exits: here the launcher's filter is empty, the last step before
// the ready byte. It runs in mount and PID namespaces of its own, which
// its mounts and it end with.
func TestPrivilegedEarlyInitReportsFailure(t *testing.T) {
	privtest.Require(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// Sealed as the launcher's is, and empty.
	fd, err := unix.MemfdCreate("empty", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	empty := os.NewFile(uintptr(fd), "empty")
	defer empty.Close()
	if _, err := unix.FcntlInt(empty.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE); err != nil {
		t.Fatal(err)
	}
	cmd, release, err := initCommand(initArgs(false, false, "", nil, nil, nil), w, empty)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC}
	err = cmd.Start()
	_ = w.Close()
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(r)
	err = cmd.Wait()
	want := "trialnet-init: no seccomp filter from the launcher on fd 4"
	if got := execMessage(msg); got != want || cmd.ProcessState.ExitCode() != 1 {
		t.Errorf("the init's set-up without a filter: %q, %v; want %q and exit 1", got, err, want)
	}
}

// unsealedFilter is the commands' filter in a plain file: what a launcher
// that lost the sealed memfd, or a substitute for it, would pass.
func unsealedFilter(t *testing.T) *os.File {
	t.Helper()
	sealed, err := seccompFile(false)
	if err != nil {
		t.Fatal(err)
	}
	prog, err := io.ReadAll(io.NewSectionReader(sealed, 0, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	// A memfd sealed in every way but against writes: whoever holds it
	// could still change the filter under the reader. (A plain file's
	// answer to F_GET_SEALS depends on its file system: tmpfs has seals.)
	fd, err := unix.MemfdCreate("filter", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "filter")
	t.Cleanup(func() { _ = f.Close() })
	if _, err := f.Write(prog); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		t.Fatal(err)
	}
	return f
}

// Both C set-ups install the filter only from a memfd sealed against
// change: a file another process may still write could hold a different
// filter by the time it is read, or one program's size and another's
// instructions. The init's set-up refuses one before it changes anything.
func TestPrivilegedEarlyInitRefusesUnsealedFilter(t *testing.T) {
	privtest.Require(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd, release, err := initCommand(initArgs(false, false, "", nil, nil, nil), w, unsealedFilter(t))
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC}
	err = cmd.Start()
	_ = w.Close()
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(r)
	_ = cmd.Process.Kill() // an init that took the filter is the reaper by now
	err = cmd.Wait()
	want := "trialnet-init: the seccomp filter on fd 4 is not a sealed memfd: operation not permitted"
	if got := execMessage(msg); got != want || cmd.ProcessState.ExitCode() != 1 {
		t.Errorf("the init's set-up with an unsealed filter: %q, %v; want %q and exit 1", got, err, want)
	}
}

// trialnet-exec refuses an unsealed filter too, first thing.
func TestPrivilegedEarlyExecRefusesUnsealedFilter(t *testing.T) {
	privtest.Require(t)
	errR, errW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer errR.Close()
	goR, goW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	_ = goW.Close() // never ready: a filter taken goes no further
	defer goR.Close()
	cmd := &exec.Cmd{
		Path:       "/proc/self/exe",
		Args:       []string{execArg0, "65534", "65534", "16", socketsAnywhere, "--", "true"},
		ExtraFiles: []*os.File{errW, goR, unsealedFilter(t)},
	}
	err = cmd.Start()
	_ = errW.Close()
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(errR)
	err = cmd.Wait()
	want := "trialnet-exec: the seccomp filter on fd 5 is not a sealed memfd: operation not permitted"
	if got := execMessage(msg); got != want || cmd.ProcessState.ExitCode() != ExitCannotExecute {
		t.Errorf("trialnet-exec with an unsealed filter: %q, %v; want %q and exit %d", got, err, want, ExitCannotExecute)
	}
}

// cap_last_cap is the kernel's, but trialnet-exec takes nothing it could
// not parse for the last capability to drop: the Go path's Atoi refuses
// it, and C that read no digit as capability 0 left every other one in
// the bounding set. Here the file is covered, in a mount namespace of the
// test's, by one that says nothing.
func TestPrivilegedEarlyExecRefusesUnreadableCapLastCap(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "bash")
	garbage := filepath.Join(t.TempDir(), "cap_last_cap")
	if err := os.WriteFile(garbage, []byte("forty\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	filter, err := seccompFile(false)
	if err != nil {
		t.Fatal(err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer errR.Close()
	goR, goW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer goR.Close()
	_, _ = goW.Write([]byte{0}) // ready at once
	_ = goW.Close()
	cmd := &exec.Cmd{
		Path: "/bin/bash",
		Args: []string{"bash", "-c", `mount --make-rprivate / && mount --bind "$1" /proc/sys/kernel/cap_last_cap && exec -a trialnet-exec /proc/$PPID/exe 65534 65534 16 sockets=anywhere -- true`,
			"bash", garbage},
		ExtraFiles:  []*os.File{errW, goR, filter},
		SysProcAttr: &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNS},
	}
	err = cmd.Start()
	_ = errW.Close()
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(errR)
	err = cmd.Wait()
	want := "trialnet-exec: read cap_last_cap: invalid argument"
	if got := execMessage(msg); got != want || cmd.ProcessState.ExitCode() != ExitCannotExecute {
		t.Errorf("trialnet-exec with cap_last_cap %q: %q, %v; want %q and exit %d", "forty", got, err, want, ExitCannotExecute)
	}
}
