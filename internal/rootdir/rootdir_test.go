//go:build linux

package rootdir

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/internal/privtest"
)

// A lock directory someone else made, or could write into, is refused;
// so is a lock file that is a symlink. Root-owned directories need root.
func TestPrivilegedRefusesPlantedDirsAndFiles(t *testing.T) {
	privtest.Require(t)
	base := t.TempDir()
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}

	good := filepath.Join(base, "good")
	f, err := OpenLock(good, "x.lock")
	if err != nil {
		t.Fatalf("a fresh directory: %v", err)
	}
	_ = f.Close()

	foreign := filepath.Join(base, "foreign")
	if err := os.Mkdir(foreign, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(foreign, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o1777); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	for name, dir := range map[string]string{"owned by nobody": foreign, "world-writable": open, "a symlink": link} {
		if err := Private(dir); err == nil || !strings.Contains(err.Error(), "must be a directory of root's") {
			t.Errorf("%s: %v, want a refusal", name, err)
		}
	}

	if err := os.Symlink("/etc/hostname", filepath.Join(good, "planted.lock")); err != nil {
		t.Fatal(err)
	}
	if f, err := OpenLock(good, "planted.lock"); err == nil {
		_ = f.Close()
		t.Fatal("a lock file that is a symlink was opened")
	}
}
