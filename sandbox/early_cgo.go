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
extern const char *const trialnet_early_own_dirs[];
static const char *trialnet_early_own_dir(int i) { return trialnet_early_own_dirs[i]; }
*/
import "C"

// earlyOwnDirs are the directories early.c lets a confined command make
// sockets beneath: ownDirs' (TestEarlyOwnDirs).
func earlyOwnDirs() []string {
	var dirs []string
	for i := C.int(0); C.trialnet_early_own_dir(i) != nil; i++ {
		dirs = append(dirs, C.GoString(C.trialnet_early_own_dir(i)))
	}
	return dirs
}
