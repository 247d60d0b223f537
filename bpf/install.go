//go:build linux

package bpf

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/internal/rootdir"
)

// lockDir holds one lock file per pin directory. The pin directory itself
// is on bpffs, which may not even be mounted yet when a Load starts (and
// two Loads must not both mount it), so the lock lives outside it; /run is
// cleared at boot, as bpffs is. It is root's and private: the lock file
// holds the install record an adopting Load trusts, so no one else may
// create it first (a world-writable /run/lock would let them).
const lockDir = rootdir.Locks

// lockName is the lock file that serializes installs into pinDir.
func lockName(pinDir string) string {
	return "install-" + strings.ReplaceAll(strings.Trim(filepath.Clean(pinDir), "/"), "/", "_") + ".lock"
}

// installLock is an exclusive flock on a pin directory's lock file. The
// file also records why the installing Load found no BPF LSM layer, so
// that a Load which adopts the pins can say so without probing again.
type installLock struct{ f *os.File }

// lockPins takes the install lock of pinDir, waiting for any other Load or
// Uninstall of the same directory. An Uninstall removes the lock file while
// holding it, so a waiter that got the lock on a removed file tries again.
func lockPins(pinDir string) (*installLock, error) {
	path := filepath.Join(lockDir, lockName(pinDir))
	for range 100 {
		f, err := rootdir.OpenLock(lockDir, lockName(pinDir))
		if err != nil {
			return nil, fmt.Errorf("open install lock %s: %w", path, err)
		}
		if err := flock(f, unix.LOCK_EX); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		var held, now unix.Stat_t
		if unix.Fstat(int(f.Fd()), &held) == nil && unix.Stat(path, &now) == nil && held.Ino == now.Ino && held.Dev == now.Dev {
			return &installLock{f}, nil
		}
		_ = f.Close() // removed by an Uninstall while we waited
	}
	return nil, fmt.Errorf("lock %s: it keeps being removed", path)
}

func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// unlock releases the lock (closing the file drops the flock).
func (k *installLock) unlock() { _ = k.f.Close() }

// remove deletes the lock file while still holding it (Uninstall).
func (k *installLock) remove() { _ = os.Remove(k.f.Name()) }

// installNote is what the installing Load recorded in the lock file:
// which embedded object it loaded, why it found no BPF LSM layer, and the
// kernel's tag of each program it loaded. A program whose instructions are
// fixed up at load (a kfunc's BTF id, CO-RE field offsets: the unix hooks)
// has a tag that only the kernel's BTF could predict; the record lets an
// adopting Load check it without parsing that BTF.
type installNote struct {
	object  string // sha256 of the embedded ELF
	lsmMiss string // "": none recorded
	tags    map[string]string
}

func objectHash() string { return trialnetAdopt.object }

func (k *installLock) note() installNote {
	n := installNote{tags: map[string]string{}}
	b, _ := io.ReadAll(io.NewSectionReader(k.f, 0, 1<<16))
	for _, line := range strings.Split(string(b), "\n") {
		key, val, _ := strings.Cut(line, " ")
		switch key {
		case "object":
			n.object = val
		case "lsm_missing":
			n.lsmMiss = val
		case "tag":
			if name, tag, ok := strings.Cut(val, " "); ok {
				n.tags[name] = tag
			}
		}
	}
	return n
}

// record writes what an install found and loaded.
func (k *installLock) record(lsmErr error, progs map[string]*ebpf.Program) {
	var b strings.Builder
	fmt.Fprintf(&b, "object %s\n", objectHash())
	// A reason that may pass (memory, a busy kernel) is not recorded:
	// without one, the next Load installs again and retries the LSM
	// layer, rather than every adopting Load going without it until
	// reboot.
	if lsmErr != nil && !transient(lsmErr) {
		fmt.Fprintf(&b, "lsm_missing %s\n", strings.ReplaceAll(lsmErr.Error(), "\n", " "))
	}
	for name, p := range progs {
		if info, err := p.Info(); err == nil {
			fmt.Fprintf(&b, "tag %s %s\n", name, info.Tag)
		}
	}
	if k.f.Truncate(0) == nil {
		_, _ = k.f.WriteAt([]byte(b.String()), 0)
	}
}

// transient reports an error that a later attempt may not meet.
func transient(err error) bool {
	return errors.Is(err, errLSMAttach) || errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) || errors.Is(err, unix.EBUSY)
}

// errPinsDiffer means the pins are not exactly what this binary would
// install: Load installs (or updates in place) instead of adopting.
var errPinsDiffer = errors.New("pinned programs differ from the embedded ones")

// adopt returns a Loader over what an earlier Load pinned in pinDir, when
// every link that this kernel's Load would attach is pinned, attached to
// the parent cgroup (or to its LSM hook), and runs a program with the
// embedded program's tag over the pinned maps and the same constants. It
// loads nothing, so the verifier never runs. Anything else is
// errPinsDiffer (or another error), and the caller installs.
func adopt(opts Options, parentID uint64, level int, pinDir string, lk *installLock) (_ *Loader, err error) {
	coll := &ebpf.Collection{Programs: map[string]*ebpf.Program{}, Maps: map[string]*ebpf.Map{}}
	l := &Loader{coll: coll, pinDir: pinDir}
	defer func() {
		if err != nil {
			_ = l.Close()
		}
	}()
	mapIDs, err := l.adoptMaps()
	if err != nil {
		return nil, err
	}
	note := lk.note()
	if note.object != objectHash() {
		note.tags = nil // recorded by another build: its tags prove nothing
	}
	want := adoption{tags: note.tags, mapIDs: mapIDs, rodata: trialnetAdopt.rodataFor(level, parentID)}
	if err := l.adoptCgroupLinks(want, parentID); err != nil {
		return nil, err
	}
	if err := l.adoptLSMLinks(want, note.lsmMiss); err != nil {
		return nil, err
	}
	return l, nil
}

// adoptedMaps are the maps an install pins and an adoption opens.
var adoptedMaps = []string{trialnetMapPolicyMap, trialnetMapCountersMap, trialnetMapUnixPathsMap, trialnetMapUnixIdsMap, trialnetMapPtysMap, trialnetMapPtyFilesMap}

// adoptMaps opens the maps pinned in l.pinDir into l, each checked against
// the embedded object's, and returns their ids for the programs' map checks.
func (l *Loader) adoptMaps() (map[ebpf.MapID]bool, error) {
	// The maps the programs may use: the pinned ones, and a .rodata once
	// checked (all programs share one: it is checked once, not per program).
	mapIDs := map[ebpf.MapID]bool{}
	for _, name := range adoptedMaps {
		m, err := ebpf.LoadPinnedMap(filepath.Join(l.pinDir, name), nil)
		if err != nil {
			return nil, fmt.Errorf("%w: map %s: %w", errPinsDiffer, name, err)
		}
		l.coll.Maps[name] = m
		if err := trialnetAdopt.maps[name].compatible(m); err != nil {
			return nil, fmt.Errorf("%w: map %s: %w", errPinsDiffer, name, err)
		}
		id, err := pinnedMapID(name, m)
		if err != nil {
			return nil, err
		}
		mapIDs[id] = true
	}
	l.policy, l.counters = l.coll.Maps[trialnetMapPolicyMap], l.coll.Maps[trialnetMapCountersMap]
	l.unix, l.unixIDs = l.coll.Maps[trialnetMapUnixPathsMap], l.coll.Maps[trialnetMapUnixIdsMap]
	l.ptys = l.coll.Maps[trialnetMapPtysMap]
	return mapIDs, nil
}

// adoption is what adopt holds each pinned program to (adoptLink): the
// tags the installing Load recorded, and the maps and .rodata the
// program may use; the embedded programs' own tags are trialnetAdopt's.
type adoption struct {
	tags   map[string]string
	mapIDs map[ebpf.MapID]bool
	rodata []byte
}

// adoptHook adopts the link pinned for the program name, and the program
// into l's collection, so that the cgroup and LSM hooks are checked alike.
func (l *Loader) adoptHook(name string, want adoption) (namedLink, error) {
	nl, prog, tag, err := adoptLink(l.pinDir, name, want.tags[name], want.mapIDs, want.rodata)
	if err != nil {
		return namedLink{}, err
	}
	l.coll.Programs[name] = prog
	// The tag just checked is the one a receipt names (ProgramTags): kept,
	// so that no receipt reads the program's info again.
	l.tagMu.Lock()
	if l.tags == nil {
		l.tags = make(map[string]string)
	}
	l.tags[name] = tag
	l.tagMu.Unlock()
	return nl, nil
}

// adoptCgroupLinks adopts the pinned cgroup links, each of which must be
// attached to the parent cgroup.
func (l *Loader) adoptCgroupLinks(want adoption, parentID uint64) error {
	// The unix hooks are pinned exactly when the installing Load's kernel
	// had them; this is the same kernel (bpffs does not outlive a boot).
	_, err := os.Stat(filepath.Join(l.pinDir, "link_"+trialnetProgTrialnetConnectUnix))
	l.unixHook = err == nil
	for _, h := range hooks {
		if h.unix && !l.unixHook {
			continue
		}
		nl, err := l.adoptHook(h.name, want)
		if err != nil {
			return err
		}
		l.links = append(l.links, nl)
		if cg := cgroupOf(nl.lk); cg != parentID {
			return fmt.Errorf("%w: %s is attached to cgroup %d, not %d", errPinsDiffer, h.name, cg, parentID)
		}
	}
	return nil
}

// adoptLSMLinks adopts the pinned LSM layer whole (optional hooks aside),
// or, with none of it pinned, the reason the installing Load recorded.
func (l *Loader) adoptLSMLinks(want adoption, lsmMiss string) error {
	missing := 0
	for _, h := range lsmHooks {
		pin := filepath.Join(l.pinDir, "link_"+h.name)
		if _, err := os.Stat(pin); errors.Is(err, os.ErrNotExist) {
			if !h.optional {
				missing++
			}
			continue
		}
		nl, err := l.adoptHook(h.name, want)
		if err != nil {
			return err
		}
		l.lsmLinks = append(l.lsmLinks, nl)
	}
	if len(l.lsmLinks) > 0 && missing > 0 {
		return fmt.Errorf("%w: %d LSM links missing", errPinsDiffer, missing)
	}
	if len(l.lsmLinks) == 0 {
		if lsmMiss == "" {
			return fmt.Errorf("%w: no LSM links and no recorded reason", errPinsDiffer)
		}
		l.lsmErr = fmt.Errorf("%w: %s", errLSMMissing, strings.TrimPrefix(lsmMiss, errLSMMissing.Error()+": "))
	}
	return nil
}

// pinnedMapID is the kernel's id of the pinned map name, which adopt
// matches against the maps each pinned program uses.
func pinnedMapID(name string, m *ebpf.Map) (ebpf.MapID, error) {
	var info mapInfo
	if err := objInfo(m.FD(), unsafe.Pointer(&info), unsafe.Sizeof(info)); err != nil {
		return 0, fmt.Errorf("map %s: read its info: %w (the pin opened, but the kernel would not describe its map: a security module denying bpf access, or memory; if it persists, 'trialnet uninstall' removes the pins, ending the enforcement of live Trials, and the next start installs them afresh)", name, err)
	}
	if info.id == 0 {
		return 0, fmt.Errorf("%w: map %s: the kernel does not report its id", errPinsDiffer, name)
	}
	return ebpf.MapID(info.id), nil
}

// adoptLink opens the link pinned for name and its program, and checks
// that the program is the embedded one over the pinned maps and rodata:
// by the tag it was compiled with, or for a program fixed up at load by
// the tag recorded when this same object was installed.
func adoptLink(pinDir, name string, recorded string, mapIDs map[ebpf.MapID]bool, rodata []byte) (namedLink, *ebpf.Program, string, error) {
	compiled, ok := trialnetAdopt.tags[name]
	if !ok {
		return namedLink{}, nil, "", fmt.Errorf("%w: no embedded program %s", errPinsDiffer, name)
	}
	lk, err := link.LoadPinnedLink(filepath.Join(pinDir, "link_"+name), nil)
	if err != nil {
		return namedLink{}, nil, "", fmt.Errorf("%w: link %s: %w", errPinsDiffer, name, err)
	}
	nl := namedLink{name, lk}
	prog, tag, err := linkedProgram(lk, compiled, recorded, mapIDs, rodata)
	if err != nil {
		_ = lk.Close()
		return namedLink{}, nil, "", fmt.Errorf("%w: %s: %w", errPinsDiffer, name, err)
	}
	return nl, prog, tag, nil
}

// linkedProgram opens the program lk runs, checks it as adoptLink says,
// and returns it with its tag.
func linkedProgram(lk link.Link, compiled [2]string, recorded string, mapIDs map[ebpf.MapID]bool, rodata []byte) (_ *ebpf.Program, _ string, err error) {
	info, err := lk.Info()
	if err != nil {
		return nil, "", err
	}
	prog, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		return nil, "", err
	}
	defer func() {
		if err != nil {
			_ = prog.Close()
		}
	}()
	tag, ids, err := tagAndMaps(prog)
	if err != nil {
		return nil, "", err
	}
	if !slices.Contains(compiled[:], tag) && (recorded == "" || recorded != tag) {
		return nil, "", fmt.Errorf("its tag %s is neither the embedded program's (%s) nor the one recorded at install", tag, strings.Join(compiled[:], " or "))
	}
	for _, id := range ids {
		if mapIDs[id] {
			continue
		}
		if err := sameRodata(id, rodata); err != nil {
			return nil, "", err
		}
		mapIDs[id] = true
	}
	return prog, tag, nil
}

// progInfo is the head of the kernel's struct bpf_prog_info, up to the
// map ids: a shorter info_len is read as far as it goes.
type progInfo struct {
	typ, id                           uint32
	tag                               [8]byte
	jitedLen, xlatedLen               uint32
	jitedInsns, xlatedInsns, loadTime uint64
	createdByUID, nrMapIDs            uint32
	mapIDs                            ptr64
}

// mapInfo is the head of the kernel's struct bpf_map_info, up to the
// name: what adopt checks, where ebpf.Map.Info also reads the map's
// fdinfo (through os.File: nine system calls and a parse a map, seven
// maps a start).
type mapInfo struct {
	typ, id, keySize, valueSize, maxEntries, flags uint32
	name                                           [unix.BPF_OBJ_NAME_LEN]byte
}

// ptr64 is a __aligned_u64 that holds a pointer (little-endian: the
// first word), as a pointer: the runtime keeps what it points to, and
// adjusts it if a stack moves.
type ptr64 [8 / unsafe.Sizeof(uintptr(0))]unsafe.Pointer

// tagAndMaps is the kernel's tag of prog and the ids of the maps it uses:
// two BPF_OBJ_GET_INFO_BY_FD calls for these fields only, where
// ebpf.Program.Info also copies out the program's instructions, line and
// jit infos, reads its fdinfo and, for a name of 15 characters or more,
// loads and parses its BTF (1.7 ms of CPU for the ten hooks of a start).
func tagAndMaps(prog *ebpf.Program) (string, []ebpf.MapID, error) {
	var info progInfo
	if err := objInfo(prog.FD(), unsafe.Pointer(&info), unsafe.Sizeof(info)); err != nil {
		return "", nil, fmt.Errorf("read the program's info: %w", err)
	}
	if info.nrMapIDs == 0 {
		return hex.EncodeToString(info.tag[:]), nil, nil
	}
	ids := make([]uint32, info.nrMapIDs)
	more := progInfo{nrMapIDs: info.nrMapIDs, mapIDs: ptr64{unsafe.Pointer(&ids[0])}}
	if err := objInfo(prog.FD(), unsafe.Pointer(&more), unsafe.Sizeof(more)); err != nil {
		return "", nil, fmt.Errorf("read the program's maps: %w", err)
	}
	if more.nrMapIDs != info.nrMapIDs {
		return "", nil, fmt.Errorf("the program's maps changed while read (%d, then %d)", info.nrMapIDs, more.nrMapIDs)
	}
	out := make([]ebpf.MapID, len(ids))
	for i, id := range ids {
		out[i] = ebpf.MapID(id)
	}
	return hex.EncodeToString(info.tag[:]), out, nil
}

// objInfo is BPF_OBJ_GET_INFO_BY_FD for the program or map fd into the
// size bytes at info (a progInfo or a mapInfo).
func objInfo(fd int, info unsafe.Pointer, size uintptr) error {
	attr := struct {
		fd, infoLen uint32
		info        ptr64
	}{uint32(fd), uint32(size), ptr64{info}}
	_, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_OBJ_GET_INFO_BY_FD, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(info)
	if errno != 0 {
		return errno
	}
	return nil
}

// sameRodata checks that the map with id is a .rodata holding want: the
// tag covers the instructions, not the constants the loader sets.
func sameRodata(id ebpf.MapID, want []byte) error {
	m, err := ebpf.NewMapFromID(id)
	if err != nil {
		return err
	}
	defer m.Close()
	var info mapInfo
	if err := objInfo(m.FD(), unsafe.Pointer(&info), unsafe.Sizeof(info)); err != nil {
		return err
	}
	name := unix.ByteSliceToString(info.name[:])
	if !strings.HasSuffix(name, ".rodata") || info.typ != unix.BPF_MAP_TYPE_ARRAY || info.maxEntries != 1 {
		return fmt.Errorf("uses map %d (%s), not a pinned map", id, name)
	}
	got := make([]byte, info.valueSize)
	if err := m.Lookup(uint32(0), &got); err != nil {
		return fmt.Errorf("read .rodata: %w", err)
	}
	if !bytes.Equal(got, want) {
		return errors.New("its constants (trial level, parent cgroup) differ")
	}
	return nil
}

func cgroupOf(l link.Link) uint64 {
	info, err := l.Info()
	if err != nil {
		return 0
	}
	if cg := info.Cgroup(); cg != nil {
		return cg.CgroupId
	}
	return 0
}
