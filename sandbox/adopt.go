//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/internal/cgroup2"
	"github.com/trialnet/trialnet/netns"
	"github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

// ErrNotAdoptable is wrapped by Adopt when the container's network
// namespace or cgroup cannot become a Trial's: the caller's to fix
// (bad request), not the host's failure.
var ErrNotAdoptable = errors.New("cannot become a Trial")

// Container is a container whose runtime has made its network namespace
// and cgroup and started nothing of its image yet (the OCI createRuntime
// stage), for Adopt. Pidfd names its init process so that no reused pid
// is taken for it; it stays the caller's.
type Container struct {
	PID   int
	Pidfd *os.File
	// Prepared is the cgroup id the agent gave a pending entry for this
	// container (bpf AddPending), 0 for none: that entry is the one
	// cgroup entry Adopt replaces; any other is a Trial's, or another
	// container's pending one, and refused.
	Prepared uint64
}

// Adopt makes a Trial of a container's own network namespace and cgroup,
// as spec describes it: the same policy entry, proxy endpoint, loopback
// addresses and record as Create makes, around what the runtime made.
// Its cgroup must be a child of the Trial parent (where the eBPF
// programs key a Trial), no Trial's yet; its network namespace must be
// fresh: not the host's, nor a Trial's, with no interface but lo, no
// socket in it and no task outside the container's cgroup. The cgroup
// and the namespace stay the runtime's: the Trial's teardown kills their
// processes, removes the policy entry and drops its mount of the
// namespace, but removes neither. All-or-nothing like Create; pool
// bounds are the runtime's, so spec has none.
func (h *Host) Adopt(spec trial.Spec, ep Endpoint, c Container) (_ *Trial, err error) {
	if err := h.checkSpec(spec); err != nil {
		return nil, err
	}
	if spec.Pools() != (trial.PoolLimits{}) {
		return nil, fmt.Errorf("adopt a container as Trial %s: pool bounds are its runtime's (--pids-limit, --memory), a Trial made around it has none of its own", spec.ID)
	}
	refuse := func(format string, a ...any) (*Trial, error) {
		return nil, fmt.Errorf("adopt a container as Trial %s: %w: %s", spec.ID, ErrNotAdoptable, fmt.Sprintf(format, a...))
	}
	mount, err := cgroup2.Cached()
	if err != nil {
		return nil, fmt.Errorf("adopt a container as Trial %s: %w", spec.ID, err)
	}
	cg, err := procCgroup(mount, strconv.Itoa(c.PID))
	if err != nil {
		return refuse("%v", err)
	}
	if filepath.Dir(cg) != filepath.Clean(h.Parent) {
		rel := strings.TrimPrefix(h.Parent, mount)
		return refuse("its cgroup %s is not directly under trialnet's %s, where a Trial's cgroup is: give the runtime --cgroup-parent %s (podman, --cgroup-manager cgroupfs) or a cgroupsPath %s/NAME in the bundle", cg, h.Parent, rel, rel)
	}
	cgid, err := bpf.CgroupID(cg)
	if err != nil {
		return refuse("%v", err)
	}
	switch {
	case c.Prepared != 0 && cgid != c.Prepared:
		return refuse("its cgroup %s is not the one prepared for it: its runtime put it elsewhere than the cgroups path it was prepared with; run it again with one cgroups path throughout", cg)
	case c.Prepared == 0 && h.BPF.IsPending(cgid):
		return refuse("its cgroup %s was prepared for another container: give each container a cgroups path of its own", cg)
	case c.Prepared == 0 && h.BPF.HasTrial(cgid):
		return refuse("its cgroup %s is a live Trial's already", cg)
	}
	nsFile, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", c.PID))
	if err != nil {
		return refuse("open its network namespace: %v", err)
	}
	defer nsFile.Close()
	if exited(c.Pidfd) {
		// The cgroup and namespace read above may be a reused pid's.
		return refuse("its process %d exited", c.PID)
	}
	if why := h.notFresh(nsFile, mount, cg); why != "" {
		return refuse("%s: run it with a network namespace of its own and nothing in it (podman --network none, a bundle's network namespace without a path)", why)
	}
	t := &Trial{Launcher: Launcher{ID: spec.ID, Cgroup: cg, CgroupID: cgid, Spec: spec}, recorded: spec,
		proxy: slices.Clone(h.Proxy), host: h, endpoint: ep, adopted: true}
	if err := t.writeRecord(PhaseCreating, true); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_, _ = t.Close()
		}
	}()
	if t.Netns, err = netns.Adopt(h.netnsDir(), spec.ID, nsFile, c.PID, t.loAddrs()...); errors.Is(err, netns.ErrNotBare) {
		return refuse("%v: run it with --network none (podman) or a new network namespace in the bundle", err)
	} else if err != nil {
		return nil, fmt.Errorf("adopt a container as Trial %s: %w", spec.ID, err)
	}
	if exited(c.Pidfd) {
		// What netns.Adopt read of it by pid may be a reused pid's.
		return refuse("its process %d exited", c.PID)
	}
	if err := h.BPF.AddTrial(t.CgroupID, t.policy()); err != nil {
		return nil, fmt.Errorf("adopt a container as Trial %s: %w", spec.ID, err)
	}
	if err := t.serve(nil); err != nil {
		return nil, err
	}
	if err := t.writeRecord(PhaseLive, false); err != nil {
		return nil, err
	}
	return t, nil
}

// notFresh says why the network namespace nsFile refers to cannot be
// made a Trial's ("": it can): it is the host's, this process's or a
// Trial's, or a task outside the container's cgroup cg is in it (a
// namespace shared with another container, or entered by a host
// process), whose sockets there no Trial hook would judge. mount is the
// cgroup2 mount.
func (h *Host) notFresh(nsFile *os.File, mount, cg string) string {
	var st unix.Stat_t
	if err := unix.Fstat(int(nsFile.Fd()), &st); err != nil {
		return fmt.Sprintf("cannot read its network namespace: %v", err)
	}
	same := func(path string) bool {
		var o unix.Stat_t
		return unix.Stat(path, &o) == nil && o.Dev == st.Dev && o.Ino == st.Ino
	}
	switch {
	case same("/proc/self/ns/net"):
		return "it is trialnet's own (the host's) network namespace"
	case same("/proc/1/ns/net"):
		return "it is the host's network namespace"
	}
	ids, _ := netns.List(h.netnsDir())
	for _, id := range ids {
		if same(filepath.Join(h.netnsDir(), id)) {
			return fmt.Sprintf("it is Trial %s's network namespace (annotate the container trialnet.io/trial=%s to join it)", id, id)
		}
	}
	pids, err := pidsIn(&st)
	if err != nil {
		return fmt.Sprintf("cannot tell which processes are in its network namespace: %v", err)
	}
	for _, pid := range pids {
		own, err := procCgroup(mount, pid)
		if err != nil || !within(own, cg) {
			comm, _ := os.ReadFile("/proc/" + pid + "/comm")
			return fmt.Sprintf("process %s (%s) outside the container is in its network namespace", pid, strings.TrimSpace(string(comm)))
		}
	}
	return ""
}

// pidsIn are the processes with a task in the network namespace ns: any
// thread, since a thread can be in another network namespace than its
// process (setns). A process's task directory links two more than its
// threads: one of a single thread is read as /proc/PID/ns/net, its one
// thread's, and only the others' task lists are read: listing every
// process's costs twice as much on a host of mostly single-threaded
// processes.
func pidsIn(ns *unix.Stat_t) ([]string, error) {
	proc, err := os.Open("/proc")
	if err != nil {
		return nil, err
	}
	defer proc.Close()
	names, err := proc.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	fd := int(proc.Fd())
	in := func(path string) bool {
		var st unix.Stat_t
		return unix.Fstatat(fd, path, &st, 0) == nil && st.Dev == ns.Dev && st.Ino == ns.Ino
	}
	var out []string
	for _, pid := range names {
		if pid[0] < '0' || pid[0] > '9' {
			continue
		}
		var task unix.Stat_t
		if unix.Fstatat(fd, pid+"/task", &task, 0) != nil {
			continue // exited
		}
		if task.Nlink <= 3 {
			if in(pid + "/ns/net") {
				out = append(out, pid)
			}
			continue
		}
		for _, tid := range dirNames("/proc/" + pid + "/task") {
			if in(pid + "/task/" + tid + "/ns/net") {
				out = append(out, pid)
				break
			}
		}
	}
	return out, nil
}

// dirNames lists dir; one that is gone (a process that exited) is empty.
func dirNames(dir string) []string {
	f, err := os.Open(dir)
	if err != nil {
		return nil
	}
	defer f.Close()
	names, _ := f.Readdirnames(-1)
	return names
}

// procCgroup is the cgroup v2 directory of process pid; mount is the
// cgroup2 mount.
func procCgroup(mount, pid string) (string, error) {
	b, err := os.ReadFile("/proc/" + pid + "/cgroup")
	if err != nil {
		return "", fmt.Errorf("read its cgroup: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		if rel, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "0::"); ok {
			return filepath.Join(mount, rel), nil
		}
	}
	return "", errors.New("it has no cgroup v2 cgroup")
}

// within: path is dir or under it.
func within(path, dir string) bool {
	return path == dir || strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
}

// exited reports whether pidfd's process has exited: a pidfd polls
// readable from then on. Read through its raw conn, which leaves a pidfd
// on Go's poller as it is.
func exited(pidfd *os.File) bool {
	rc, err := pidfd.SyscallConn()
	if err != nil {
		return true
	}
	gone := true
	_ = rc.Control(func(fd uintptr) {
		for {
			n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
			if err != unix.EINTR {
				gone = err != nil || n > 0
				return
			}
		}
	})
	return gone
}
