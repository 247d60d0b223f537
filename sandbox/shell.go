//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/trialnet/trialnet/netns"
	"github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

// ShellPrefix starts the name of a shell's cgroup v1 groups. No Trial's
// group (trialnet-<cgroup id>) or id can start with it, so a sweep of
// shells never takes a Trial's, nor a Trial's teardown a shell's.
const ShellPrefix = "_shell-"

// ErrShell is wrapped by CreateFrom's errors that are the shell's: the
// Trial was not made, nothing of it is left, and Create can make it
// afresh.
var ErrShell = errors.New("the prepared shell cannot be used")

// A Shell is what a Trial is made of that does not depend on its
// description, made ahead of it (Prepare): its network namespace (lo up,
// held by a descriptor, mounted nowhere), its proxy endpoint's listeners
// in it, and its cgroup v1 pool groups at their default bounds. Its
// cgroup v2 group, and so every eBPF program's view of it (policy entry,
// counters), is made only when a create takes it (CreateFrom): the kernel
// does not rename cgroup v2 groups, and a Trial's cgroup is named by its
// id. A shell holds no process.
type Shell struct {
	// Name names its cgroup v1 groups (NewShellName).
	Name        string
	transparent bool
	ns          *netns.Held
	lns         []net.Listener
	pools       []shellPool // its cgroup v1 groups not yet given
	// poolsOnV2: a pool is bounded on cgroup v2, in the Trial's cgroup,
	// which only the create makes.
	poolsOnV2 bool
}

type shellPool struct {
	c   controller
	dir string
}

// shellSeq numbers this process's shells. It starts at a random value so
// that a process with the pid of one that crashed does not name a shell
// as one that process left (which is not swept: its pid is alive).
var shellSeq atomic.Uint32

func init() { shellSeq.Store(mathrand.Uint32()) }

// NewShellName names a new shell: ShellPrefix, this process's pid, a
// sequence number.
func NewShellName() string {
	return ShellPrefix + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatUint(uint64(shellSeq.Add(1)), 10)
}

// ShellPID is the pid in a shell's name, or false for a name that is not
// a shell's.
func ShellPID(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, ShellPrefix)
	if !ok {
		return 0, false
	}
	pid, seq, ok := strings.Cut(rest, "-")
	p, err := strconv.Atoi(pid)
	if _, serr := strconv.Atoi(seq); !ok || err != nil || serr != nil || p <= 0 {
		return 0, false
	}
	return p, true
}

// Prepare makes a shell for Trials of the given transparent mode (its
// loopback carries that mode's addresses). On error nothing is left.
func (h *Host) Prepare(transparent bool) (_ *Shell, err error) {
	name := NewShellName()
	s := &Shell{Name: name, transparent: transparent}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	l := Launcher{Spec: trial.Spec{Transparent: transparent}}
	if s.ns, err = netns.Prepare(l.loAddrs()...); err != nil {
		return nil, fmt.Errorf("prepare shell %s: %w", name, err)
	}
	if s.lns, err = h.listenProxy(s.ns.Listen, h.Proxy, name); err != nil {
		return nil, fmt.Errorf("prepare shell %s: proxy endpoint: %w", name, err)
	}
	lim := l.poolLimits()
	for _, c := range controllersFor(h.Parent) {
		s.poolsOnV2 = s.poolsOnV2 || c.v2
		if c.dir == "" {
			continue // on cgroup v2 the pool is the Trial's cgroup
		}
		dir := filepath.Join(c.dir, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, fmt.Errorf("prepare shell %s: %w", name, err)
		}
		s.pools = append(s.pools, shellPool{c, dir})
		if err := boundPool(c, dir, lim); err != nil {
			return nil, fmt.Errorf("prepare shell %s: %w", name, err)
		}
	}
	return s, nil
}

// NetnsPath names the shell's network namespace until a create takes it,
// for this process alone (a descriptor of it), to open sockets in.
func (s *Shell) NetnsPath() string { return s.ns.Path() }

// Transparent reports the transparent mode of the Trials s is for.
func (s *Shell) Transparent() bool { return s.transparent }

// Close removes what is left of the shell: what a create did not take.
func (s *Shell) Close() {
	for _, l := range s.lns {
		_ = l.Close()
	}
	s.lns = nil
	if s.ns != nil {
		_ = s.ns.Close()
		s.ns = nil
	}
	for _, p := range s.pools {
		_ = removeShellGroup(p.dir)
	}
	s.pools = nil
}

// check refuses a shell that something reached before a create took it:
// a process put into one of its groups (killed here), or a connection
// waiting on one of its listeners (one from inside its namespace, which
// only a process there can make).
func (s *Shell) check(spec trial.Spec) error {
	if spec.Transparent != s.transparent {
		return errors.New("it was made for the other transparent mode")
	}
	for _, p := range s.pools {
		if pids := groupProcs(p.dir); len(pids) > 0 {
			return fmt.Errorf("process(es) %v were put into its %s group %s before a create took it (killed)", pids, p.c.name, p.dir)
		}
	}
	for _, ln := range s.lns {
		c, _ := ln.(syscall.Conn)
		if c == nil {
			return fmt.Errorf("its listener %s is not a socket", ln.Addr())
		}
		if n, err := Waiting(c); err != nil || n > 0 {
			return fmt.Errorf("its listener %s had %d connection(s) waiting before a create took it (%v)", ln.Addr(), n, err)
		}
	}
	return nil
}

// givePools makes the shell's groups the Trial's: renamed to the names
// its cgroup's id gives them (cgroup v1 renames within a hierarchy), and
// bounded again where its description says more than the defaults, or
// where a pool is on cgroup v2 (the Trial's cgroup, just made).
func (s *Shell) givePools(t *Trial) error {
	for len(s.pools) > 0 {
		p := s.pools[0]
		dir, err := t.poolDir(p.c)
		if err != nil {
			return err
		}
		if err := os.Rename(p.dir, dir); err != nil {
			return fmt.Errorf("give the shell's %s group to the Trial: %w", p.c.name, err)
		}
		s.pools = s.pools[1:]
	}
	if t.Spec.Pools() == (trial.PoolLimits{}) && !s.poolsOnV2 {
		return nil // the groups are at the defaults already
	}
	return t.setupPools()
}

// Waiting is what waits on a socket of a shell: the connections not yet
// accepted on a listening TCP socket, on a UDP one the first datagram's
// bytes, or 1 for an empty datagram. A shell's are all zero until a
// create takes it.
func Waiting(c syscall.Conn) (int, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var serr error
	err = raw.Control(func(fd uintptr) {
		if _, ok := c.(*net.UDPConn); ok {
			// SIOCINQ is 0 for a datagram of no bytes too: a peek
			// tells it from none.
			if n, serr = unix.IoctlGetInt(int(fd), unix.SIOCINQ); serr == nil && n == 0 {
				_, _, perr := unix.Recvfrom(int(fd), nil, unix.MSG_PEEK|unix.MSG_DONTWAIT)
				if !errors.Is(perr, unix.EAGAIN) {
					n, serr = 1, perr
				}
			}
			return
		}
		var info *unix.TCPInfo
		if info, serr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); serr == nil {
			n = int(info.Unacked) // for a listener: its accept queue
		}
	})
	return n, errors.Join(err, serr)
}

// groupProcs are the processes in cgroup v1 group dir, each killed: a
// shell holds none, and one put there would be its Trial's.
func groupProcs(dir string) []int {
	pids := readProcs(dir)
	for _, pid := range pids {
		killIfIn(dir, pid)
	}
	return pids
}

func readProcs(dir string) []int {
	b, err := readKernfs(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killIfIn kills process pid if it is in group dir: through a pidfd
// opened first and the group read again after, so that a pid reused
// meanwhile by a process elsewhere is never signalled.
func killIfIn(dir string, pid int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	for _, p := range readProcs(dir) {
		if p == pid {
			_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
			return
		}
	}
}

// removeShellGroup kills whatever is in a shell's group and removes it.
func removeShellGroup(dir string) error {
	deadline := time.Now().Add(killWait)
	for {
		err := unix.Rmdir(dir)
		if err == nil || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return fmt.Errorf("remove shell group %s: %w", dir, err)
		}
		groupProcs(dir)
		time.Sleep(5 * time.Millisecond)
	}
}

// SweepShells removes the cgroup v1 groups of shells whose process is
// gone (alive says), as a crash leaves them; what else a shell is died
// with its process. Only names made by ShellName are looked at.
func (h *Host) SweepShells(alive func(pid int) bool) {
	for _, c := range controllersFor(h.Parent) {
		if c.dir == "" {
			continue
		}
		entries, _ := os.ReadDir(c.dir)
		for _, e := range entries {
			pid, ok := ShellPID(e.Name())
			if !ok || !e.IsDir() || alive(pid) {
				continue
			}
			dir := filepath.Join(c.dir, e.Name())
			h.log().Warn("removing a prepared shell's group that a stopped agent left", "group", dir)
			if err := removeShellGroup(dir); err != nil {
				h.log().Error("remove a leftover shell group", "error", err)
			}
		}
	}
}
