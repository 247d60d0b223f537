//go:build linux

// Package ledger keeps, per Trial and per agent process, the tunnels that
// process has open, where the agent that serves the Trial next finds them
// if the process is killed, and records each as cut.
//
// A tunnel's record is written when it ends, with its byte counts. An
// agent killed outright (SIGKILL, the OOM killer) takes the records of
// its open tunnels with it, and the Trial's log would not show that they
// were ever allowed, nor that they were cut. So each agent process keeps
// a ledger per Trial: a file on the state directory's tmpfs, in a
// directory of the Trial's own (so that finding one Trial's ledgers
// reads that directory, not every live Trial's files), mapped shared, with one slot per open tunnel or forwarded request holding its
// record as it stood when it was allowed. Taking a slot is a copy into
// memory and one atomic store; nothing is written to a disk. The agent
// that serves the Trial next finds the ledgers of processes that are
// gone and records each tunnel left in them as cut. A ledger keeps a copy
// of the Trial's pending summary too (pending.go), which that agent
// writes.
package ledger

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/internal/procstat"
	"github.com/trialnet/trialnet/record"
)

const (
	ledgerMagic  = "TNLEDGR1"
	ledgerHeader = 64   // magic, pid, process start time, slots (0: every 2048 bytes after the header, as before the pending summary)
	ledgerSlot   = 2048 // state (4), length (4), the record's JSON
)

// Ledger is one process's open tunnels of one Trial. It is a
// proxy.Ledger.
type Ledger struct {
	dir, id string // the state directory and the Trial
	mem     []byte
	mu      sync.Mutex
	free    []int // slots not in use

	pendingAt int         // where the copy of the pending summary starts (pending.go)
	kept      pendingCopy // what is in that copy
}

// fileSize is the size of a ledger of slots slots.
func fileSize(slots int) int { return ledgerHeader + slots*ledgerSlot + pendingSize }

// trialDir is the directory of Trial id's ledgers under dir.
func trialDir(dir, id string) string {
	return filepath.Join(dir, trialDirName(id))
}

func trialDirName(id string) string { return id + ".ledgers" }

// ledgerPath names pid's ledger of Trial id under dir.
func ledgerPath(dir, id string, pid int) string {
	return filepath.Join(trialDir(dir, id), strconv.Itoa(pid))
}

// Each name below the state directory is resolved beneath the directory
// it is in, through no symlink: a state directory configured outside the
// hidden /run/trialnet is one a uid-0 Trial can write (it owns root's
// files), and the agent, root outside every Trial, must not create,
// truncate, read, move or remove a file wherever a link planted there
// leads.
var beneath = &unix.OpenHow{Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS}

// openAt opens name beneath the directory at, with flags (close-on-exec
// added) and mode; path names it in errors.
func openAt(at *os.File, name, path string, flags int, mode uint32) (*os.File, error) {
	how := *beneath
	how.Flags, how.Mode = uint64(flags|unix.O_CLOEXEC), uint64(mode)
	fd, err := unix.Openat2(int(at.Fd()), name, &how)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// openTrialDir opens the state directory dir and Trial id's ledger
// directory in it, which it makes first if create is set.
func openTrialDir(dir, id string, create bool) (state, trial *os.File, _ error) {
	state, err := os.Open(dir)
	if err != nil {
		return nil, nil, err
	}
	if create {
		if err := unix.Mkdirat(int(state.Fd()), trialDirName(id), 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			_ = state.Close()
			return nil, nil, &os.PathError{Op: "mkdir", Path: trialDir(dir, id), Err: err}
		}
	}
	trial, err = openAt(state, trialDirName(id), trialDir(dir, id), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		_ = state.Close()
		return nil, nil, err
	}
	return state, trial, nil
}

// removeTrialDir removes Trial id's ledger directory from the state
// directory if it is empty (and a directory).
func removeTrialDir(state *os.File, id string) {
	_ = unix.Unlinkat(int(state.Fd()), trialDirName(id), unix.AT_REMOVEDIR)
}

// Create makes this process's ledger of Trial id under dir (the state
// directory, a tmpfs), with one slot per tunnel it may have open.
func Create(dir, id string, slots int) (*Ledger, error) {
	l, f, err := create(dir, id, slots)
	if err != nil {
		return nil, err
	}
	_ = f.Close() // the mapping stays
	return l, nil
}

// create is Create, which also returns the ledger's file, open.
func create(dir, id string, slots int) (*Ledger, *os.File, error) {
	f, err := createFile(dir, id)
	if err != nil {
		return nil, nil, err
	}
	l := &Ledger{dir: dir, id: id}
	fail := func(err error) (*Ledger, *os.File, error) {
		_ = f.Close()
		l.unlink()
		return nil, nil, err
	}
	size := fileSize(slots)
	if err := f.Truncate(int64(size)); err != nil {
		return fail(err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail(err)
	}
	start, _ := procstat.StartTime(os.Getpid())
	copy(mem, ledgerMagic)
	binary.LittleEndian.PutUint64(mem[8:], uint64(os.Getpid()))
	binary.LittleEndian.PutUint64(mem[16:], start)
	binary.LittleEndian.PutUint64(mem[24:], uint64(slots))
	l.mem, l.free, l.pendingAt = mem, make([]int, slots), ledgerHeader+slots*ledgerSlot
	for i := range l.free {
		l.free[i] = slots - 1 - i
	}
	return l, f, nil
}

// createFile makes this process's ledger file of Trial id under dir,
// empty.
func createFile(dir, id string) (*os.File, error) {
	name, path := strconv.Itoa(os.Getpid()), ledgerPath(dir, id, os.Getpid())
	var err error
	// Twice: another agent process (one draining after a hand-over)
	// removes the directory when its own last ledger in it goes.
	for range 2 {
		var state, trial *os.File
		if state, trial, err = openTrialDir(dir, id, true); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return nil, err
		}
		// A new file, never one already there: a stale ledger, or a hard
		// link a Trial planted to a file it wants written.
		if err := unix.Unlinkat(int(trial.Fd()), name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			_ = trial.Close()
			_ = state.Close()
			return nil, &os.PathError{Op: "remove", Path: path, Err: err}
		}
		f, ferr := openAt(trial, name, path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL, 0o600)
		_ = trial.Close()
		_ = state.Close()
		if err = ferr; !errors.Is(err, os.ErrNotExist) {
			return f, err
		}
	}
	return nil, err
}

// unlink removes this process's ledger file, and the Trial's ledger
// directory if it is left empty (it is not while another process's
// ledger is in it).
func (l *Ledger) unlink() {
	state, trial, err := openTrialDir(l.dir, l.id, false)
	if err != nil {
		return
	}
	_ = unix.Unlinkat(int(trial.Fd()), strconv.Itoa(os.Getpid()), 0)
	_ = trial.Close()
	removeTrialDir(state, l.id)
	_ = state.Close()
}

func slotState(mem []byte, i int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&mem[ledgerHeader+i*ledgerSlot]))
}

// Open keeps ev in a free slot until the function it returns is called
// (proxy.Ledger). A record too long for a slot is trimmed to fit it
// (slotLine). There is a slot for every tunnel and request that the
// Trial's max_tunnels lets this process have open (the proxy frees a
// slot before it counts its tunnel as ended), so none is left unkept.
func (l *Ledger) Open(ev *record.Event) func() {
	// A record lists only the first of its name's addresses, and how many
	// there were is not in its JSON: the slot's detail says it, which is
	// what Lost keeps of it (the detail is the cut's).
	slot := *ev
	slot.Detail = record.ResolvedNote(ev)
	line, err := slotLine(&slot, ledgerSlot-8)
	if err != nil {
		return func() {} // only a start time JSON cannot hold (past year 9999)
	}
	l.mu.Lock()
	if len(l.free) == 0 || l.mem == nil {
		l.mu.Unlock()
		return func() {}
	}
	i := l.free[len(l.free)-1]
	l.free = l.free[:len(l.free)-1]
	l.mu.Unlock()
	off := ledgerHeader + i*ledgerSlot
	binary.LittleEndian.PutUint32(l.mem[off+4:], uint32(len(line)))
	copy(l.mem[off+8:], line)
	slotState(l.mem, i).Store(1) // after the record: a reader sees it whole
	return func() {
		slotState(l.mem, i).Store(0)
		l.mu.Lock()
		l.free = append(l.free, i)
		l.mu.Unlock()
	}
}

// Remove drops the ledger once every tunnel it kept has ended.
func (l *Ledger) Remove() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mem == nil {
		return
	}
	_ = unix.Munmap(l.mem)
	l.mem = nil
	l.unlink()
}

// Lost reads and removes the ledgers of Trial id under dir that
// belong to processes which are gone (or to pid, once it is known to
// be), and returns the tunnels they kept, each as the record of its cut,
// and the summary each kept pending (pending.go), as a summary record.
// A ledger of a live process other than this one is left alone: an
// agent draining after a hand-over.
func Lost(dir, id string) ([]record.Event, error) {
	state, trial, err := openTrialDir(dir, id, false)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // no ledger
	}
	if err != nil {
		return nil, err
	}
	defer state.Close()
	defer trial.Close()
	files, _ := trial.ReadDir(-1)
	var out []record.Event
	var errs []error
	for _, f := range files {
		evs, err := readLedger(trial, f.Name(), filepath.Join(trialDir(dir, id), f.Name()))
		if errors.Is(err, errLedgerLive) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
		}
		for i := range evs {
			evs[i].Trial = id // the ledger's Trial, whatever its slot held
		}
		out = append(out, evs...)
		_ = unix.Unlinkat(int(trial.Fd()), f.Name(), 0) // the name, even a symlink's: never where it leads
	}
	removeTrialDir(state, id) // left while a live process's ledger is in it
	return out, errors.Join(errs...)
}

var errLedgerLive = errors.New("its process runs")

// processRuns reports whether process pid, started at start, runs: not
// gone, not another process with its pid, not a zombie.
func processRuns(pid int, start uint64) bool {
	if s, err := procstat.StartTime(pid); err != nil || s != start {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	rest := string(b[bytes.LastIndexByte(b, ')')+1:])
	f := strings.Fields(rest)
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// RemoveAll removes every ledger of Trial id under dir, unread: what
// they kept is no Trial's any more.
func RemoveAll(dir, id string) {
	_ = os.RemoveAll(trialDir(dir, id))
}

// readLedger reads the ledger name in the directory trial (path names
// it in errors).
func readLedger(trial *os.File, name, path string) ([]record.Event, error) {
	f, err := openAt(trial, name, path, unix.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	mem, err := io.ReadAll(f)
	_ = f.Close()
	if err != nil {
		return nil, err
	}
	if len(mem) < ledgerHeader || string(mem[:8]) != ledgerMagic {
		return nil, fmt.Errorf("%s: not a tunnel ledger", path)
	}
	pid := int(binary.LittleEndian.Uint64(mem[8:]))
	if name != strconv.Itoa(pid) {
		return nil, fmt.Errorf("%s: its header names pid %d", path, pid)
	}
	if processRuns(pid, binary.LittleEndian.Uint64(mem[16:])) {
		return nil, errLedgerLive
	}
	end := len(mem)
	if slots := binary.LittleEndian.Uint64(mem[24:]); slots != 0 && slots <= uint64((len(mem)-ledgerHeader)/ledgerSlot) {
		end = ledgerHeader + int(slots)*ledgerSlot
	}
	var out []record.Event
	now := time.Now()
	for off := ledgerHeader; off+ledgerSlot <= end; off += ledgerSlot {
		if binary.LittleEndian.Uint32(mem[off:]) != 1 {
			continue
		}
		n := int(binary.LittleEndian.Uint32(mem[off+4:]))
		if n > ledgerSlot-8 {
			continue
		}
		var ev record.Event
		if err := ev.UnmarshalJSON(bytes.Clone(mem[off+8 : off+8+n])); err != nil {
			continue
		}
		trimmed, note := ev.Detail == ledgerTrimmed, ev.Detail
		ev.Decision, ev.Reason = record.DecisionAllow, record.ReasonAllowed
		ev.Detail = fmt.Sprintf("tunnel cut: the agent process serving it (pid %d) ended without closing it (killed or crashed); its byte counts are unknown", pid)
		if trimmed {
			ev.Detail += "; its record was trimmed to fit the ledger: its resolved addresses are not kept, and a value ending in …[N bytes] was N bytes long"
		}
		if record.IsResolvedNote(note) { // Open's; an earlier agent's detail is not kept
			ev.Detail += "; " + note
		}
		ev.Duration = now.Sub(ev.Time)
		out = append(out, ev)
	}
	if end < len(mem) {
		if sum := readPending(mem[end:], pid); sum != nil {
			out = append(out, *sum)
		}
	}
	return out, nil
}

// MoveLegacy moves the ledgers an agent before per-Trial directories left
// under dir (<id>.open.<pid>) into their Trial's directory, so that the
// agent serving the Trial next finds them. A process still writing one
// keeps its mapping, which a rename leaves in place.
func MoveLegacy(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		id, pid, ok := strings.Cut(e.Name(), ".open.")
		if !ok || !e.Type().IsRegular() {
			continue
		}
		if _, err := strconv.Atoi(pid); err != nil {
			continue
		}
		state, trial, err := openTrialDir(dir, id, true)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if err := unix.Renameat(int(state.Fd()), e.Name(), int(trial.Fd()), pid); err != nil {
			errs = append(errs, &os.LinkError{Op: "rename", Old: filepath.Join(dir, e.Name()), New: filepath.Join(trialDir(dir, id), pid), Err: err})
		}
		_ = trial.Close()
		_ = state.Close()
	}
	return errors.Join(errs...)
}
