//go:build linux && cgo

package sandbox

import (
	"io"
	"os"
	"os/exec"
	"slices"
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
		if _, err := startCommand(cmd); err == nil {
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
	exe, err := os.Executable()
	if err != nil {
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
	cmd := &exec.Cmd{Path: exe, Args: []string{execArg0, "65534", "65534", "64", socketsAnywhere, "--", "true"},
		Env: []string{"PATH=/usr/bin:/bin"}, ExtraFiles: []*os.File{errW, goR, filter}}
	stdio, err := startCommand(cmd)
	if err != nil {
		t.Fatal(err)
	}
	_ = errW.Close()
	_ = goR.Close()
	_, _ = goW.Write([]byte{0})
	_ = goW.Close()
	msg, _ := io.ReadAll(errR)
	err = cmd.Wait()
	stdio.gone()
	if err != nil || len(msg) > 0 {
		t.Fatalf("the command did not run: %v, %q", err, msg)
	}
	if d, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0); err != nil || d != 0 {
		t.Errorf("after a launch with fs.suid_dumpable=1 the launcher's memory is dumpable (%d, %v): the child's uid change made it so, and a process of uid 65534 could have read it", d, err)
	}
}
