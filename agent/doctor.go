//go:build linux

package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

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
	return append(checks, bpf.Probe()...)
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
