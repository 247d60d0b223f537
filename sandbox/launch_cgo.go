//go:build linux && cgo

package sandbox

/*
#include <stdlib.h>
#include "early.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"unsafe"
)

// startCommand starts cmd, a trialnet-exec as execCmd makes it, with one
// exec instead of two: early.c's trialnet_launch clones the process into
// the cgroup, on a thread that enter runs it on (in the Trial's
// namespaces), and runs the constructor's steps in it before it execs the
// command, so trialnet itself is never executed. That thread waits until
// the child has exec'd (a vfork), which needs the ready byte sent after
// this returns: so the launch runs on a goroutine of its own, and its
// child's first byte says it started. What exec.Cmd.Start would do around
// the fork (stdio, the environment's duplicates) is done here, as it does
// it; the returned launchIO is its copying, which Process.Wait waits for.
func startCommand(cmd *exec.Cmd, enter func(func() error) error) (*launchIO, error) {
	l, err := newLaunch(cmd)
	if err != nil {
		return nil, err
	}
	stdio, err := newLaunchIO(cmd)
	if err != nil {
		freeLaunch(l)
		return nil, err
	}
	startR, startW, err := os.Pipe()
	if err != nil {
		freeLaunch(l)
		stdio.abort()
		return nil, err
	}
	defer startR.Close()
	files := append(stdio.child[:], cmd.ExtraFiles...)
	for i, f := range files {
		l.fds[i] = C.int(f.Fd())
	}
	l.started = C.int(startW.Fd())
	// As Go's fork: no descriptor is half made (not yet close-on-exec)
	// while the child copies the table; unlocked once it has.
	syscall.ForkLock.Lock()
	result := make(chan error, 1)
	took := make(chan struct{})
	stdio.launched = make(chan struct{})
	go func() {
		defer close(stdio.launched)
		err := enter(func() error {
			if pid := C.trialnet_launch(l); pid < 0 {
				return os.NewSyscallError("clone3", syscall.Errno(-pid))
			}
			return nil
		})
		runtime.KeepAlive(files)
		_ = startW.Close() // no byte: end of file
		result <- err
		<-took
		freeLaunch(l)
	}()
	n, _ := startR.Read(make([]byte, 1))
	syscall.ForkLock.Unlock()
	pid := int(l.pid)
	close(took)
	if n != 1 {
		err := <-result
		stdio.abort()
		if err == nil {
			err = errors.New("start: the launched process ended before it started")
		}
		return nil, err
	}
	// FindProcess opens a pidfd (it returns no error on Linux): the child
	// is not reaped before Wait, so the pid is still the child's.
	cmd.Process, _ = os.FindProcess(pid)
	stdio.started()
	return stdio, nil
}

// newLaunch is cmd in C memory for trialnet_launch, or why it cannot be
// started as exec.Cmd would start it.
func newLaunch(cmd *exec.Cmd) (*C.struct_trialnet_launch, error) {
	var attr syscall.SysProcAttr
	if cmd.SysProcAttr != nil {
		attr = *cmd.SysProcAttr
	}
	l := (*C.struct_trialnet_launch)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_trialnet_launch{}))))
	l.cgroup = -1
	if attr.Setsid {
		l.setsid = 1
	}
	if attr.Setctty {
		l.setctty, l.ctty = 1, C.int(attr.Ctty)
	}
	if attr.UseCgroupFD {
		l.cgroup = C.int(attr.CgroupFD)
	}
	// What exec.Cmd would do and this does not is refused, not dropped.
	attr.Setsid, attr.Setctty, attr.Ctty, attr.UseCgroupFD, attr.CgroupFD = false, false, 0, false, 0
	if len(cmd.ExtraFiles) != 3 || !reflect.DeepEqual(attr, syscall.SysProcAttr{}) {
		freeLaunch(l)
		return nil, errors.New("start: not a trialnet-exec command as execCmd makes it")
	}
	if err := fillLaunch(l, cmd); err != nil {
		freeLaunch(l)
		return nil, err
	}
	return l, nil
}

// fillLaunch puts cmd's arguments, environment (deduplicated, as
// exec.Cmd does) and working directory into l, in C memory.
func fillLaunch(l *C.struct_trialnet_launch, cmd *exec.Cmd) error {
	env, err := dedupEnv(cmd.Env)
	if err != nil {
		return err
	}
	if l.argv, err = cStrings(cmd.Args); err != nil {
		return err
	}
	l.argc = C.int(len(cmd.Args))
	if l.envp, err = cStrings(env); err != nil {
		return err
	}
	if cmd.Dir != "" {
		if strings.IndexByte(cmd.Dir, 0) >= 0 {
			return fmt.Errorf("start: the working directory %q holds a NUL byte", cmd.Dir)
		}
		l.dir = C.CString(cmd.Dir)
	}
	return nil
}

// freeLaunch frees l and all it holds.
func freeLaunch(l *C.struct_trialnet_launch) {
	freeCStrings(l.argv)
	freeCStrings(l.envp)
	C.free(unsafe.Pointer(l.dir))
	C.free(unsafe.Pointer(l))
}

// dedupEnv is exec.Cmd's: the last of each name wins, and a variable with
// a NUL byte is refused.
func dedupEnv(env []string) ([]string, error) {
	seen := make(map[string]bool, len(env))
	out := make([]string, 0, len(env))
	for i := len(env) - 1; i >= 0; i-- {
		kv := env[i]
		if strings.IndexByte(kv, 0) >= 0 {
			return nil, errors.New("exec: environment variable contains NUL")
		}
		eq := strings.Index(kv, "=")
		if eq == 0 {
			eq = strings.Index(kv[1:], "=") + 1 // a name may begin with '='
		}
		if eq < 0 {
			if kv != "" {
				out = append(out, kv)
			}
			continue
		}
		if seen[kv[:eq]] {
			continue
		}
		seen[kv[:eq]] = true
		out = append(out, kv)
	}
	slices.Reverse(out)
	return out, nil
}

// cStrings is ss as a NULL-terminated array of C strings, in C memory;
// a NUL byte in one is EINVAL, as exec's.
func cStrings(ss []string) (**C.char, error) {
	arr := (**C.char)(C.calloc(C.size_t(len(ss)+1), C.size_t(unsafe.Sizeof((*C.char)(nil)))))
	ptrs := unsafe.Slice(arr, len(ss)+1)
	for i, s := range ss {
		if strings.IndexByte(s, 0) >= 0 {
			freeCStrings(arr)
			return nil, fmt.Errorf("start: %q holds a NUL byte: %w", s, syscall.EINVAL)
		}
		ptrs[i] = C.CString(s)
	}
	return arr, nil
}

func freeCStrings(arr **C.char) {
	if arr == nil {
		return
	}
	for _, p := range unsafe.Slice(arr, 1<<20) {
		if p == nil {
			break
		}
		C.free(unsafe.Pointer(p))
	}
	C.free(unsafe.Pointer(arr))
}
