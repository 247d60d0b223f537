// Package rootdirtest builds, for tests of internal/rootdir's callers, the
// directories and links whose owners and modes TrustedPath judges.
package rootdirtest

import (
	"os"
	"path/filepath"
	"testing"
)

// Parents are directories each holding one file of the test's, and links
// to Safe: Safe is root's (0700), Open everyone's to write (0777), Owned
// uid 65534's, Sticky a sticky 0777 one as /tmp and UnderSticky root's
// (0700) inside it; RootLink and UserLink are links to Safe owned by
// root and by uid 65534. Planted, in Sticky, is a hard link to another
// file of root's (0600, holding PlantedContent), as a user may make one
// where fs.protected_hardlinks=0.
type Parents struct {
	Safe, Open, Owned, Sticky, UnderSticky, RootLink, UserLink, Planted string
}

// PlantedContent is what Planted holds: a line a gateway secret or the
// upstream proxy's credentials could be read as.
const PlantedContent = "other:root-file"

// Make makes Parents under a temporary directory, each directory holding
// file with content; ownedMode is Owned's mode. It needs root (chown).
func Make(t *testing.T, file, content string, ownedMode os.FileMode) Parents {
	t.Helper()
	dir := t.TempDir()
	mkdir := func(name string, mode os.FileMode, uid int) string {
		p := filepath.Join(dir, name)
		if err := os.Mkdir(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, 0); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, file), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	p := Parents{
		Safe:   mkdir("safe", 0o700, 0),
		Open:   mkdir("open", 0o777, 0),
		Owned:  mkdir("owned", ownedMode, 65534),
		Sticky: mkdir("sticky", 0o777|os.ModeSticky, 0),
	}
	link := func(name string, uid int) string {
		l := filepath.Join(dir, name)
		if err := os.Symlink(p.Safe, l); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(l, uid, 0); err != nil {
			t.Fatal(err)
		}
		return l
	}
	p.RootLink, p.UserLink = link("root-link", 0), link("user-link", 65534)
	p.UnderSticky = mkdir(filepath.Join("sticky", "inner"), 0o700, 0)
	other := filepath.Join(p.Safe, "other")
	if err := os.WriteFile(other, []byte(PlantedContent), 0o600); err != nil {
		t.Fatal(err)
	}
	p.Planted = filepath.Join(p.Sticky, "planted")
	if err := os.Link(other, p.Planted); err != nil {
		t.Fatal(err)
	}
	return p
}
