//go:build linux

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// i386Attempts go through the i386 system call entry (int $0x80), each
// in a child process of its own (-mode i386): a seccomp profile that
// does not list the i386 ABI meets libseccomp's bad-architecture action,
// which runc and crun leave at its default, KILL_THREAD. A Go process
// never hears that one of its threads died, so the child watches the
// attempt's thread from another, and the parent takes the child's
// SIGSYS (KILL_PROCESS) as the refusal too.
var i386Attempts = map[string]func() error{"keyctl-i386": keyctlI386, "socketcall-vsock-i386": vsockI386}

// i386Answer is how long the child waits for the attempt's thread.
const i386Answer = 10 * time.Second

// inChild runs the i386 attempt name in a child and returns its outcome.
func inChild(name string) error {
	self, err := os.Executable()
	if err != nil {
		return errSkip(err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*i386Answer)
	defer cancel()
	out, err := exec.CommandContext(ctx, self, "-mode", "i386", "-i386", name).Output()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit) && exit.Sys().(syscall.WaitStatus).Signal() == syscall.SIGSYS:
		return errors.New("the process was killed by SIGSYS (the bad-architecture action)")
	case err != nil:
		return fmt.Errorf("the child: %v: %s", err, out)
	}
	var r Result
	if err := json.Unmarshal(out, &r); err != nil {
		return fmt.Errorf("the child's %q: %v", out, err)
	}
	switch r.Result {
	case "skipped":
		return errSkip(r.Reason)
	case "blocked":
		return errors.New(r.Reason)
	}
	return errEscaped(r.Reason)
}

// i386Child is -mode i386: the attempt *i386Name on a thread of its own,
// reported when it returns or, if that thread is gone, as killed. No
// garbage collection runs meanwhile: its stop-the-world would wait on
// the dead thread.
func i386Child() {
	fn, ok := i386Attempts[*i386Name]
	if !ok {
		fmt.Fprintln(os.Stderr, "unknown -i386", *i386Name)
		os.Exit(2)
	}
	debug.SetGCPercent(-1)
	tids, done := make(chan int, 1), make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		tids <- unix.Gettid()
		done <- fn()
	}()
	tid := <-tids
	enc := json.NewEncoder(os.Stdout)
	select {
	case err := <-done:
		report(enc, *i386Name, err)
	case <-time.After(i386Answer):
		if state := threadState(tid); state == "gone" || state == "Z" || state == "X" {
			report(enc, *i386Name, fmt.Errorf("its thread was killed (the bad-architecture action, SIGSYS; thread state %s)", state))
		} else {
			report(enc, *i386Name, fmt.Errorf("no answer in %v, its thread still there (state %s)", i386Answer, state))
		}
	}
	os.Exit(0)
}

// threadState is thread tid's state letter as /proc has it, or "gone".
// A killed thread that led the group stays a zombie (Z) until the others
// exit; any other is gone at once.
func threadState(tid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/stat", tid))
	if errors.Is(err, fs.ErrNotExist) {
		return "gone"
	}
	i := strings.LastIndexByte(string(b), ')')
	if err != nil || i < 0 || i+2 >= len(b) {
		return fmt.Sprintf("unknown (%v)", err)
	}
	return string(b[i+2])
}
