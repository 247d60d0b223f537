//go:build linux && cgo

package sandbox

// early.c runs trialnet-exec before the Go runtime starts (and, off
// x86-64, the Trial's init: initfiles_cgo.go); this file links it in.

/*
// A launch's child runs on the launcher thread's TLS, which that thread
// may take with it before the child execs: no stack canary read from it,
// and no lazy binding, whose resolver writes it (launch_cgo_test.go).
#cgo CFLAGS: -fno-stack-protector
#cgo LDFLAGS: -Wl,-z,now
#include <stdlib.h>
#include "early.h"
extern const char *const trialnet_early_own_dirs[];
static const char *trialnet_early_own_dir(int i) { return trialnet_early_own_dirs[i]; }
*/
import "C"

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// earlyOwnDirs are the directories early.c lets a confined command make
// sockets beneath: ownDirs' (TestEarlyOwnDirs).
func earlyOwnDirs() []string {
	var dirs []string
	for i := C.int(0); C.trialnet_early_own_dir(i) != nil; i++ {
		dirs = append(dirs, C.GoString(C.trialnet_early_own_dir(i)))
	}
	return dirs
}

// earlyMountCovered is the init's trialnet_mount_covered, which
// TestMountCovered holds to mountCovered.
func earlyMountCovered(table string, id uint64) (point string, listed, covered bool) {
	t := C.CString(table)
	defer C.free(unsafe.Pointer(t))
	var p *C.char
	var n C.size_t
	r := C.trialnet_mount_covered(t, C.ulonglong(id), &p, &n)
	if r < 0 {
		return "", false, false
	}
	return C.GoStringN(p, C.int(n)), true, r == 1
}

// earlyRoot is the chroot check early.c made before the runtime started
// (rootcheck.c): whether this process's root directory was its mount
// namespace's root. ok is false where it could not look, or where the
// root is no longer the one it looked at (a chroot since).
func earlyRoot() (same, ok bool) {
	r := C.trialnet_early_root
	if r.checked == 0 {
		return false, false
	}
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, "/", 0, unix.STATX_INO|unix.STATX_MNT_ID, &st); err != nil || st.Mask&unix.STATX_MNT_ID == 0 {
		return false, false
	}
	if st.Mnt_id != uint64(r.mnt) || uint64(st.Dev_major) != uint64(r.dev_major) ||
		uint64(st.Dev_minor) != uint64(r.dev_minor) || st.Ino != uint64(r.ino) {
		return false, false
	}
	return r.same != 0, true
}
