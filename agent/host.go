//go:build linux

// Package agent joins the layers into what the CLI drives: it loads the
// eBPF layer once, makes Trials, runs commands in them and reports.
package agent

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/netns"
	"github.com/trialnet/trialnet/sandbox"
	"golang.org/x/sys/unix"
)

// Config says where the host's pieces live; zero values are the defaults.
type Config struct {
	PinDir   string // bpffs pin directory; empty: bpf.DefaultPinDir
	NetnsDir string // netns bind mounts; empty: netns.DefaultDir
	// Parent is the parent cgroup; empty: <cgroup2 mount>/trialnet.
	Parent string
	// StateDir holds one record per live Trial, for re-adoption after a
	// restart; empty: none (an embedded agent, whose Trials die with it).
	StateDir string
}

// withDefaults is c with its empty paths spelled out (the parent cgroup
// as its default's name): two agents with the same paths hold the same
// things.
func (c Config) withDefaults() Config {
	if c.PinDir == "" {
		c.PinDir = bpf.DefaultPinDir
	}
	if c.NetnsDir == "" {
		c.NetnsDir = netns.DefaultDir
	}
	if c.Parent == "" {
		c.Parent = "<cgroup2>/" + sandbox.ParentName
	}
	return c
}

// Host is a loaded eBPF layer on the parent cgroup.
type Host struct {
	*sandbox.Host
}

// ErrNotRoot is returned when trialnet runs without the privileges it needs.
var ErrNotRoot = errors.New("trialnet needs root: it creates network namespaces and cgroups and loads eBPF programs (try: sudo trialnet ...)")

// OpenHost checks privileges and that Trials can run from this root
// (not a chroot), creates the parent cgroup and loads (or adopts) the
// eBPF layer on it.
func OpenHost(cfg Config) (*Host, error) {
	if os.Geteuid() != 0 {
		return nil, ErrNotRoot
	}
	if err := sandbox.CheckRoot(); err != nil {
		return nil, err
	}
	parent := cfg.Parent
	if parent == "" {
		var err error
		if parent, err = sandbox.EnsureParent(); err != nil {
			return nil, err
		}
	}
	nsDir := cfg.NetnsDir
	if nsDir == "" {
		nsDir = netns.DefaultDir
	}
	l, err := bpf.Load(bpf.Options{Cgroup: parent, PinDir: cfg.PinDir})
	if err != nil {
		// Probing costs a few program loads: only spent to explain a failure.
		if perr := bpf.CanEnforce(bpf.Probe()); perr != nil {
			return nil, fmt.Errorf("this kernel cannot enforce a Trial (see 'trialnet doctor'): %w", perr)
		}
		if strings.Contains(err.Error(), "not on a bpf filesystem") {
			return nil, fmt.Errorf("%w (the pin directory must be on bpffs: mount it with 'mount -t bpf bpf /sys/fs/bpf', or point paths.pin_dir there)", err)
		}
		return nil, err
	}
	// After the load, which refuses a wrong parent or pin directory: a
	// host that cannot open leaves no mount behind. The pinned layer
	// stays whatever follows, as it does at Close.
	if err := netns.MountDir(nsDir); err != nil {
		_ = l.Close()
		return nil, err
	}
	return &Host{&sandbox.Host{Parent: parent, NetnsDir: cfg.NetnsDir, StateDir: cfg.StateDir, Proxy: ProxyEndpoints, BPF: l}}, nil
}

// Close releases the loader; pinned enforcement stays.
func (h *Host) Close() error { return h.BPF.Close() }

// NewID makes an id for an ephemeral Trial.
func NewID() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return "run-" + hex.EncodeToString(b[:])
}

// ProxyEndpoints are where a Trial's proxy listens on its own loopback;
// strict mode allows exactly these.
var ProxyEndpoints = []netip.AddrPort{
	netip.MustParseAddrPort("127.0.0.1:3128"),
	netip.MustParseAddrPort("[::1]:3128"),
}

// Layers reports this host's active defences.
func (h *Host) Layers() client.Layers {
	l := client.Layers{NetworkNamespace: true, CgroupEBPF: true, UnixSocketHooks: h.BPF.UnixHooks(),
		PIDNamespace: true, Seccomp: true, OwnSession: true, LandlockABI: sandbox.LandlockABI(), BPFLSM: h.BPF.LSM(),
		Pools: h.Host.PoolBounds()}
	if err := h.BPF.LSMError(); err != nil && !l.BPFLSM {
		l.BPFLSMMissing = err.Error()
	}
	return l
}

// verdictOf is the one line that says whether anything left a Trial: the
// direct egress packets the last wall saw, and the uses of sockets made
// outside the Trial that the BPF LSM layer refused. It says "ok" only
// about what an active layer observed.
func verdictOf(c bpf.Counters, l client.Layers) string {
	if c.EgressOtherPackets > 0 {
		return fmt.Sprintf("verdict: ALARM: %d direct egress packets (%d bytes) left a Trial socket and were dropped by the last wall; %d foreign-socket uses refused", c.EgressOtherPackets, c.EgressOtherBytes, c.ForeignSocketDenied)
	}
	if !l.BPFLSM {
		return "verdict: 0 direct egress packets (ok); foreign-socket uses not observed: the BPF LSM layer is not active on this host (the PID namespace, Landlock and socket-free stdio keep other processes' sockets out of reach, but no kernel counter watches)"
	}
	if c.ForeignSocketDenied > 0 {
		return fmt.Sprintf("verdict: 0 direct egress packets; ALERT: %d foreign-socket uses refused (a Trial process tried a socket made outside it; nothing left through it)", c.ForeignSocketDenied)
	}
	return "verdict: 0 direct egress packets, 0 foreign-socket uses (ok)"
}

// unsureVerdict is the verdict over final counters c that may not hold
// all a Trial did (why: unsure): a process outlived the kill, stuck in
// the kernel, and may have tried more after they were read, or they could
// not be read at all. An ALARM they show stays one; it never says "ok".
func unsureVerdict(c bpf.Counters, l client.Layers, unsure error) string {
	if c.EgressOtherPackets > 0 {
		return fmt.Sprintf("%s; and the final counters may not hold all the Trial did (%v)", verdictOf(c, l), unsure)
	}
	return fmt.Sprintf("verdict: UNKNOWN: the Trial's final counters may not hold all it did (%v); they show 0 direct egress packets and %d foreign-socket uses refused", unsure, c.ForeignSocketDenied)
}

// Uninstall detaches trialnet: it removes the pins (so the programs
// detach) and the parent cgroup, and what stopped agents left of the
// Trials they prepared ahead (shells' groups, and their files in
// dataDir, the agent's data directory, "" for none, and the state
// directory). Live Trials would keep only their namespace, so it refuses
// while any exists unless force is set, in which case it destroys them
// first (processes, cgroups, namespaces, records), through the same
// teardown as destroy.
func Uninstall(cfg Config, dataDir string, force bool) error {
	if os.Geteuid() != 0 {
		return ErrNotRoot
	}
	parent := cfg.Parent
	if parent == "" {
		mount, err := sandbox.Cgroup2Mount()
		if err != nil {
			return err
		}
		parent = filepath.Join(mount, sandbox.ParentName)
	}
	entries, err := os.ReadDir(parent)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("uninstall: list Trials in %s: %w", parent, err)
	}
	var live []string
	for _, e := range entries {
		if e.IsDir() {
			live = append(live, e.Name())
		}
	}
	if len(live) > 0 && !force {
		return fmt.Errorf("uninstall: %d Trial(s) still live (%s); without the eBPF layer they would keep only their namespace. Destroy them first, or pass --force to destroy them too", len(live), strings.Join(live, ", "))
	}
	// Records of Trials whose cgroup is already gone go too.
	if records, _ := filepath.Glob(filepath.Join(cfg.StateDir, "*.json")); cfg.StateDir != "" {
		for _, r := range records {
			if id := strings.TrimSuffix(filepath.Base(r), ".json"); !slices.Contains(live, id) {
				live = append(live, id)
			}
		}
	}
	// The eBPF layer is being removed: a Host without it tears down the
	// rest, and the pins below take the policy entries with them.
	h := &sandbox.Host{Parent: parent, NetnsDir: cfg.NetnsDir, StateDir: cfg.StateDir}
	var errs []error
	for _, id := range live {
		errs = append(errs, h.Remove(id))
	}
	// A running agent's are its own.
	h.SweepShells(pidAlive)
	if err := sweepPrepared(dataDir, cfg.StateDir, pidAlive, slog.New(slog.DiscardHandler)); err != nil {
		errs = append(errs, fmt.Errorf("remove the files a stopped agent prepared for Trials: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("uninstall: %w", err)
	}
	if err := bpf.Uninstall(cfg.PinDir); err != nil {
		return err
	}
	if err := unix.Rmdir(parent); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("uninstall: remove parent cgroup %s: %w", parent, err)
	}
	return netns.ReleaseDir(cmp.Or(cfg.NetnsDir, netns.DefaultDir))
}
