//go:build linux

// Package sandbox makes one Trial a unit: its cgroup, network namespace and
// policy entry, created all-or-nothing and closed completely, and launches
// processes into it.
package sandbox

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/netns"
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
// programs, where namespaces are mounted, and the loaded eBPF objects.
type Host struct {
	Parent   string // parent cgroup directory
	NetnsDir string // empty: netns.DefaultDir
	BPF      *bpf.Loader
}

func (h *Host) netnsDir() string {
	if h.NetnsDir == "" {
		return netns.DefaultDir
	}
	return h.NetnsDir
}

// Spec is what a Trial may reach.
type Spec struct {
	ID string
	// Strict allows only the Proxy endpoints instead of all of loopback.
	Strict bool
	// Proxy are the proxy endpoints on the Trial's loopback.
	Proxy []netip.AddrPort
	// UnixPaths are the pathname unix sockets the Trial may use.
	UnixPaths []string
	// UnixOpen opts out of unix socket confinement.
	UnixOpen bool
}

// Trial is one live Trial.
type Trial struct {
	ID       string
	Cgroup   string
	CgroupID uint64
	Netns    *netns.Namespace
	host     *Host
}

// ErrExists is wrapped by Create when a Trial's cgroup already exists.
var ErrExists = errors.New("already exists")

// Create makes the Trial's cgroup, network namespace and policy entry. It
// is all-or-nothing: on error nothing is left behind.
func (h *Host) Create(spec Spec) (_ *Trial, err error) {
	if err := netns.ValidID(spec.ID); err != nil {
		return nil, err
	}
	t := &Trial{ID: spec.ID, Cgroup: filepath.Join(h.Parent, spec.ID), host: h}
	if err := os.Mkdir(t.Cgroup, 0o755); err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("create Trial %s: cgroup %s %w (a live Trial has this id, or a crashed one left it)", spec.ID, t.Cgroup, ErrExists)
		}
		return nil, fmt.Errorf("create Trial %s: %w", spec.ID, err)
	}
	defer func() {
		if err != nil {
			_ = removeCgroup(t.Cgroup)
		}
	}()
	if t.CgroupID, err = bpf.CgroupID(t.Cgroup); err != nil {
		return nil, err
	}
	if t.Netns, err = netns.Create(h.netnsDir(), spec.ID); err != nil {
		return nil, fmt.Errorf("create Trial %s: %w", spec.ID, err)
	}
	defer func() {
		if err != nil {
			_ = t.Netns.Delete()
		}
	}()
	err = h.BPF.AddTrial(t.CgroupID, bpf.Policy{
		NetnsCookie: t.Netns.Cookie,
		Strict:      spec.Strict,
		Proxy:       spec.Proxy,
		UnixPaths:   spec.UnixPaths,
		UnixOpen:    spec.UnixOpen,
	})
	if err != nil {
		return nil, fmt.Errorf("create Trial %s: %w", spec.ID, err)
	}
	return t, nil
}

// Counters reads the Trial's kernel counters.
func (t *Trial) Counters() (bpf.Counters, error) {
	return t.host.BPF.Counters(t.CgroupID)
}

// Kill ends every process in the Trial and waits until they are gone; the
// Trial stays usable for further commands.
func (t *Trial) Kill() error {
	return stopCgroup(t.Cgroup, killWait)
}

// Close kills everything in the Trial and removes its cgroup, policy entry
// and namespace. It tries every step even when one fails.
func (t *Trial) Close() error {
	var errs []error
	// cgroup.kill is safe here: the cgroup is removed right after.
	if err := killCgroup(t.Cgroup, killWait); err != nil {
		errs = append(errs, err)
	}
	if err := removeCgroup(t.Cgroup); err != nil {
		errs = append(errs, err)
	}
	if err := t.host.BPF.RemoveTrial(t.CgroupID); err != nil {
		errs = append(errs, err)
	}
	if err := t.Netns.Delete(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close Trial %s: %w", t.ID, err)
	}
	return nil
}

// Open adopts a Trial that already exists (made by this or an earlier
// process): its cgroup, namespace and policy entry must all be there.
func (h *Host) Open(id string) (*Trial, error) {
	if err := netns.ValidID(id); err != nil {
		return nil, err
	}
	t := &Trial{ID: id, Cgroup: filepath.Join(h.Parent, id), host: h}
	var err error
	if t.CgroupID, err = bpf.CgroupID(t.Cgroup); err != nil {
		return nil, fmt.Errorf("open Trial %s: its cgroup is gone: %w", id, err)
	}
	if !h.BPF.HasTrial(t.CgroupID) {
		return nil, fmt.Errorf("open Trial %s: its cgroup has no policy entry", id)
	}
	if t.Netns, err = netns.Open(h.netnsDir(), id); err != nil {
		return nil, fmt.Errorf("open Trial %s: %w", id, err)
	}
	return t, nil
}

// Remove tears down whatever is left of Trial id (cgroup, policy entry,
// namespace) when it cannot be opened whole, as after a crash mid-create.
// What is already gone is not an error.
func (h *Host) Remove(id string) error {
	if err := netns.ValidID(id); err != nil {
		return err
	}
	var errs []error
	dir := filepath.Join(h.Parent, id)
	if cgid, err := bpf.CgroupID(dir); err == nil {
		if err := killCgroup(dir, killWait); err != nil {
			errs = append(errs, err)
		}
		if err := removeCgroup(dir); err != nil {
			errs = append(errs, err)
		}
		if err := h.BPF.RemoveTrial(cgid); err != nil {
			errs = append(errs, err)
		}
	}
	if err := netns.Delete(h.netnsDir(), id); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove Trial %s: %w", id, err)
	}
	return nil
}

// Attach returns a handle for launching processes into an existing Trial
// whose cgroup and namespace paths another process (the agent) reported.
// It can Start and Exec, not read counters or close the Trial.
func Attach(id, cgroup, netnsPath string) (*Trial, error) {
	if err := netns.ValidID(id); err != nil {
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
	return &Trial{ID: id, Cgroup: cgroup, CgroupID: cgid, Netns: ns}, nil
}

// Teardown kills everything in Trial id's cgroup below parent, removes
// the cgroup and deletes its namespace from netnsDir ("" : the default),
// without touching eBPF: for when the eBPF layer itself is being removed.
func Teardown(parent, netnsDir, id string) error {
	if err := netns.ValidID(id); err != nil {
		return err
	}
	if netnsDir == "" {
		netnsDir = netns.DefaultDir
	}
	dir := filepath.Join(parent, id)
	var errs []error
	if _, err := os.Stat(dir); err == nil {
		errs = append(errs, killCgroup(dir, killWait), removeCgroup(dir))
	}
	errs = append(errs, netns.Delete(netnsDir, id))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tear down Trial %s: %w", id, err)
	}
	return nil
}
