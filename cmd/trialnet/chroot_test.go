//go:build linux

package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/sandbox"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// chrootEnv names the directory that this test binary, started as the
// trialnet command, chroots into first (enterChroot); chrootBindEnv=1
// makes that directory a mount point first.
const (
	chrootEnv     = "TRIALNET_CLI_CHROOT"
	chrootBindEnv = "TRIALNET_CLI_CHROOT_BIND"
	// chrootPivotEnv=1 makes the directory the mount namespace's root
	// instead (pivot_root, the old root detached), as a container does.
	chrootPivotEnv = "TRIALNET_CLI_CHROOT_PIVOT"
	// chrootExecEnv=1 has the test binary exec itself once in the root
	// (execInRoot): its check before the Go runtime (sandbox's
	// rootcheck.c) then runs there, where one started in the root's
	// first process sees the root it had before.
	chrootExecEnv = "TRIALNET_CLI_CHROOT_EXEC"
	// execWorkDir is where in the root execInRoot starts the binary, if
	// the root has it: a working directory that is not the root, which
	// that check must keep.
	execWorkDir = "/conf"
)

// enterChroot makes dir a root with the host's /usr, /etc, /proc, /sys
// and /dev in it, and chroots there. It runs in a mount namespace of its
// own (rootedTrialnet), whose mounts go with it.
func enterChroot(dir string) {
	must := func(what string, err error) {
		if err != nil {
			fmt.Fprintf(os.Stderr, "test chroot: %s: %v\n", what, err)
			os.Exit(126)
		}
	}
	pivot := os.Getenv(chrootPivotEnv) == "1"
	if os.Getenv(chrootBindEnv) == "1" || pivot {
		must("bind "+dir, unix.Mount(dir, dir, "", unix.MS_BIND, ""))
	}
	for _, d := range []string{"/usr", "/etc", "/proc", "/sys", "/dev"} {
		must("mkdir "+d, os.MkdirAll(dir+d, 0o755))
		must("bind "+d, unix.Mount(d, dir+d, "", unix.MS_BIND|unix.MS_REC, ""))
	}
	for _, d := range []string{"/bin", "/sbin", "/lib", "/lib64"} {
		if _, err := os.Lstat(dir + d); err == nil {
			continue // made by an earlier command in this root
		}
		if to, err := os.Readlink(d); err == nil { // merged /usr: a link into it
			must("link "+d, os.Symlink(to, dir+d))
		} else if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			must("mkdir "+d, os.MkdirAll(dir+d, 0o755))
			must("bind "+d, unix.Mount(d, dir+d, "", unix.MS_BIND|unix.MS_REC, ""))
		}
	}
	if pivot {
		must("mkdir old root", os.MkdirAll(dir+"/.oldroot", 0o700))
		must("pivot_root", unix.PivotRoot(dir, dir+"/.oldroot"))
		must("chdir", os.Chdir("/"))
		must("detach the old root", unix.Unmount("/.oldroot", unix.MNT_DETACH))
		return
	}
	must("chroot", unix.Chroot(dir))
	must("chdir", os.Chdir("/"))
}

// execInRoot execs this binary again in the root enterChroot entered,
// without entering it again: the trialnet process then starts there.
func execInRoot() {
	env := slices.DeleteFunc(os.Environ(), func(e string) bool {
		return strings.HasPrefix(e, chrootEnv+"=") || strings.HasPrefix(e, chrootExecEnv+"=")
	})
	if _, err := os.Stat(execWorkDir); err == nil {
		if err := os.Chdir(execWorkDir); err != nil {
			fmt.Fprintf(os.Stderr, "test chroot: %v\n", err)
			os.Exit(126)
		}
	}
	err := unix.Exec("/proc/self/exe", os.Args, env) // the host's /proc is bound in
	fmt.Fprintf(os.Stderr, "test chroot: exec in the root: %v\n", err)
	os.Exit(126)
}

// rootedTrialnet is trialnet started in root, entered as modes (env
// names set to 1: chrootBindEnv, chrootPivotEnv, chrootExecEnv; none: a
// plain chroot), in a mount namespace of its own.
func rootedTrialnet(t *testing.T, root string, modes []string, args ...string) (int, string) {
	t.Helper()
	cmd := trialnetProcess(t, args...)
	cmd.Env = append(cmd.Env, chrootEnv+"="+root)
	for _, m := range modes {
		cmd.Env = append(cmd.Env, m+"=1")
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: unix.CLONE_NEWNS} // Go makes its mounts private
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("trialnet %v in a chroot: %v", args, err)
	}
	return cmd.ProcessState.ExitCode(), string(out)
}

// trialnet in a chroot, where the host's /proc, /sys and /dev are
// mounted as they would be for one: doctor says it cannot run Trials and
// why, and run refuses with the same reason before it makes anything. In
// a chroot that is a mount point of its own, run once started the
// command at the mount namespace's root, outside the chroot, with the
// host's /proc in view; in one that is not, it failed in the Trial's
// setup ("make mounts private: invalid argument").
func TestPrivilegedRefusedInAChroot(t *testing.T) {
	privtest.Require(t)
	for _, modes := range [][]string{nil, {chrootBindEnv}, {chrootExecEnv}, {chrootBindEnv, chrootExecEnv}} {
		t.Run(fmt.Sprint(modes), func(t *testing.T) {
			root := t.TempDir()
			host := testenv.IsolatedHost(t, "chroot")
			// A place outside the chroot the command would write to if it
			// ran outside it.
			outside := t.TempDir()
			if err := errors.Join(os.Chmod(filepath.Dir(outside), 0o711), os.Chmod(outside, 0o777)); err != nil {
				t.Fatal(err)
			}
			marker := filepath.Join(outside, "escaped")
			cfg := fmt.Sprintf("resolvers: [\"127.0.0.1:9\"]\npaths:\n  socket: /run/tn/agent.sock\n  state_dir: /run/tn/state\n  data_dir: /run/tn/data\n"+
				"  pin_dir: %s\n  netns_dir: /run/tn/netns\n  cgroup_parent: %s\n", host.PinDir, host.Parent)
			if err := errors.Join(os.Mkdir(filepath.Join(root, execWorkDir), 0o755),
				os.WriteFile(filepath.Join(root, execWorkDir, "trialnet.yaml"), []byte(cfg), 0o600)); err != nil {
				t.Fatal(err)
			}
			// Named from the working directory where the binary starts
			// in one: it stays there through the check before the runtime.
			cfgPath := filepath.Join(execWorkDir, "trialnet.yaml")
			if slices.Contains(modes, chrootExecEnv) {
				cfgPath = "trialnet.yaml"
			}
			reason := "this process's root directory is not its mount namespace's root"
			code, out := rootedTrialnet(t, root, modes, "doctor")
			if code == exitOK || !strings.Contains(out, reason) {
				t.Errorf("doctor in a chroot: exit %d, want a failure naming the chroot:\n%s", code, out)
			}
			code, out = rootedTrialnet(t, root, modes, "run", "--config", cfgPath, "--uid", "65534", "--gid", "65534", "--",
				"/bin/sh", "-c", "echo ran > "+marker)
			if code == exitOK || !strings.Contains(out, sandbox.ErrChroot.Error()) {
				t.Errorf("run in a chroot: exit %d, want the refusal (%q):\n%s", code, reason, out)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Errorf("the Trial's command ran outside the chroot: it wrote %s", marker)
			}
			if trials, _ := filepath.Glob(filepath.Join(host.Parent, "*", "cgroup.procs")); len(trials) != 0 {
				t.Errorf("run left cgroups behind: %v", trials)
			}
		})
	}
}

// A container's root is its mount namespace's root (pivot_root, the old
// root detached): there the check passes, doctor says nothing of a
// chroot, and a Trial's command runs inside that root.
func TestPrivilegedRunsInAPivotedRoot(t *testing.T) {
	privtest.Require(t)
	root := t.TempDir()
	host := testenv.IsolatedHost(t, "pivot")
	out := filepath.Join(root, "out")
	if err := errors.Join(os.Chmod(root, 0o755), os.Mkdir(out, 0o777), os.Chmod(out, 0o777)); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf("resolvers: [\"127.0.0.1:9\"]\npaths:\n  socket: /run/tn/agent.sock\n  state_dir: /run/tn/state\n  data_dir: /run/tn/data\n"+
		"  pin_dir: %s\n  netns_dir: /run/tn/netns\n  cgroup_parent: %s\n", host.PinDir, host.Parent)
	if err := os.WriteFile(filepath.Join(root, "trialnet.yaml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, modes := range [][]string{{chrootPivotEnv}, {chrootPivotEnv, chrootExecEnv}} {
		t.Run(fmt.Sprint(modes), func(t *testing.T) {
			ran := filepath.Join(out, "ran")
			_ = os.Remove(ran)
			if code, o := rootedTrialnet(t, root, modes, "doctor"); code != exitOK || strings.Contains(o, "is not its mount namespace's root") {
				t.Errorf("doctor in a pivoted root: exit %d, want it to enforce, no chroot named:\n%s", code, o)
			}
			code, o := rootedTrialnet(t, root, modes, "run", "--config", "/trialnet.yaml", "--uid", "65534", "--gid", "65534", "--",
				"/bin/sh", "-c", "echo ran > /out/ran")
			if code != exitOK {
				t.Fatalf("run in a pivoted root: exit %d:\n%s", code, o)
			}
			if b, err := os.ReadFile(ran); err != nil || string(b) != "ran\n" {
				t.Fatalf("the Trial's command did not run inside the pivoted root: %q %v", b, err)
			}
		})
	}
}

// noChrootEnv set to 1 has the test binary, as trialnet, exec itself
// again under a seccomp filter that refuses chroot(2), as a systemd unit
// with SystemCallFilter=~@mount does.
const noChrootEnv = "TRIALNET_TEST_NO_CHROOT"

func execWithoutChroot() {
	runtime.LockOSThread() // the filter is this thread's, which execs
	arch := map[string]uint32{"amd64": unix.AUDIT_ARCH_X86_64, "arm64": unix.AUDIT_ARCH_AARCH64}[runtime.GOARCH]
	prog, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // arch
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: arch, SkipTrue: 1},
		bpf.RetConstant{Val: unix.SECCOMP_RET_KILL_PROCESS},
		bpf.LoadAbsolute{Off: 0, Size: 4}, // nr
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.SYS_CHROOT, SkipFalse: 1},
		bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
		bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW},
	})
	if err == nil {
		err = unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
	}
	if err == nil {
		fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: (*unix.SockFilter)(unsafe.Pointer(&prog[0]))}
		if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); e != 0 {
			err = e
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "test: refuse chroot: %v\n", err)
		os.Exit(125)
	}
	env := slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, noChrootEnv+"=") })
	err = unix.Exec("/proc/self/exe", os.Args, env)
	fmt.Fprintf(os.Stderr, "test: exec: %v\n", err)
	os.Exit(125)
}

// Outside any chroot, the check before the runtime has nothing to take
// back but the working directory: trialnet runs where chroot(2) is
// refused to it (a unit with SystemCallFilter=~@mount), rather than
// stopping with 126 at its start, and still starts where it was.
func TestPrivilegedStartsWhereChrootIsRefused(t *testing.T) {
	privtest.Require(t)
	cmd := trialnetProcess(t, "help")
	cmd.Env = append(cmd.Env, noChrootEnv+"=1")
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("trialnet help where chroot is refused: %v:\n%s", err, out)
	}
	if !strings.Contains(string(out), "run") {
		t.Fatalf("trialnet help where chroot is refused printed no commands:\n%s", out)
	}
}
