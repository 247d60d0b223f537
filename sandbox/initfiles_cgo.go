//go:build linux && cgo && !amd64

package sandbox

// Off x86-64 the Trial's init is this binary again: early.c's constructor
// runs init_early.c's set-up and reaper before the Go runtime starts;
// this file holds its tables to the Go side's (TestEarlyInitTables).

/*
#include "early.h"
extern const int trialnet_init_max_ptys;
extern const char *const trialnet_init_resolv_conf;
extern const struct trialnet_own_dir trialnet_init_own_dirs[3];
extern const char *const trialnet_init_shared_dirs[3];
extern const long long trialnet_init_shared_bytes;
extern const char *const trialnet_init_remote_fs[18];
*/
import "C"

import "fmt"

// earlyInitTables are what init_early.c mounts with: MaxPtys,
// trial.ResolvConf, its own directories, each "DIR=VIEW SIZE", and the
// shared directories it covers, each "DIR SIZE", and the file-system
// types it detaches (TestEarlyInitTables).
func earlyInitTables() (ptys int, resolv string, dirs, shared, remote []string) {
	for _, d := range C.trialnet_init_own_dirs {
		dirs = append(dirs, fmt.Sprintf("%s=%s %d", C.GoString(d.dir), C.GoString(d.view), d.size))
	}
	for _, d := range C.trialnet_init_shared_dirs {
		shared = append(shared, fmt.Sprintf("%s %d", C.GoString(d), C.trialnet_init_shared_bytes))
	}
	for _, r := range C.trialnet_init_remote_fs {
		remote = append(remote, C.GoString(r))
	}
	return int(C.trialnet_init_max_ptys), C.GoString(C.trialnet_init_resolv_conf), dirs, shared, remote
}
