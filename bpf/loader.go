//go:build linux

package bpf

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// DefaultPinDir is where the maps and links live, so that enforcement
// outlives the process that loaded it.
const DefaultPinDir = "/sys/fs/bpf/trialnet"

const bpffsRoot = "/sys/fs/bpf"

// Options says where to attach and where to pin.
type Options struct {
	// Cgroup is the parent cgroup2 directory; every Trial cgroup is its child.
	Cgroup string
	// PinDir is the bpffs directory for pins; empty means DefaultPinDir.
	PinDir string
}

// Loader owns the loaded programs, their cgroup and LSM links and the maps.
type Loader struct {
	coll     *ebpf.Collection
	policy   *ebpf.Map
	counters *ebpf.Map
	unix     *ebpf.Map
	unixIDs  *ebpf.Map
	ptys     *ebpf.Map
	links    []namedLink // cgroup hooks
	lsmLinks []namedLink
	lsmErr   error // why the LSM layer is absent
	pinDir   string
	unixHook bool
	// tags are the programs' tags read so far: a loaded program's tag
	// never changes, and reading one is a syscall per program on every
	// receipt.
	tagMu sync.Mutex
	tags  map[string]string
}

// hook ties a program to its cgroup attach type.
type hook struct {
	name   string
	attach ebpf.AttachType
	unix   bool // needs the Linux 6.7 unix sock_addr hooks
}

var hooks = []hook{
	{trialnetProgTrialnetConnect4, ebpf.AttachCGroupInet4Connect, false},
	{trialnetProgTrialnetConnect6, ebpf.AttachCGroupInet6Connect, false},
	{trialnetProgTrialnetSendmsg4, ebpf.AttachCGroupUDP4Sendmsg, false},
	{trialnetProgTrialnetSendmsg6, ebpf.AttachCGroupUDP6Sendmsg, false},
	{trialnetProgTrialnetBind4, ebpf.AttachCGroupInet4Bind, false},
	{trialnetProgTrialnetBind6, ebpf.AttachCGroupInet6Bind, false},
	{trialnetProgTrialnetSockCreate, ebpf.AttachCGroupInetSockCreate, false},
	{trialnetProgTrialnetEgress, ebpf.AttachCGroupInetEgress, false},
	{trialnetProgTrialnetConnectUnix, ebpf.AttachCgroupUnixConnect, true},
	{trialnetProgTrialnetSendmsgUnix, ebpf.AttachCgroupUnixSendmsg, true},
}

// Load loads the programs, adopts or creates the pinned maps, attaches the
// cgroup programs to opts.Cgroup and, where the kernel runs BPF LSM, the LSM
// programs (which judge only tasks below opts.Cgroup). A pinned link left
// by an earlier Load (or by an agent that died) is replaced by the new
// program without a moment without enforcement. Without BPF LSM, Load
// succeeds with the cgroup layer alone; LSMError says why.
func Load(opts Options) (_ *Loader, err error) {
	pinDir := opts.PinDir
	if pinDir == "" {
		pinDir = DefaultPinDir
	}
	level, err := cgroupLevel(opts.Cgroup)
	if err != nil {
		return nil, err
	}
	parentID, err := CgroupID(opts.Cgroup)
	if err != nil {
		return nil, err
	}
	lk, err := lockPins(pinDir)
	if err != nil {
		return nil, err
	}
	defer lk.unlock()
	defer func() {
		if entries, _ := os.ReadDir(pinDir); err != nil && len(entries) == 0 {
			lk.remove() // nothing installed: leave no lock file behind
		}
	}()
	// The common case: an earlier Load installed exactly these programs.
	if l, err := adopt(opts, parentID, level, pinDir, lk); err == nil {
		return l, nil
	} else if !errors.Is(err, errPinsDiffer) {
		return nil, fmt.Errorf("adopt the eBPF programs pinned in %s: %w", pinDir, err)
	}
	return install(opts, parentID, level, pinDir, lk)
}

// install loads the programs and attaches them, updating pinned links in
// place; it runs under lk.
func install(opts Options, parentID uint64, level int, pinDir string, lk *installLock) (_ *Loader, err error) {
	before, err := pinsBefore(pinDir)
	if err != nil {
		return nil, err
	}
	if err := ensurePinDir(pinDir); err != nil {
		return nil, err
	}
	// A failed Load leaves the pins as they were: whatever it pinned goes.
	defer func() {
		if err != nil {
			rollbackPins(pinDir, before)
		}
	}()

	// One parse of the kernel's BTF for the LSM probes and the programs'
	// relocations: each takes 25-60 ms on the machines measured.
	cache := btf.NewCache()
	spec, unixHook, lsmErr, err := loadSpec(level, parentID, cache)
	if err != nil {
		return nil, err
	}
	collOpts := ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: pinDir}, Cache: cache}
	coll, replaced, err := loadOverPins(spec, collOpts, pinDir, opts.Cgroup)
	if replaced {
		before = nil
	}
	if err != nil && lsmErr == nil && !errors.Is(err, ebpf.ErrMapIncompatible) {
		// The LSM layer is an addition: where its programs fail to load,
		// enforce with the cgroup layer and say why.
		lsmErr = fmt.Errorf("%w: loading the LSM programs: %w", errLSMMissing, err)
		for _, h := range lsmHooks {
			delete(spec.Programs, h.name)
		}
		coll, err = ebpf.NewCollectionWithOptions(spec, collOpts)
	}
	if err != nil {
		return nil, loadError(err, pinDir)
	}
	l := &Loader{
		coll:     coll,
		policy:   coll.Maps[trialnetMapPolicyMap],
		counters: coll.Maps[trialnetMapCountersMap],
		unix:     coll.Maps[trialnetMapUnixPathsMap],
		unixIDs:  coll.Maps[trialnetMapUnixIdsMap],
		ptys:     coll.Maps[trialnetMapPtysMap],
		lsmErr:   lsmErr,
		pinDir:   pinDir,
		unixHook: unixHook,
	}
	defer func() {
		if err != nil {
			_ = l.Close()
		}
	}()

	zero := uint64(0)
	if err := l.counters.Update(&zero, make([]trialnetTrialCounters, ebpf.MustPossibleCPU()), ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return nil, fmt.Errorf("create the unattributed counters entry: %w", err)
	}
	if err := l.attachCgroupHooks(opts.Cgroup, parentID); err != nil {
		return nil, err
	}
	if err := l.addLSMLayer(before); err != nil {
		return nil, err
	}
	lk.record(l.lsmErr, coll.Programs)
	if err := l.syncPolicies(l.LSM()); err != nil {
		return nil, err
	}
	return l, nil
}

// loadOverPins loads spec over the maps pinned in pinDir. An older
// trialnet's pins with no Trial behind them (an upgrade with nothing live)
// enforce nothing, so they are replaced rather than refused; replaced says
// the pins from before are gone, whether or not the load then succeeded.
func loadOverPins(spec *ebpf.CollectionSpec, collOpts ebpf.CollectionOptions, pinDir, cgroup string) (_ *ebpf.Collection, replaced bool, _ error) {
	coll, err := ebpf.NewCollectionWithOptions(spec, collOpts)
	if !errors.Is(err, ebpf.ErrMapIncompatible) || !unusedPins(pinDir, cgroup) {
		return coll, false, err
	}
	if err := removePins(pinDir); err != nil {
		return nil, false, err
	}
	if err := ensurePinDir(pinDir); err != nil {
		return nil, true, err
	}
	coll, err = ebpf.NewCollectionWithOptions(spec, collOpts)
	return coll, true, err
}

// loadError says why the collection did not load, and what to do where
// live Trials hold maps this version cannot use.
func loadError(err error, pinDir string) error {
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		return fmt.Errorf("load eBPF programs: the verifier refused them: %+v", ve)
	}
	if errors.Is(err, ebpf.ErrMapIncompatible) {
		return fmt.Errorf("load eBPF maps: the maps pinned in %s come from an incompatible trialnet version, and Trials are live under them (they stay enforced): end them ('trialnet destroy ID', or 'trialnet uninstall --force' for all), then start again: %w", pinDir, err)
	}
	return fmt.Errorf("load eBPF programs: %w", err)
}

// attachCgroupHooks attaches each cgroup hook this kernel has to cgroup,
// updating a link pinned there in place.
func (l *Loader) attachCgroupHooks(cgroup string, cgroupID uint64) error {
	for _, h := range hooks {
		if h.unix && !l.unixHook {
			continue
		}
		cl, err := attachOrAdopt(cgroup, cgroupID, filepath.Join(l.pinDir, "link_"+h.name), l.coll.Programs[h.name], h.attach)
		if err != nil {
			return fmt.Errorf("attach %s to %s: %w", h.name, cgroup, err)
		}
		l.links = append(l.links, namedLink{h.name, cl})
	}
	return nil
}

// addLSMLayer attaches the LSM layer, or goes without it where that drops
// nothing a live Trial relies on: before lists the pins from before this
// Load.
func (l *Loader) addLSMLayer(before map[string]bool) error {
	err := l.attachLSMLayer()
	if err == nil {
		return nil
	}
	if errors.Is(err, errLSMAttach) && !hadLSMLayer(before) {
		// The LSM layer is an addition: one that fails to attach
		// goes whole, and the cgroup layer enforces alone, saying why.
		l.lsmErr = fmt.Errorf("%w: %w", errLSMMissing, err)
		return nil
	}
	// Trials admitted under the pinned layer rely on it (unix
	// confinement without the cgroup unix hooks, any allowed
	// path): it stays, and this Load fails rather than drop it.
	return fmt.Errorf("%w; the BPF LSM layer pinned in %s stays as it was", err, l.pinDir)
}

// syncPolicies makes every live Trial's policy agree with the layers now
// attached: the unix hooks leave paths to the LSM layer's peer check only
// while it runs (else a path would go unjudged), and a nested Trial,
// whose processes may mount, keeps no policy at all without it: the
// kernel then refuses it everything (no_policy), until it is destroyed.
func (l *Loader) syncPolicies(lsm bool) error {
	// Collected first: deleting while iterating restarts the walk.
	var (
		id      uint64
		v       trialnetTrialPolicy
		drop    []uint64
		flipIDs []uint64
		flipped []trialnetTrialPolicy
	)
	it := l.policy.Iterate()
	for it.Next(&id, &v) {
		switch {
		case v.Flags&flagNested != 0 && !lsm:
			drop = append(drop, id)
		case (v.Flags&flagPeerCheck != 0) != lsm:
			v.Flags ^= flagPeerCheck
			flipIDs, flipped = append(flipIDs, id), append(flipped, v)
		}
	}
	errs := []error{it.Err()}
	for _, id := range drop {
		if err := l.policy.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("refuse everything to nested Trial cgroup %d without the LSM layer: %w", id, err))
		}
	}
	for i, id := range flipIDs {
		if err := l.policy.Update(id, flipped[i], ebpf.UpdateExist); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("policy of Trial cgroup %d: %w", id, err))
		}
	}
	return errors.Join(errs...)
}

// loadSpec is the collection spec for a parent cgroup at level with id
// parentID, less the programs this kernel cannot run: the unix hooks where
// absent (unixHook false) and the LSM layer where absent (lsmErr says why).
func loadSpec(level int, parentID uint64, cache *btf.Cache) (_ *ebpf.CollectionSpec, unixHook bool, lsmErr error, _ error) {
	spec, err := configuredSpec(level, parentID)
	if err != nil {
		return nil, false, nil, err
	}
	unixHook = haveUnixHooks() == nil
	if !unixHook {
		for _, h := range hooks {
			if h.unix {
				delete(spec.Programs, h.name)
			}
		}
	}
	return spec, unixHook, prepareLSM(spec, cache), nil
}

// configuredSpec is the embedded collection with its constants set for a
// parent cgroup at level with id parentID.
func configuredSpec(level int, parentID uint64) (*ebpf.CollectionSpec, error) {
	spec, err := loadTrialnet()
	if err != nil {
		return nil, err
	}
	if err := spec.Variables[trialnetVarTrialLevel].Set(uint32(level + 1)); err != nil {
		return nil, fmt.Errorf("set trial_level: %w", err)
	}
	if err := spec.Variables[trialnetVarParentCgroupId].Set(parentID); err != nil {
		return nil, fmt.Errorf("set parent_cgroup_id: %w", err)
	}
	return spec, nil
}

// unusedPins reports whether the pins in pinDir serve no Trial: their
// cgroup links are on parent, and parent has no Trial cgroup. (Entries
// left in the maps by a Trial whose cgroup is gone enforce nothing.)
func unusedPins(pinDir, parent string) bool {
	parentID, err := CgroupID(parent)
	if err != nil {
		return false
	}
	entries, err := os.ReadDir(parent)
	if err != nil {
		return false
	}
	for _, e := range entries {
		if e.IsDir() {
			return false
		}
	}
	pins, _ := filepath.Glob(filepath.Join(pinDir, "link_*"))
	for _, p := range pins {
		lk, err := link.LoadPinnedLink(p, nil)
		if err != nil {
			continue
		}
		other := false
		if info, err := lk.Info(); err == nil {
			if cg := info.Cgroup(); cg != nil && cg.CgroupId != parentID {
				other = true
			}
		}
		_ = lk.Close()
		if other {
			return false
		}
	}
	return true
}

// pinsBefore lists the pins that exist before a Load; nil means that the
// pin directory itself does not exist yet.
func pinsBefore(pinDir string) (map[string]bool, error) {
	entries, err := os.ReadDir(pinDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read pin directory %s: %w", pinDir, err)
	}
	have := make(map[string]bool, len(entries))
	for _, e := range entries {
		have[e.Name()] = true
	}
	return have, nil
}

// rollbackPins removes every pin that was not there before (its link
// detaches once this process closes it) and the directory if Load made it.
func rollbackPins(pinDir string, before map[string]bool) {
	entries, _ := os.ReadDir(pinDir)
	for _, e := range entries {
		if !before[e.Name()] {
			_ = os.Remove(filepath.Join(pinDir, e.Name()))
		}
	}
	if before == nil {
		_ = os.Remove(pinDir)
	}
}

// attachOrAdopt reuses a pinned link on the same cgroup by swapping in the
// new program atomically; otherwise it attaches and pins a new link.
func attachOrAdopt(cgroup string, cgroupID uint64, pin string, prog *ebpf.Program, attach ebpf.AttachType) (link.Link, error) {
	old, err := link.LoadPinnedLink(pin, nil)
	switch {
	case err == nil:
		if sameCgroup(old, cgroupID) {
			if err := old.Update(prog); err != nil {
				_ = old.Close()
				return nil, fmt.Errorf("update pinned link %s: %w", pin, err)
			}
			return old, nil
		}
		// The cgroup was recreated: the old link guards nothing any more.
		_ = old.Unpin()
		_ = old.Close()
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("open pinned link %s: %w", pin, err)
	}
	lk, err := link.AttachCgroup(link.CgroupOptions{Path: cgroup, Attach: attach, Program: prog})
	if err != nil {
		return nil, err
	}
	if err := lk.Pin(pin); err != nil {
		_ = lk.Close()
		return nil, fmt.Errorf("pin link %s: %w", pin, err)
	}
	return lk, nil
}

func sameCgroup(l link.Link, cgroupID uint64) bool {
	info, err := l.Info()
	if err != nil {
		return false
	}
	cg := info.Cgroup()
	return cg != nil && cg.CgroupId == cgroupID
}

// CheckPins reports whether enforcement would outlive this process: each
// of its links must still be pinned, and the pin must hold the very link
// this loader attached (so the program is loaded and attached). It opens
// every pin, a few syscalls each: cheap enough for a health check.
func (l *Loader) CheckPins() error {
	for _, nl := range append(slices.Clone(l.links), l.lsmLinks...) {
		pin := filepath.Join(l.pinDir, "link_"+nl.name)
		pinned, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			return fmt.Errorf("link %s: %w", nl.name, err)
		}
		pi, perr := pinned.Info()
		_ = pinned.Close()
		li, lerr := nl.lk.Info()
		if err := errors.Join(perr, lerr); err != nil {
			return fmt.Errorf("link %s: %w", nl.name, err)
		}
		if pi.ID != li.ID {
			return fmt.Errorf("link %s: the pin %s holds link %d, not the attached link %d", nl.name, pin, pi.ID, li.ID)
		}
	}
	return nil
}

// SteerPin is where OpenSteer pins the sk_lookup link and map of the Trial
// in cgroup cgroupID: beside the other pins, so that Uninstall removes
// them too, under a name no other pin has (never "link_").
func (l *Loader) SteerPin(cgroupID uint64) string {
	return filepath.Join(l.pinDir, fmt.Sprintf("steer_%d", cgroupID))
}

// UnixHooks reports whether the unix socket hooks are attached.
func (l *Loader) UnixHooks() bool { return l.unixHook }

// Close releases this process's handles. Pinned links and maps stay, and
// with them enforcement.
func (l *Loader) Close() error {
	var errs []error
	for _, nl := range append(l.links, l.lsmLinks...) {
		errs = append(errs, nl.lk.Close())
	}
	l.links, l.lsmLinks = nil, nil
	l.coll.Close()
	return errors.Join(errs...)
}

// Uninstall removes every pin under pinDir (empty: DefaultPinDir). Links
// no process holds any more detach, so this ends enforcement for all Trials.
func Uninstall(pinDir string) error {
	if pinDir == "" {
		pinDir = DefaultPinDir
	}
	lk, err := lockPins(pinDir)
	if err != nil {
		return fmt.Errorf("uninstall: %w", err)
	}
	defer lk.unlock()
	if err := removePins(pinDir); err != nil {
		return err
	}
	lk.remove()
	return nil
}

// removePins removes pinDir and every pin in it; the caller holds the
// install lock. Only on bpffs: pinDir comes from a config file
// (paths.pin_dir), and one naming /etc, or a directory a user could
// make it lead to, would have root remove every file there.
func removePins(pinDir string) error {
	entries, err := os.ReadDir(pinDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("uninstall: read %s: %w", pinDir, err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(pinDir, &st); err != nil {
		return fmt.Errorf("uninstall: %s: %w", pinDir, err)
	}
	if st.Type != unix.BPF_FS_MAGIC {
		return fmt.Errorf("uninstall: the pin directory %s is not on bpffs, so it holds no pins: nothing in it was removed (check paths.pin_dir in the config given: pins live under %s)", pinDir, bpffsRoot)
	}
	for _, e := range entries {
		if err := os.Remove(filepath.Join(pinDir, e.Name())); err != nil {
			return fmt.Errorf("uninstall: remove pin: %w", err)
		}
	}
	if err := os.Remove(pinDir); err != nil {
		return fmt.Errorf("uninstall: %w", err)
	}
	return nil
}

// Policy is what one Trial may reach.
type Policy struct {
	// NetnsCookie is the SO_NETNS_COOKIE of the Trial's own namespace; a
	// socket in any other namespace gets nothing, not even loopback.
	NetnsCookie uint64
	// Strict allows only the Proxy endpoints instead of all of loopback.
	Strict bool
	// Proxy lists the proxy endpoints: at most one IPv4 and one IPv6
	// loopback address, with the same port.
	Proxy []netip.AddrPort
	// UnixPaths are the pathname unix sockets the Trial may use. Each must
	// exist (be bound) when the Trial is added: the LSM layer allows the
	// socket found there by its inode, so a socket bound there later (or a
	// bind mount over the path) is refused until the Trial is added again.
	UnixPaths []string
	// UnixOpen opts out of unix socket confinement.
	UnixOpen bool
	// OwnDirs says the Trial's /tmp, /var/tmp and /dev/shm are its own
	// tmpfs, viewed nosymfollow under /run/trialnet/{t,v,d} (the sandbox
	// mounts them): paths beneath them are then allowed, by way of the
	// views. A Trial made before these existed lacks them, and the flag.
	OwnDirs bool
	// Nested says the Trial's tasks may make network namespaces of their
	// own (user namespaces allowed): a socket in one is the Trial's, not
	// a mismatch, and gets the Trial's policy there (nothing but loopback
	// exists in it).
	Nested bool
	// Pool, when valid, is the Trial's name pool in transparent mode
	// (docs/transparent.md): strict mode then also allows TCP to any port
	// of it, and UDP and TCP to the DNS stub at StubAddr. Outside strict
	// mode all of 127.0.0.0/8 is allowed already. It is a range as
	// AttachSteer takes (CheckPool), clear of the proxy endpoints.
	Pool netip.Prefix
	// MaxPtys bounds the pty masters the Trial's tasks hold open at once,
	// from any devpts instance (the BPF LSM layer counts them); 0 allows
	// none. Where the layer is not attached, only the devpts instances'
	// own max= bound them.
	MaxPtys uint32
}

// The policy's flags: enum trial_flag, carried through bpf2go.
const (
	flagStrict   = trialnetTrialFlagTRIAL_F_STRICT
	flagUnixOpen = trialnetTrialFlagTRIAL_F_UNIX_OPEN
	flagOwnDirs  = trialnetTrialFlagTRIAL_F_OWN_DIRS
	// flagPeerCheck: the BPF LSM layer judges each unix peer (AddTrial).
	flagPeerCheck = trialnetTrialFlagTRIAL_F_PEER_CHECK
	flagNested    = trialnetTrialFlagTRIAL_F_NESTED
	// flagTransparent: Pool is set, and strict mode allows it and the stub.
	flagTransparent = trialnetTrialFlagTRIAL_F_TRANSPARENT
)

func (p Policy) encode() (trialnetTrialPolicy, error) {
	v := trialnetTrialPolicy{NetnsCookie: p.NetnsCookie}
	if p.NetnsCookie == 0 {
		return v, errors.New("policy: netns cookie is 0; pass the SO_NETNS_COOKIE of the Trial's namespace")
	}
	var have4, have6 bool
	for _, ap := range p.Proxy {
		a := ap.Addr().Unmap()
		if !a.IsLoopback() {
			return v, fmt.Errorf("policy: proxy %s is not a loopback address; the proxy endpoint must live on the Trial's own loopback", ap)
		}
		if ap.Port() == 0 || (v.ProxyPort != 0 && v.ProxyPort != ap.Port()) {
			return v, fmt.Errorf("policy: proxy %s: every proxy endpoint needs the same non-zero port", ap)
		}
		v.ProxyPort = ap.Port()
		if a.Is4() {
			if have4 {
				return v, fmt.Errorf("policy: proxy %s: only one IPv4 proxy address is supported", ap)
			}
			have4 = true
			b := a.As4()
			v.ProxyIp4 = nativeU32(b[:])
		} else {
			if have6 {
				return v, fmt.Errorf("policy: proxy %s: only one IPv6 proxy address is supported", ap)
			}
			have6 = true
			b := a.As16()
			for i := range v.ProxyIp6 {
				v.ProxyIp6[i] = nativeU32(b[4*i : 4*i+4])
			}
		}
	}
	if p.Strict {
		v.Flags |= flagStrict
		if len(p.Proxy) == 0 {
			return v, errors.New("policy: strict mode needs a proxy endpoint; without one it would allow nothing at all")
		}
	}
	if p.Pool.IsValid() {
		if err := CheckPool(p.Pool); err != nil {
			return v, fmt.Errorf("policy: %w", err)
		}
		for _, ap := range p.Proxy {
			if p.Pool.Contains(ap.Addr().Unmap()) {
				return v, fmt.Errorf("policy: pool %s holds the proxy endpoint %s, which would then answer for names", p.Pool, ap)
			}
		}
		v.Flags |= flagTransparent
		net4 := p.Pool.Addr().As4()
		v.PoolIp4, v.PoolBits = nativeU32(net4[:]), uint16(p.Pool.Bits())
	}
	if p.UnixOpen {
		v.Flags |= flagUnixOpen
	}
	if p.OwnDirs {
		v.Flags |= flagOwnDirs
	}
	if p.Nested {
		v.Flags |= flagNested
	}
	return v, nil
}

// nativeU32 reads 4 bytes in network order the way the kernel's __u32
// fields hold them on this little-endian machine.
func nativeU32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func unixKey(cgroupID uint64, path string) (trialnetUnixKey, error) {
	k := trialnetUnixKey{CgroupId: cgroupID}
	if !filepath.IsAbs(path) || filepath.Clean(path) != path || strings.ContainsRune(path, 0) {
		return k, fmt.Errorf("policy: unix path %q must be absolute and clean", path)
	}
	if len(path) >= len(k.Path) {
		return k, fmt.Errorf("policy: unix path %q is longer than the %d bytes a sockaddr_un holds", path, len(k.Path)-1)
	}
	for i := range len(path) {
		k.Path[i] = int8(path[i])
	}
	return k, nil
}

// unixID is the identity of the socket at path as the kernel spells it: its
// inode number and the kernel's dev_t encoding of its device (major<<20 |
// minor, not userspace's st_dev).
func unixID(cgroupID uint64, path string) (trialnetUnixIdKey, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return trialnetUnixIdKey{}, fmt.Errorf("policy: unix path %s: %w; bind the socket before adding the Trial, or drop the path from its allowed unix paths", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return trialnetUnixIdKey{}, fmt.Errorf("policy: unix path %s is not a socket (mode %#o); bind the socket there before adding the Trial, or drop the path from its allowed unix paths", path, st.Mode&unix.S_IFMT)
	}
	dev := unix.Major(st.Dev)<<20 | unix.Minor(st.Dev)
	return trialnetUnixIdKey{CgroupId: cgroupID, Ino: st.Ino, Dev: dev}, nil
}

// errUnixHookMissing means the kernel cannot confine unix sockets.
var errUnixHookMissing = errors.New("this kernel has neither the cgroup/connect_unix hook (Linux 6.7+) nor an active BPF LSM layer, so pathname unix sockets cannot be confined; opt out of unix confinement explicitly (--no-unix-confine, or unix_open) to run anyway")

// AddTrial installs the policy of the Trial whose cgroup has cgroupID. Until
// it returns, that cgroup is denied everything; on error nothing is left.
func (l *Loader) AddTrial(cgroupID uint64, p Policy) (err error) {
	v, err := p.encode()
	if err != nil {
		return err
	}
	// Unix confinement needs the path check of the cgroup hooks or the
	// LSM layer's peer check (own netns, or a recorded inode): the latter
	// alone confines on kernels before 6.7.
	if !p.UnixOpen && !l.unixHook && !l.LSM() {
		return errUnixHookMissing
	}
	if p.Nested && !l.LSM() {
		return fmt.Errorf("policy: a nested Trial needs the BPF LSM layer (%v)", l.lsmErr)
	}
	if l.LSM() {
		// The peer check judges what a path leads to: the path hooks
		// leave every path to it, and its refusals are counted.
		v.Flags |= flagPeerCheck
	}
	var keys []trialnetUnixKey
	var ids []trialnetUnixIdKey
	for _, path := range p.UnixPaths {
		k, err := unixKey(cgroupID, path)
		if err != nil {
			return err
		}
		keys = append(keys, k)
		if p.UnixOpen {
			continue // no unix confinement: identities are never asked
		}
		id, err := unixID(cgroupID, path)
		if err != nil {
			return err
		}
		ids = append(ids, id)
	}
	defer func() {
		if err != nil {
			_ = l.RemoveTrial(cgroupID)
		}
	}()
	if err := l.addCounters(cgroupID); err != nil {
		return fmt.Errorf("add trial counters: %w", err)
	}
	if err := l.setPtyBound(cgroupID, p.MaxPtys); err != nil {
		return fmt.Errorf("add trial pty bound: %w", err)
	}
	one := uint8(1)
	for i := range keys {
		if err := l.unix.Update(&keys[i], &one, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("add trial unix path: %w", err)
		}
	}
	for i := range ids {
		if err := l.unixIDs.Update(&ids[i], &one, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("add trial unix socket identity: %w", err)
		}
	}
	// The policy entry goes last: it is what turns "deny all" into the policy.
	if err := l.policy.Update(&cgroupID, &v, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("add trial policy: %w", err)
	}
	return nil
}

// setPtyBound sets cgroupID's pty bound to max, keeping the counts of a
// pending entry's (AddPending): a master its tasks hold open is given
// back at its close, which must find it counted.
func (l *Loader) setPtyBound(cgroupID uint64, max uint32) error {
	var v trialnetTrialPtys
	if err := l.ptys.Lookup(&cgroupID, &v); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	v.Max = uint64(max)
	return l.ptys.Update(&cgroupID, &v, ebpf.UpdateAny)
}

// pendingCookie is a pending entry's network namespace cookie: none has
// it (the kernel hands cookies out counting up from 1), so every socket
// a task of that cgroup uses is in "another" namespace than its own.
const pendingCookie = ^uint64(0)

// AddPending gives cgroupID, a new cgroup under the parent that no task
// is in yet, a pending entry: a Trial's rules with no network namespace
// and no proxy. Its tasks are judged as a Trial's (the BPF LSM layer
// lets a container runtime's init use the sockets it makes and is
// handed, and ptrace its own), while every cgroup hook refuses them
// everything (their namespace is never the entry's): nothing in the
// cgroup reaches anything until AddTrial replaces the entry with the
// Trial's. maxPtys bounds its pty masters as a Trial's are.
func (l *Loader) AddPending(cgroupID uint64, maxPtys uint32) (err error) {
	if l.HasTrial(cgroupID) {
		// Checked first: the clean-up below would remove that entry.
		return fmt.Errorf("add pending policy: cgroup %d has a policy entry already", cgroupID)
	}
	v := trialnetTrialPolicy{NetnsCookie: pendingCookie, Flags: flagStrict}
	if l.LSM() {
		v.Flags |= flagPeerCheck
	}
	defer func() {
		if err != nil {
			_ = l.RemoveTrial(cgroupID)
		}
	}()
	if err := l.addCounters(cgroupID); err != nil {
		return fmt.Errorf("add pending counters: %w", err)
	}
	if err := l.ptys.Update(&cgroupID, &trialnetTrialPtys{Max: uint64(maxPtys)}, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("add pending pty bound: %w", err)
	}
	if err := l.policy.Update(&cgroupID, &v, ebpf.UpdateNoExist); err != nil {
		return fmt.Errorf("add pending policy: %w", err)
	}
	return nil
}

// Pending lists the cgroup ids with a pending entry (AddPending).
func (l *Loader) Pending() []uint64 {
	var (
		id  uint64
		v   trialnetTrialPolicy
		out []uint64
	)
	it := l.policy.Iterate()
	for it.Next(&id, &v) {
		if v.NetnsCookie == pendingCookie {
			out = append(out, id)
		}
	}
	return out
}

// IsPending reports whether cgroupID's entry is a pending one.
func (l *Loader) IsPending(cgroupID uint64) bool {
	var v trialnetTrialPolicy
	return l.policy.Lookup(&cgroupID, &v) == nil && v.NetnsCookie == pendingCookie
}

// RemoveTrial deletes the Trial's policy (denying it everything from then
// on), its unix paths and its counters. Missing entries are not an error.
func (l *Loader) RemoveTrial(cgroupID uint64) error {
	var errs []error
	if err := l.policy.Delete(&cgroupID); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		errs = append(errs, fmt.Errorf("remove trial policy: %w", err))
	}
	var k trialnetUnixKey
	var stale []trialnetUnixKey
	var v uint8
	it := l.unix.Iterate()
	for it.Next(&k, &v) {
		if k.CgroupId == cgroupID {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		errs = append(errs, fmt.Errorf("list trial unix paths: %w", err))
	}
	for i := range stale {
		if err := l.unix.Delete(&stale[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("remove trial unix path: %w", err))
		}
	}
	errs = append(errs, l.removeUnixIDs(cgroupID))
	if err := l.ptys.Delete(&cgroupID); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		errs = append(errs, fmt.Errorf("remove trial pty bound: %w", err))
	}
	if err := l.counters.Delete(&cgroupID); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		errs = append(errs, fmt.Errorf("remove trial counters: %w", err))
	}
	return errors.Join(errs...)
}

func (l *Loader) removeUnixIDs(cgroupID uint64) error {
	var errs []error
	var k trialnetUnixIdKey
	var stale []trialnetUnixIdKey
	var v uint8
	it := l.unixIDs.Iterate()
	for it.Next(&k, &v) {
		if k.CgroupId == cgroupID {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		errs = append(errs, fmt.Errorf("list trial unix socket identities: %w", err))
	}
	for i := range stale {
		if err := l.unixIDs.Delete(&stale[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("remove trial unix socket identity: %w", err))
		}
	}
	return errors.Join(errs...)
}

// HasTrial reports whether cgroupID has a policy entry.
func (l *Loader) HasTrial(cgroupID uint64) bool {
	var v trialnetTrialPolicy
	return l.policy.Lookup(&cgroupID, &v) == nil
}

// OpenPtys is the number of pty masters that tasks of the Trial with
// cgroupID opened under the BPF LSM layer and that are not yet freed.
func (l *Loader) OpenPtys(cgroupID uint64) (uint64, error) {
	var v trialnetTrialPtys
	if err := l.ptys.Lookup(&cgroupID, &v); err != nil {
		return 0, fmt.Errorf("open ptys of Trial cgroup %d: %w", cgroupID, err)
	}
	return v.Open, nil
}

// Counters sums the per-CPU counters of cgroupID (0: the unattributed ones).
func (l *Loader) Counters(cgroupID uint64) (Counters, error) {
	var per []trialnetTrialCounters
	if err := l.counters.Lookup(&cgroupID, &per); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return Counters{}, fmt.Errorf("counters: no Trial with cgroup id %d is known to the eBPF maps", cgroupID)
		}
		return Counters{}, fmt.Errorf("counters: %w", err)
	}
	c := sumCounters(per)
	var tp trialnetTrialPtys
	if err := l.ptys.Lookup(&cgroupID, &tp); err == nil {
		c.PtyDenied = tp.Denied
	}
	return c, nil
}

// EnsurePtys gives the Trial with cgroupID a pty bound of max if it has
// none: a Trial made by a trialnet before the bound, adopted by this one.
// Masters it opened before are not counted, nor given back.
func (l *Loader) EnsurePtys(cgroupID uint64, max uint32) error {
	err := l.ptys.Update(&cgroupID, &trialnetTrialPtys{Max: uint64(max)}, ebpf.UpdateNoExist)
	if err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return fmt.Errorf("give the Trial a pty bound: %w", err)
	}
	return nil
}

// ensurePinDir mounts bpffs when it is absent and creates pinDir (0700: the
// pins are the enforcement, nobody but root may unlink them).
func ensurePinDir(pinDir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(bpffsRoot, &st); err != nil {
		return fmt.Errorf("bpffs: stat %s: %w", bpffsRoot, err)
	}
	if st.Type != unix.BPF_FS_MAGIC {
		if err := unix.Mount("bpf", bpffsRoot, "bpf", 0, "mode=0700"); err != nil {
			return fmt.Errorf("bpffs is not mounted at %s and mounting it failed: %w", bpffsRoot, err)
		}
	}
	if err := os.MkdirAll(pinDir, 0o700); err != nil {
		return fmt.Errorf("create pin directory %s: %w", pinDir, err)
	}
	return nil
}

// CgroupID is the kernel's id of a cgroup2 directory: its inode number.
func CgroupID(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("cgroup id of %s: %w", path, err)
	}
	return st.Ino, nil
}

// cgroupLevel counts how deep path is below its cgroup2 mount's root.
func cgroupLevel(path string) (int, error) {
	path = filepath.Clean(path)
	level := -1
	for p := path; ; p = filepath.Dir(p) {
		var st unix.Statfs_t
		if err := unix.Statfs(p, &st); err != nil {
			return 0, fmt.Errorf("cgroup %s: %w", path, err)
		}
		if st.Type != unix.CGROUP2_SUPER_MAGIC {
			break
		}
		level++
		if p == "/" {
			break
		}
	}
	if level < 0 {
		return 0, fmt.Errorf("cgroup %s is not on a cgroup2 file system", path)
	}
	return level, nil
}

// TrialCount is the number of Trials with a policy, unix path or counters
// entry (the unattributed counters entry is not a Trial).
func (l *Loader) TrialCount() int {
	ids := map[uint64]bool{}
	var id uint64
	it := l.policy.Iterate()
	var pv trialnetTrialPolicy
	for it.Next(&id, &pv) {
		ids[id] = true
	}
	var per []trialnetTrialCounters
	it = l.counters.Iterate()
	for it.Next(&id, &per) {
		if id != 0 {
			ids[id] = true
		}
	}
	var k trialnetUnixKey
	var v uint8
	it = l.unix.Iterate()
	for it.Next(&k, &v) {
		ids[k.CgroupId] = true
	}
	var ik trialnetUnixIdKey
	it = l.unixIDs.Iterate()
	for it.Next(&ik, &v) {
		ids[ik.CgroupId] = true
	}
	var tp trialnetTrialPtys
	it = l.ptys.Iterate()
	for it.Next(&id, &tp) {
		ids[id] = true
	}
	return len(ids)
}

// ProgStats is how often a program ran and for how long in total; the
// kernel only counts while stats are enabled (EnableRunStats).
type ProgStats struct {
	Name    string
	Runs    uint64
	Runtime time.Duration
}

// EnableRunStats turns on the kernel's per-program run time accounting
// until the returned Closer is closed. It costs a little on every run.
func EnableRunStats() (io.Closer, error) {
	c, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("enable BPF run time stats: %w", err)
	}
	return c, nil
}

// RunStats reports every loaded program's run count and run time.
func (l *Loader) RunStats() ([]ProgStats, error) {
	var out []ProgStats
	names := make([]string, 0, len(hooks)+len(lsmHooks))
	for _, h := range hooks {
		names = append(names, h.name)
	}
	for _, h := range lsmHooks {
		names = append(names, h.name)
	}
	for _, name := range names {
		p := l.coll.Programs[name]
		if p == nil {
			continue
		}
		st, err := p.Stats()
		if err != nil {
			return nil, fmt.Errorf("program stats %s: %w", name, err)
		}
		out = append(out, ProgStats{Name: name, Runs: st.RunCount, Runtime: st.Runtime})
	}
	return out, nil
}

// ProgramTags are the tags (as bpftool shows them) of the programs that
// enforce Trials now: the cgroup hooks attached, and the LSM hooks while
// that layer is.
func (l *Loader) ProgramTags() map[string]string {
	out := make(map[string]string)
	l.tagMu.Lock()
	defer l.tagMu.Unlock()
	add := func(name string) {
		if tag, ok := l.tags[name]; ok {
			out[name] = tag
			return
		}
		if p := l.coll.Programs[name]; p != nil {
			if info, err := p.Info(); err == nil {
				if l.tags == nil {
					l.tags = make(map[string]string)
				}
				l.tags[name], out[name] = info.Tag, info.Tag
			}
		}
	}
	for _, h := range hooks {
		if !h.unix || l.unixHook {
			add(h.name)
		}
	}
	if l.LSM() {
		for _, h := range lsmHooks {
			add(h.name)
		}
	}
	return out
}

// addCounters makes a Trial's counters entry. Its per-CPU value is
// allocated without waiting (the map is not preallocated), so it fails
// with ENOMEM while the per-CPU allocator is short of populated chunks,
// as under heavy cgroup churn (each memory cgroup takes per-CPU memory
// too); the allocator refills them in the background, so a few tries
// spaced out get through.
func (l *Loader) addCounters(cgroupID uint64) error {
	var err error
	for try := range 10 {
		err = l.counters.Update(&cgroupID, make([]trialnetTrialCounters, ebpf.MustPossibleCPU()), ebpf.UpdateNoExist)
		if err == nil || errors.Is(err, ebpf.ErrKeyExist) {
			return nil
		}
		if !errors.Is(err, unix.ENOMEM) {
			return err
		}
		time.Sleep(time.Duration(try+1) * 10 * time.Millisecond)
	}
	return err
}
