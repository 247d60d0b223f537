//go:build linux

package ledger

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/record"
)

// A prepared ledger taken is its Trial's: at its path, its shell's
// directory gone, and read as a lost one once its process is dead.
func TestPreparedLedgerTaken(t *testing.T) {
	dir := t.TempDir()
	p, err := Prepare(dir, "_shell-1-1", 4)
	if err != nil {
		t.Fatal(err)
	}
	l, err := p.Take("pt1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(trialDir(dir, "_shell-1-1")); !os.IsNotExist(err) {
		t.Errorf("the shell's ledger directory is left: %v", err)
	}
	l.Open(&record.Event{Schema: record.EventSchema, ID: "x", Time: time.Now().UTC(), Trial: "pt1", Method: "CONNECT",
		Target: "a.example.com:443", Host: "a.example.com", Port: 443, Decision: record.DecisionAllow})
	asDead(t, dir, "pt1", 1<<22-1)
	if evs, err := Lost(dir, "pt1"); err != nil || len(evs) != 1 {
		t.Fatalf("the taken ledger's tunnel: %v %v", evs, err)
	}
	l.Remove()
}

// A prepared ledger that anything touched before it was taken is
// refused and removed, and a Trial whose ledger directory exists is not
// given one.
func TestPreparedLedgerTouchedIsRefused(t *testing.T) {
	// write changes the byte at off: one written over with its own
	// value (a header byte that happened to be 1) was no change at all.
	write := func(off int64) func(t *testing.T, path string) {
		return func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			b := make([]byte, 1)
			if _, err := f.ReadAt(b, off); err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt([]byte{^b[0]}, off); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, c := range []struct {
		name  string
		touch func(t *testing.T, path string)
		want  string
	}{
		{"its first slot written", write(ledgerHeader + 4), "first slot was written"},
		{"its header written", write(9), "header or first slot"},
		{"a later slot written", write(ledgerHeader + 3*ledgerSlot), "holds data"},
		{"its file replaced", func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "another than the one made"},
		{"a hard link to it", func(t *testing.T, path string) {
			if err := os.Link(path, filepath.Join(t.TempDir(), "l")); err != nil {
				t.Skip("no hard link across the test's directories:", err)
			}
		}, "2 links"},
		{"its mode changed", func(t *testing.T, path string) {
			if err := os.Chmod(path, 0o644); err != nil {
				t.Fatal(err)
			}
		}, "mode 100644"},
		{"its owner changed", func(t *testing.T, path string) {
			if err := os.Chown(path, 65534, 65534); err != nil {
				t.Skip("not root:", err)
			}
		}, "owner 65534"},
		{"it held open elsewhere", func(t *testing.T, path string) {
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = f.Close() })
		}, "open elsewhere"},
		{"it mapped elsewhere", func(t *testing.T, path string) {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			mem, err := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			_ = f.Close() // the mapping keeps it open
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = unix.Munmap(mem) })
		}, "open elsewhere"},
		{"a file beside it", func(t *testing.T, path string) {
			if err := os.WriteFile(filepath.Join(filepath.Dir(path), "1"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "its directory holds"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			p, err := Prepare(dir, "_shell-1-2", 4)
			if err != nil {
				t.Fatal(err)
			}
			c.touch(t, filepath.Join(trialDir(dir, "_shell-1-2"), strconv.Itoa(os.Getpid())))
			if _, err := p.Take("pt2"); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("taken: %v; want a refusal with %q", err, c.want)
			}
			if _, err := os.Stat(ledgerPath(dir, "pt2", os.Getpid())); !os.IsNotExist(err) {
				t.Errorf("the refused ledger is left: %v", err)
			}
			l, err := Create(dir, "pt2", 4)
			if err != nil {
				t.Fatal(err)
			}
			l.Remove()
		})
	}
	t.Run("the Trial's directory exists", func(t *testing.T) {
		dir := t.TempDir()
		p, err := Prepare(dir, "_shell-1-3", 4)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(trialDir(dir, "pt3"), 0o700); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Take("pt3"); err == nil {
			t.Fatal("taken over an existing ledger directory")
		}
		if _, err := os.Stat(trialDir(dir, "_shell-1-3")); !os.IsNotExist(err) {
			t.Errorf("the refused ledger is left: %v", err)
		}
	})
}
