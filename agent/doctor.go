//go:build linux

package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/sandbox"
	"golang.org/x/sys/unix"
)

// Doctor lists what this machine offers trialnet, required and optional.
func Doctor() []bpf.Check {
	checks := []bpf.Check{{Name: "running as root", Required: true, Err: rootErr()}}
	if rootErr() == nil { // joining a mount namespace, as the check does, needs root
		checks = append(checks, bpf.Check{Name: rootCheck, Required: true, Err: sandbox.CheckRoot()})
	}
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
	image, imageErr := sandbox.CheckInitImage()
	if imageErr != nil {
		image = "none"
	}
	checks = append(checks, bpf.Check{Name: "an image for a Trial's init that no Trial can change: " + image, Required: true, Err: imageErr})
	checks = append(checks, bpf.Check{Name: "seccomp filters with errno", Required: true, Err: seccompErr()})
	checks = append(checks, bpf.Check{Name: "Landlock (a domain per Trial command: no ptrace or pidfd_getfd outside it)", Required: false, Err: landlockErr()})
	checks = append(checks, poolChecks()...)
	checks = append(checks, twReuseCheck())
	checks = append(checks, bpf.Check{Name: "SO_PEERPIDFD (Linux 6.5+: a run through the agent is the owner of its Trial, which ends when it dies)", Required: false, Err: HavePeerPidfd()})
	probe := bpf.Probe()
	if err != nil || rootErr() != nil {
		return append(checks, probe...)
	}
	// The probes say what the kernel has; a real Load says what 'trialnet
	// run' will get, with the pins and attachments it makes.
	layer, loadErr := loadOnce(mount)
	checks = append(checks, bpf.Check{Name: LoadCheck, Required: true, Err: loadErr})
	checks = append(checks, bpf.Check{Name: NetnsScanCheck, Err: sandbox.NetnsScanError()})
	if loadErr == nil {
		for i := range probe {
			if strings.HasPrefix(probe[i].Name, "BPF LSM") {
				probe[i] = bpf.Check{Name: "BPF LSM layer (loaded, attached and pinned as a Trial's would be)", Err: layer.lsm}
			}
		}
		unixErr := error(nil)
		if !layer.unixHooks && layer.lsm != nil {
			unixErr = errors.New("neither the cgroup connect_unix hook (Linux 6.7+) nor the BPF LSM layer: 'trialnet run' and 'create' need --no-unix-confine (unix_open) here")
		}
		checks = append(checks, bpf.Check{Name: UnixConfineCheck, Err: unixErr})
		nestErr := layer.lsm
		if nestErr != nil {
			nestErr = fmt.Errorf("%w: they need the BPF LSM layer (%w)", sandbox.ErrNestingUnavailable, nestErr)
		} else {
			nestErr = sandbox.UserNamespacesAllowed()
		}
		checks = append(checks, bpf.Check{Name: nestedCheck, Err: nestErr})
	}
	return append(checks, probe...)
}

// The names of the doctor's checks that the CLI's summary speaks of.
const (
	rootCheck        = "root directory is its mount namespace's root (not a chroot: a Trial's commands start there)"
	LoadCheck        = "load, attach and pin trialnet's eBPF programs (a scratch cgroup and pin directory, removed after)"
	NetnsScanCheck   = "a task iterator for the processes in a container's network namespace (else adoptions walk /proc)"
	UnixConfineCheck = "pathname unix socket confinement (cgroup connect_unix hook or BPF LSM layer)"
	nestedCheck      = "nested sandboxes (--nested: bwrap in a Trial; user namespaces and the BPF LSM layer, which also bounds their ptys)"
)

// loadedLayer is what a real Load attached.
type loadedLayer struct {
	lsm       error // why the BPF LSM layer is not attached; nil: it is
	unixHooks bool
}

// loadOnce loads, attaches and pins the eBPF layer as 'trialnet run'
// does, on a parent cgroup and pin directory of its own, and removes both.
func loadOnce(mount string) (loadedLayer, error) {
	parent, err := os.MkdirTemp(mount, "trialnet-doctor-")
	if err != nil {
		return loadedLayer{}, fmt.Errorf("cannot create a scratch cgroup: %w", err)
	}
	defer unix.Rmdir(parent)
	pins := bpf.DefaultPinDir + "-doctor-" + strings.TrimPrefix(filepath.Base(parent), "trialnet-doctor-")
	l, err := bpf.Load(bpf.Options{Cgroup: parent, PinDir: pins})
	if err != nil {
		return loadedLayer{}, err
	}
	layer := loadedLayer{lsm: l.LSMError(), unixHooks: l.UnixHooks()}
	_ = l.Close()
	if err := bpf.Uninstall(pins); err != nil {
		return layer, fmt.Errorf("remove the scratch pins %s: %w", pins, err)
	}
	return layer, nil
}

// poolChecks say what bounds each Trial's share of the host's pools
// here: its tasks and memory through the cgroup controllers, as the
// agent's Trials would get them (under its parent cgroup, which this
// makes if need be, as the agent does), and the pools every Trial gets
// its own bounded instance of, or is refused.
func poolChecks() []bpf.Check {
	parent, err := sandbox.EnsureParent()
	if err != nil {
		return []bpf.Check{{Name: "per-Trial pids and memory bounds", Err: err}}
	}
	var out []bpf.Check
	for _, b := range sandbox.PoolBoundsFor(parent) {
		c := bpf.Check{Name: "per-Trial " + b.Pool + " bound: " + b.Bound}
		if !b.Bounded {
			c = bpf.Check{Name: "per-Trial " + b.Pool + " bound", Err: errors.New(b.Bound)}
		}
		out = append(out, c)
	}
	for _, b := range []string{
		fmt.Sprintf("ptys: %d, its own devpts instance (max=); with the BPF LSM layer, in any devpts instance its sandboxes mount", sandbox.MaxPtys),
		fmt.Sprintf("/dev/shm: %d MiB, its own tmpfs", sandbox.ShmBytes>>20),
		fmt.Sprintf("/tmp and /var/tmp: %d MiB each, its own tmpfs (counted in its memory)", sandbox.TmpBytes>>20),
		fmt.Sprintf("processes per command: %d (RLIMIT_NPROC, per uid)", sandbox.DefaultMaxProcs),
		"AIO contexts: none (io_setup refused)",
		"core dumps: none (RLIMIT_CORE 1, which a command cannot change: 0 would not stop a core_pattern pipe)",
	} {
		out = append(out, bpf.Check{Name: "per-Trial " + b})
	}
	return out
}

// twReuseCheck says whether the host lets a new outgoing connection take
// a port that an earlier one to the same address holds in TIME_WAIT.
func twReuseCheck() bpf.Check {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_tw_reuse")
	return bpf.Check{Name: "ports in TIME_WAIT reused for the agent's upstream connections (net.ipv4.tcp_tw_reuse = 1)",
		Err: twReuseErr(strings.TrimSpace(string(b)), err)}
}

// twReuseErr judges the value v of net.ipv4.tcp_tw_reuse, read with err.
// Where it is not 1, a tunnel the agent closes first (its client ended)
// holds its port to that upstream address for 60 s, every Trial's
// together: Trials opening and closing tunnels to one provider address
// used up its ephemeral ports, and another Trial's CONNECT there failed
// (a network namespace with 100 ports: 96 tunnels did it).
func twReuseErr(v string, err error) error {
	switch {
	case err != nil:
		return fmt.Errorf("read net.ipv4.tcp_tw_reuse: %w", err)
	case v == "1":
		return nil
	}
	return fmt.Errorf("net.ipv4.tcp_tw_reuse is %s, not 1: each tunnel the agent closes first keeps its port to that upstream address for 60 s, "+
		"so Trials opening and closing tunnels to one provider address (50 a second each by default) can use up the host's ephemeral ports for it, "+
		"and other Trials' CONNECTs there then fail (502, cannot assign requested address); "+
		"set it with 'sysctl -w net.ipv4.tcp_tw_reuse=1' and in /etc/sysctl.d", v)
}

// HavePeerPidfd asks for the pidfd of a socket pair's peer, as the agent
// does of the caller of an owned create (SO_PEERPIDFD, Linux 6.5+).
func HavePeerPidfd() error {
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
