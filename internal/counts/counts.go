//go:build linux

// Package counts keeps the counts behind a Trial's limits (its open
// tunnels, client connections and unread request heads, its CONNECT and
// record rates, its decision-log bytes) in memory that two agent
// processes can map at once. During a hand-over the old agent and its
// successor both accept on the Trial's sockets: each checks every limit
// against both processes' counts, one rate and one log budget, so the two
// together keep within each limit as one process would.
//
// A Region is one page of a memfd, mapped shared; the agent sends the
// memfd to its successor with the listeners. Counts that end with their
// process (what it has open) are per process, in one of two slots, so
// that a process that dies leaves nothing the other must count; the
// rates and the log bytes belong to the Trial, and are one word each.
package counts

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Slots is how many processes share a Region: an agent and the one it
// hands over to.
const Slots = 2

// Slot is what one process has open. It lives in the mapped page.
type Slot struct {
	Tunnels atomic.Int64 // tunnels and forwarded requests being served
	Clients atomic.Int64 // client connections admitted and not closed
	Pending atomic.Int64 // of those, the ones whose request head is unread
}

// The page: a header, then each word on a cache line of its own, as the
// processes write them at once.
const (
	magic      = "TNCOUNT1"
	pageSize   = 4096
	offConnect = 64  // the CONNECT rate's theoretical arrival time (ratelimit)
	offRecord  = 128 // the record rate's
	offLog     = 192 // decision-log bytes written
	offSlots   = 256 // Slots slots, 64 bytes apart
	slotStride = 64  // > unsafe.Sizeof(Slot{})
)

// Region is one Trial's counts (or the proxy's, for its connection cap
// over every Trial). Close unmaps it.
type Region struct {
	mem  []byte
	file *os.File // the memfd; nil for a private Region
}

// New makes a Region in a memfd, zeroed: nothing open, both rates full,
// no log bytes. name is for /proc/PID/fd.
func New(name string) (*Region, error) {
	fd, err := unix.MemfdCreate("trialnet-counts:"+name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("counts: memfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), "trialnet-counts:"+name)
	if err := f.Truncate(pageSize); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("counts: %w", err)
	}
	// Its size is fixed: a peer could not shrink it under this mapping.
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("counts: seal: %w", err)
	}
	r, err := mapFile(f)
	if err != nil {
		return nil, err
	}
	copy(r.mem, magic)
	return r, nil
}

// Open maps a Region another process made (New), received as f, which
// the Region owns from here, whatever the outcome.
func Open(f *os.File) (*Region, error) {
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil || seals&(unix.F_SEAL_SHRINK|unix.F_SEAL_GROW) != unix.F_SEAL_SHRINK|unix.F_SEAL_GROW {
		_ = f.Close()
		return nil, fmt.Errorf("counts: %s is not a sealed counts page (seals %#x, %v)", f.Name(), seals, err)
	}
	if st, err := f.Stat(); err != nil || st.Size() != pageSize {
		_ = f.Close()
		return nil, fmt.Errorf("counts: %s is not one page (%v)", f.Name(), err)
	}
	r, err := mapFile(f)
	if err != nil {
		return nil, err
	}
	if string(r.mem[:len(magic)]) != magic {
		_ = r.Close()
		return nil, errors.New("counts: the page is not a counts page of this layout (" + magic + ")")
	}
	return r, nil
}

func mapFile(f *os.File) (*Region, error) {
	mem, err := unix.Mmap(int(f.Fd()), 0, pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("counts: mmap: %w", err)
	}
	return &Region{mem: mem, file: f}, nil
}

// Private is a Region no other process can map: a Trial's counts when
// nothing is handed over (tests, a proxy on its own).
func Private() *Region {
	words := make([]int64, pageSize/8) // 8-aligned, as the words must be
	r := &Region{mem: unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), pageSize)}
	copy(r.mem, magic)
	return r
}

// Dup is a new descriptor of the Region's memfd, for a hand-over; the
// caller closes it.
func (r *Region) Dup() (*os.File, error) {
	if r.file == nil {
		return nil, errors.New("counts: a private region cannot be shared")
	}
	fd, err := unix.FcntlInt(r.file.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), r.file.Name()), nil
}

// Close unmaps the Region: nothing may use its words after.
func (r *Region) Close() error {
	var err error
	if r.file != nil {
		err = errors.Join(unix.Munmap(r.mem), r.file.Close())
	}
	r.mem = nil
	return err
}

func (r *Region) word(off int) *atomic.Int64 { return (*atomic.Int64)(unsafe.Pointer(&r.mem[off])) }

// ConnectRate and RecordRate are the words of the Trial's CONNECT and
// record rates (ratelimit.NewShared).
func (r *Region) ConnectRate() *atomic.Int64 { return r.word(offConnect) }
func (r *Region) RecordRate() *atomic.Int64  { return r.word(offRecord) }

// LogBytes is the word of the bytes of the Trial's decision log.
func (r *Region) LogBytes() *atomic.Int64 { return r.word(offLog) }

// Slot is slot i (0 or 1): one process's.
func (r *Region) Slot(i int) *Slot {
	return (*Slot)(unsafe.Pointer(&r.mem[offSlots+i*slotStride]))
}

// Clear zeroes slot i: the process that used it is gone, and the one
// that takes it next starts with nothing open.
func (r *Region) Clear(i int) {
	s := r.Slot(i)
	s.Tunnels.Store(0)
	s.Clients.Store(0)
	s.Pending.Store(0)
}
