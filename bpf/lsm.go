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
}

// ErrLSMMissing means the kernel cannot run trialnet's BPF LSM layer; the
// cgroup layer still enforces, but a socket handed in from outside is not
// judged by the Trial that uses it.
var ErrLSMMissing = errors.New("BPF LSM layer unavailable")

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
			return fmt.Errorf("%w: the kernel has no BTF (CONFIG_DEBUG_INFO_BTF), which BPF LSM programs need: %w", ErrLSMMissing, err)
		case errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EINVAL):
			return fmt.Errorf("%w: no BPF LSM program type (CONFIG_BPF_LSM): %w", ErrLSMMissing, err)
		case errors.As(err, &errno):
			// Seen on kernels that cannot build BPF trampolines (fentry
			// fails the same way) and under lockdown policies. Only the
			// errno: the library's hint about MEMLOCK does not apply to
			// a root process on a memcg-accounted kernel.
			return fmt.Errorf("%w: the kernel refused to load a BPF LSM program (%w)", ErrLSMMissing, errno)
		}
		return fmt.Errorf("%w: the kernel refused to load a BPF LSM program: %w", ErrLSMMissing, err)
	}
	active, err := activeLSMs()
	if err != nil {
		if aerr := probeLSMAttach(cache); aerr != nil {
			return fmt.Errorf("%w: %w; attaching a probe program: %w", ErrLSMMissing, err, aerr)
		}
		return nil
	}
	if !slices.Contains(active, "bpf") {
		return fmt.Errorf("%w: bpf is not in the active LSM list %q; add it to the lsm= kernel command line", ErrLSMMissing, strings.Join(active, ","))
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
			lsmErr = fmt.Errorf("%w: this kernel has no %s LSM hook", ErrLSMMissing, spec.Programs[h.name].AttachTo)
		}
	}
	for _, h := range lsmHooks {
		if lsmErr != nil || !haveLSMHook(cache, spec.Programs[h.name].AttachTo) {
			delete(spec.Programs, h.name)
		}
	}
	return lsmErr
}

// attachLSM attaches prog and pins its link at pin. A link pinned there
// before (an earlier Load) cannot be updated in place, so the new link is
// attached and pinned beside it first and then renamed over it: there is
// no moment without a program. The temporary name has no dot: bpffs
// refuses names with one (EPERM), as the kernel reserves them.
func attachLSM(pin string, prog *ebpf.Program) (link.Link, error) {
	lk, err := link.AttachLSM(link.LSMOptions{Program: prog})
	if err != nil {
		return nil, err
	}
	tmp := pin + tmpPinSuffix
	_ = os.Remove(tmp) // left by a Load that died between pin and rename
	if err := lk.Pin(tmp); err != nil {
		_ = lk.Close()
		return nil, fmt.Errorf("pin link %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, pin); err != nil {
		_ = os.Remove(tmp)
		_ = lk.Close()
		return nil, fmt.Errorf("replace pinned link %s: %w", pin, err)
	}
	return lk, nil
}

// attachLSMLayer attaches and pins every loaded LSM program. If one
// fails, it leaves no LSM link at all: neither the ones it attached nor
// pins an earlier Load left for the hooks it did not reach, so that an
// adopting Load never finds half a layer.
func (l *Loader) attachLSMLayer() error {
	for _, h := range lsmHooks {
		prog := l.coll.Programs[h.name]
		if prog == nil {
			continue // no BPF LSM, or an optional hook this kernel lacks
		}
		lk, err := attachLSM(filepath.Join(l.pinDir, "link_"+h.name), prog)
		if err != nil {
			_ = l.DetachLSM()
			for _, h := range lsmHooks {
				_ = os.Remove(filepath.Join(l.pinDir, "link_"+h.name))
			}
			return fmt.Errorf("attach %s: %w", h.name, err)
		}
		l.lsmLinks = append(l.lsmLinks, namedLink{h.name, lk})
	}
	return nil
}

// tmpPinSuffix names the pin a new LSM link takes before it is renamed
// over the old one.
const tmpPinSuffix = "_new"

// LSM reports whether the BPF LSM layer is attached.
func (l *Loader) LSM() bool { return len(l.lsmLinks) > 0 }

// LSMError says why the BPF LSM layer is not attached (it wraps
// ErrLSMMissing), or nil when it is, or was until DetachLSM.
func (l *Loader) LSMError() error { return l.lsmErr }

// DetachLSM unpins and closes the LSM links, leaving the cgroup layer alone
// (for tests that need enforcement without the LSM layer).
func (l *Loader) DetachLSM() error {
	err := detach(l.pinDir, l.lsmLinks)
	l.lsmLinks = nil
	return err
}

// DetachCgroup unpins and closes the cgroup links, leaving the LSM layer
// alone (for tests that need the LSM layer on its own).
func (l *Loader) DetachCgroup() error {
	err := detach(l.pinDir, l.links)
	l.links = nil
	return err
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
