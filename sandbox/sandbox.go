//go:build linux

// Package sandbox makes one Trial a unit: its cgroup, namespaces, policy
// entry, proxy endpoint and record, created all-or-nothing and ended by
// one teardown, and the one launch path of processes into it.
package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/internal/ident"
	"github.com/trialnet/trialnet/netns"
	"github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

// ParentName is the cgroup below the cgroup2 root that holds every Trial
// and carries the eBPF programs.
const ParentName = "trialnet"

// killWait bounds how long tearing down waits for a Trial's processes.
const killWait = 10 * time.Second

// EnsureParent creates <cgroup2 mount>/<ParentName> if needed and returns it.
func EnsureParent() (string, error) {
	root, err := Cgroup2Mount()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, ParentName)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("create parent cgroup %s: %w", dir, err)
	}
	return dir, nil
}

// Host is what Trials are made from: the parent cgroup that carries the
// programs, where namespaces are mounted, the loaded eBPF objects, where
// Trials' records live and who serves their proxy endpoints.
type Host struct {
	Parent   string // parent cgroup directory
	NetnsDir string // empty: netns.DefaultDir
	BPF      *bpf.Loader
	// StateDir holds one record per Trial, written before anything of it
	// is made, so that a later process can open or remove it (Recorded,
	// Open). Empty: no records, for a host whose Trials die with it.
	StateDir string
	// Proxy are the proxy endpoints on a new Trial's loopback, which its
	// Endpoint serves (none: no endpoint is opened); its record keeps
	// them, and its BPF policy allows them.
	Proxy  []netip.AddrPort
	Logger *slog.Logger // nil: discard
}

// Endpoint serves one Trial's proxy endpoint. The sandbox opens the
// listening sockets inside the Trial's network namespace; the Endpoint
// serves them from its own. This is all the sandbox knows of the proxy.
type Endpoint interface {
	// Serve takes the Trial's listeners and serves them until Stop.
	Serve(lns []net.Listener) error
	// Stop ends serving: when it returns, the listeners and every
	// connection of the Trial are closed.
	Stop()
}

func (h *Host) netnsDir() string {
	if h.NetnsDir == "" {
		return netns.DefaultDir
	}
	return h.NetnsDir
}

func (h *Host) log() *slog.Logger {
	if h.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return h.Logger
}

// Launcher starts commands in a Trial (Start, Exec). It is all that a
// process attached to a Trial by its paths (Attach) has of it, and it
// owns nothing: a Trial made or opened here embeds one.
type Launcher struct {
	ID       string
	Cgroup   string
	CgroupID uint64
	Netns    *netns.Namespace
	// Spec is the Trial as it was made: its unix rule, nesting and pool
	// limits are what the launcher applies. It is not changed while the
	// Trial lives (Trial.SetSpec changes its record).
	Spec trial.Spec
}

// Trial is one live Trial. It owns everything it is (cgroup, network,
// PID and mount namespaces, policy entry, proxy endpoint, record) and is
// ended by Close alone.
type Trial struct {
	Launcher
	proxy    []netip.AddrPort // its proxy endpoints
	host     *Host
	endpoint Endpoint // serves its proxy endpoint; nil: none
	// adopted: its cgroup and network namespace are a container
	// runtime's (Adopt), which its teardown leaves to the runtime.
	adopted bool

	recMu    sync.Mutex // orders SetSpec and the teardown's removal of the record
	recorded trial.Spec // the description its record keeps; under recMu
	closing  bool

	closeOnce sync.Once
	final     bpf.Counters
	// unsure is why final may not hold all the Trial did (nil: it does).
	unsure error
	// finalPools is the Trial's pool use as the teardown found it.
	finalPools atomic.Pointer[[]trial.PoolUse]
	closeErr   error
}

// ValidID checks a Trial id: it becomes a file name, a cgroup name and
// a namespace's name.
func ValidID(id string) error {
	if !ident.Valid(id) {
		return fmt.Errorf("invalid Trial id %q: use 1-63 characters from a-z, 0-9, '-' and '_', starting with a letter or digit", id)
	}
	return nil
}

// ErrExists is wrapped by Create when a Trial's cgroup already exists.
var ErrExists = errors.New("already exists")

// Create makes the Trial: its record (write-ahead), cgroup, network
// namespace, policy entry (the last kernel step: until then the cgroup is
// denied everything; policy says what it holds) and proxy endpoint, as
// spec describes it. It is all-or-nothing: on error nothing is left
// behind. spec is kept in the record for Open; ep serves the Trial's
// proxy endpoint (nil: none is opened), and is stopped first by its
// teardown.
func (h *Host) Create(spec trial.Spec, ep Endpoint) (*Trial, error) {
	return h.create(spec, ep, nil)
}

// CreateFrom is Create with what the shell s made ahead: its network
// namespace, listeners and pool groups become the Trial's; what is made
// after is made as Create makes it, so the Trial is one Create would
// have made. s is used up either way (what the Trial did not take is
// removed). An error that wraps ErrShell is the shell's: nothing of the
// Trial is left, and Create can make it.
func (h *Host) CreateFrom(s *Shell, spec trial.Spec, ep Endpoint) (*Trial, error) {
	defer s.Close()
	if err := s.check(spec); err != nil {
		return nil, fmt.Errorf("create Trial %s: %w: %v", spec.ID, ErrShell, err)
	}
	return h.create(spec, ep, s)
}

// create is Create, from s where it is not nil.
func (h *Host) create(spec trial.Spec, ep Endpoint, s *Shell) (_ *Trial, err error) {
	if err := h.checkSpec(spec); err != nil {
		return nil, err
	}
	t := &Trial{Launcher: Launcher{ID: spec.ID, Cgroup: filepath.Join(h.Parent, spec.ID), Spec: spec}, recorded: spec,
		proxy: slices.Clone(h.Proxy), host: h, endpoint: ep}
	if err := t.writeRecord(PhaseCreating, true); err != nil {
		return nil, err
	}
	if err := os.Mkdir(t.Cgroup, 0o755); err != nil {
		t.removeRecord()
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("create Trial %s: cgroup %s %w (a live Trial has this id, or a crashed one left it)", spec.ID, t.Cgroup, ErrExists)
		}
		return nil, fmt.Errorf("create Trial %s: %w", spec.ID, err)
	}
	defer func() {
		if err != nil {
			_, _ = t.Close()
		}
	}()
	if t.CgroupID, err = bpf.CgroupID(t.Cgroup); err != nil {
		return nil, err
	}
	// made are the endpoint's listeners opened as the namespace was
	// made, closed here until served.
	var made []net.Listener
	defer func() {
		if err != nil {
			closeListeners(made)
		}
	}()
	if s != nil {
		err = t.takeShell(s)
	} else {
		made, err = t.makeFresh()
	}
	if err != nil {
		return nil, err
	}
	if err := h.BPF.AddTrial(t.CgroupID, t.policy()); err != nil {
		return nil, fmt.Errorf("create Trial %s: %w", spec.ID, err)
	}
	var lns []net.Listener
	if s != nil {
		lns, s.lns = s.lns, nil
	}
	served := made
	made = nil // serve's from here
	if err := t.serve(served, lns); err != nil {
		return nil, err
	}
	if err := t.writeRecord(PhaseLive, false); err != nil {
		return nil, err
	}
	return t, nil
}

// makeFresh makes the Trial's pool groups and network namespace, side by
// side: neither needs the other, and the namespace is made on a thread of
// its own anyway. What was made of either is the Trial's, for its Close.
// On that thread, in the namespace, it opens every socket the Trial needs
// there (listenInside): one trip into it, not one for each. It returns
// the proxy endpoint's listeners, for serve; on error it leaves none open.
func (t *Trial) makeFresh() ([]net.Listener, error) {
	type made struct {
		ns  *netns.Namespace
		lns []net.Listener
		err error
	}
	nsc := make(chan made, 1)
	go func() {
		var m made
		m.ns, m.err = netns.CreateIn(t.host.netnsDir(), t.ID, t.loAddrs(), func(listen netns.ListenFunc) (err error) {
			m.lns, err = t.listenInside(listen)
			return err
		})
		if m.err != nil {
			closeListeners(m.lns) // opened, then a later step failed
			m.lns = nil
		}
		nsc <- m
	}()
	perr := t.setupPools()
	m := <-nsc
	t.Netns = m.ns
	if err := cmp.Or(perr, m.err); err != nil {
		closeListeners(m.lns)
		return nil, fmt.Errorf("create Trial %s: %w", t.ID, err)
	}
	return m.lns, nil
}

// NetnsEndpoint is an Endpoint with sockets of its own in the Trial's
// network namespace, which a Create without a shell has it open on the
// thread that made the namespace, while there (netns.CreateIn).
type NetnsEndpoint interface {
	Endpoint
	// ListenInside opens them in the calling thread's network namespace,
	// the Trial's: at once, on that thread (it must not unlock it), and
	// on error leaving none open. What it opened is its own to close if
	// the create fails after it, and Create does not say which step did.
	ListenInside() error
}

// listenInside opens, with listen, on the calling thread (in the Trial's
// namespace), the proxy endpoint's listeners, then the Endpoint's own
// sockets (NetnsEndpoint). On error none it opened is left open.
func (t *Trial) listenInside(listen netns.ListenFunc) ([]net.Listener, error) {
	if t.endpoint == nil {
		return nil, nil
	}
	var lns []net.Listener
	if len(t.proxy) > 0 {
		var err error
		if lns, err = t.host.listenProxy(listen, t.proxy, t.ID); err != nil {
			return nil, fmt.Errorf("proxy endpoint: %w", err)
		}
	}
	if ne, ok := t.endpoint.(NetnsEndpoint); ok {
		if err := ne.ListenInside(); err != nil {
			closeListeners(lns)
			return nil, err
		}
	}
	return lns, nil
}

func closeListeners(lns []net.Listener) {
	for _, l := range lns {
		_ = l.Close()
	}
}

// takeShell makes the shell's pool groups and network namespace the
// Trial's. Its errors are the shell's (ErrShell).
func (t *Trial) takeShell(s *Shell) (err error) {
	if err := s.givePools(t); err != nil {
		return fmt.Errorf("create Trial %s: %w: %v", t.ID, ErrShell, err)
	}
	if t.Netns, err = s.ns.Mount(t.host.netnsDir(), t.ID); err != nil {
		return fmt.Errorf("create Trial %s: %w: %v", t.ID, ErrShell, err)
	}
	s.ns = nil
	return nil
}

// checkSpec refuses a description this host cannot make a Trial of.
func (h *Host) checkSpec(spec trial.Spec) error {
	if err := ValidID(spec.ID); err != nil {
		return err
	}
	if err := checkUnixPathsVisible(spec.UnixAllow, hiddenDirs(h.netnsDir())); err != nil {
		return fmt.Errorf("create Trial %s: %w", spec.ID, err)
	}
	if err := checkUnixPathsOffHostShm(spec.UnixAllow); err != nil {
		return fmt.Errorf("create Trial %s: %w", spec.ID, err)
	}
	if err := checkUnixPathsOffSharedDirs(spec.UnixAllow); err != nil {
		return fmt.Errorf("create Trial %s: %w", spec.ID, err)
	}
	if err := checkUnixPathsOffRemoteFS(spec.UnixAllow); err != nil {
		return fmt.Errorf("create Trial %s: %w", spec.ID, err)
	}
	if spec.Nested {
		if err := h.canNest(); err != nil {
			return fmt.Errorf("create Trial %s: %w", spec.ID, err)
		}
	}
	if !spec.UnixOpen && !h.BPF.LSM() {
		for _, p := range spec.UnixAllow {
			if err := checkUnixPathSafe(p); err != nil {
				return fmt.Errorf("create Trial %s: %w; without the BPF LSM layer (%v) trialnet allows only sockets whose path only root can change: put the socket under a root-owned directory, or confine no unix sockets (unix_open)", spec.ID, err, h.BPF.LSMError())
			}
		}
	}
	return nil
}

// policy is the Trial's BPF policy entry, as its Spec and endpoints say.
func (t *Trial) policy() bpf.Policy {
	return bpf.Policy{
		NetnsCookie: t.Netns.Cookie,
		Strict:      t.Spec.Strict,
		Proxy:       t.proxy,
		UnixPaths:   t.Spec.UnixAllow,
		UnixOpen:    t.Spec.UnixOpen,
		OwnDirs:     true, // the init mounts them (mountOwnDirs)
		Nested:      t.Spec.Nested,
		Pool:        t.pool(),
		MaxPtys:     MaxPtys,
	}
}

// serve hands the proxy endpoint's listeners to the Trial's Endpoint:
// made, those opened in its namespace as it was made, or inherited, from
// a shell or an earlier process, checked first; with neither, it opens
// them inside the Trial's namespace.
func (t *Trial) serve(made, inherited []net.Listener) error {
	ep := t.endpoint
	if ep == nil || len(t.proxy) == 0 {
		closeListeners(made)
		closeListeners(inherited)
		return nil
	}
	if len(made) > 0 {
		closeListeners(inherited)
		if err := ep.Serve(made); err != nil {
			return fmt.Errorf("serve the proxy endpoint of Trial %s: %w", t.ID, err)
		}
		return nil
	}
	if len(inherited) > 0 {
		for _, ln := range inherited {
			if err := t.checkInherited(ln); err != nil {
				closeListeners(inherited)
				return err
			}
		}
		if err := ep.Serve(inherited); err != nil {
			return fmt.Errorf("serve the proxy endpoint of Trial %s: %w", t.ID, err)
		}
		return nil
	}
	lns, err := t.host.listenProxy(t.Netns.Listen, t.proxy, t.ID)
	if err != nil {
		return fmt.Errorf("proxy endpoint of Trial %s: %w", t.ID, err)
	}
	if err := ep.Serve(lns); err != nil {
		return fmt.Errorf("serve the proxy endpoint of Trial %s: %w", t.ID, err)
	}
	return nil
}

// listenProxy opens the proxy endpoints eps with listen (in a Trial's
// namespace), for the Trial (or shell) named who.
func (h *Host) listenProxy(listen netns.ListenFunc, eps []netip.AddrPort, who string) ([]net.Listener, error) {
	var lns []net.Listener
	for i, ap := range eps {
		ln, err := listen(context.Background(), "tcp", ap.String())
		if err != nil {
			if i > 0 && ap.Addr().Is6() {
				// No IPv6 on this kernel's loopback: the IPv4 endpoint,
				// which HTTPS_PROXY names, is enough.
				h.log().Warn("no IPv6 proxy endpoint", "trial", who, "error", err)
				continue
			}
			closeListeners(lns)
			return nil, err
		}
		lns = append(lns, ln)
	}
	return lns, nil
}

// checkInherited refuses a listener handed over for this Trial that is
// not one of its proxy endpoints, in its namespace: served as this
// Trial's, another Trial's listener would get this Trial's policy.
func (t *Trial) checkInherited(ln net.Listener) error {
	bad := func(why string) error {
		return fmt.Errorf("a listener handed over for Trial %s is not its proxy endpoint (%s); it is not served", t.ID, why)
	}
	ap, err := netip.ParseAddrPort(ln.Addr().String())
	if err != nil || !slices.Contains(t.proxy, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())) {
		return bad("it listens on " + ln.Addr().String())
	}
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return bad("not a socket")
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return bad(err.Error())
	}
	var cookie uint64
	var cerr error
	if err := raw.Control(func(fd uintptr) { cookie, cerr = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_NETNS_COOKIE) }); err != nil || cerr != nil {
		return bad(fmt.Sprint("its namespace cannot be read: ", errors.Join(err, cerr)))
	}
	if cookie != t.Netns.Cookie {
		return bad("it lives in another network namespace")
	}
	return nil
}

// Counters reads the Trial's kernel counters.
func (t *Trial) Counters() (bpf.Counters, error) {
	return t.host.BPF.Counters(t.CgroupID)
}

// Close is the Trial's one teardown. In this order: the proxy endpoint
// stops (no new connection can reach a namespace that is going away),
// every process is killed, the final counters are read, and the cgroup,
// policy entry, namespace and record are removed. It tries every step
// even when one fails, and whatever is already gone is not an error, so
// it also removes a half-made Trial. It returns the final counters; a
// second Close returns what the first did.
func (t *Trial) Close() (bpf.Counters, error) { return t.CloseWith(nil) }

// CloseWith is Close that also runs during with the final counters, and
// returns its error joined to the teardown's. In the Close that tears the
// Trial down, during runs once the counters and pool use are read, beside
// the removals that follow (cgroups, policy entry, namespace, locks,
// record), so that a caller's own work at the Trial's end (its receipt,
// made durable) overlaps them; the teardown returns when both are done.
// After an earlier Close it runs on its own, with that Close's counters.
// unsure, given to during, says why the counters may not hold all the
// Trial did: its processes outlived the kill (one stuck in the kernel),
// or the counters could not be read; nil when they do.
func (t *Trial) CloseWith(during func(final bpf.Counters, unsure error) error) (bpf.Counters, error) {
	var derr error
	do := func(final bpf.Counters, unsure error) {
		if during != nil {
			derr = during(final, unsure)
		}
	}
	ran := false
	t.closeOnce.Do(func() {
		ran = true
		t.final, t.unsure, t.closeErr = t.teardown(do)
	})
	if !ran {
		do(t.final, t.unsure)
	}
	return t.final, errors.Join(t.closeErr, derr)
}

// SetSpec replaces the Trial's description in its record, so that a
// later Open hands it back: what the proxy enforces may change (the
// allowlist), what the sandbox enforces may not, as the Trial was made
// with it. It fails once Close has begun, so that a closed Trial's record
// is never written again.
func (t *Trial) SetSpec(spec trial.Spec) error {
	if err := sameSandbox(t.Spec, spec); err != nil {
		return fmt.Errorf("Trial %s: %w", t.ID, err)
	}
	t.recMu.Lock()
	defer t.recMu.Unlock()
	if t.closing {
		return fmt.Errorf("Trial %s is being closed", t.ID)
	}
	old := t.recorded
	t.recorded = spec
	if err := t.writeRecord(PhaseLive, false); err != nil {
		t.recorded = old
		return err
	}
	return nil
}

// sameSandbox refuses a change of what the sandbox enforces.
func sameSandbox(was, now trial.Spec) error {
	if was.ID != now.ID || was.Strict != now.Strict || was.UnixOpen != now.UnixOpen || was.Nested != now.Nested ||
		was.Transparent != now.Transparent || !slices.Equal(was.UnixAllow, now.UnixAllow) || was.Pools() != now.Pools() {
		return errors.New("its id, loopback, unix, nesting, transparent and pool rules are fixed when it is made")
	}
	return nil
}

// teardown ends the Trial in Close's order: stop reads what the Trial
// ended with, then remove takes it apart while during runs.
func (t *Trial) teardown(during func(bpf.Counters, error)) (bpf.Counters, error, error) {
	final, errs := t.stop()
	unsure := errors.Join(errs...)
	var beside sync.WaitGroup
	beside.Go(func() { during(final, unsure) })
	errs = append(errs, t.remove()...)
	beside.Wait()
	// Last, once what runs beside is done too: until then a successor
	// of an agent killed here finds the record, and removes what is
	// left of the Trial, the agent's own (its steering's pins) with it.
	t.removeRecord()
	if err := errors.Join(errs...); err != nil {
		return final, unsure, fmt.Errorf("close Trial %s: %w", t.ID, err)
	}
	return final, unsure, nil
}

// stop ends everything that runs in the Trial and reads what it ended
// with: no launcher joins it from here, its proxy endpoint stops (no new
// connection can reach a namespace that is going away), every process
// is killed, and the final counters and pool use are read.
func (t *Trial) stop() (bpf.Counters, []error) {
	t.recMu.Lock()
	t.closing = true
	t.recMu.Unlock()
	if err := markClosing(t.Cgroup, t.CgroupID); err != nil {
		t.host.log().Warn("mark the Trial closing for other launchers", "trial", t.ID, "error", err)
	}
	var errs []error
	if t.endpoint != nil {
		t.endpoint.Stop()
	}
	// cgroup.kill is safe here: the cgroup is removed right after, or,
	// adopted, is left with no policy entry. An adopted path that names
	// another cgroup now (its runtime made one again) is not this Trial's.
	if err := t.killAll(); err != nil {
		errs = append(errs, err)
	}
	var final bpf.Counters
	if t.host.BPF != nil && t.CgroupID != 0 {
		var err error
		if final, err = t.host.BPF.Counters(t.CgroupID); err != nil {
			errs = append(errs, err)
		}
	}
	use := t.PoolUse() // peaks and events: read while the groups are there
	t.finalPools.Store(&use)
	return final, errs
}

// remove takes apart what stop left: the cgroups, the policy entry, the
// namespace and the launch locks; the record is teardown's to remove.
func (t *Trial) remove() []error {
	var errs []error
	// An adopted cgroup is its runtime's to remove, emptied here; with
	// no policy entry left, the eBPF programs deny it everything.
	removed := true
	if !t.adopted {
		if err := removeCgroup(t.Cgroup); err != nil {
			errs = append(errs, err)
			removed = false
		}
		if err := t.removePools(); err != nil {
			errs = append(errs, err)
		}
	}
	if t.host.BPF != nil && t.CgroupID != 0 {
		if err := t.host.BPF.RemoveTrial(t.CgroupID); err != nil {
			errs = append(errs, err)
		}
	}
	if err := netns.Delete(t.host.netnsDir(), t.ID); err != nil {
		errs = append(errs, err)
	}
	if removed {
		// With the cgroup still there, its locks stay too: the join
		// lock's closing mark keeps launchers out of what is left.
		RemoveLaunchLock(t.CgroupID)
	}
	return errs
}

// killAll kills every process in the Trial's cgroup.
func (t *Trial) killAll() error {
	if t.adopted {
		if id, err := bpf.CgroupID(t.Cgroup); err != nil || id != t.CgroupID {
			return nil
		}
	}
	return killCgroup(t.Cgroup, killWait)
}

// Remove tears down whatever is left of Trial id (processes, cgroup,
// policy entry, namespace, record) when it cannot be opened whole, as
// after a crash mid-create, or when the eBPF layer itself is going (a Host
// without BPF). What is already gone is not an error.
func (h *Host) Remove(id string) error {
	if err := ValidID(id); err != nil {
		return err
	}
	t := &Trial{Launcher: Launcher{ID: id, Cgroup: filepath.Join(h.Parent, id)}, host: h}
	if rec, err := h.readRecord(id); err == nil && rec.CgroupID != 0 {
		// The cgroup may be gone already; its policy entry is not.
		t.CgroupID = rec.CgroupID
		if rec.Adopted {
			t.Cgroup, t.adopted = rec.Cgroup, true
		}
	}
	if cgid, err := bpf.CgroupID(t.Cgroup); err == nil && !t.adopted {
		if t.CgroupID != 0 && t.CgroupID != cgid && h.BPF != nil {
			_ = h.BPF.RemoveTrial(t.CgroupID)
		}
		t.CgroupID = cgid
	}
	_, err := t.Close()
	if err != nil {
		return fmt.Errorf("remove Trial %s: %w", id, err)
	}
	return nil
}

// Recorded lists the Trials recorded in StateDir by an earlier process,
// each with its record, or why that cannot be read (the caller removes
// those: Remove). A file that names no valid Trial id is removed here.
func (h *Host) Recorded() []Recorded {
	if h.StateDir == "" {
		return nil
	}
	files, _ := filepath.Glob(filepath.Join(h.StateDir, "*.json"))
	var out []Recorded
	for _, f := range files {
		id := strings.TrimSuffix(filepath.Base(f), ".json")
		if ValidID(id) != nil {
			h.log().Error("a state file with no valid Trial id; removing it", "file", f)
			_ = os.Remove(f)
			continue
		}
		rec, err := h.readRecord(id)
		out = append(out, Recorded{ID: id, Record: rec, Err: err})
	}
	return out
}

// Recorded is one Trial an earlier process recorded.
type Recorded struct {
	ID     string
	Record Record
	Err    error // the record cannot be read
}

// Open takes over a live Trial an earlier process recorded, once its
// cgroup, namespace and policy entry are all checked to be there, and
// serves its proxy endpoint with ep: enforcement never lapsed, as it is
// pinned. The endpoint's listeners are lns, when an earlier process
// handed them over or a keeper held them (they are Open's from here on,
// closed if it fails); nil: Open listens anew. A Trial that cannot be
// opened whole is the caller's to remove.
func (h *Host) Open(rec Record, ep Endpoint, lns []net.Listener) (_ *Trial, err error) {
	defer func() {
		if err != nil {
			for _, l := range lns {
				_ = l.Close()
			}
		}
	}()
	id := rec.Trial.ID
	if err := ValidID(id); err != nil {
		return nil, err
	}
	if rec.Phase != PhaseLive {
		return nil, errors.New("it was being created when the previous agent stopped")
	}
	t := &Trial{Launcher: Launcher{ID: id, Cgroup: filepath.Join(h.Parent, id), Spec: rec.Trial}, recorded: rec.Trial,
		proxy: rec.Proxy, host: h, endpoint: ep, adopted: rec.Adopted}
	if rec.Adopted {
		if filepath.Dir(rec.Cgroup) != filepath.Clean(h.Parent) {
			return nil, fmt.Errorf("its recorded cgroup %s is not under %s", rec.Cgroup, h.Parent)
		}
		t.Cgroup = rec.Cgroup
	}
	if t.CgroupID, err = bpf.CgroupID(t.Cgroup); err != nil {
		return nil, fmt.Errorf("its cgroup is gone: %w", err)
	}
	if t.CgroupID != rec.CgroupID {
		return nil, fmt.Errorf("its cgroup was made again (id %d, recorded %d)", t.CgroupID, rec.CgroupID)
	}
	if !h.BPF.HasTrial(t.CgroupID) {
		return nil, errors.New("its cgroup has no policy entry")
	}
	if err := h.BPF.EnsurePtys(t.CgroupID, MaxPtys); err != nil {
		return nil, err
	}
	if t.Netns, err = netns.Open(h.netnsDir(), id); err != nil {
		return nil, err
	}
	served := lns
	lns = nil // serve's from here
	if err := t.serve(nil, served); err != nil {
		return nil, err
	}
	return t, nil
}

// Sweep removes every recorded Trial whose description alive does not
// claim: for hosts whose Trials belong to one process each (an embedded
// agent), where a process killed outright leaves its Trial behind. A
// Trial alive claims, a live owner's (being made or in use), is left
// alone. gone is told each one removed, for what its creator kept beside
// the sandbox's.
func (h *Host) Sweep(alive func(trial.Spec) bool, gone func(id string, cgroupID uint64)) {
	if h.StateDir == "" {
		return
	}
	files, _ := filepath.Glob(filepath.Join(h.StateDir, "*.json"))
	for _, f := range files {
		id := strings.TrimSuffix(filepath.Base(f), ".json")
		if ValidID(id) != nil {
			continue
		}
		rec, err := h.readRecord(id)
		if err == nil && alive(rec.Trial) {
			continue
		}
		h.log().Warn("removing a Trial whose owner is gone", "trial", id)
		if err := h.Remove(id); err != nil {
			h.log().Error("remove leftover trial", "trial", id, "error", err)
		}
		gone(id, rec.CgroupID) // 0 for a record that could not be read
	}
}

// Attach returns a Launcher for an existing Trial whose cgroup and
// namespace paths another process (the agent) reported: it can Start and
// Exec, and owns nothing of the Trial.
func Attach(id, cgroup, netnsPath string) (*Launcher, error) {
	if err := ValidID(id); err != nil {
		return nil, err
	}
	ns, err := netns.Open(filepath.Dir(netnsPath), filepath.Base(netnsPath))
	if err != nil {
		return nil, err
	}
	cgid, err := bpf.CgroupID(cgroup)
	if err != nil {
		return nil, fmt.Errorf("attach to Trial %s: %w", id, err)
	}
	return &Launcher{ID: id, Cgroup: cgroup, CgroupID: cgid, Netns: ns}, nil
}
