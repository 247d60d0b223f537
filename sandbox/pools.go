//go:build linux

package sandbox

import (
	"bufio"

	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/internal/cgroup2"
	"github.com/trialnet/trialnet/trial"

	"golang.org/x/sys/unix"
)

// The host-wide pools that a Trial's processes draw from, and that the
// cgroup controllers bound per Trial: tasks (pids) and memory. RLIMIT_NPROC
// stays too: it bounds each command's uid, and holds where no controller
// is there.
const (
	PoolPids   = "pids"
	PoolMemory = "memory"
)

var poolNames = []string{PoolPids, PoolMemory}

// MsgQueueBytes is every command's RLIMIT_MSGQUEUE (soft and hard; early.h
// has it too): a quarter of the kernel's default. The kernel counts
// message queue bytes per uid on the whole host, a Trial's own IPC
// namespace notwithstanding, and checks the caller's limit against that
// total: a Trial that shares a uid with host processes (the operator's,
// under sudo) took all 819,200 bytes with nine queues, and the host's
// mq_open failed with EMFILE until it ended. Two queues of glibc's
// default size still fit.
const MsgQueueBytes = 204800

// CoreLimit is every command's RLIMIT_CORE (soft and hard; early.h has it
// too), which the seccomp filter keeps: 1 byte, not 0. Where core_pattern
// pipes to a helper (systemd-coredump, apport: root, outside the Trial,
// handed the crashed process's memory), the kernel ignores the limit but
// for 1, where it dumps nothing; a core file needs a page at least.
const CoreLimit = 1

// defaultMaxPids bounds a Trial's tasks (processes and threads, all its
// commands together) where the pids controller is there.
const defaultMaxPids = DefaultMaxProcs

// defaultMaxMemory is the share of the host's memory one Trial may use by
// default (memory.max, or memory.limit_in_bytes on cgroup v1): half. Swap
// is not given to it at all where the controller can say so.
func defaultMaxMemory() int64 {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0
	}
	return int64(si.Totalram) * int64(si.Unit) / 2
}

// controller is where one pool's controller is, for this host's Trials:
// in the cgroup v2 tree beside the Trial's cgroup, or in a cgroup v1
// hierarchy of its own (dir: the group there that holds Trials' groups,
// ParentName), or nowhere (the pool is unbounded here).
type controller struct {
	name string
	v2   bool
	dir  string // v1 only
	err  error  // why neither, when neither
}

func (c controller) bounded() bool { return c.v2 || c.dir != "" }

// boundText names what bounds the pool on this host, as doctor and the
// layers line say it.
func (c controller) boundText() string {
	switch {
	case c.v2:
		return "cgroup v2 " + c.name + " controller"
	case c.dir != "":
		return "cgroup v1 " + c.name + " controller (" + c.dir + ")"
	}
	return "unbounded: " + c.err.Error()
}

// PoolBounds says what bounds each pool for the Trials of h, as its
// Trials are made.
func (h *Host) PoolBounds() []trial.PoolBound { return boundsOf(controllersFor(h.Parent)) }

// PoolBoundsFor says what bounds each pool for the Trials under parent,
// found afresh (doctor).
func PoolBoundsFor(parent string) []trial.PoolBound { return boundsOf(findControllers(parent)) }

func boundsOf(cs []controller) []trial.PoolBound {
	var out []trial.PoolBound
	for _, c := range cs {
		out = append(out, trial.PoolBound{Pool: c.name, Bounded: c.bounded(), Bound: c.boundText()})
	}
	return out
}

// controllers is controllersFor the Trial's parent: a Trial opened only
// to launch into (no Host) finds the same groups as its creator.
func (t *Launcher) controllers() []controller { return controllersFor(filepath.Dir(t.Cgroup)) }

// foundControllers keeps, per parent and pool, a controller found
// bounded: where it is is the host's, the same for every Trial, and
// finding it reads the parent's controller files and makes (or finds)
// the cgroup v1 group, which each create, launch and destroy asked for
// again. One not bounded is looked for anew each time, as before: it may
// come. What it found may go while the agent runs (a parent removed and
// made again loses what was enabled on it; an operator removes the v1
// group, which is possible while no Trial has a group in it): a create
// that cannot bound its Trial with what is kept forgets it and finds
// again (setupPools), so it never runs unbounded on a stale answer.
var foundControllers sync.Map // controllerKey → controller

type controllerKey struct{ parent, name string }

// controllersFor finds where each pool's controller is for the Trials
// under parent, enabling it for parent's children on cgroup v2, or takes
// what an earlier call found bounded.
func controllersFor(parent string) []controller {
	parent = filepath.Clean(parent)
	var cs []controller
	for _, name := range poolNames {
		k := controllerKey{parent, name}
		if c, ok := foundControllers.Load(k); ok {
			cs = append(cs, c.(controller))
			continue
		}
		c := findController(parent, name)
		if c.bounded() {
			foundControllers.Store(k, c)
		}
		cs = append(cs, c)
	}
	return cs
}

// forgetControllers drops what controllersFor kept for parent.
func forgetControllers(parent string) {
	for _, name := range poolNames {
		foundControllers.Delete(controllerKey{filepath.Clean(parent), name})
	}
}

// findControllers finds where each pool's controller is for the Trials
// under parent, as controllersFor does, keeping nothing.
func findControllers(parent string) []controller {
	var cs []controller
	for _, name := range poolNames {
		cs = append(cs, findController(parent, name))
	}
	return cs
}

func findController(parent, name string) controller {
	c := controller{name: name}
	if on, err := readKernfs(filepath.Join(parent, "cgroup.subtree_control")); err == nil && slices.Contains(strings.Fields(string(on)), name) {
		c.v2 = true // enabled already: no write, which takes the cgroup lock
		return c
	}
	avail, err := readKernfs(filepath.Join(parent, "cgroup.controllers"))
	if err == nil && slices.Contains(strings.Fields(string(avail)), name) {
		err = os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+"+name), 0)
		if err == nil {
			c.v2 = true
			return c
		}
	}
	v2err := err
	if v2err == nil {
		v2err = fmt.Errorf("not enabled for %s's children on cgroup v2", filepath.Dir(parent))
	}
	mnt, err := cachedV1Mount(name)
	if err != nil {
		c.err = fmt.Errorf("%v, and %v", v2err, err)
		return c
	}
	dir := filepath.Join(mnt, ParentName)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		// A hierarchy's top is often 0555: making the group needs
		// CAP_DAC_OVERRIDE, which the unit does not keep (its
		// ExecStartPre makes the group with full privileges).
		c.err = fmt.Errorf("create the cgroup v1 %s group %s: %w (create it once as root: mkdir %s)", name, dir, err, dir)
		return c
	}
	c.dir = dir
	return c
}

// PreparePools makes the cgroup v1 groups that hold Trials' pool groups,
// where those hierarchies are mounted, for an agent that will run without
// the privilege to (the unit's ExecStartPre does the same).
func PreparePools() error {
	var errs []error
	for _, name := range poolNames {
		mnt, err := v1Mount(name)
		if err != nil {
			continue // not a cgroup v1 host for this pool
		}
		if err := os.Mkdir(filepath.Join(mnt, ParentName), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

var v1Mounts sync.Map // controller name → its cgroup v1 mount point

// cachedV1Mount is v1Mount, read once per process for each controller
// found: hierarchies are mounted at boot, and the launch path asks. One
// read keeps every pool's hierarchy it finds, as a launch asks for each
// pool in turn and the kernel makes mountinfo afresh at each read (about
// 0.1 ms of a CLI's launch).
func cachedV1Mount(name string) (string, error) {
	if m, ok := v1Mounts.Load(name); ok {
		return m.(string), nil
	}
	found, err := v1MountsOf(append([]string{name}, poolNames...))
	if err != nil {
		return "", err
	}
	for n, m := range found {
		v1Mounts.Store(n, m)
	}
	return v1Found(found, name)
}

// v1Mount is the mount point of the cgroup v1 hierarchy that carries
// controller name.
func v1Mount(name string) (string, error) {
	found, err := v1MountsOf([]string{name})
	if err != nil {
		return "", err
	}
	return v1Found(found, name)
}

func v1Found(found map[string]string, name string) (string, error) {
	if m, ok := found[name]; ok {
		return m, nil
	}
	return "", fmt.Errorf("no cgroup v1 hierarchy carries the %s controller", name)
}

// v1MountsOf reads mountinfo once for where the cgroup v1 hierarchies
// that carry names are mounted; a name on none is left out.
func v1MountsOf(names []string) (map[string]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	found := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 || g[0] != "cgroup" {
			continue
		}
		opts := strings.Split(g[2], ",")
		for _, name := range names {
			if _, done := found[name]; !done && slices.Contains(opts, name) {
				found[name] = cgroup2.UnescapeMountPath(f[4])
			}
		}
	}
	return found, nil
}

// poolLimits are the Trial's bounds on the pools, each zero one at its
// default.
func (t *Launcher) poolLimits() trial.PoolLimits {
	l := t.Spec.Pools()
	if l.MaxPids <= 0 {
		l.MaxPids = defaultMaxPids
	}
	if l.MaxMemory <= 0 {
		l.MaxMemory = defaultMaxMemory()
	}
	return l
}

// poolDir is the directory of the Trial's group for c: its cgroup on v2;
// on v1, a group in ParentName there named by the Trial cgroup's id
// (unique while the host runs), which whoever has the Trial's cgroup can
// find: a launcher in another process, a restarted agent.
func (t *Launcher) poolDir(c controller) (string, error) {
	if c.v2 {
		return t.Cgroup, nil
	}
	id := t.CgroupID
	if id == 0 {
		var err error
		if id, err = bpf.CgroupID(t.Cgroup); err != nil {
			return "", err
		}
	}
	return filepath.Join(c.dir, "trialnet-"+strconv.FormatUint(id, 10)), nil
}

// setupPools bounds the Trial's pools where their controllers are; a
// controller that is there but refuses fails the Trial (all or nothing).
// What controllersFor kept may be stale: a group or file of it missing,
// it is found again and tried once more, and a pool that was bounded and
// no longer can be fails the Trial rather than leave it unbounded.
func (t *Launcher) setupPools() error {
	kept := t.controllers()
	err := t.boundPools(kept)
	if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	parent := filepath.Dir(t.Cgroup)
	forgetControllers(parent)
	now := t.controllers()
	for i, c := range now {
		if kept[i].bounded() && !c.bounded() {
			return fmt.Errorf("the Trial's %s cannot be bounded: its controller was there (%s) and is no longer (%w): %v", c.name, kept[i].boundText(), err, c.err)
		}
	}
	return t.boundPools(now)
}

// boundPools makes the Trial's groups in cs and writes its bounds there.
func (t *Launcher) boundPools(cs []controller) error {
	lim := t.poolLimits()
	for _, c := range cs {
		if !c.bounded() {
			continue
		}
		dir, err := t.poolDir(c)
		if err != nil {
			return err
		}
		if err := boundPool(c, dir, lim); err != nil {
			return err
		}
	}
	return nil
}

// boundPool makes dir, the group of c for one Trial (on v1; on v2 it is
// the Trial's cgroup), if it is not there, and bounds it at lim.
func boundPool(c controller, dir string, lim trial.PoolLimits) error {
	if !c.v2 {
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create the Trial's %s group: %w", c.name, err)
		}
	}
	var files [][2]string
	switch {
	case c.name == PoolPids:
		files = [][2]string{{"pids.max", strconv.FormatInt(lim.MaxPids, 10)}}
	case c.v2:
		files = [][2]string{{"memory.max", strconv.FormatInt(lim.MaxMemory, 10)}, {"memory.swap.max", "0"}}
	default:
		files = [][2]string{{"memory.limit_in_bytes", strconv.FormatInt(lim.MaxMemory, 10)},
			{"memory.memsw.limit_in_bytes", strconv.FormatInt(lim.MaxMemory, 10)}}
		// cgroup v1 refuses a memory limit above the memory+swap one:
		// a group bounded already (a prepared shell's, at the defaults)
		// is raised swap-first.
		if lim.MaxMemory > readCgroupInt(filepath.Join(dir, "memory.limit_in_bytes"), "") {
			slices.Reverse(files)
		}
	}
	if c.name == PoolMemory && !c.v2 {
		files = append(files, [2]string{tcpLimitFile, strconv.FormatInt(socketMemoryBound(lim.MaxMemory), 10)})
	}
	for _, f := range files {
		err := writeKernfs(filepath.Join(dir, f[0]), f[1])
		if errors.Is(err, os.ErrNotExist) && (strings.Contains(f[0], "sw") || f[0] == tcpLimitFile) {
			continue // no swap or socket accounting on this host: nothing to bound
		}
		if err != nil {
			return fmt.Errorf("bound the Trial's %s (%s): %w", c.name, f[0], err)
		}
	}
	return nil
}

// tcpLimitFile bounds a cgroup v1 memory group's socket buffers (TCP and
// UDP), which cgroup v1 charges nowhere else: not to
// memory.limit_in_bytes, only to the host-wide tcp_mem and udp_mem. A
// Trial bounded at 64 MiB held 1.6 GiB of socket memory with 440
// connections over its own loopback whose receivers never read, and put
// every TCP socket of the host, the agent's tunnels among them, under
// memory pressure. Written, it also makes the kernel charge the group's
// sockets at all (and logs once that the file is deprecated; a kernel
// without it leaves socket buffers unbounded, as before). On cgroup v2
// memory.max counts socket buffers already.
const tcpLimitFile = "memory.kmem.tcp.limit_in_bytes"

// socketMemoryBound is a Trial's socket buffers' bound beside its memory
// bound maxMemory: that, but no more than a quarter of the host's
// tcp_mem low mark, below which the kernel never presses TCP, so that
// one Trial cannot bring the host's sockets near pressure alone.
func socketMemoryBound(maxMemory int64) int64 {
	b, err := readKernfs("/proc/sys/net/ipv4/tcp_mem")
	if err != nil {
		return maxMemory
	}
	f := strings.Fields(string(b))
	if len(f) != 3 {
		return maxMemory
	}
	low, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil || low <= 0 {
		return maxMemory
	}
	return min(maxMemory, low*int64(os.Getpagesize())/4)
}

// v1Groups are the Trial's cgroup v1 groups (on v2 the cgroup is the
// group), each made if it is not there (a Trial made before trialnet
// bounded pools), once its pids group is checked for room for one more
// command.
func (t *Launcher) v1Groups() ([]v1Group, error) {
	var gs []v1Group
	for _, c := range t.controllers() {
		if c.dir == "" {
			continue
		}
		dir, err := t.poolDir(c)
		if err != nil {
			return nil, err
		}
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			if err := t.setupPools(); err != nil {
				return nil, err
			}
		}
		g := v1Group{controller: c, dir: dir}
		if c.name == PoolPids {
			// A command in a Trial at its bound could not even start its
			// runtime's threads: say so rather than crash. newPoolMove
			// takes the same count.
			g.tasks, g.bound = pidsCount(dir)
			if err := pidsFull(g.tasks, g.bound); err != nil {
				return nil, err
			}
		}
		gs = append(gs, g)
	}
	return gs, nil
}

// v1Dirs are the Trial's cgroup v1 groups, made or not, that its init
// shows it (hideV1); none where no v1 controller bounds a pool.
func (t *Launcher) v1Dirs() []string {
	var dirs []string
	for _, c := range t.controllers() {
		if c.dir == "" {
			continue
		}
		if dir, err := t.poolDir(c); err == nil {
			dirs = append(dirs, dir)
		}
	}
	return dirs
}

type v1Group struct {
	controller
	dir          string // the Trial's group
	tasks, bound int64  // a pids group's pids.current and pids.max when v1Groups read them
}

// joinPools puts process pid, just cloned into the Trial's cgroup and
// not yet running its command, into the Trial's cgroup v1 groups: the
// way a command gets there when the launching thread did not take it
// there (poolMove). Moving another process takes the kernel's
// threadgroup lock for writing, which waits out an RCU grace period.
func joinPools(gs []v1Group, pid int) error {
	for _, g := range gs {
		if err := os.WriteFile(filepath.Join(g.dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("put the command in the Trial's %s group: %w", g.name, err)
		}
	}
	return nil
}

// poolMove takes the launching thread itself into the Trial's cgroup v1
// groups for the clone, so that the command is born there (a child
// starts in its parent thread's groups), and back out after it. A thread
// that moves itself (`tasks`, pid 0) is the one migration the kernel
// makes without the threadgroup lock (cgroup_procs_write_start: "If the
// thread is `current`... we can skip the global lock": `pid ||
// threadgroup` in 6.1 and 6.12, CGRP_ATTACH_LOCK_NONE in 6.18), where
// moving the command afterwards (joinPools) waits out an RCU grace
// period, ~10 ms.
//
// While it is there the thread counts as one of the Trial's tasks, and
// what the kernel allocates for the clone is charged to the Trial's
// memory. It is never an OOM victim there: the memory controller's OOM
// killer looks at thread-group leaders only (mem_cgroup_scan_tasks,
// CSS_TASK_ITER_PROCS), and the launching thread is never the main one
// (netns.EnterProcess). It moves back before it is parked (spawn): it is
// discarded only once the command has been reaped, and a move back that
// fails leaves it counted in the Trial's groups until then, one task
// more beside the command, which is there as long.
type poolMove struct {
	into, back []int // the tasks files of the Trial's groups and of the launcher's own
	joined     atomic.Bool
	closed     sync.Once
}

// newPoolMove opens what the thread needs, in this (the host's) mount
// namespace: the thread writes them from inside the Trial's. nil, with
// no error, means the command is to be moved the old way: no cgroup v1
// controller, the Trial one task short of its pids bound (the thread
// would take that place, and the clone be refused), or a group of the
// launcher's own that cannot be found.
func newPoolMove(gs []v1Group) *poolMove {
	if len(gs) == 0 {
		return nil
	}
	own, err := readKernfs("/proc/self/cgroup")
	if err != nil {
		return nil
	}
	m := &poolMove{}
	for _, g := range gs {
		if g.name == PoolPids {
			if g.bound >= 0 && g.tasks+1 >= g.bound {
				m.close()
				return nil
			}
		}
		mnt, err := cachedV1Mount(g.name)
		path, ok := v1Path(string(own), g.name)
		if err != nil || !ok {
			m.close()
			return nil
		}
		into, err := unix.Open(filepath.Join(g.dir, "tasks"), unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			m.close()
			return nil
		}
		m.into = append(m.into, into)
		back, err := unix.Open(filepath.Join(mnt, path, "tasks"), unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			m.close()
			return nil
		}
		m.back = append(m.back, back)
	}
	return m
}

// v1Path is the group of the cgroup v1 hierarchy that carries controller
// name in a /proc/PID/cgroup text.
func v1Path(procCgroup, name string) (string, bool) {
	for line := range strings.Lines(procCgroup) {
		f := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(f) == 3 && slices.Contains(strings.Split(f[1], ","), name) {
			return f[2], true
		}
	}
	return "", false
}

// around runs launch on the calling thread, which must be one that is
// discarded after it, in the Trial's groups if the thread can get there;
// Joined says whether it did.
func (m *poolMove) around(launch func() error) func() error {
	return func() error {
		if m == nil {
			return launch()
		}
		defer m.close()
		n := 0
		for _, fd := range m.into {
			if _, err := unix.Write(fd, []byte("0")); err != nil {
				break
			}
			n++
		}
		m.joined.Store(n == len(m.into))
		if n < len(m.into) {
			// Part way: back out, and joinPools moves the command.
			m.leave(n)
			n = 0
		}
		err := launch()
		m.leave(n)
		return err
	}
}

// leave moves the thread back into the launcher's own groups of the
// first n.
func (m *poolMove) leave(n int) {
	for _, fd := range m.back[:n] {
		_, _ = unix.Write(fd, []byte("0"))
	}
}

// Joined says whether the command was cloned in the Trial's groups.
func (m *poolMove) Joined() bool { return m != nil && m.joined.Load() }

// close closes the files; a move that never ran closes them too.
func (m *poolMove) close() {
	if m == nil {
		return
	}
	m.closed.Do(func() {
		for _, fd := range slices.Concat(m.into, m.back) {
			_ = unix.Close(fd)
		}
	})
}

// pidsCount is the pids group at dir's pids.current and pids.max, -1
// where one cannot be read (or is "max").
func pidsCount(dir string) (tasks, bound int64) {
	return readCgroupInt(filepath.Join(dir, "pids.current"), ""), readCgroupInt(filepath.Join(dir, "pids.max"), "")
}

// pidsFull says, if a pids group with tasks of bound is at its bound, why
// a new command cannot start there.
func pidsFull(tasks, bound int64) error {
	if bound >= 0 && tasks >= bound {
		return fmt.Errorf("the Trial has %d tasks, its bound (pids.max %d): end some of its processes, or give it a higher max_pids", tasks, bound)
	}
	return nil
}

// pidsBound is pidsFull for the Trial's pids group, wherever it is.
func (t *Launcher) pidsBound() error {
	for _, c := range t.controllers() {
		if c.name == PoolPids && c.bounded() {
			if dir, err := t.poolDir(c); err == nil {
				return pidsFull(pidsCount(dir))
			}
		}
	}
	return nil
}

// removePools removes the Trial's cgroup v1 groups once its processes
// are gone (they were killed with the Trial's cgroup).
func (t *Launcher) removePools() error {
	var errs []error
	for _, c := range t.controllers() {
		if c.dir == "" {
			continue
		}
		dir, err := t.poolDir(c)
		if err != nil {
			continue // no cgroup id: no group was made
		}
		deadline := time.Now().Add(killWait)
		for {
			err := unix.Rmdir(dir)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("remove the Trial's %s group %s: %w", c.name, dir, err))
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return errors.Join(errs...)
}

// PoolUse reads the Trial's use of each pool (unbounded ones by name
// only); once the Trial is closed, its use as the teardown found it.
func (t *Trial) PoolUse() []trial.PoolUse {
	if f := t.finalPools.Load(); f != nil {
		return *f
	}
	lim := t.poolLimits()
	var out []trial.PoolUse
	for _, c := range t.controllers() {
		u := trial.PoolUse{Pool: c.name, Bound: c.boundText()}
		if !c.bounded() {
			out = append(out, u)
			continue
		}
		dir, err := t.poolDir(c)
		if err != nil {
			out = append(out, u)
			continue
		}
		read := func(file, key string) int64 { return readCgroupInt(filepath.Join(dir, file), key) }
		switch {
		case c.name == PoolPids:
			u.Max, u.Current, u.Peak, u.Events = lim.MaxPids, read("pids.current", ""), read("pids.peak", ""), read("pids.events", "max")
		case c.v2:
			u.Max, u.Current, u.Peak, u.Events = lim.MaxMemory, read("memory.current", ""), read("memory.peak", ""), read("memory.events", "oom_kill")
		default:
			u.Max, u.Current, u.Peak, u.Events = lim.MaxMemory, read("memory.usage_in_bytes", ""), read("memory.max_usage_in_bytes", ""), read("memory.oom_control", "oom_kill")
		}
		out = append(out, u)
	}
	return out
}

// readCgroupInt reads a number from a cgroup file: the whole file, or the
// value of key in a flat-keyed file; -1 if it is not there.
func readCgroupInt(path, key string) int64 {
	b, err := readKernfs(path)
	if err != nil {
		return -1
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if key == "" && len(f) == 1 {
			n, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return -1
			}
			return n
		}
		if len(f) == 2 && f[0] == key {
			n, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
}

// BoundContainerPools holds a container of the Trial, its init pid, to
// the Trial's pool bounds on a host whose pids or memory controller is on
// cgroup v1. runc places a container at the same path (its cgroupsPath)
// in every hierarchy, so on v1 its tasks were at the Trial's cgroup path
// there, outside the Trial's pool groups (named by the cgroup's id) and
// bounded by nothing: a container in a Trial bounded at 16 tasks ran 49.
// The group at the Trial's path in each such hierarchy gets the Trial's
// bounds: one bound for all its containers and whatever runc exec puts
// in them, beside the one of the commands the Trial launches, while each
// container's own limits stay on its own group below. An init that a
// runtime left elsewhere in a v1 hierarchy is moved into the Trial's own
// pool group there. Nothing to do on v2, where the container's cgroup
// is under the Trial's, nor for a Trial made around a container, whose
// pool bounds are its runtime's (a container that joins it is at that
// container's path, below them).
func (t *Trial) BoundContainerPools(pid int) error {
	if t.adopted {
		return nil
	}
	gs, err := t.v1Groups()
	if err != nil || len(gs) == 0 {
		return err
	}
	mount, err := cgroup2.Mount()
	if err != nil {
		return err
	}
	rel, ok := strings.CutPrefix(t.Cgroup, mount)
	if !ok || !strings.HasPrefix(rel, "/") {
		return fmt.Errorf("the Trial's cgroup %s is not under the cgroup2 mount %s", t.Cgroup, mount)
	}
	own, err := readKernfs(filepath.Join("/proc", strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return fmt.Errorf("read the container's cgroups: %w", err)
	}
	lim := t.poolLimits()
	for _, g := range gs {
		path, ok := v1Path(string(own), g.name)
		if !ok {
			return fmt.Errorf("the container's init is in no cgroup v1 %s group, which the Trial's %s is bounded by", g.name, g.name)
		}
		mnt, err := cachedV1Mount(g.name)
		if err != nil {
			return err
		}
		dir := filepath.Join(mnt, rel)
		if path != rel && !strings.HasPrefix(path, rel+"/") || dir == g.dir {
			if err := writeKernfs(filepath.Join(g.dir, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
				return fmt.Errorf("put the container's init in the Trial's %s group: %w", g.name, err)
			}
			continue
		}
		if n, ok := strings.CutPrefix(filepath.Base(dir), "trialnet-"); ok && filepath.Dir(dir) == filepath.Dir(g.dir) && strings.Trim(n, "0123456789") == "" {
			// Another Trial's pool group (poolDir): its bound is not this
			// Trial's to write, nor its tasks this Trial's to count.
			return fmt.Errorf("the container's cgroup v1 %s group %s is in another Trial's pool group: give the Trial an id not spelt trialnet-NUMBER", g.name, path)
		}
		if err := boundPool(g.controller, dir, lim); err != nil {
			return fmt.Errorf("the Trial's containers' %s: %w", g.name, err)
		}
		if g.name == PoolMemory && path != rel {
			// cgroup v1 charges a socket's buffers only where the group
			// the socket is made in has a socket bound written: then up
			// its parents, so to the bound above.
			err := writeKernfs(filepath.Join(mnt, path, tcpLimitFile), strconv.FormatInt(socketMemoryBound(lim.MaxMemory), 10))
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("bound the container's socket buffers: %w", err)
			}
		}
	}
	return nil
}
