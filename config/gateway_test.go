package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/internal/rootdirtest"
	"github.com/trialnet/trialnet/trial"
)

func gatewayConfig(route string) string {
	return "profiles:\n  claude:\n    allow: [api.anthropic.com:443]\n    gateway:\n" + route
}

const goodRoute = "      - {path: /anthropic/, upstream: https://api.anthropic.com, header: x-api-key, secret_file: /etc/trialnet/secrets/anthropic}\n"

func TestGatewayRoutes(t *testing.T) {
	f, err := ParseFile([]byte(gatewayConfig(goodRoute)))
	if err != nil {
		t.Fatal(err)
	}
	spec, _, err := f.Spec(trial.Request{ID: "x", Profiles: []string{"claude", "claude"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := trial.GatewayRoute{Path: "/anthropic/", Upstream: "https://api.anthropic.com", Header: "x-api-key", SecretFile: "/etc/trialnet/secrets/anthropic"}
	if len(spec.Gateway) != 1 || spec.Gateway[0] != want {
		t.Fatalf("spec routes %+v", spec.Gateway)
	}
}

func TestGatewayRouteRefusals(t *testing.T) {
	for _, c := range []struct{ name, route, want string }{
		{"upstream off the allowlist", "      - {path: /o/, upstream: https://api.openai.com, header: authorization, secret_file: /s}\n", "not on the profile's allowlist"},
		{"port off the allowlist", "      - {path: /o/, upstream: 'https://api.anthropic.com:8443', header: authorization, secret_file: /s}\n", "not on the profile's allowlist"},
		{"plain http", "      - {path: /o/, upstream: http://api.anthropic.com, header: authorization, secret_file: /s}\n", "want https"},
		{"address", "      - {path: /o/, upstream: https://1.2.3.4, header: authorization, secret_file: /s}\n", "not an address"},
		{"upstream path", "      - {path: /o/, upstream: https://api.anthropic.com/v1, header: authorization, secret_file: /s}\n", "want only"},
		{"path without slashes", "      - {path: anthropic, upstream: https://api.anthropic.com, header: x-api-key, secret_file: /s}\n", "prefix"},
		{"dot segment", "      - {path: /a/../, upstream: https://api.anthropic.com, header: x-api-key, secret_file: /s}\n", "segment"},
		{"framing header", "      - {path: /a/, upstream: https://api.anthropic.com, header: host, secret_file: /s}\n", "field name"},
		{"relative secret", "      - {path: /a/, upstream: https://api.anthropic.com, header: x-api-key, secret_file: s}\n", "absolute"},
		{"unknown key", "      - {path: /a/, upstream: https://api.anthropic.com, header: x-api-key, secret_file: /s, secret: x}\n", "secret"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseFile([]byte(gatewayConfig(c.route)))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error with %q", err, c.want)
			}
		})
	}
}

func TestReadSecret(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the secret file checks need files owned by root and by others: run as root")
	}
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode, uid int) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, 0); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "sk-secret\n", 0o600, 0)
	if b, err := ReadSecret(good); err != nil || string(b) != "sk-secret" {
		t.Fatalf("good: %q %v", b, err)
	}
	if err := os.Symlink(good, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, want string }{
		{write("group", "sk-secret", 0o640, 0), "mode 0640"},
		{write("world", "sk-secret", 0o604, 0), "mode 0604"},
		{write("other-owner", "sk-secret", 0o600, 65534), "not root"},
		{write("empty", "\n", 0o600, 0), "empty"},
		{write("short", "sk-1234\n", 0o600, 0), "7 bytes, under 8"},
		{write("two-lines", "sk-a\nsk-b", 0o600, 0), "control"},
		{filepath.Join(dir, "link"), "symbolic link"},
		{dir, "not a regular file"},
		{filepath.Join(dir, "none"), "no such file"},
	} {
		_, err := ReadSecret(c.path)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want an error with %q", c.path, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "sk-") {
			t.Errorf("%s: the error shows the secret: %v", c.path, err)
		}
	}
}

// TestReadSecretRefusesAParentOthersCanChange: a secret file under a
// directory that someone but root can change (writable by others, owned
// by another user, or reached through a link another user owns) is
// refused: that user could put another root-only file there, whose
// content the gateway would then send upstream. A root-owned link in
// root's directories, and a sticky directory such as /tmp on the way,
// are fine; a sticky directory as the file's own is not: a user may
// take the file's name while it is absent with a hard link to another
// root-only file (made here by root, as a user may where
// fs.protected_hardlinks=0).
func TestReadSecretRefusesAParentOthersCanChange(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the checks need directories owned by root and by others: run as root")
	}
	p := rootdirtest.Make(t, "key", "sk-secret", 0o700)
	for _, ok := range []string{p.Safe, p.UnderSticky, p.RootLink} {
		if b, err := ReadSecret(filepath.Join(ok, "key")); err != nil || string(b) != "sk-secret" {
			t.Errorf("%s/key: %q %v", ok, b, err)
		}
	}
	for _, c := range []struct{ path, want string }{
		{filepath.Join(p.Open, "key"), "writable by others"},
		{filepath.Join(p.Owned, "key"), "owned by uid 65534"},
		{filepath.Join(p.UserLink, "key"), "owned by uid 65534"},
		{filepath.Join(p.Sticky, "key"), "(mode 1777) lets others add names, sticky or not"},
		{p.Planted, "(mode 1777) lets others add names, sticky or not"},
	} {
		b, err := ReadSecret(c.path)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %q, %v; want an error with %q", c.path, b, err, c.want)
		}
	}
}
