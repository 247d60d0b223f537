//go:build linux

package ocicmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The binary install writes into the runtime's configuration runs as
// root for every container: one that another user could change, or
// replace through a directory above it, is refused.
func TestInstallRefusesABinaryOthersCanChange(t *testing.T) {
	mk := func(dirMode, fileMode os.FileMode) string {
		dir := filepath.Join(t.TempDir(), "bin")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		bin := filepath.Join(dir, Name)
		if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		// Chmod: the umask does not narrow what the case asks for.
		if err := os.Chmod(bin, fileMode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, dirMode); err != nil {
			t.Fatal(err)
		}
		return bin
	}
	if err := ownedHere(mk(0o755, 0o755)); err != nil {
		t.Errorf("a binary only its owner writes: %v", err)
	}
	if err := ownedHere(mk(os.ModeSticky|0o777, 0o755)); err != nil {
		t.Errorf("a binary in a sticky directory: %v", err)
	}
	for _, tc := range []struct {
		name              string
		dirMode, fileMode os.FileMode
		owner             int
	}{
		{"a world-writable binary", 0o755, 0o757, -1},
		{"a group-writable binary", 0o755, 0o775, -1},
		{"in a world-writable directory", 0o777, 0o755, -1},
		{"owned by another user", 0o755, 0o755, 65534},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := mk(tc.dirMode, tc.fileMode)
			if tc.owner >= 0 {
				if os.Geteuid() != 0 {
					t.Skip("chown needs root")
				}
				if err := os.Chown(bin, tc.owner, tc.owner); err != nil {
					t.Fatal(err)
				}
			}
			err := ownedHere(bin)
			if err == nil || !strings.Contains(err.Error(), "could be changed by others") {
				t.Fatalf("got %v, want refused", err)
			}
		})
	}
}
