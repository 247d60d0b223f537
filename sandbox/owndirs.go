//go:build linux

package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/internal/rootdir"
)

// A Trial's own directories: /tmp, /var/tmp and /dev/shm are fresh tmpfs
// of its mount namespace, emptied with it, that no host process and no
// other Trial sees. They are where a confined Trial makes its unix sockets
// (Landlock allows nowhere else), so its own servers (tmux, ssh-agent,
// Python's forkserver, a test database) work while no host client looking
// at a shared path (/tmp/.s.PGSQL.5432) finds one of them.
//
// The cgroup unix hooks see a path, not what it resolves to, and a Trial
// may put a symlink to a host socket in its own /tmp. So a path beneath
// an own directory is reached through a view: the same tmpfs bound again
// under rootdir.Run with nosymfollow, where a symlink ends the lookup
// (ELOOP). The hooks rewrite the path to its view and refuse "..". This
// table and own_dirs in trialnet.bpf.c are the same list
// (TestOwnDirsMatchTheC reads the C and holds it to this).
var ownDirs = []struct {
	dir  string
	view string // beneath rootdir.Run
	size int    // bytes of the host's memory it may hold
}{
	{"/tmp", "t", TmpBytes},
	{"/var/tmp", "v", TmpBytes},
	{"/dev/shm", "d", ShmBytes},
}

// TmpBytes bounds each of the Trial's /tmp and /var/tmp: what a tmpfs
// holds is the host's memory (charged to the Trial's memory bound where
// there is one), and builds in /tmp can want a gigabyte.
const TmpBytes = 1 << 30

// OwnDirOf is the directory a Trial has its own of (/tmp, /var/tmp,
// /dev/shm) that path is beneath, or "".
func OwnDirOf(path string) string {
	for _, d := range ownDirs {
		if under(filepath.Clean(path), d.dir) {
			return d.dir
		}
	}
	return ""
}

// mountOwnDirs covers each own directory the host has with a fresh tmpfs.
// Where one is a symlink on the host (/dev/shm to /run/shm, /var/tmp to
// /tmp), the tmpfs goes where it leads, in the Trial's mount namespace
// only: Landlock's rules and the views follow the same link, so they
// must find the Trial's tmpfs there, never a host directory. An allowed
// socket of the host beneath one (keep: clean, sorted, each once) is
// bound at its path in the new tmpfs, so that the Trial still reaches it
// there.
func mountOwnDirs(keep []string) error {
	// Every allowed socket is opened before the first tmpfs hides any of
	// them (with /var/tmp leading to /tmp, covering /tmp hides both).
	socks := map[string][]*os.File{}
	defer func() {
		for _, fs := range socks {
			closeAll(fs)
		}
	}()
	for _, p := range keep {
		d := OwnDirOf(p)
		if d == "" {
			continue
		}
		f, err := os.OpenFile(p, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open allowed unix socket %s to keep it in the Trial's own %s: %w", p, d, err)
		}
		socks[d] = append(socks[d], f)
	}
	mounted := map[string]uint64{} // where a tmpfs went: its mount id
	for _, d := range ownDirs {
		real, err := filepath.EvalSymlinks(d.dir)
		if err != nil {
			continue // none on this host: its paths lead nowhere
		}
		id, ok := mounted[real]
		if !ok {
			if err := unix.Mount("tmpfs", real, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777,size="+strconv.Itoa(d.size)); err != nil {
				return fmt.Errorf("mount the Trial's own %s: %w", d.dir, err)
			}
			if id, err = mountID(real); err != nil {
				return fmt.Errorf("mount the Trial's own %s: %w", d.dir, err)
			}
			mounted[real] = id
		}
		// Followed as Landlock and the views follow it, the directory is
		// the tmpfs just mounted.
		if got, err := mountID(d.dir); err != nil || got != id {
			return fmt.Errorf("the Trial's own %s is not the tmpfs mounted for it at %s (mount %d, want %d): %v", d.dir, real, got, id, err)
		}
		if err := bindSockets(socks[d.dir]); err != nil {
			return fmt.Errorf("mount the Trial's own %s: %w", d.dir, err)
		}
	}
	return nil
}

// sharedDirs are the host's directories, besides those a Trial has its
// own of, where every user may make files by convention: lock files
// (/run/lock, and /var/lock where it is no link to it) and crash reports
// (/var/crash, whose reports Ubuntu's whoopsie uploads). A file a Trial
// left there outlived it, for any other Trial, of any uid, to read: a way
// out through a Trial with a wider allowlist, or a host program that acts
// on the file. Each is covered with an empty tmpfs of the host
// directory's mode and owner, in the Trial's mount namespace only
// (coverSharedDirs). This table and init_early.c's
// trialnet_init_shared_dirs are the same list (TestEarlyInitTables).
var sharedDirs = []string{"/run/lock", "/var/lock", "/var/crash"}

// SharedBytes bounds each covered shared directory: Debian's /run/lock
// is as large. What a tmpfs holds is the host's memory.
const SharedBytes = 5 << 20

// coverSharedDirs covers each of sharedDirs the host has, where it leads,
// with an empty tmpfs of its mode and owner.
func coverSharedDirs() error {
	covered := map[string]bool{}
	for _, d := range sharedDirs {
		real, err := filepath.EvalSymlinks(d)
		if err != nil || covered[real] {
			continue // none on this host, or one link to another
		}
		var st unix.Stat_t
		if err := unix.Stat(real, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		data := fmt.Sprintf("mode=%o,uid=%d,gid=%d,size=%d", st.Mode&0o7777, st.Uid, st.Gid, SharedBytes)
		if err := unix.Mount("tmpfs", real, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, data); err != nil {
			return fmt.Errorf("cover the host's %s with the Trial's own (so that no file outlives the Trial there): %w", d, err)
		}
		covered[real] = true
	}
	return nil
}

// mountID is the id of the mount path (followed) is on.
func mountID(path string) (uint64, error) {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, 0, unix.STATX_MNT_ID, &st); err != nil {
		return 0, err
	}
	if st.Mask&unix.STATX_MNT_ID == 0 {
		return 0, fmt.Errorf("statx %s: no mount id (Linux 5.8+)", path)
	}
	return st.Mnt_id, nil
}

// bindSockets binds each opened socket at its own path, making the
// directories on the way (root's, 0755; a uid-0 command owns them too).
// A path already bound to the same socket (two spellings of one path
// through a symlinked own directory) is left as it is.
func bindSockets(socks []*os.File) error {
	for _, f := range socks {
		p := filepath.Clean(f.Name())
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		mp, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if errors.Is(err, os.ErrExist) && sameFile(p, f) {
			continue
		}
		if err != nil {
			return err
		}
		_ = mp.Close()
		if err := unix.Mount("/proc/self/fd/"+strconv.Itoa(int(f.Fd())), p, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind allowed unix socket %s: %w", p, err)
		}
	}
	return nil
}

// sameFile says whether path leads to the file f holds.
func sameFile(path string, f *os.File) bool {
	a, err1 := os.Stat(path)
	b, err2 := f.Stat()
	return err1 == nil && err2 == nil && os.SameFile(a, b)
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}

// mountViews binds, beneath dir (the Trial's read-only tmpfs over
// rootdir.Run, still writable here), each own directory again without
// symlinks, setuid, devices or exec: the hooks' way to its sockets.
func mountViews(dir string) error {
	for _, d := range ownDirs {
		v := filepath.Join(dir, d.view)
		if err := os.Mkdir(v, 0o755); err != nil {
			return fmt.Errorf("make the view of %s: %w", d.dir, err)
		}
		if _, err := os.Stat(d.dir); err != nil {
			continue // none on this host: its paths lead nowhere
		}
		// Recursive: an allowed socket bound into the tmpfs is reached
		// through the view too, by any spelling of its path.
		if err := unix.Mount(d.dir, v, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind the view of %s: %w", d.dir, err)
		}
		if err := unix.Mount("", v, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_NOSYMFOLLOW|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("make the view of %s follow no symlinks: %w", d.dir, err)
		}
	}
	return nil
}

// ensureRunDir makes trialnet's runtime directory if the host lacks it:
// every Trial covers it, and keeps its views there.
func ensureRunDir() error {
	if err := os.MkdirAll(rootdir.Run, 0o755); err != nil {
		return fmt.Errorf("make %s, where the Trial's own directories are viewed: %w", rootdir.Run, err)
	}
	return nil
}
