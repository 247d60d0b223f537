//go:build linux && cgo

package sandbox

import (
	"bytes"
	"slices"
	"testing"
	"unsafe"

	"github.com/trialnet/trialnet/trial"
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
