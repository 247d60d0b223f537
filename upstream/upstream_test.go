package upstream

import (
	"bufio"
	"context"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/internal/rootdirtest"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
		err  string
	}{
		{"empty is off", Config{}, ""},
		{"name and port", Config{Address: "proxy.corp.example:3128"}, ""},
		{"no port", Config{Address: "proxy.corp.example"}, "want host:port"},
		{"bad port", Config{Address: "proxy.corp.example:99999"}, "port"},
		{"direct without address", Config{Direct: []string{"a.example"}}, "want host:port"},
		{"bad resolve", Config{Address: "p.example:3128", Resolve: "both"}, "resolve"},
		{"bad direct", Config{Address: "p.example:3128", Direct: []string{"*"}}, "direct"},
		{"single label direct", Config{Address: "p.example:3128", Direct: []string{"localhost"}}, "direct"},
		{"relative credentials", Config{Address: "p.example:3128", CredentialsFile: "cred"}, "absolute"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := Parse(c.cfg)
			if c.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				if (p == nil) != (c.cfg.Address == "") {
					t.Fatalf("Parse(%+v) = %v", c.cfg, p)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("Parse(%+v) = %v, want an error with %q", c.cfg, err, c.err)
			}
		})
	}
}

func TestDirect(t *testing.T) {
	p, err := Parse(Config{Address: "p.example:3128", Direct: []string{"Registry.Corp.Example.", "*.git.corp.example", "10.0.0.0/8", "fd00::/8"}})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		"registry.corp.example": true, "x.registry.corp.example": false, "corp.example": false,
		"a.git.corp.example": true, "a.b.git.corp.example": true, "git.corp.example": false, "evilgit.corp.example": false,
	} {
		if got := p.DirectName(name); got != want {
			t.Errorf("DirectName(%q) = %v, want %v", name, got, want)
		}
	}
	for a, want := range map[string]bool{"10.1.2.3": true, "::ffff:10.1.2.3": true, "11.0.0.1": false, "fd12::1": true, "fe80::1": false} {
		if got := p.DirectAddr(netip.MustParseAddr(a)); got != want {
			t.Errorf("DirectAddr(%s) = %v, want %v", a, got, want)
		}
	}
}

// The credentials file is the agent's alone: group or other bits, a
// link, or another owner refuse it, and no error shows its content.
func TestCredentialsFile(t *testing.T) {
	dir := t.TempDir()
	secret := "hunter2-do-not-print"
	write := func(name string, mode os.FileMode, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", 0o600, "user:"+secret+"\n")
	link := filepath.Join(dir, "link")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, path, err string
	}{
		{"root-only", good, ""},
		{"read-only owner", write("ro", 0o400, "user:"+secret), ""},
		{"group readable", write("g", 0o640, "user:"+secret), "chmod 600"},
		{"world readable", write("o", 0o604, "user:"+secret), "chmod 600"},
		{"a symlink", link, "symbolic link"},
		{"no colon", write("nocolon", 0o600, secret), "user:password"},
		{"two lines", write("two", 0o600, "user:"+secret+"\nmore\n"), "user:password"},
		{"missing", filepath.Join(dir, "none"), "no such file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := Load(Config{Address: "p.example:3128", CredentialsFile: c.path})
			if c.err == "" {
				if err != nil || p.auth == "" {
					t.Fatalf("Load: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Fatalf("Load = %v, want an error with %q", err, c.err)
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("the error shows the secret: %v", err)
			}
		})
	}
	if os.Geteuid() == 0 {
		other := write("other", 0o600, "user:"+secret)
		if err := os.Chown(other, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if _, err := Load(Config{Address: "p.example:3128", CredentialsFile: other}); err == nil || !strings.Contains(err.Error(), "chown") {
			t.Fatalf("a file owned by another user: %v", err)
		}
	}
}

// A credentials file under a directory another user owns or can write,
// or reached through that user's link, is refused: that user could swap
// in a link to another one-line file of root's with a colon in it (a
// git credential, another proxy's password), and the agent would send
// its content to the upstream proxy. The agent's own directories, a
// sticky one on the way, and root's links are fine; a sticky one as the
// file's own is not: a user may take the file's name while it is absent
// with a hard link to such a file (made here by root, as a user may where
// fs.protected_hardlinks=0).
func TestCredentialsFileRefusesAParentOthersCanChange(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the checks need directories owned by root and by others: run as root")
	}
	p := rootdirtest.Make(t, "cred", "user:pw", 0o755)
	for _, ok := range []string{p.Safe, p.UnderSticky, p.RootLink} {
		if _, err := Load(Config{Address: "p.example:3128", CredentialsFile: filepath.Join(ok, "cred")}); err != nil {
			t.Errorf("%s/cred: %v", ok, err)
		}
	}
	for _, c := range []struct{ path, want string }{
		{filepath.Join(p.Open, "cred"), "writable by others"},
		{filepath.Join(p.Owned, "cred"), "owned by uid 65534"},
		{filepath.Join(p.UserLink, "cred"), "owned by uid 65534"},
		{filepath.Join(p.Sticky, "cred"), "(mode 1777) lets others add names, sticky or not"},
		{p.Planted, "(mode 1777) lets others add names, sticky or not"},
	} {
		_, err := Load(Config{Address: "p.example:3128", CredentialsFile: c.path})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error with %q", c.path, err, c.want)
		}
	}
}

func TestStatusOf(t *testing.T) {
	for head, want := range map[string]int{
		"HTTP/1.1 200 Connection established\r\n\r\n": 200,
		"HTTP/1.0 407 Auth\r\n\r\n":                   407,
		"SSH-2.0-OpenSSH\r\n\r\n":                     0,
		"HTTP/1.1 20 x\r\n\r\n":                       0,
	} {
		code, _, err := statusOf([]byte(head), func(s string) string { return s })
		if code != want || (want == 0) != (err != nil) {
			t.Errorf("statusOf(%q) = %d, %v", head, code, err)
		}
	}
}

// TestRefusalNeverShowsTheCredentials: an upstream proxy that repeats the
// Proxy-Authorization it was sent (its value, or the user:password it
// decodes to) in a refusal's status line, or in an answer that is no
// status line at all, does not put the credentials in the error a Trial
// and the record read.
func TestRefusalNeverShowsTheCredentials(t *testing.T) {
	dir := t.TempDir()
	cred := filepath.Join(dir, "cred")
	const pass = "hunter2-do-not-print"
	if err := os.WriteFile(cred, []byte("corpuser:"+pass+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, answer := range []func(auth, plain string) string{
		func(auth, _ string) string { return "HTTP/1.1 407 you sent " + auth + "\r\n\r\n" },
		func(_, plain string) string { return "HTTP/1.1 403 user " + plain + " is not allowed\r\n\r\n" },
		func(auth, _ string) string { return "NOPE " + strings.TrimPrefix(auth, "Basic ") + "\r\n\r\n" },
		func(_, plain string) string { return "HTTP/1.1 407 " + strings.Repeat("x", 50) + plain + "\r\n\r\n" }, // cut inside it
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			req, err := http.ReadRequest(bufio.NewReader(c))
			if err != nil {
				return
			}
			auth := req.Header.Get("Proxy-Authorization")
			raw, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(auth, "Basic "))
			_, _ = io.WriteString(c, answer(auth, string(raw)))
		}()
		p, err := Load(Config{Address: ln.Addr().String(), CredentialsFile: cred})
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.Dial(context.Background(), "api.example.com:443")
		_ = ln.Close()
		b64 := base64.StdEncoding.EncodeToString([]byte("corpuser:" + pass))
		if err == nil || strings.Contains(err.Error(), pass[:4]) || strings.Contains(err.Error(), b64[4:20]) {
			t.Errorf("the refusal shows the credentials: %v", err)
		}
	}
}
