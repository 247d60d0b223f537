//go:build linux

package sandbox

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/trialnet/trialnet/internal/cgroup2"
	"github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

// Transparent mode's part of a Trial (docs/transparent.md): what its
// loopback carries, what its BPF policy adds in strict mode, and what its
// /etc/resolv.conf reads. The agent serves the stub and the pool; these
// are the same addresses as dnsstub's defaults and bpf.StubAddr
// (TestTransparentAddressesAgree).
var (
	// transparentPool is the range the stub hands names addresses from.
	transparentPool = netip.MustParsePrefix("127.100.0.0/16")
	// transparentLo are lo's addresses beyond its 127.0.0.1/8 and ::1:
	// glibc's AI_ADDRCONFIG counts no loopback address as configured, so
	// a lookup of one family fails before it asks anything unless lo
	// has one more of each. The stub's own, and a unique-local IPv6 one
	// that nothing may connect to (connect6 allows only ::1).
	transparentLo = []netip.Prefix{netip.MustParsePrefix("127.0.0.53/32"), netip.MustParsePrefix("fd7a:7472:6e73::53/128")}
)

// loAddrs are the addresses the Trial's lo carries besides its own.
func (t *Launcher) loAddrs() []netip.Prefix {
	if !t.Spec.Transparent {
		return nil
	}
	return transparentLo
}

// pool is the Trial's name pool for its BPF policy; none (invalid)
// outside transparent mode.
func (t *Launcher) pool() netip.Prefix {
	if !t.Spec.Transparent {
		return netip.Prefix{}
	}
	return transparentPool
}

// resolvPath is where resolvers read their configuration.
const resolvPath = "/etc/resolv.conf"

// mountResolvConf makes path read trial.ResolvConf, read-only, in the calling
// process's mount namespace (private: nothing leaks to the host or other
// Trials), whatever the host has there: a file, a symlink (to
// systemd-resolved's stub-resolv.conf, or dangling) or nothing. No host
// file is written. scratch is an empty directory of this namespace, where
// the file's own tmpfs is mounted while it is written; covered says that a
// later mount covers scratch (maskHost's, in setupInit), and the tmpfs is
// then left beneath it.
func mountResolvConf(path, scratch string, covered bool) error {
	const flags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := unix.Mount("tmpfs", scratch, "tmpfs", flags, "mode=0755,size=16k"); err != nil {
		return fmt.Errorf("transparent mode: mount a tmpfs for the Trial's resolv.conf: %w", err)
	}
	// What is mounted from it keeps it: the scratch mount point is free
	// again. Unless a later mount covers it anyway: each umount2 waits
	// out an RCU grace period, on a Trial's first command's path, and
	// beneath the cover the tmpfs is reachable by no path (the Trial can
	// no more take a mount it was given off than the hidden host's).
	if !covered {
		defer unix.Unmount(scratch, unix.MNT_DETACH)
	}
	top := filepath.Join(scratch, "top")
	if err := os.Mkdir(top, 0o755); err != nil {
		return fmt.Errorf("transparent mode: %w", err)
	}
	src := filepath.Join(top, filepath.Base(path))
	if err := os.WriteFile(src, []byte(trial.ResolvConf), 0o644); err != nil {
		return fmt.Errorf("transparent mode: write the Trial's resolv.conf: %w", err)
	}
	fd, err := unix.Open(path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return overlayResolvConf(filepath.Dir(path), top)
	}
	if err != nil {
		return fmt.Errorf("transparent mode: open %s: %w", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("transparent mode: %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return fmt.Errorf("transparent mode: %s is a directory on this host, which a resolv.conf cannot cover: make it a file, or turn transparent mode off (--no-transparent)", path)
	}
	// On path itself, through the descriptor, never where a symlink there
	// leads: a dangling one leads nowhere, and the file it names
	// (systemd-resolved's) stays the host's.
	if err := unix.Mount(src, fmt.Sprintf("/proc/self/fd/%d", fd), "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("transparent mode: bind the Trial's resolv.conf over %s: %w", path, err)
	}
	if err := unix.Mount("", path, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|flags, ""); err != nil {
		return fmt.Errorf("transparent mode: make the Trial's %s read-only: %w", path, err)
	}
	return nil
}

// overlayResolvConf gives dir, which has no resolv.conf, one from top
// without writing the host's dir: a read-only overlay of top over it (a
// bind mount needs a file to cover). The Trial's dir is then read-only,
// and mounts below it would be hidden, so a host with any is refused.
func overlayResolvConf(dir, top string) error {
	if sub := mountsBelow(dir); sub != "" {
		return fmt.Errorf("transparent mode: this host has no %s/resolv.conf, and giving a Trial one would hide the mount at %s: create the file on the host (any content: the Trial sees its own), or turn transparent mode off (--no-transparent)", dir, sub)
	}
	// Two lower layers and no upper: read-only, and nothing is copied up.
	opts := "lowerdir=" + top + ":" + dir
	if err := unix.Mount("overlay", dir, "overlay", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("transparent mode: this host has no %s/resolv.conf, and an overlay to give the Trial one failed: %w; create the file on the host (any content: the Trial sees its own), or turn transparent mode off (--no-transparent)", dir, err)
	}
	return nil
}

// mountsBelow is a mount point strictly below dir, or "".
func mountsBelow(dir string) string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "/proc/self/mountinfo unreadable"
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		if p := cgroup2.UnescapeMountPath(fields[4]); p != dir && under(p, dir) {
			return p
		}
	}
	return ""
}
