//go:build linux

package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// lsmHook is one BPF LSM program; optional ones are skipped on kernels
// that lack their hook, the others are the layer.
type lsmHook struct {
	name     string
	optional bool
}

var lsmHooks = []lsmHook{
	{trialnetProgTrialnetLsmSocketConnect, false},
	{trialnetProgTrialnetLsmSocketSendmsg, false},
	{trialnetProgTrialnetLsmPtraceAccessCheck, false},
	{trialnetProgTrialnetLsmSocketCreate, false},
	{trialnetProgTrialnetLsmFileIoctl, false},
	{trialnetProgTrialnetLsmFileIoctlCompat, true}, // Linux 6.8+
	{trialnetProgTrialnetLsmUnixStreamConnect, false},
	{trialnetProgTrialnetLsmUnixMaySend, false},
	{trialnetProgTrialnetLsmNetlinkSend, false},
	{trialnetProgTrialnetLsmFileOpen, false},
	{trialnetProgTrialnetLsmFileFreeSecurity, false},
}

// errLSMMissing means the kernel cannot run trialnet's BPF LSM layer; the
// cgroup layer still enforces, but a socket handed in from outside is not
// judged by the Trial that uses it.
var errLSMMissing = errors.New("BPF LSM layer unavailable")

const securityfsRoot = "/sys/kernel/security"

// HaveLSM reports whether BPF LSM programs can be loaded and whether the
// kernel runs them: bpf must be in the active LSM list (boot with
// lsm=...,bpf). When that list cannot be read, attaching a probe decides.
func HaveLSM() error { return haveLSM(btf.NewCache()) }

// haveLSM is HaveLSM with the kernel BTF of cache: parsing it takes
// 25-60 ms here, and a Load needs it again for the programs.
func haveLSM(cache *btf.Cache) error {
	if err := probeLSMProgram(cache); err != nil {
		var errno unix.Errno
		switch {
		case errors.Is(err, btf.ErrNotSupported):
			return fmt.Errorf("%w: the kernel has no BTF (CONFIG_DEBUG_INFO_BTF), which BPF LSM programs need: %w", errLSMMissing, err)
		case errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EINVAL):
			return fmt.Errorf("%w: no BPF LSM program type (CONFIG_BPF_LSM): %w", errLSMMissing, err)
		case errors.As(err, &errno):
			// Seen on kernels that cannot build BPF trampolines (fentry
			// fails the same way) and under lockdown policies. Only the
			// errno: the library's hint about MEMLOCK does not apply to
			// a root process on a memcg-accounted kernel.
			return fmt.Errorf("%w: the kernel refused to load a BPF LSM program (%w)", errLSMMissing, errno)
		}
		return fmt.Errorf("%w: the kernel refused to load a BPF LSM program: %w", errLSMMissing, err)
	}
	active, err := activeLSMs()
	if err != nil {
		if aerr := probeLSMAttach(cache); aerr != nil {
			return fmt.Errorf("%w: %w; attaching a probe program: %w", errLSMMissing, err, aerr)
		}
		return nil
	}
	if !slices.Contains(active, "bpf") {
		return fmt.Errorf("%w: bpf is not in the active LSM list %q; add it to the lsm= kernel command line", errLSMMissing, strings.Join(active, ","))
	}
	return nil
}

// loadLSMProbe loads a program that allows everything, for file_ioctl,
// resolving the hook in cache's kernel BTF (a lone ebpf.NewProgram, or
// features.HaveProgramType, would parse it anew).
func loadLSMProbe(cache *btf.Cache) (*ebpf.Collection, error) {
	spec := &ebpf.CollectionSpec{Programs: map[string]*ebpf.ProgramSpec{"probe": {
		Type:         ebpf.LSM,
		AttachType:   ebpf.AttachLSMMac,
		AttachTo:     "file_ioctl",
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	}}}
	return ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Cache: cache})
}

// probeLSMProgram reports whether the kernel loads a BPF LSM program.
func probeLSMProgram(cache *btf.Cache) error {
	coll, err := loadLSMProbe(cache)
	if err != nil {
		return err
	}
	coll.Close()
	return nil
}

// activeLSMs reads securityfs's lsm file, mounting securityfs if needed.
func activeLSMs() ([]string, error) {
	file := filepath.Join(securityfsRoot, "lsm")
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		var st unix.Statfs_t
		if serr := unix.Statfs(securityfsRoot, &st); serr == nil && st.Type != unix.SECURITYFS_MAGIC {
			if merr := unix.Mount("securityfs", securityfsRoot, "securityfs", 0, ""); merr != nil {
				return nil, fmt.Errorf("securityfs is not mounted at %s and mounting it failed: %w", securityfsRoot, merr)
			}
			b, err = os.ReadFile(file)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("read the active LSM list: %w", err)
	}
	return strings.Split(strings.TrimSpace(string(b)), ","), nil
}

// probeLSMAttach attaches the probe program and detaches it again.
func probeLSMAttach(cache *btf.Cache) error {
	coll, err := loadLSMProbe(cache)
	if err != nil {
		return err
	}
	defer coll.Close()
	lk, err := link.AttachLSM(link.LSMOptions{Program: coll.Programs["probe"]})
	if err != nil {
		return err
	}
	return lk.Close()
}

// haveLSMHook reports whether the kernel has the LSM hook (bpf_lsm_<hook>).
func haveLSMHook(cache *btf.Cache, hook string) bool {
	spec, err := cache.Kernel()
	if err != nil {
		return false
	}
	var fn *btf.Func
	return spec.TypeByName("bpf_lsm_"+hook, &fn) == nil
}

// prepareLSM removes the LSM programs the kernel cannot run from spec: all
// of them when BPF LSM is unavailable (the returned error says why), the
// optional ones whose hook is missing.
func prepareLSM(spec *ebpf.CollectionSpec, cache *btf.Cache) error {
	lsmErr := haveLSM(cache)
	for _, h := range lsmHooks {
		if lsmErr != nil {
			break
		}
		if !haveLSMHook(cache, spec.Programs[h.name].AttachTo) && !h.optional {
			lsmErr = fmt.Errorf("%w: this kernel has no %s LSM hook", errLSMMissing, spec.Programs[h.name].AttachTo)
		}
	}
	for _, h := range lsmHooks {
		if lsmErr != nil || !haveLSMHook(cache, spec.Programs[h.name].AttachTo) {
			delete(spec.Programs, h.name)
		}
	}
	return lsmErr
}

// errLSMAttach marks an LSM layer whose programs loaded but did not all
// attach. It is not recorded for adopting Loads: the next Load tries again.
var errLSMAttach = errors.New("the LSM programs loaded but did not all attach")

// tmpPinSuffix names the pin a new LSM link takes before it is renamed
// over the old one. It has no dot: bpffs refuses names with one (EPERM),
// as the kernel reserves them.
const tmpPinSuffix = "_new"

// attachLSMLayer attaches every loaded LSM program and pins each new link
// beside the pin it replaces; only once all are attached and pinned are
// they renamed over the old pins (a link pinned by an earlier Load cannot
// be updated in place). There is no moment without a program, and a
// failure leaves the layer pinned before exactly as it was.
func (l *Loader) attachLSMLayer() error {
	var fresh []namedLink
	undo := func(err error) error {
		for _, nl := range fresh {
			_ = nl.lk.Close()
			_ = os.Remove(filepath.Join(l.pinDir, "link_"+nl.name+tmpPinSuffix))
		}
		return fmt.Errorf("%w: %w", errLSMAttach, err)
	}
	for _, h := range lsmHooks {
		prog := l.coll.Programs[h.name]
		if prog == nil {
			continue // no BPF LSM, or an optional hook this kernel lacks
		}
		lk, err := link.AttachLSM(link.LSMOptions{Program: prog})
		if err != nil {
			return undo(fmt.Errorf("attach %s: %w", h.name, err))
		}
		tmp := filepath.Join(l.pinDir, "link_"+h.name+tmpPinSuffix)
		_ = os.Remove(tmp) // left by a Load that died between pin and rename
		if err := lk.Pin(tmp); err != nil {
			_ = lk.Close()
			return undo(fmt.Errorf("attach %s: pin link %s: %w", h.name, tmp, err))
		}
		fresh = append(fresh, namedLink{h.name, lk})
	}
	for _, nl := range fresh {
		pin := filepath.Join(l.pinDir, "link_"+nl.name)
		if err := os.Rename(pin+tmpPinSuffix, pin); err != nil {
			l.lsmLinks = fresh // closed with the Loader; the pins renamed so far stay
			return fmt.Errorf("replace pinned link %s: %w", pin, err)
		}
	}
	l.lsmLinks = fresh
	return nil
}

// hadLSMLayer reports whether pins (a listing from before a Load) hold an
// LSM layer, which live Trials may rely on.
func hadLSMLayer(pins map[string]bool) bool {
	for _, h := range lsmHooks {
		if pins["link_"+h.name] {
			return true
		}
	}
	return false
}

// LSM reports whether the BPF LSM layer is attached.
func (l *Loader) LSM() bool { return len(l.lsmLinks) > 0 }

// LSMError says why the BPF LSM layer is not attached (it wraps
// ErrLSMMissing), or nil when it is, or was until DetachLSM.
func (l *Loader) LSMError() error { return l.lsmErr }

// DetachLSM unpins and closes the LSM links, leaving the cgroup layer alone
// (for tests that need enforcement without the LSM layer), and makes the
// live Trials' policies do without it (syncPolicies).
func (l *Loader) DetachLSM() error {
	// First: no moment when a policy counts on a layer already gone.
	serr := l.syncPolicies(false)
	err := detach(l.pinDir, l.lsmLinks)
	l.lsmLinks = nil
	return errors.Join(serr, err)
}

func detach(pinDir string, links []namedLink) error {
	var errs []error
	for _, nl := range links {
		if err := os.Remove(filepath.Join(pinDir, "link_"+nl.name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("unpin %s: %w", nl.name, err))
		}
		if err := nl.lk.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close %s: %w", nl.name, err))
		}
	}
	return errors.Join(errs...)
}

// namedLink is an attached link and the program name its pin is named by.
type namedLink struct {
	name string
	lk   link.Link
}
