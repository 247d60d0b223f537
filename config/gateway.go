package config

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"go.yaml.in/yaml/v3"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/internal/rootdir"
	"github.com/trialnet/trialnet/trial"
)

// MaxSecretBytes bounds a gateway secret file: an API key is tens of
// bytes, a token a few kilobytes.
const MaxSecretBytes = 16 << 10

// MinSecretBytes is the shortest secret read: the gateway cuts every
// answer of the Trial's routes that holds a route's secret, and a
// shorter one would be in ordinary answers by chance.
const MinSecretBytes = 8

// refusedHeaders are the fields a route may not set: they frame the
// request or name its host, which the gateway decides.
var refusedHeaders = map[string]bool{
	"host": true, "content-length": true, "transfer-encoding": true, "connection": true, "keep-alive": true,
	"te": true, "trailer": true, "upgrade": true, "proxy-authorization": true, "proxy-connection": true, "expect": true,
}

// Upstream is a gateway route's upstream as checked: a DNS name and a
// port (443 unless given).
type Upstream struct {
	Host string
	Port uint16
}

// ParseUpstream checks a route's upstream: https://name[:port], with no
// user, path (but "/"), query or fragment, and a DNS name, not an
// address, so that the allowlist judges it before any lookup.
func ParseUpstream(s string) (Upstream, error) {
	u, err := url.Parse(s)
	if err != nil {
		return Upstream{}, fmt.Errorf("upstream %q: %v", s, err)
	}
	switch {
	case u.Scheme != "https":
		return Upstream{}, fmt.Errorf("upstream %q: want https://host[:port]; the gateway speaks only TLS to its upstreams", s)
	case u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "":
		return Upstream{}, fmt.Errorf("upstream %q: want only https://host[:port]: the request's path follows the route's prefix", s)
	}
	authority := u.Host
	if u.Port() == "" {
		authority = strings.TrimSuffix(authority, ":") + ":443"
	}
	e, err := allow.ParseEntry(authority) // a name, never an address, as an allowlist entry
	if err != nil || e.Wildcard {
		return Upstream{}, fmt.Errorf("upstream %q: want one DNS name, not an address or a wildcard (%v)", s, err)
	}
	return Upstream{Host: e.Name, Port: e.Port}, nil
}

// checkRoutePath refuses a route prefix that is not "/word/.../": lower
// case letters, digits, '-', '_' and '.', no empty or dot segment.
func checkRoutePath(p string) error {
	if len(p) < 3 || p[0] != '/' || p[len(p)-1] != '/' {
		return fmt.Errorf("path %q: want a prefix such as /anthropic/ (starting and ending with '/')", p)
	}
	for _, seg := range strings.Split(p[1:len(p)-1], "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("path %q: empty, '.' or '..' segment", p)
		}
		for _, c := range seg {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
				return fmt.Errorf("path %q: use lower-case letters, digits, '-', '_' and '.'", p)
			}
		}
	}
	return nil
}

// checkRouteKeys refuses an unknown key in a profile's gateway routes
// (a decoder's known-fields check does not reach inside a profile).
func checkRouteKeys(profile *yaml.Node) error {
	for i := 0; i+1 < len(profile.Content); i += 2 {
		if profile.Content[i].Value != "gateway" {
			continue
		}
		for _, r := range profile.Content[i+1].Content {
			for j := 0; j < len(r.Content); j += 2 {
				switch k := r.Content[j].Value; k {
				case "path", "upstream", "header", "secret_file":
				default:
					return fmt.Errorf("line %d: unknown gateway route key %q (want path, upstream, header, secret_file; a secret is never in the config, only its file)", r.Content[j].Line, k)
				}
			}
		}
	}
	return nil
}

// checkRoutes validates a profile's gateway routes against its own
// allowlist: a route to an upstream the allowlist does not admit is
// refused here, as the request would be.
func checkRoutes(routes []trial.GatewayRoute, list *allow.List) error {
	seen := map[string]bool{}
	for i := range routes {
		r := &routes[i]
		if err := checkRoutePath(r.Path); err != nil {
			return fmt.Errorf("gateway route %d: %w", i+1, err)
		}
		if seen[r.Path] {
			return fmt.Errorf("gateway route %q: the path is given twice", r.Path)
		}
		seen[r.Path] = true
		up, err := ParseUpstream(r.Upstream)
		if err != nil {
			return fmt.Errorf("gateway route %q: %w", r.Path, err)
		}
		if _, ok := list.Match(up.Host, up.Port); !ok {
			return fmt.Errorf("gateway route %q: its upstream %s:%d is not on the profile's allowlist; add it to allow (the gateway reaches only what the allowlist admits)", r.Path, up.Host, up.Port)
		}
		r.Header = strings.ToLower(r.Header)
		if r.Header == "" || strings.IndexFunc(r.Header, func(c rune) bool {
			return !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_')
		}) >= 0 || refusedHeaders[r.Header] {
			return fmt.Errorf("gateway route %q: header %q: want a field name such as x-api-key or authorization (not one that frames the request)", r.Path, r.Header)
		}
		if !filepath.IsAbs(r.SecretFile) || filepath.Clean(r.SecretFile) != r.SecretFile {
			return fmt.Errorf("gateway route %q: secret_file %q: want a clean absolute path to a root-only file", r.Path, r.SecretFile)
		}
	}
	return nil
}

// gatewayOf gathers the routes of the named profiles; two with the same
// path, or one's path inside another's, are refused: a request must
// name one route.
func (f *File) gatewayOf(profiles []string) ([]trial.GatewayRoute, error) {
	if f == nil {
		return nil, nil
	}
	var out []trial.GatewayRoute
	for _, n := range profiles {
		for _, r := range f.Profiles[n].Gateway {
			for _, o := range out {
				if o == r {
					continue // one profile named twice
				}
				if strings.HasPrefix(r.Path, o.Path) || strings.HasPrefix(o.Path, r.Path) {
					return nil, fmt.Errorf("gateway routes %q and %q of the profiles given overlap: give each its own path", o.Path, r.Path)
				}
			}
			if !slices.Contains(out, r) {
				out = append(out, r)
			}
		}
	}
	return out, nil
}

// ErrSecretFile is wrapped by ReadSecret for a file it will not read.
var ErrSecretFile = errors.New("gateway secret file")

// ReadSecret reads a gateway route's secret: the file must be a regular
// file owned by root with no group or other permission bits, so that
// nothing a Trial runs as could have read or written it; its content,
// trailing white space cut, is the credential, one line of printable
// ASCII.
func ReadSecret(path string) ([]byte, error) {
	real, err := rootdir.TrustedPath(path, 0)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrSecretFile, path, err)
	}
	if err := rootdir.ClosedDir(filepath.Dir(real)); err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrSecretFile, path, err)
	}
	f, err := os.OpenFile(real, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w (create it as root with mode 0600)", ErrSecretFile, path, err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrSecretFile, path, err)
	}
	switch {
	case st.Mode&syscall.S_IFMT != syscall.S_IFREG:
		return nil, fmt.Errorf("%w %s: not a regular file", ErrSecretFile, path)
	case st.Uid != 0:
		return nil, fmt.Errorf("%w %s: owned by uid %d, not root: the agent reads only a root-owned secret (chown root:root %s; chmod 0600 %s)", ErrSecretFile, path, st.Uid, path, path)
	case st.Mode&0o077 != 0:
		return nil, fmt.Errorf("%w %s: mode %04o lets others than root read or write it (chmod 0600 %s)", ErrSecretFile, path, st.Mode&0o7777, path)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxSecretBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrSecretFile, path, err)
	}
	b = bytes.TrimRight(b, " \t\r\n")
	switch {
	case len(b) > MaxSecretBytes:
		return nil, fmt.Errorf("%w %s: over %d bytes", ErrSecretFile, path, MaxSecretBytes)
	case len(b) == 0:
		return nil, fmt.Errorf("%w %s: empty", ErrSecretFile, path)
	case len(b) < MinSecretBytes:
		return nil, fmt.Errorf("%w %s: %d bytes, under %d: the gateway cuts any answer holding a route's secret, and one this short would be in ordinary answers by chance (write the provider's whole key)", ErrSecretFile, path, len(b), MinSecretBytes)
	case bytes.IndexFunc(b, func(c rune) bool { return c < 0x20 || c > 0x7e }) >= 0:
		// Never the byte itself: an error may be shown to anyone.
		return nil, fmt.Errorf("%w %s: holds a control or non-ASCII byte; want one line of printable ASCII", ErrSecretFile, path)
	}
	return b, nil
}

// TrustStore is the host's trust store the gateway verifies its
// upstreams against: the certificates in SSL_CERT_FILE and the
// directories of SSL_CERT_DIR when either is set (read now, not cached
// for the process, so that a test or an operator's change is seen by the
// next Trial), else the system's. where says where it came from.
func TrustStore() (pool *x509.CertPool, where string, err error) {
	file, dirs := os.Getenv("SSL_CERT_FILE"), os.Getenv("SSL_CERT_DIR")
	if file == "" && dirs == "" {
		p, err := x509.SystemCertPool()
		if err != nil {
			return nil, "", fmt.Errorf("the system trust store: %w", err)
		}
		return p, "the system trust store", nil
	}
	pool = x509.NewCertPool()
	n := 0
	add := func(p string) error {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if pool.AppendCertsFromPEM(b) {
			n++
		}
		return nil
	}
	if file != "" {
		if err := add(file); err != nil {
			return nil, "", fmt.Errorf("SSL_CERT_FILE: %w", err)
		}
	}
	for _, d := range filepath.SplitList(dirs) {
		ents, err := os.ReadDir(d)
		if err != nil {
			return nil, "", fmt.Errorf("SSL_CERT_DIR: %w", err)
		}
		for _, e := range ents {
			_ = add(filepath.Join(d, e.Name())) // a directory holds other files too
		}
	}
	if n == 0 {
		return nil, "", fmt.Errorf("no certificate in SSL_CERT_FILE=%q SSL_CERT_DIR=%q: the gateway could verify no upstream", file, dirs)
	}
	return pool, fmt.Sprintf("SSL_CERT_FILE=%q SSL_CERT_DIR=%q", file, dirs), nil
}
