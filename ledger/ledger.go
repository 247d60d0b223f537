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
// gone and records each tunnel left in them as cut.
package ledger

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
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
	ledgerHeader = 64   // magic, pid, process start time
	ledgerSlot   = 2048 // state (4), length (4), the record's JSON
)

// Ledger is one process's open tunnels of one Trial. It is a
// proxy.Ledger.
type Ledger struct {
	path string
	mem  []byte
	mu   sync.Mutex
	free []int // slots not in use
}

// trialDir is the directory of Trial id's ledgers under dir.
func trialDir(dir, id string) string {
	return filepath.Join(dir, id+".ledgers")
}

// ledgerPath names pid's ledger of Trial id under dir.
func ledgerPath(dir, id string, pid int) string {
	return filepath.Join(trialDir(dir, id), strconv.Itoa(pid))
}

// Create makes this process's ledger of Trial id under dir (the state
// directory, a tmpfs), with one slot per tunnel it may have open.
func Create(dir, id string, slots int) (*Ledger, error) {
	path := ledgerPath(dir, id, os.Getpid())
	var f *os.File
	var err error
	// Twice: another agent process (one draining after a hand-over)
	// removes the directory when its own last ledger in it goes.
	for range 2 {
		if err = os.Mkdir(trialDir(dir, id), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, err
		}
		f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		if !errors.Is(err, os.ErrNotExist) {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	defer f.Close() // the mapping stays
	size := ledgerHeader + slots*ledgerSlot
	if err := f.Truncate(int64(size)); err != nil {
		_ = os.Remove(path)
		return nil, err
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		_ = os.Remove(path)
		return nil, err
	}
	start, _ := procstat.StartTime(os.Getpid())
	copy(mem, ledgerMagic)
	binary.LittleEndian.PutUint64(mem[8:], uint64(os.Getpid()))
	binary.LittleEndian.PutUint64(mem[16:], start)
	l := &Ledger{path: path, mem: mem, free: make([]int, slots)}
	for i := range l.free {
		l.free[i] = slots - 1 - i
	}
	return l, nil
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
	line, err := slotLine(ev, ledgerSlot-8)
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
	_ = os.Remove(l.path)
	_ = os.Remove(filepath.Dir(l.path)) // fails while another process's ledger is in it
}

// Lost reads and removes the ledgers of Trial id under dir that
// belong to processes which are gone (or to pid, once it is known to
// be), and returns the tunnels they kept, each as the record of its cut.
// A ledger of a live process other than this one is left alone: an
// agent draining after a hand-over.
func Lost(dir, id string) ([]record.Event, error) {
	d := trialDir(dir, id)
	files, _ := os.ReadDir(d)
	var out []record.Event
	var errs []error
	for _, f := range files {
		path := filepath.Join(d, f.Name())
		evs, err := readLedger(path)
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
		_ = os.Remove(path)
	}
	_ = os.Remove(d) // left while a live process's ledger is in it
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

func readLedger(path string) ([]record.Event, error) {
	mem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(mem) < ledgerHeader || string(mem[:8]) != ledgerMagic {
		return nil, fmt.Errorf("%s: not a tunnel ledger", path)
	}
	pid := int(binary.LittleEndian.Uint64(mem[8:]))
	if filepath.Base(path) != strconv.Itoa(pid) {
		return nil, fmt.Errorf("%s: its header names pid %d", path, pid)
	}
	if processRuns(pid, binary.LittleEndian.Uint64(mem[16:])) {
		return nil, errLedgerLive
	}
	var out []record.Event
	now := time.Now()
	for off := ledgerHeader; off+ledgerSlot <= len(mem); off += ledgerSlot {
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
		trimmed := ev.Detail == ledgerTrimmed
		ev.Decision, ev.Reason = record.DecisionAllow, record.ReasonAllowed
		ev.Detail = fmt.Sprintf("tunnel cut: the agent process serving it (pid %d) ended without closing it (killed or crashed); its byte counts are unknown", pid)
		if trimmed {
			ev.Detail += "; its record was trimmed to fit the ledger: its resolved addresses are not kept, and a value ending in …[N bytes] was N bytes long"
		}
		ev.Duration = now.Sub(ev.Time)
		out = append(out, ev)
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
		if err := os.Mkdir(trialDir(dir, id), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			errs = append(errs, err)
			continue
		}
		if err := os.Rename(filepath.Join(dir, e.Name()), filepath.Join(trialDir(dir, id), pid)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
