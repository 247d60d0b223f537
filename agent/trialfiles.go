//go:build linux

package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/internal/rootdir"
	"github.com/trialnet/trialnet/ledger"
	"github.com/trialnet/trialnet/sandbox"
	"golang.org/x/sys/unix"
)

// trialFiles are a Trial's files made ahead of it, as a running agent
// keeps them beside its shells (prepared.go): its data directory with
// an empty decision log, and this process's tunnel ledger, in the
// agent's root-only directories under a shell's name
// (sandbox.NewShellName), which no Trial id can be. A create or a
// container's adoption takes them (takeData, takeLedger): each is
// renamed to the Trial's name (never over one) and checked there to be
// as it was made, else removed and made afresh. Like shells, they are
// this process's alone: removed by close, and those of a process that
// is gone by sweepFiles.
type trialFiles struct {
	name string
	// data is the data directory's descriptor, dir the one made in it,
	// log its empty decisions.jsonl; nil without a DataDir.
	data, dir, log *os.File
	// ledger has slots for a Trial of the default max_tunnels; nil
	// without a StateDir.
	ledger *ledger.Prepared
	slots  int
	// steer is the steer program loaded for shellPool, attached nowhere,
	// when Trials are transparent: a Trial made without a shell's (a
	// container's adoption) attaches it rather than loading its own.
	steer *bpf.Steer
}

// beneath resolves a name in the agent's directories through no
// symlink: a data or state directory configured where a Trial can
// write is one it could plant links in.
var beneath = unix.OpenHow{Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS}

func openBeneath(at *os.File, name string, flags int, mode uint32) (*os.File, error) {
	how := beneath
	how.Flags, how.Mode = uint64(flags|unix.O_CLOEXEC|unix.O_NOFOLLOW), uint64(mode)
	fd, err := unix.Openat2(int(at.Fd()), name, &how)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Join(at.Name(), name), Err: err}
	}
	return os.NewFile(uintptr(fd), filepath.Join(at.Name(), name)), nil
}

// prepareFiles makes a Trial's files ahead of it; on error nothing is
// left.
func (a *Agent) prepareFiles(transparent bool) (_ *trialFiles, err error) {
	f := &trialFiles{name: sandbox.NewShellName()}
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	if a.cfg.DataDir != "" {
		if f.data, err = os.Open(a.cfg.DataDir); err != nil {
			return nil, err
		}
		if err := unix.Mkdirat(int(f.data.Fd()), f.name, 0o700); err != nil {
			return nil, &os.PathError{Op: "mkdir", Path: filepath.Join(a.cfg.DataDir, f.name), Err: err}
		}
		if f.dir, err = openBeneath(f.data, f.name, unix.O_RDONLY|unix.O_DIRECTORY, 0); err != nil {
			return nil, err
		}
		if f.log, err = openBeneath(f.dir, decisionsFile, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_APPEND, 0o600); err != nil {
			return nil, err
		}
	}
	if dir := a.cfg.Host.StateDir; dir != "" {
		f.slots = a.proxy.DefaultLimits().MaxTunnels
		if f.ledger, err = ledger.Prepare(dir, f.name, f.slots); err != nil {
			return nil, fmt.Errorf("tunnel ledger: %w", err)
		}
	}
	// Only an adoption uses it (a create's shell has its steering), so
	// only on a host whose containers come for Trials: elsewhere each set
	// would load a program (2.5 ms of CPU) to close it unused.
	if transparent && a.adopts.Load() {
		if f.steer, err = bpf.LoadSteer(shellPool); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// takeSteer is the steer program loaded ahead, the caller's from here
// (nil: none).
func (f *trialFiles) takeSteer() *bpf.Steer {
	if f == nil {
		return nil
	}
	s := f.steer
	f.steer = nil
	return s
}

// decisionsFile is a Trial's decision log in its data directory.
const decisionsFile = "decisions.jsonl"

// takeData makes the prepared data directory Trial id's, and returns its
// decision log; nil if there is none, or it was refused (logged).
func (f *trialFiles) takeData(a *Agent, id string) *os.File {
	if f == nil || f.dir == nil {
		return nil
	}
	log := f.log
	f.log = nil
	if err := unix.Renameat2(int(f.data.Fd()), f.name, int(f.data.Fd()), id, unix.RENAME_NOREPLACE); err != nil {
		_ = log.Close()
		a.log.Error("a prepared Trial data directory was refused; making it afresh", "trial", id, "error",
			&os.LinkError{Op: "rename", Old: filepath.Join(a.cfg.DataDir, f.name), New: filepath.Join(a.cfg.DataDir, id), Err: err})
		return nil
	}
	f.name = id // what close removes if it is refused
	if err := f.untouched(log); err != nil {
		_ = log.Close()
		a.log.Error("a prepared Trial data directory was changed before it was taken; making it afresh", "trial", id, "error", err)
		// What is at the Trial's path is moved aside, as an earlier
		// Trial's is: the new Trial's directory starts empty.
		if err := a.keepOldData(id); err != nil {
			a.log.Error("move a changed prepared data directory aside", "trial", id, "error", err)
		}
		return nil
	}
	// Its times are the Trial's start, as a directory and log made now
	// have (the retention rule reads them of a Trial whose agent died).
	now := []unix.Timespec{{Nsec: unix.UTIME_NOW}, {Nsec: unix.UTIME_NOW}}
	if err := errors.Join(unix.UtimesNanoAt(int(f.dir.Fd()), decisionsFile, now, unix.AT_SYMLINK_NOFOLLOW),
		unix.UtimesNanoAt(int(f.data.Fd()), id, now, unix.AT_SYMLINK_NOFOLLOW)); err != nil {
		a.log.Warn("a prepared Trial data directory's times could not be set to its start", "trial", id, "error", err)
	}
	_ = f.dir.Close()
	f.dir = nil
	return log
}

// untouched refuses a prepared data directory, renamed to f.name, that
// anything but this process changed: the directory at the name is the
// one made, root's alone, and holds only its decision log, the file
// made (one link, root's alone, empty, open here alone: an open
// elsewhere could write records into it later).
func (f *trialFiles) untouched(log *os.File) error {
	var at, dir, inDir, held unix.Stat_t
	if err := unix.Fstatat(int(f.data.Fd()), f.name, &at, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if err := unix.Fstat(int(f.dir.Fd()), &dir); err != nil {
		return err
	}
	euid := uint32(os.Geteuid())
	switch {
	case at.Dev != dir.Dev || at.Ino != dir.Ino:
		return errors.New("its directory is another than the one made")
	case dir.Uid != euid || dir.Mode != unix.S_IFDIR|0o700:
		return fmt.Errorf("its directory has owner %d, mode %o", dir.Uid, dir.Mode)
	}
	names, err := f.dir.Readdirnames(-1)
	if err != nil {
		return err
	}
	if !slices.Equal(names, []string{decisionsFile}) {
		return fmt.Errorf("its directory holds %q", names)
	}
	if err := unix.Fstatat(int(f.dir.Fd()), decisionsFile, &inDir, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if err := unix.Fstat(int(log.Fd()), &held); err != nil {
		return err
	}
	switch {
	case inDir.Dev != held.Dev || inDir.Ino != held.Ino:
		return errors.New("its decision log is another than the one made")
	case held.Nlink != 1 || held.Uid != euid || held.Mode != unix.S_IFREG|0o600 || held.Size != 0:
		return fmt.Errorf("its decision log has %d links, owner %d, mode %o, size %d", held.Nlink, held.Uid, held.Mode, held.Size)
	}
	if err := rootdir.OpenOnlyHere(log); err != nil {
		return fmt.Errorf("its decision log: %w", err)
	}
	return nil
}

// takeLedger makes the prepared ledger Trial id's, for a Trial of slots
// tunnels; nil if there is none, it has other slots, or it was refused
// (logged).
func (f *trialFiles) takeLedger(a *Agent, id string, slots int) *ledger.Ledger {
	if f == nil || f.ledger == nil {
		return nil
	}
	p := f.ledger
	f.ledger = nil
	if slots != f.slots {
		p.Remove()
		return nil
	}
	l, err := p.Take(id)
	if err != nil {
		a.log.Error("a prepared tunnel ledger was refused; making it afresh", "trial", id, "error", err)
		return nil
	}
	return l
}

// close removes what was not taken; a data directory refused at the
// Trial's name is left there, moved aside (takeData).
func (f *trialFiles) close() {
	if f == nil {
		return
	}
	if f.log != nil {
		_ = f.log.Close()
	}
	if f.dir != nil {
		if strings.HasPrefix(f.name, sandbox.ShellPrefix) {
			_ = unix.Unlinkat(int(f.dir.Fd()), decisionsFile, 0)
			_ = unix.Unlinkat(int(f.data.Fd()), f.name, unix.AT_REMOVEDIR)
		}
		_ = f.dir.Close()
	}
	if f.data != nil {
		_ = f.data.Close()
	}
	if f.ledger != nil {
		f.ledger.Remove()
	}
	if f.steer != nil {
		_ = f.steer.Close()
	}
	*f = trialFiles{}
}

// sweepFiles removes the prepared files of agents that are gone (alive
// says), as a crash leaves them.
func (a *Agent) sweepFiles(alive func(pid int) bool) {
	if err := sweepPrepared(a.cfg.DataDir, a.cfg.Host.StateDir, alive, a.log); err != nil {
		a.log.Error("remove a Trial's leftover prepared files", "error", err)
	}
}

// sweepPrepared removes the prepared files (data directories in
// dataDir, ledgers in stateDir; "" for none) of agents that are gone
// (alive says): only names a shell's can be are looked at. It tries
// each, and returns what failed.
func sweepPrepared(dataDir, stateDir string, alive func(pid int) bool, log *slog.Logger) error {
	var errs []error
	sweep := func(dir, suffix string, remove func(name string)) {
		if dir == "" {
			return
		}
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			name, ok := strings.CutSuffix(e.Name(), suffix)
			pid, shell := sandbox.ShellPID(name)
			if !ok || !shell || !e.IsDir() || alive(pid) {
				continue
			}
			log.Warn("removing a Trial's files prepared by a stopped agent", "path", filepath.Join(dir, e.Name()))
			remove(name)
		}
	}
	sweep(dataDir, "", func(name string) { errs = append(errs, os.RemoveAll(filepath.Join(dataDir, name))) })
	sweep(stateDir, ledgersSuffix, func(name string) { ledger.RemoveAll(stateDir, name) })
	return errors.Join(errs...)
}
