//go:build linux && cgo

package sandbox

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"unsafe"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/trial"
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

// init_early.c mounts the Trial's own directories, its devpts and its
// resolv.conf with its own copies of the Go side's bounds and text.
func TestEarlyInitTables(t *testing.T) {
	tmp, shm, ptys, resolv := earlyInitTables()
	if tmp != TmpBytes || shm != ShmBytes || ptys != MaxPtys || resolv != trial.ResolvConf {
		t.Errorf("init_early.c's tables: tmp %d, shm %d, ptys %d, resolv.conf %q; want %d, %d, %d, %q",
			tmp, shm, ptys, resolv, TmpBytes, ShmBytes, MaxPtys, trial.ResolvConf)
	}
	var want []string
	for _, d := range ownDirs {
		want = append(want, d.dir+"="+d.view)
	}
	if got := earlyInitOwnDirs(); !slices.Equal(got, want) {
		t.Errorf("init_early.c's own directories are %q, ownDirs' %q", got, want)
	}
}

// The init's C set-up reports a failure on fd 3 as runInit does, and
// exits: here the launcher's filter is missing, the last step before
// the ready byte. It runs in mount and PID namespaces of its own, which
// its mounts and it end with.
func TestPrivilegedEarlyInitReportsFailure(t *testing.T) {
	privtest.Require(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	empty, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer empty.Close()
	cmd := &exec.Cmd{
		Path:        "/proc/self/exe",
		Args:        initArgs(false, false, "", nil, nil),
		ExtraFiles:  []*os.File{w, empty},
		SysProcAttr: &syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWIPC},
	}
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
