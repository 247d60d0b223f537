//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/cgroup2"
	"github.com/trialnet/trialnet/internal/fdpass"
	"github.com/trialnet/trialnet/sandbox"
	trialspec "github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

// A profile container's cgroup is made before its runtime creates it
// (PrepareContainer): where the BPF LSM layer is active, a task in a
// cgroup under the Trial parent with no policy entry is refused
// everything, and the runtime puts the container's init there before any
// hook runs. The agent makes the cgroup itself and gives it a pending
// entry (bpf AddPending: a Trial's rules, no namespace, no proxy), which
// the hook's adoption replaces with the Trial's. An entry not adopted
// goes when the process that asked exits (its runtime's create ended),
// after DefaultPendingFor, and when the agent stops or hands over.

// DefaultPendingFor bounds how long a pending entry waits for its hook:
// the runtime's create, image mounts included, runs between.
const DefaultPendingFor = time.Minute

// maxPending bounds the pending entries at once: each takes a policy,
// counters and pty entry of the maps' 16384.
const maxPending = 256

// pending is one prepared cgroup, waiting for its container's hook.
type pending struct {
	// key is the container's id, or for one prepared with none (podman's
	// precreate stage) cgroupKey of its cgroup.
	key                string
	container, profile string
	cgroup             string // absolute
	cgid               uint64
	caller             *os.File // pidfd of the process that asked; nil: none
	timer              *time.Timer
}

// pendings are an agent's pending entries by container id.
type pendings struct {
	mu sync.Mutex
	m  map[string]*pending
	// dropping is read-held by each drop that a timer or a caller's exit
	// makes, from its take to its entry's removal: dropPendingAll waits
	// for those under way, as the agent closes the maps they remove from
	// next.
	dropping sync.RWMutex
}

// take removes container cid's pending entry from the set and returns
// it: the taker then owns it (adopts or drops it).
func (ps *pendings) take(cid string) *pending {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p := ps.m[cid]
	delete(ps.m, cid)
	return p
}

// takeIf is take, if the entry is still p.
func (ps *pendings) takeIf(p *pending) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.m[p.key] != p {
		return false
	}
	delete(ps.m, p.key)
	return true
}

// takeCgroup takes the entry prepared with no container id for the
// cgroup with id cgid, if any.
func (ps *pendings) takeCgroup(cgid uint64) *pending {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for k, p := range ps.m {
		if p.container == "" && p.cgid == cgid {
			delete(ps.m, k)
			return p
		}
	}
	return nil
}

func (ps *pendings) takeAll() []*pending {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var out []*pending
	for cid, p := range ps.m {
		out = append(out, p)
		delete(ps.m, cid)
	}
	return out
}

// PrepareContainer makes the cgroup at req.CgroupsPath, directly under
// the Trial parent and new (an existing one, a live Trial's or a
// leftover with tasks in it, is refused), with a pending entry for
// container req.Container with profile req.Profile, for ContainerTrial
// to adopt. The caller's process (the control socket's peer) is watched:
// when it exits with the entry not adopted, the entry and the cgroup go.
// With no container id (podman's precreate stage, whose config names
// none and whose hook process ends at once) the entry is for whichever
// container's init is in that cgroup at the hook, and only its bound or
// the hook's refusal ends it.
func (a *Agent) PrepareContainer(ctx context.Context, req client.ContainerPrepare) (client.PreparedContainer, error) {
	leave, err := a.enter()
	if err != nil {
		return client.PreparedContainer{}, err
	}
	defer leave()
	if err := checkContainer(client.Container{ID: req.Container, PID: 1}); err != nil && req.Container != "" {
		return client.PreparedContainer{}, errf(client.CodeBadRequest, "container: %v", err)
	}
	who := "container " + req.Container
	if req.Container == "" {
		who = fmt.Sprintf("the container for cgroups path %q", req.CgroupsPath)
	}
	if req.Profile == "" {
		return client.PreparedContainer{}, errf(client.CodeBadRequest, "%s: a Trial around a container needs a profile", who)
	}
	if _, _, err := a.file.Load().Spec(trialspec.Request{ID: "prepare", Profiles: []string{req.Profile}}, a.proxy.Guard().Allowed()); err != nil {
		return client.PreparedContainer{}, errf(client.CodeUnknownProfile, "%s: profile %q: %v", who, req.Profile, err)
	}
	cg, err := a.pendingPath(req.CgroupsPath)
	if err != nil {
		return client.PreparedContainer{}, errf(client.CodeBadRequest, "%s: %v", who, err)
	}
	p := &pending{key: req.Container, container: req.Container, profile: req.Profile, cgroup: cg}
	conn := callerConn(ctx)
	if p.key == "" {
		p.key, conn = cgroupKey(cg), nil
	}
	a.pend.mu.Lock()
	defer a.pend.mu.Unlock()
	if a.pend.m == nil {
		a.pend.m = map[string]*pending{}
	}
	switch {
	case a.pend.m[p.key] != nil:
		return client.PreparedContainer{}, errf(client.CodeDuplicateID, "%s is prepared already (cgroup %s): a runtime that retries must wait for that create to end", who, a.pend.m[p.key].cgroup)
	case len(a.pend.m) >= maxPending:
		return client.PreparedContainer{}, errf(client.CodeBadRequest, "%s: %d containers are prepared and not yet created; retry when their runtimes are done", who, maxPending)
	}
	if err := a.makePending(p, who, conn); err != nil {
		return client.PreparedContainer{}, err
	}
	a.pend.m[p.key] = p
	bound := a.cfg.PendingFor
	if bound <= 0 {
		bound = DefaultPendingFor
	}
	p.timer = time.AfterFunc(bound, func() { a.dropPending(p, "its hook did not adopt it in time") })
	if p.caller != nil {
		go a.watchCaller(p)
	}
	a.log.Info("container prepared", "container", p.container, "profile", p.profile, "cgroup", p.cgroup, "cgroup_id", p.cgid)
	return client.PreparedContainer{Cgroup: cg, Expires: time.Now().Add(bound).UTC()}, nil
}

// cgroupKey is the key of an entry prepared with no container id: a NUL
// first, so that no container's id (printable: checkContainer) is it,
// takes it, or stands in its way.
func cgroupKey(cg string) string { return "\x00" + cg }

// pendingPath is the cgroup a bundle's cgroupsPath names, which must be
// a cgroupfs path directly under the Trial parent, with a plain name.
func (a *Agent) pendingPath(cp string) (string, error) {
	mount, err := cgroup2.Cached()
	if err != nil {
		return "", err
	}
	parent := filepath.Clean(a.host.Parent)
	rel := strings.TrimPrefix(parent, mount)
	if !strings.HasPrefix(cp, "/") || filepath.Clean(cp) != cp || filepath.Dir(filepath.Join(mount, cp)) != parent {
		return "", fmt.Errorf("its cgroups path %q is not a cgroup directly under trialnet's %s: give the runtime a cgroups path %s/NAME (podman: --cgroup-manager cgroupfs --cgroup-parent %s)", cp, parent, rel, rel)
	}
	if name := filepath.Base(cp); !plainCgroupName(name) {
		return "", fmt.Errorf("its cgroup's name %q is not one the agent makes: a name of at most 255 printable characters, no space, not starting with a dot, and not an interface file's (cgroup.*, memory.*, pids.* and the other controllers'), which the kernel may yet add to %s", name, parent)
	}
	return filepath.Join(mount, cp), nil
}

// interfacePrefixes are the prefixes of cgroup v2 interface file names:
// the core's and each controller's. A child named like one blocks the
// kernel from adding that file to the parent when the controller is
// enabled above it, and reads as a file in a listing and in a message.
var interfacePrefixes = []string{"cgroup", "cpu", "cpuset", "io", "memory", "hugetlb", "pids", "rdma", "misc", "dmem"}

// plainCgroupName: name is printable, without space, not hidden, not an
// interface file's, and fits a directory entry.
func plainCgroupName(name string) bool {
	pre, _, dotted := strings.Cut(name, ".")
	return name != "" && len(name) <= 255 && !strings.HasPrefix(name, ".") &&
		!(dotted && slices.Contains(interfacePrefixes, pre)) &&
		strings.IndexFunc(name, func(r rune) bool { return !unicode.IsPrint(r) || unicode.IsSpace(r) }) < 0
}

// makePending makes p's cgroup, new, and its pending entry, and takes a
// pidfd of conn's peer (nil: an in-process caller, whose entry only
// expires); all or nothing. who names its container in errors.
func (a *Agent) makePending(p *pending, who string, conn *net.UnixConn) (err error) {
	if conn != nil {
		fd, _, err := fdpass.PeerPidfd(conn)
		if err != nil {
			return errf(client.CodeInternal, "%s: the process that asks: %v", who, err)
		}
		p.caller = pidFile(fd)
	}
	defer func() {
		if err != nil && p.caller != nil {
			_ = p.caller.Close()
		}
	}()
	// Between the cgroup's making and its entry, only the mark names it
	// for a sweep (sweepPending), should this agent die there.
	mark := a.pendingMark(p.cgroup)
	if mark != "" {
		if err := os.WriteFile(mark, nil, 0o600); err != nil {
			return errf(client.CodeInternal, "%s: mark its cgroup as being made: %v", who, err)
		}
		defer os.Remove(mark)
	}
	if err := os.Mkdir(p.cgroup, 0o755); errors.Is(err, os.ErrExist) {
		return errf(client.CodeBadRequest, "%s: its cgroup %s exists already: a prepared cgroup is a new one the agent makes, never one in use; give the container a cgroups path of its own", who, p.cgroup)
	} else if err != nil {
		return errf(client.CodeInternal, "%s: make its cgroup: %v", who, err)
	}
	if p.cgid, err = bpf.CgroupID(p.cgroup); err == nil {
		err = a.host.BPF.AddPending(p.cgid, sandbox.MaxPtys)
	}
	if err != nil {
		_ = unix.Rmdir(p.cgroup)
		return errf(client.CodeInternal, "%s: %v", who, err)
	}
	return nil
}

// pendingMarkSuffix ends the name of the mark, in the state directory,
// of a prepared cgroup being made (pendingMark).
const pendingMarkSuffix = ".preparing"

// pendingMark is the file that marks cgroup as being made for a prepare,
// "" without a state directory.
func (a *Agent) pendingMark(cgroup string) string {
	if a.cfg.Host.StateDir == "" {
		return ""
	}
	return filepath.Join(a.cfg.Host.StateDir, filepath.Base(cgroup)+pendingMarkSuffix)
}

// watchCaller drops p when the process that prepared it exits first: its
// runtime's create ended, and the hook did not adopt it (a create that
// succeeded ran the hook before it returned).
func (a *Agent) watchCaller(p *pending) {
	rc, err := p.caller.SyscallConn()
	if err == nil {
		err = rc.Read(func(fd uintptr) bool { return exited(int(fd)) })
	}
	if err == nil {
		a.dropPending(p, "the runtime's create ended without its hook adopting it")
	}
}

// dropPending removes p's entry and its cgroup, unless it was taken.
func (a *Agent) dropPending(p *pending, why string) {
	a.pend.dropping.RLock()
	defer a.pend.dropping.RUnlock()
	if !a.pend.takeIf(p) {
		return
	}
	a.removePending(p, why)
}

// removePending removes p's entry, then its cgroup if empty: one with a
// task in it (a runtime that went on without its hook) keeps no entry,
// so the kernel refuses that task everything, and its runtime removes it.
func (a *Agent) removePending(p *pending, why string) {
	p.timer.Stop()
	if p.caller != nil {
		_ = p.caller.Close()
	}
	// Its own cgroup only: one its runtime removed (a create that
	// failed) leaves the path to whoever makes it next, a Trial or
	// another container among them. The cgroup goes before its entry: an
	// agent that dies between leaves an entry, which the next one sweeps,
	// not a cgroup no entry names.
	if id, err := bpf.CgroupID(p.cgroup); err == nil && id == p.cgid {
		if err := unix.Rmdir(p.cgroup); err != nil && !errors.Is(err, unix.ENOENT) {
			a.log.Warn("a prepared cgroup not adopted is left to its runtime, without an entry", "container", p.container, "cgroup", p.cgroup, "error", err)
		}
	}
	if err := a.host.BPF.RemoveTrial(p.cgid); err != nil {
		a.log.Error("remove a pending entry", "container", p.container, "cgroup", p.cgroup, "error", err)
	}
	a.log.Info("prepared container dropped", "container", p.container, "cgroup", p.cgroup, "why", why)
}

// dropPendingAll drops every pending entry: the agent stops or hands
// over, and a successor does not take them (a container between its
// prepare and its hook then fails to create, closed; a retry prepares it
// anew with the successor).
func (a *Agent) dropPendingAll(why string) {
	for _, p := range a.pend.takeAll() {
		a.removePending(p, why)
	}
	// A drop that took its entry first may still be removing it; none
	// takes one from here on (the set is empty).
	a.pend.dropping.Lock()
	defer a.pend.dropping.Unlock()
}

// sweepPending removes the pending entries an agent left (it died, or
// handed over, between a prepare and its hook), with their cgroups where
// empty: no record names them, and none is a Trial's; and, where no
// agent is running to be making one, the empty cgroups an agent died
// making (pendingMark), before their entries.
func (a *Agent) sweepPending() {
	if dir := a.cfg.Host.StateDir; dir != "" && !a.takingOver() {
		marks, _ := filepath.Glob(filepath.Join(dir, "*"+pendingMarkSuffix))
		for _, m := range marks {
			cg := filepath.Join(a.host.Parent, strings.TrimSuffix(filepath.Base(m), pendingMarkSuffix))
			if err := unix.Rmdir(cg); err == nil {
				a.log.Info("removed a prepared cgroup an earlier agent died making", "cgroup", cg)
			}
			_ = os.Remove(m)
		}
	}
	left := map[uint64]bool{}
	for _, id := range a.host.BPF.Pending() {
		left[id] = true
	}
	if len(left) == 0 {
		return
	}
	for _, name := range dirNames(a.host.Parent) {
		dir := filepath.Join(a.host.Parent, name)
		if id, err := bpf.CgroupID(dir); err == nil && left[id] {
			_ = unix.Rmdir(dir)
		}
	}
	for id := range left {
		if err := a.host.BPF.RemoveTrial(id); err != nil {
			a.log.Error("remove a pending entry left by an earlier agent", "cgroup_id", id, "error", err)
		}
	}
	a.log.Info("removed pending entries an earlier agent left", "count", len(left))
}

// dirNames are the subdirectories of dir.
func dirNames(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out
}

// initCgroupID is the id of the cgroup v2 cgroup process pid is in.
func initCgroupID(pid int) (uint64, error) {
	mount, err := cgroup2.Cached()
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if rel, ok := strings.CutPrefix(strings.TrimRight(line, "\n"), "0::"); ok {
			return bpf.CgroupID(filepath.Join(mount, rel))
		}
	}
	return 0, errors.New("no cgroup v2 cgroup")
}
