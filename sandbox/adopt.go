//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

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
	id, err := readNetnsID(nsFile, c.PID)
	if err != nil {
		return refuse("%v", err)
	}
	if exited(c.Pidfd) {
		// The cgroup and namespace read above may be a reused pid's.
		return refuse("its process %d exited", c.PID)
	}
	if why := h.notFresh(id, mount, cg); why != "" {
		return refuse("%s: run it with a network namespace of its own and nothing in it (podman --network none, a bundle's network namespace without a path)", why)
	}
	if why := strangerIn(cg, c.PID); why != "" {
		return refuse("%s", why)
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
	if err := t.serve(nil, nil); err != nil {
		return nil, err
	}
	if err := t.writeRecord(PhaseLive, false); err != nil {
		return nil, err
	}
	return t, nil
}

// netnsID names a network namespace twice: by its namespace file, and
// by its per-namespace procfs entry net/dev. The kernel lets a process
// read another's namespace file only where it may ptrace-read it (an
// agent without CAP_SYS_PTRACE: no process of another user, none that is
// non-dumpable or holds a capability the agent lacks), while anyone may
// stat /proc/PID/net/dev, whose inode is its namespace's own for as long
// as the namespace lives.
type netnsID struct{ ns, dev unix.Stat_t }

// readNetnsID reads the identity of nsFile, process pid's network
// namespace; the caller checks after that pid was not reused meanwhile.
func readNetnsID(nsFile *os.File, pid int) (netnsID, error) {
	var id netnsID
	if err := unix.Fstat(int(nsFile.Fd()), &id.ns); err != nil {
		return id, fmt.Errorf("cannot read its network namespace: %w", err)
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/net/dev", pid), &id.dev); err != nil {
		return id, fmt.Errorf("cannot read its network namespace's /proc/%d/net/dev: %w", pid, err)
	}
	return id, nil
}

// notFresh says why the network namespace id names cannot be made a
// Trial's ("": it can): it is the host's, this process's or a Trial's,
// or a task outside the container's cgroup cg is in it (a namespace
// shared with another container, or entered by a host process), whose
// sockets there no Trial hook would judge. mount is the cgroup2 mount.
func (h *Host) notFresh(id netnsID, mount, cg string) string {
	st := id.ns
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
	for _, other := range ids {
		if same(filepath.Join(h.netnsDir(), other)) {
			return fmt.Sprintf("it is Trial %s's network namespace (annotate the container trialnet.io/trial=%s to join it)", other, other)
		}
	}
	pids, err := pidsIn(id)
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

// netnsScan is this process's task iterator for pidsIn, loaded at its
// first adoption (or NetnsScanError) and kept: a load parses the
// kernel's BTF, an adoption's scan is then one read.
var netnsScan = sync.OnceValues(bpf.OpenNetnsScan)

// NetnsScanError says why adoptions scan /proc rather than read the task
// iterator (nil: they read it), loading it if not yet loaded.
func NetnsScanError() error {
	_, err := netnsScan()
	return err
}

// pidsIn are the processes with a task in the network namespace id: any
// thread, since a thread can be in another network namespace than its
// process (setns). The task iterator lists them with one read, whatever
// the agent may read of them; where it cannot load (NetnsScanError),
// walkPidsIn walks /proc.
func pidsIn(id netnsID) ([]string, error) {
	s, err := netnsScan()
	if err != nil {
		return walkPidsIn(id)
	}
	return iterPidsIn(s, id)
}

// iterPidsIn is pidsIn by the task iterator s.
func iterPidsIn(s *bpf.NetnsScan, id netnsID) ([]string, error) {
	if id.ns.Ino > math.MaxUint32 {
		return nil, fmt.Errorf("its namespace's inode number %d is not an nsfs one", id.ns.Ino)
	}
	pids, err := s.Pids(uint32(id.ns.Ino))
	if err != nil {
		return nil, err
	}
	out := make([]string, len(pids))
	for i, pid := range pids {
		out[i] = strconv.Itoa(pid)
	}
	return out, nil
}

// walkPidsIn is pidsIn by a walk of /proc. A process's task directory links two more than its
// threads: one of a single thread is read as /proc/PID, its one
// thread's, and only the others' task lists are read: listing every
// process's costs twice as much on a host of mostly single-threaded
// processes. A task whose namespace file the kernel will not show is
// placed by its net/dev entry; one neither shows is an error, not
// skipped: it may be in the namespace.
func walkPidsIn(id netnsID) ([]string, error) {
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
	var out []string
	for _, pid := range names {
		if pid[0] < '0' || pid[0] > '9' {
			continue
		}
		var task unix.Stat_t
		if err := unix.Fstatat(fd, pid+"/task", &task, 0); err != nil {
			if err := unreadable(pid, "task", err); err != nil {
				return nil, err
			}
			continue
		}
		tasks := []string{pid}
		if task.Nlink > 3 {
			if tasks, err = taskDirs(fd, pid); err != nil {
				return nil, err
			}
		}
		for _, t := range tasks {
			ok, err := taskIn(fd, t, id)
			if err != nil {
				return nil, err
			}
			if ok {
				out = append(out, pid)
				break
			}
		}
	}
	return out, nil
}

// taskIn says whether the task whose directory is task (relative to
// procFd, /proc) is in the network namespace id; false for one that has
// exited.
func taskIn(procFd int, task string, id netnsID) (bool, error) {
	var st unix.Stat_t
	err := unix.Fstatat(procFd, task+"/ns/net", &st, 0)
	if err == nil {
		return st.Dev == id.ns.Dev && st.Ino == id.ns.Ino, nil
	}
	if !errors.Is(err, unix.EACCES) && !errors.Is(err, unix.EPERM) {
		return false, unreadable(task, "ns/net", err)
	}
	if err := unix.Fstatat(procFd, task+"/net/dev", &st, 0); err != nil {
		return false, unreadable(task, "net/dev", err)
	}
	return st.Dev == id.dev.Dev && st.Ino == id.dev.Ino, nil
}

// taskDirs are the directories of process pid's threads, relative to
// procFd (/proc); none when it has exited.
func taskDirs(procFd int, pid string) ([]string, error) {
	dfd, err := unix.Openat(procFd, pid+"/task", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, unreadable(pid, "task", err)
	}
	f := os.NewFile(uintptr(dfd), "/proc/"+pid+"/task")
	defer f.Close()
	tids, err := f.Readdirnames(-1)
	if err != nil {
		return nil, unreadable(pid, "task", err)
	}
	out := make([]string, 0, len(tids))
	for _, tid := range tids {
		out = append(out, pid+"/task/"+tid)
	}
	return out, nil
}

// unreadable is nil when file of the task directory task cannot be read
// because the task exited (ENOENT; ESRCH; a zombie's namespace reads as
// ENOENT): an exited task holds no socket. Any other error stops the
// scan: skipping that task would let a process hide in the namespace.
func unreadable(task, file string, err error) error {
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
		return nil
	}
	pid, _, _ := strings.Cut(task, "/")
	comm, _ := os.ReadFile("/proc/" + pid + "/comm")
	return fmt.Errorf("cannot read /proc/%s/%s of process %s (%s), which may be in it: %w; an LSM that hides processes from the agent hides them from this check too: let the agent read /proc", task, file, pid, strings.TrimSpace(string(comm)), err)
}

// strangerIn says which task in cgroup cg or below it is neither of the
// container's init nor of a process it forked ("": none). The runtime
// made cg for the container, or the agent prepared it, and put init in
// it; anything else there was put by someone else (root writing
// cgroup.procs), and would be judged as the Trial and counted in its
// record. Threads are read, not processes: one thread of a stranger may
// be in a threaded cgroup below cg.
func strangerIn(cg string, init int) string {
	var why string
	err := filepath.WalkDir(cg, func(dir string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.threads"))
		if err != nil {
			return err
		}
		for _, f := range strings.Fields(string(b)) {
			tid, err := strconv.Atoi(f)
			if err != nil {
				return fmt.Errorf("%s/cgroup.threads lists %q", dir, f)
			}
			ok, err := forkedBy(tid, init)
			if err != nil {
				return err
			}
			if ok {
				continue
			}
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", tid))
			why = fmt.Sprintf("its cgroup %s holds task %d (%s), which is neither the container's init (process %d) nor forked by it: something else put it there; a Trial's cgroup holds its container's processes alone: remove that task from the cgroup and create the container again", dir, tid, strings.TrimSpace(string(comm)), init)
			return fs.SkipAll
		}
		return nil
	})
	if err != nil {
		return fmt.Sprintf("cannot tell which tasks are in its cgroup %s: %v", cg, err)
	}
	return why
}

// forkedBy says whether task tid is one of process init's threads or of
// a process init forked (its parent, or its parent's, ... is init). A
// task that exited meanwhile is not counted; an ancestor that exited is
// no proof of descent, and its descendant is not let pass.
func forkedBy(tid, init int) (bool, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", tid))
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return true, nil
	}
	for range maxAncestors {
		if err != nil {
			return false, err
		}
		tgid, ppid := statusField(b, "Tgid:"), statusField(b, "PPid:")
		switch {
		case tgid == init:
			return true, nil
		case ppid <= 1:
			return false, nil
		}
		b, err = os.ReadFile(fmt.Sprintf("/proc/%d/status", ppid))
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			return false, nil
		}
	}
	return false, nil
}

// maxAncestors bounds forkedBy's walk: deeper than any process tree a
// runtime's init starts before its hooks run.
const maxAncestors = 64

// statusField is the number after key in a /proc/PID/status text (-1:
// none).
func statusField(status []byte, key string) int {
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, key); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
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
