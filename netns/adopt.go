//go:build linux

package netns

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// ErrNotBare is wrapped by Adopt when the namespace has an interface
// besides lo or a socket: a way out that no Trial's namespace has.
var ErrNotBare = errors.New("its network namespace is not a fresh one")

// Adopt makes the network namespace nsFile refers to (a container's,
// made by its runtime; process pid is in it) a Trial's: bind-mounted at
// dir/id like one Create makes, lo up with loAddrs added. It refuses one
// with any interface but lo, or with any socket in it (ErrNotBare).
// Delete later drops the mount, trialnet's one hold on it; the namespace
// lives on while the container does. On error nothing is left behind.
func Adopt(dir, id string, nsFile *os.File, pid int, loAddrs ...netip.Prefix) (_ *Namespace, err error) {
	if err := checkName(id); err != nil {
		return nil, err
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(nsFile.Fd()), &st); err != nil || st.Type != unix.NSFS_MAGIC {
		return nil, fmt.Errorf("adopt a network namespace: %s is not a namespace file (%v)", nsFile.Name(), err)
	}
	h, err := netlink.NewHandleAt(netns.NsHandle(int(nsFile.Fd())), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink in the namespace to adopt: %w", err)
	}
	defer h.Close()
	if err := bare(h); err != nil {
		return nil, err
	}
	if err := sameNamespace(nsFile, pid); err != nil {
		return nil, err
	}
	if err := noSockets(fmt.Sprintf("/proc/%d/net", pid)); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create netns directory %s: %w", dir, err)
	}
	path := filepath.Join(dir, id)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("netns %s: %w (a Trial with this id is live, or a crashed one left it; 'trialnet destroy %s' removes it)", path, errExists, id)
		}
		return nil, fmt.Errorf("create netns mount point: %w", err)
	}
	_ = f.Close()
	defer func() {
		if err != nil {
			_ = Delete(dir, id)
		}
	}()
	src := fmt.Sprintf("/proc/self/fd/%d", nsFile.Fd())
	if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
		return nil, fmt.Errorf("bind-mount the adopted netns at %s: %w", path, err)
	}
	if err := loUpWith(h, loAddrs); err != nil {
		return nil, err
	}
	return Open(dir, id)
}

// bare refuses a namespace with a link other than the loopback.
func bare(h *netlink.Handle) error {
	links, err := h.LinkList()
	for range 3 {
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
		links, err = h.LinkList()
	}
	if err != nil {
		return fmt.Errorf("list the interfaces of the namespace to adopt: %w", err)
	}
	var other []string
	for _, l := range links {
		if a := l.Attrs(); a.Name != "lo" || l.Type() != "device" {
			other = append(other, fmt.Sprintf("%s (%s)", a.Name, l.Type()))
		}
	}
	if len(other) > 0 {
		slices.Sort(other)
		return fmt.Errorf("%w: it has interfaces besides lo: %s", ErrNotBare, strings.Join(other, ", "))
	}
	return nil
}

// socketTables are the /proc/net tables that list a namespace's sockets
// of each family a Trial's processes could reach another process by.
var socketTables = []string{"tcp", "tcp6", "udp", "udp6", "raw", "raw6", "unix", "packet"}

// noSockets refuses a namespace in which any socket exists: at a
// container's createRuntime stage nothing of it has run, so a socket
// there is another process's, one outside the container that would serve
// it on its loopback (a relay that no Trial hook sees). procNet is a
// /proc/PID/net of a process in the namespace: its tables are the
// namespace's, read without entering it.
func noSockets(procNet string) error {
	if _, err := os.Stat(procNet); err != nil {
		return fmt.Errorf("read its sockets: %w", err)
	}
	// The TCP tables cost a walk of the host's whole established hash
	// (every namespace's buckets, empty ones included: milliseconds) per
	// read; the namespace's own counters in sockstat say for nothing
	// whether they would list a row.
	skipTCP, err := noTCP(procNet)
	if err != nil {
		return err
	}
	var found []string
	for _, tab := range socketTables {
		if skipTCP && (tab == "tcp" || tab == "tcp6") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procNet, tab))
		if errors.Is(err, os.ErrNotExist) {
			continue // a family this kernel lacks (IPv6)
		}
		if err != nil {
			return fmt.Errorf("read its %s sockets: %w", tab, err)
		}
		if n := strings.Count(string(b), "\n") - 1; n > 0 {
			found = append(found, fmt.Sprintf("%d %s", n, tab))
		}
	}
	if len(found) > 0 {
		return fmt.Errorf("%w: it already has sockets (%s), which only another process can have made", ErrNotBare, strings.Join(found, ", "))
	}
	return nil
}

// noTCP reports whether the namespace's sockstat counters say its TCP
// tables are empty. A row of /proc/net/tcp or tcp6 is a hashed socket
// (a listener, or a connection: "inuse" of TCP or TCP6, counted per
// namespace as it is hashed), a request socket (its listener is
// counted) or a time-wait one ("tw", per namespace). Any of them, or a
// line that does not read, and the tables themselves decide.
func noTCP(procNet string) (bool, error) {
	want := map[string][]string{"sockstat": {"TCP:", "inuse", "tw"}, "sockstat6": {"TCP6:", "inuse"}}
	for file, keys := range want {
		b, err := os.ReadFile(filepath.Join(procNet, file))
		if errors.Is(err, os.ErrNotExist) && file == "sockstat6" {
			continue // no IPv6: no tcp6 table either
		}
		if err != nil {
			return false, fmt.Errorf("read its socket counters: %w", err)
		}
		if !zeroCounters(string(b), keys[0], keys[1:]) {
			return false, nil
		}
	}
	return true, nil
}

// zeroCounters: sockstat's line for proto ("TCP: inuse 0 orphan 0 tw 0
// ...") is there and gives 0 for every one of names.
func zeroCounters(sockstat, proto string, names []string) bool {
	for line := range strings.Lines(sockstat) {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != proto {
			continue
		}
		for _, name := range names {
			i := slices.Index(f, name)
			if i < 0 || i+1 >= len(f) || f[i+1] != "0" {
				return false
			}
		}
		return true
	}
	return false
}

// sameNamespace checks that process pid is in the namespace nsFile
// refers to, so that its /proc/PID/net tables are that namespace's.
func sameNamespace(nsFile *os.File, pid int) error {
	var a, b unix.Stat_t
	if err := unix.Fstat(int(nsFile.Fd()), &a); err != nil {
		return fmt.Errorf("the namespace to adopt: %w", err)
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &b); err != nil {
		return fmt.Errorf("the namespace of process %d: %w", pid, err)
	}
	if a.Dev != b.Dev || a.Ino != b.Ino {
		return fmt.Errorf("process %d is not in the namespace to adopt", pid)
	}
	return nil
}
