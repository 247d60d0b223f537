//go:build linux

package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/sandbox"
	"golang.org/x/sys/unix"
)

// Doctor lists what this machine offers trialnet, required and optional.
func Doctor() []bpf.Check {
	checks := []bpf.Check{{Name: "running as root", Required: true, Err: rootErr()}}
	mount, err := sandbox.Cgroup2Mount()
	checks = append(checks, bpf.Check{Name: "cgroup2 mount", Required: true, Err: err})
	if err == nil {
		_, kerr := os.Stat(filepath.Join(mount, "cgroup.procs"))
		checks = append(checks, bpf.Check{Name: "cgroup2 at " + mount, Required: true, Err: kerr})
		// cgroup.kill exists in every non-root cgroup of a 5.14+ kernel.
		checks = append(checks, bpf.Check{Name: "cgroup.kill (Linux 5.14+)", Required: true, Err: cgroupKill(mount)})
	}
	checks = append(checks, bpf.Check{Name: "bpffs at /sys/fs/bpf", Required: false, Err: bpffs()})
	checks = append(checks, bpf.Check{Name: "BTF (/sys/kernel/btf/vmlinux)", Required: true, Err: statErr("/sys/kernel/btf/vmlinux")})
	checks = append(checks, bpf.Check{Name: "network namespaces", Required: true, Err: statErr("/proc/self/ns/net")})
	checks = append(checks, bpf.Check{Name: "PID and mount namespaces (a Trial's own /proc)", Required: true, Err: errors.Join(statErr("/proc/self/ns/pid"), statErr("/proc/self/ns/mnt"))})
	checks = append(checks, bpf.Check{Name: "seccomp filters with errno", Required: true, Err: seccompErr()})
	checks = append(checks, bpf.Check{Name: "Landlock (a domain per Trial command: no ptrace or pidfd_getfd outside it)", Required: false, Err: landlockErr()})
	checks = append(checks, bpf.Check{Name: processBound(mount)})
	checks = append(checks, bpf.Check{Name: "SO_PEERPIDFD (Linux 6.5+: a run through the agent is the owner of its Trial, which ends when it dies)", Required: false, Err: peerPidfdErr()})
	return append(checks, bpf.Probe()...)
}

// processBound names the bound on a Trial's processes that applies here:
// RLIMIT_NPROC, which the kernel counts per uid. The cgroup v2 pids
// controller would bound each Trial whatever its uid; trialnet does not
// use it yet, and on hosts that bind it to cgroup v1 it is not there.
func processBound(mount string) string {
	const bound = "process bound: RLIMIT_NPROC of each Trial command, counted per uid (Trials sharing a uid share it; uid 0 is exempt)"
	b, err := os.ReadFile(filepath.Join(mount, "cgroup.controllers"))
	if err == nil && slices.Contains(strings.Fields(string(b)), "pids") {
		return bound + "; the cgroup v2 pids controller is available, unused"
	}
	return bound + "; no cgroup v2 pids controller (per-Trial pids.max) here"
}

// peerPidfdErr asks for the pidfd of a socket pair's peer, as the agent
// does of the caller of an owned create.
func peerPidfdErr() error {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	pidfd, err := unix.GetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	if err != nil {
		return fmt.Errorf("%w: 'trialnet run' through the agent is refused; it embeds its own agent when none runs", err)
	}
	return unix.Close(pidfd)
}

func rootErr() error {
	if os.Geteuid() != 0 {
		return ErrNotRoot
	}
	return nil
}

func statErr(p string) error {
	_, err := os.Stat(p)
	return err
}

func cgroupKill(mount string) error {
	dir, err := os.MkdirTemp(mount, "trialnet-doctor-")
	if err != nil {
		return fmt.Errorf("cannot create a probe cgroup: %w", err)
	}
	defer unix.Rmdir(dir)
	if _, err := os.Stat(filepath.Join(dir, "cgroup.kill")); err != nil {
		return errors.New("cgroup.kill is missing (Linux 5.14+ is needed to kill a whole Trial at once)")
	}
	return nil
}

func bpffs() error {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/bpf", &st); err != nil {
		return err
	}
	if st.Type != unix.BPF_FS_MAGIC {
		return errors.New("not mounted (trialnet mounts it when it loads)")
	}
	return nil
}

func seccompErr() error {
	b, err := os.ReadFile("/proc/sys/kernel/seccomp/actions_avail")
	if err != nil {
		return fmt.Errorf("no seccomp filter support (CONFIG_SECCOMP_FILTER): %w", err)
	}
	if !strings.Contains(string(b), "errno") {
		return errors.New("seccomp filters cannot return an errno here")
	}
	return nil
}

func landlockErr() error {
	abi := sandbox.LandlockABI()
	if abi < 1 {
		return sandbox.ErrNoLandlock
	}
	if abi < 6 {
		return fmt.Errorf("ABI %d: no signal scoping (Linux 6.12+); ptrace scoping is there", abi)
	}
	return nil
}
