//go:build linux

package sandbox

import (
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// mountCoveredCases: a mount table, a mount id in it, and what
// mountCovered (and the init's trialnet_mount_covered) says of it. Mount
// 3 is a host user's FUSE mount on /home/u/a/fuse, on /home's mount 2.
var mountCoveredCases = []struct {
	name, table   string
	id            uint64
	point         string
	listed, cover bool
}{
	{"on top", "", 3, "/home/u/a/fuse", true, false},
	{"stacked on it", "4 3 0:41 / /home/u/a/fuse rw - tmpfs t rw\n", 3, "/home/u/a/fuse", true, true},
	{"stacked twice", "4 3 0:41 / /home/u/a/fuse rw - tmpfs t rw\n5 4 0:42 / /home/u/a/fuse rw - tmpfs t rw\n", 4, "/home/u/a/fuse", true, true},
	{"over a directory above", "5 2 0:42 / /home/u/a rw - tmpfs t rw\n", 3, "/home/u/a/fuse", true, true},
	{"over the parent mount", "5 2 0:42 / /home rw - tmpfs t rw\n", 3, "/home/u/a/fuse", true, true},
	{"over the root", "6 1 0:43 / / rw - tmpfs t rw\n", 3, "/home/u/a/fuse", true, true},
	{"a sibling", "7 2 0:44 / /home/u/b rw - tmpfs t rw\n", 3, "/home/u/a/fuse", true, false},
	{"a name it begins", "7 2 0:44 / /home/u/a/fu rw - tmpfs t rw\n", 3, "/home/u/a/fuse", true, false},
	{"beneath it", "8 3 0:45 / /home/u/a/fuse/x rw - tmpfs t rw\n", 3, "/home/u/a/fuse", true, false},
	// Mount 11 is beneath the root mount 12 stacked over 1, on which
	// /home is: it hides nothing of 3's.
	{"beneath a mount below", "12 1 0:46 / / rw - tmpfs t rw\n11 1 0:47 / /home/u rw - tmpfs t rw\n13 12 0:48 / /home/u/a/fuse rw - fuse.x x rw\n", 13, "/home/u/a/fuse", true, false},
	{"escaped", "20 2 0:49 / /home/u/my\\040dir/fuse rw - fuse.x x rw\n21 2 0:50 / /home/u/my\\040dir rw - tmpfs t rw\n", 20, "/home/u/my\\040dir/fuse", true, true},
	{"not listed", "", 99, "", false, false},
}

const mountCoveredBase = "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n2 1 8:2 / /home rw - ext4 /dev/sda2 rw\n3 2 0:40 / /home/u/a/fuse rw,nosuid - fuse.sshfs u@h: rw\n"

// TestMountCovered holds mountCovered to the cases, and the init's
// trialnet_mount_covered to it (where cgo builds it in).
func TestMountCovered(t *testing.T) {
	for _, c := range mountCoveredCases {
		table := mountCoveredBase + c.table
		impls := map[string]func(string, uint64) (string, bool, bool){"mountCovered": mountCovered}
		if earlyMountCoveredC != nil {
			impls["trialnet_mount_covered"] = earlyMountCoveredC
		}
		for name, f := range impls {
			point, listed, cover := f(table, c.id)
			if point != c.point || listed != c.listed || cover != c.cover {
				t.Errorf("%s: %s(%d) = %q, listed %v, covered %v; want %q, %v, %v", c.name, name, c.id, point, listed, cover, c.point, c.listed, c.cover)
			}
		}
	}
}

// A mount whose listed point no longer leads to it (a directory above it
// renamed since the table was read) is looked for where the table lists
// it now: here the root, listed at a path that leads nowhere.
func TestMountOnTopFollowsAMove(t *testing.T) {
	root, err := mountIDAt(unix.AT_FDCWD, "/", 0)
	if err != nil {
		t.Fatal(err)
	}
	mnt, top, err := mountOnTop(threadMountTable(t), root, "/trialnet-moved/away", unix.AT_SYMLINK_NOFOLLOW, "a test")
	if mnt != "/" || !top || err != nil {
		t.Fatalf("mountOnTop(the root, listed elsewhere) = %q, %v, %v; want /, on top", mnt, top, err)
	}
}

// One that is never where the table lists it, nor covered there (a host
// process renames a directory above it each time the init looks),
// refuses the Trial instead of staying in its view.
func TestMountOnTopRefusesAMountThatKeepsMoving(t *testing.T) {
	root, err := mountIDAt(unix.AT_FDCWD, "/", 0)
	if err != nil {
		t.Fatal(err)
	}
	looks := 0
	topMountID = func(int, string, int) (uint64, error) { looks++; return 0, nil }
	t.Cleanup(func() { topMountID = mountIDAt })
	_, top, err := mountOnTop(threadMountTable(t), root, "/", unix.AT_SYMLINK_NOFOLLOW, "a test")
	if top || !errors.Is(err, unix.EAGAIN) || !strings.Contains(err.Error(), "renamed") || looks != movedMax {
		t.Fatalf("mountOnTop(a mount never found) = %v, %v after %d looks; want EAGAIN after %d", top, err, looks, movedMax)
	}
}

// threadMountTable is this thread's mount table, as a walk reads it.
func threadMountTable(t *testing.T) []byte {
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	return b
}
