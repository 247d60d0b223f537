//go:build linux

package rootdir

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TrustedPath lets a path's directories and links be owner's as well as
// root's (the upstream proxy's credentials of an agent run as a user),
// and no one else's; a refusal names who may own them and says what to
// do in words that read right for root alone and for root and owner.
func TestTrustedPathOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the checks need directories and links owned by root and by another user: run as root")
	}
	const user = 65534
	dir := t.TempDir()
	owned := filepath.Join(dir, "owned")
	if err := os.Mkdir(owned, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(owned, user, user); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(owned, "cred"), []byte("u:p"), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(owned, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, user, user); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(owned, "cred"), filepath.Join(link, "cred")} {
		real, err := TrustedPath(p, user)
		if err != nil || real != filepath.Join(owned, "cred") {
			t.Errorf("TrustedPath(%s, %d) = %q, %v; want %s/cred, its directories and link the owner's", p, user, real, err, owned)
		}
	}
	for _, c := range []struct {
		path  string
		owner uint32
		want  string
	}{
		{filepath.Join(owned, "cred"), 0, "owned by uid 65534, not root: "},
		{filepath.Join(owned, "cred"), 1000, "owned by uid 65534, not root or uid 1000: "},
		{filepath.Join(link, "cred"), 0, "a link owned by uid 65534, not root: whoever owns it can point it elsewhere (replace it with one root owns)"},
		{filepath.Join(link, "cred"), 1000, "(replace it with one root or uid 1000 owns)"},
	} {
		if _, err := TrustedPath(c.path, c.owner); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("TrustedPath(%s, %d): %v; want it refused, saying %q", c.path, c.owner, err, c.want)
		}
	}
}

// A loop of links ends the walk with an error that names where and what
// to do, not a bare count.
func TestTrustedPathLinkLoop(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the walk trusts only root's directories and links: run as root")
	}
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	if err := os.Symlink(b, a); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(a, b); err != nil {
		t.Fatal(err)
	}
	_, err := TrustedPath(filepath.Join(a, "cred"), 0)
	if err == nil || !strings.Contains(err.Error(), "a loop of links?): name the file by a path with fewer links") {
		t.Errorf("TrustedPath through a loop of links: %v; want it refused, saying what to do", err)
	}
}
