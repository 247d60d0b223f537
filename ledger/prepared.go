//go:build linux

package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/internal/rootdir"
)

// Prepared is this process's ledger made ahead of its Trial (Prepare),
// in a directory named for no Trial; Take gives it to one. It is made as
// Create makes a ledger: a new file, empty but for its header.
type Prepared struct {
	l      *Ledger // its dir and id: the state directory and the name
	f      *os.File
	size   int64
	header []byte // as Prepare wrote it
}

// Prepare makes this process's ledger, with one slot per tunnel, under
// dir (the state directory) in the directory of name, which must be no
// Trial's id (so that nothing of a Trial's is ever taken for it). On
// error nothing is left.
func Prepare(dir, name string, slots int) (*Prepared, error) {
	l, f, err := create(dir, name, slots)
	if err != nil {
		return nil, err
	}
	return &Prepared{l: l, f: f, size: int64(fileSize(slots)), header: bytes.Clone(l.mem[:ledgerHeader])}, nil
}

// Take makes the prepared ledger Trial id's: its directory is renamed to
// the Trial's, which must not exist (no other process keeps a ledger of
// a Trial being made), and the ledger is checked to be as Prepare left
// it, so that it is one Create would have made now. On error the
// prepared ledger is removed, and Create makes one.
func (p *Prepared) Take(id string) (*Ledger, error) {
	defer p.f.Close()
	state, err := os.Open(p.l.dir)
	if err != nil {
		p.Remove()
		return nil, err
	}
	defer state.Close()
	if err := unix.Renameat2(int(state.Fd()), trialDirName(p.l.id), int(state.Fd()), trialDirName(id), unix.RENAME_NOREPLACE); err != nil {
		p.Remove()
		return nil, &os.LinkError{Op: "rename", Old: trialDir(p.l.dir, p.l.id), New: trialDir(p.l.dir, id), Err: err}
	}
	// Checked once in place: whatever was done to it before is seen, and
	// after, it is the Trial's as a new ledger is.
	p.l.id = id
	if err := p.untouched(state); err != nil {
		p.l.Remove()
		return nil, fmt.Errorf("the tunnel ledger prepared in %s was changed before it was taken: %w", trialDir(p.l.dir, id), err)
	}
	return p.l, nil
}

// untouched refuses a ledger that anything but this process wrote or
// holds open, and a directory with anything in it but the ledger: the
// file at its path is the one Prepare made (one link, root's alone, its
// size), holds nothing but the header its page starts with, and is open
// here alone.
func (p *Prepared) untouched(state *os.File) error {
	dir, err := openAt(state, trialDirName(p.l.id), trialDir(p.l.dir, p.l.id), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer dir.Close()
	name := strconv.Itoa(os.Getpid())
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return err
	}
	if !slices.Equal(names, []string{name}) {
		return fmt.Errorf("its directory holds %q", names)
	}
	var at, held unix.Stat_t
	if err := unix.Fstatat(int(dir.Fd()), name, &at, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if err := unix.Fstat(int(p.f.Fd()), &held); err != nil {
		return err
	}
	switch {
	case at.Dev != held.Dev || at.Ino != held.Ino:
		return errors.New("its file is another than the one made")
	case held.Nlink != 1 || held.Uid != uint32(os.Geteuid()) || held.Mode != unix.S_IFREG|0o600 || held.Size != p.size:
		return fmt.Errorf("its file has %d links, owner %d, mode %o, size %d", held.Nlink, held.Uid, held.Mode, held.Size)
	}
	page := min(os.Getpagesize(), len(p.l.mem))
	if !bytes.Equal(p.l.mem[:ledgerHeader], p.header) || slices.ContainsFunc(p.l.mem[ledgerHeader:page], func(b byte) bool { return b != 0 }) {
		return errors.New("its header or first slot was written")
	}
	// Only the header's page was written: anything after it is a hole.
	if off, err := unix.Seek(int(p.f.Fd()), int64(page), unix.SEEK_DATA); !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("it holds data at %d (%v)", off, err)
	}
	return rootdir.OpenOnlyHere(p.f)
}

// Remove removes a ledger that was not taken.
func (p *Prepared) Remove() {
	_ = p.f.Close()
	p.l.Remove()
}
