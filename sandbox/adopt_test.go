//go:build linux

package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"testing"

	"github.com/trialnet/trialnet/internal/privtest"
	"golang.org/x/sys/unix"
)

// A task whose namespace file the adoption scan may not read is not
// skipped. The agent as deploy/trialnet.service bounds it has no
// CAP_SYS_PTRACE, and the kernel shows it no other user's process's
// namespace file: a process of another uid in a container's namespace
// passed unseen. The walk (walkPidsIn, where the task iterator does not
// load) runs here without CAP_SYS_PTRACE, and a process of uid 65534 is
// alone in a new network namespace.
func TestPrivilegedAdoptScanSeesUnreadable(t *testing.T) {
	privtest.Require(t)
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := strconv.Itoa(cmd.Process.Pid)
	id, err := nsIDOf(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	var pids []string
	var hidden error
	privtest.WithoutCap(t, unix.CAP_SYS_PTRACE, func() {
		var st unix.Stat_t
		hidden = unix.Stat("/proc/"+pid+"/ns/net", &st)
		pids, err = walkPidsIn(id)
	})
	if hidden == nil {
		t.Fatal("without CAP_SYS_PTRACE the kernel still shows another user's namespace file: the test shows nothing")
	}
	if err != nil || !slices.Contains(pids, pid) {
		t.Fatalf("without CAP_SYS_PTRACE (its namespace file: %v) the scan found %v, %v; want process %s, of uid 65534, in it", hidden, pids, err, pid)
	}
}

// nsIDOf is the identity of process pid's network namespace.
func nsIDOf(pid int) (netnsID, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return netnsID{}, err
	}
	defer f.Close()
	return readNetnsID(f, pid)
}

// The task iterator finds what the agent cannot read and what /proc
// lists only under a process's threads: a process of uid 65534 alone in
// a new network namespace, read without CAP_SYS_PTRACE, and one thread
// of this (multi-threaded) process that entered that namespace alone.
func TestPrivilegedAdoptScanIterator(t *testing.T) {
	privtest.Require(t)
	s, err := netnsScan()
	if err != nil {
		t.Fatalf("the task iterator did not load: %v", err)
	}
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	id, err := nsIDOf(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	// A thread left in that namespace until the test ends; locked, it
	// exits with its goroutine.
	entered, done := make(chan error), make(chan struct{})
	t.Cleanup(func() { close(done) })
	go func() {
		runtime.LockOSThread()
		f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid))
		if err == nil {
			err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
			f.Close()
		}
		entered <- err
		<-done
	}()
	if err := <-entered; err != nil {
		t.Fatal(err)
	}
	var pids []string
	privtest.WithoutCap(t, unix.CAP_SYS_PTRACE, func() { pids, err = iterPidsIn(s, id) })
	want := []string{strconv.Itoa(os.Getpid()), strconv.Itoa(cmd.Process.Pid)}
	slices.Sort(want)
	if err != nil || !slices.Equal(slices.Sorted(slices.Values(pids)), want) {
		t.Fatalf("the iterator found %v, %v; want %v: process %d of uid 65534, and this process, one of whose threads is in its namespace", pids, err, want, cmd.Process.Pid)
	}
}

// BenchmarkAdoptScan is the adoption's scan of every task on the host, by
// a walk of /proc and by the task iterator, for a namespace with one
// process in it.
func BenchmarkAdoptScan(b *testing.B) {
	privtest.Require(b)
	s, err := netnsScan()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	id, err := nsIDOf(cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*")
	tasks, _ := filepath.Glob("/proc/[0-9]*/task/[0-9]*")
	b.Logf("%d processes, %d tasks", len(procs), len(tasks))
	for _, bc := range []struct {
		name string
		scan func(netnsID) ([]string, error)
	}{
		{"walk", walkPidsIn},
		{"iterator", func(id netnsID) ([]string, error) { return iterPidsIn(s, id) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if pids, err := bc.scan(id); err != nil || len(pids) != 1 {
					b.Fatalf("%v, %v", pids, err)
				}
			}
		})
	}
}
