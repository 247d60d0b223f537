//go:build linux && cgo

package sandbox

// early.c runs trialnet-exec, the Trial's init's set-up (init_early.c)
// and its reaper before the Go runtime starts; this file links them in.

/*
// A launch's child runs on the launcher thread's TLS, which that thread
// may take with it before the child execs: no stack canary read from it,
// and no lazy binding, whose resolver writes it (launch_cgo_test.go).
#cgo CFLAGS: -fno-stack-protector
#cgo LDFLAGS: -Wl,-z,now
extern const char *const trialnet_early_own_dirs[];
static const char *trialnet_early_own_dir(int i) { return trialnet_early_own_dirs[i]; }
#include "early.h"
static long long trialnet_tmp_bytes(void) { return TRIALNET_TMP_BYTES; }
static long long trialnet_shm_bytes(void) { return TRIALNET_SHM_BYTES; }
static int trialnet_max_ptys(void) { return TRIALNET_MAX_PTYS; }
extern const char *const trialnet_init_resolv_conf;
extern const char *trialnet_init_own_dir(int i, const char **view);
*/
import "C"

import "os"

// initFiles are the Trial's init's descriptors from 3 on: the ready pipe,
// and the commands' seccomp filter, which init_early.c installs (it
// cannot assemble it, as Go's installSeccomp does).
func initFiles(ready *os.File) ([]*os.File, error) {
	filter, err := seccompFile(false)
	if err != nil {
		return nil, err
	}
	return []*os.File{ready, filter}, nil
}

// earlyInitTables are what init_early.c mounts with: TmpBytes, ShmBytes,
// MaxPtys and trial.ResolvConf (TestEarlyInitTables).
func earlyInitTables() (tmp, shm int64, ptys int, resolv string) {
	return int64(C.trialnet_tmp_bytes()), int64(C.trialnet_shm_bytes()), int(C.trialnet_max_ptys()),
		C.GoString(C.trialnet_init_resolv_conf)
}

// earlyOwnDirs are the directories early.c lets a confined command make
// sockets beneath: ownDirs' (TestEarlyOwnDirs).
func earlyOwnDirs() []string {
	var dirs []string
	for i := C.int(0); C.trialnet_early_own_dir(i) != nil; i++ {
		dirs = append(dirs, C.GoString(C.trialnet_early_own_dir(i)))
	}
	return dirs
}

// earlyInitOwnDirs are init_early.c's own directories, each DIR=VIEW.
func earlyInitOwnDirs() []string {
	var dirs []string
	for i := C.int(0); ; i++ {
		var view *C.char
		d := C.trialnet_init_own_dir(i, &view)
		if d == nil {
			return dirs
		}
		dirs = append(dirs, C.GoString(d)+"="+C.GoString(view))
	}
}
