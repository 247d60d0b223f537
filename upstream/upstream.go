// Package upstream is the next hop for networks whose only way out is
// their own HTTP proxy: the config's upstream_proxy, parsed and checked
// (its credentials from a root-only file), the exceptions that are
// dialled directly, and the bounded CONNECT handshake with it.
package upstream

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/trialnet/trialnet/internal/rootdir"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/wire"
)

// Defaults of the handshake with the upstream proxy.
const (
	// DefaultHandshakeTimeout bounds the CONNECT answer, once connected.
	DefaultHandshakeTimeout = 10 * time.Second
	// MaxResponseHead bounds the upstream's answer to a CONNECT.
	MaxResponseHead = 8 << 10
	maxCredentials  = 4 << 10
)

// Resolve modes: who resolves a name that goes through the upstream.
const (
	// ResolveUpstream sends the name: the upstream proxy resolves it, and
	// the address guard never sees the destination's address.
	ResolveUpstream = "upstream"
	// ResolveLocal resolves here, checks every answer with the guard and
	// asks the upstream for the checked address, never the name.
	ResolveLocal = "local"
)

// Config is the upstream_proxy section of the configuration.
type Config struct {
	// Address is the proxy's host:port (a name is resolved by the host's
	// resolver, as the operator named it).
	Address string `yaml:"address"`
	// CredentialsFile holds "user:password" for Proxy-Authorization
	// (basic); it must be a regular file owned by the agent's user with
	// no group or other permissions. Empty: no credentials.
	CredentialsFile string `yaml:"credentials_file"`
	// Direct are names (exact, or "*.suffix") and CIDRs dialled directly,
	// not through the proxy.
	Direct []string `yaml:"direct"`
	// Resolve is ResolveUpstream (the default) or ResolveLocal.
	Resolve string `yaml:"resolve"`
}

// Proxy is a checked upstream proxy, ready to dial through.
type Proxy struct {
	addr    string
	auth    string   // the Proxy-Authorization value; never printed
	hide    []string // auth's forms a refusal must not repeat
	local   bool
	names   []string // exact names
	suffix  []string // "*.suffix" without the "*."
	cidrs   []netip.Prefix
	Timeout time.Duration // the handshake's bound; 0: DefaultHandshakeTimeout
}

// Load checks c and reads its credentials file; nil, nil when c is
// empty (no upstream proxy).
func Load(c Config) (*Proxy, error) {
	p, err := Parse(c)
	if err != nil || p == nil || c.CredentialsFile == "" {
		return p, err
	}
	user, pass, err := readCredentials(c.CredentialsFile)
	if err != nil {
		return nil, fmt.Errorf("upstream_proxy: credentials_file %s: %w", c.CredentialsFile, err)
	}
	token := base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))
	p.auth = "Basic " + token
	// Longest first, so that no piece of a longer one is left.
	p.hide = []string{token, strings.TrimRight(token, "="), user + ":" + pass}
	if pass != "" {
		p.hide = append(p.hide, pass)
	}
	return p, nil
}

// Parse checks c without reading its credentials file (Load does); nil,
// nil when c is empty.
func Parse(c Config) (*Proxy, error) {
	if c.Address == "" && c.CredentialsFile == "" && len(c.Direct) == 0 && c.Resolve == "" {
		return nil, nil
	}
	host, port, err := net.SplitHostPort(c.Address)
	if err != nil || host == "" {
		return nil, fmt.Errorf("upstream_proxy: address %q: want host:port (for example proxy.corp.example:3128)", c.Address)
	}
	if _, err := wire.ParsePort(port); err != nil {
		return nil, fmt.Errorf("upstream_proxy: address %q: %v", c.Address, err)
	}
	p := &Proxy{addr: c.Address}
	switch c.Resolve {
	case "", ResolveUpstream:
	case ResolveLocal:
		p.local = true
	default:
		return nil, fmt.Errorf("upstream_proxy: resolve %q: want %q (the proxy resolves names) or %q (trialnet resolves and checks them)", c.Resolve, ResolveUpstream, ResolveLocal)
	}
	for _, d := range c.Direct {
		if err := p.addDirect(d); err != nil {
			return nil, err
		}
	}
	if c.CredentialsFile != "" && !strings.HasPrefix(c.CredentialsFile, "/") {
		return nil, fmt.Errorf("upstream_proxy: credentials_file %q: want an absolute path", c.CredentialsFile)
	}
	return p, nil
}

func (p *Proxy) addDirect(d string) error {
	if pre, err := netip.ParsePrefix(d); err == nil {
		p.cidrs = append(p.cidrs, pre.Masked())
		return nil
	}
	rest, wild := strings.CutPrefix(d, "*.")
	name, err := wire.NormaliseName(rest)
	if err != nil || !strings.Contains(name, ".") || strings.Contains(name, "*") {
		return fmt.Errorf("upstream_proxy: direct %q: want a fully qualified name, a *.suffix or a CIDR (for example 10.0.0.0/8)", d)
	}
	if wild {
		p.suffix = append(p.suffix, name)
	} else {
		p.names = append(p.names, name)
	}
	return nil
}

// readCredentials reads "user:password" from path, which must be a
// regular file (not a link) owned by this process's user, with no group
// or other permission bits: the agent's own secret, on a path only root
// or that user can change (rootdir.TrustedPath). Its content never
// appears in an error.
func readCredentials(path string) (user, pass string, err error) {
	real, err := rootdir.TrustedPath(path, uint32(os.Geteuid()))
	if err != nil {
		return "", "", err
	}
	if err := rootdir.ClosedDir(filepath.Dir(real)); err != nil {
		return "", "", err
	}
	f, err := os.OpenFile(real, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", "", err
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return "", "", errors.New("not a regular file")
	case fi.Mode().Perm()&0o077 != 0:
		return "", "", fmt.Errorf("mode %#o lets others read or change it: chmod 600 it", fi.Mode().Perm())
	case st == nil || int(st.Uid) != os.Geteuid():
		return "", "", fmt.Errorf("owned by uid %d, not by the agent's user (uid %d): chown it", st.Uid, os.Geteuid())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxCredentials+1))
	if err != nil {
		return "", "", err
	}
	if len(b) > maxCredentials {
		return "", "", fmt.Errorf("longer than %d bytes", maxCredentials)
	}
	line := strings.TrimRight(string(b), "\r\n")
	user, pass, ok := strings.Cut(line, ":")
	if !ok || user == "" || strings.ContainsAny(line, "\r\n") {
		return "", "", errors.New("want one line user:password")
	}
	return user, pass, nil
}

// Address is the proxy's host:port as configured.
func (p *Proxy) Address() string { return p.addr }

// ResolvesLocally reports whether names are resolved and checked here,
// and the upstream asked for the checked address.
func (p *Proxy) ResolvesLocally() bool { return p.local }

// DirectName reports whether name (normalised) is dialled directly.
func (p *Proxy) DirectName(name string) bool {
	for _, n := range p.names {
		if n == name {
			return true
		}
	}
	for _, s := range p.suffix {
		if strings.HasSuffix(name, "."+s) {
			return true
		}
	}
	return false
}

// HasDirectCIDRs reports whether any exception is a CIDR.
func (p *Proxy) HasDirectCIDRs() bool { return len(p.cidrs) > 0 }

// DirectAddr reports whether a falls in a direct CIDR.
func (p *Proxy) DirectAddr(a netip.Addr) bool {
	a = a.Unmap()
	for _, c := range p.cidrs {
		if c.Contains(a) {
			return true
		}
	}
	return false
}

// Dial connects to the upstream proxy and asks it for a tunnel to target
// (host:port, or an address and port), within ctx and the handshake
// bound. Its errors are *record.Denial saying which hop failed; none
// carries the credentials.
func (p *Proxy) Dial(ctx context.Context, target string) (net.Conn, error) {
	// The keepalive of the proxy's own direct dials: a dead hop is
	// noticed in minutes, an idle tunnel (a long model call) never cut.
	d := net.Dialer{KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 60 * time.Second, Interval: 10 * time.Second, Count: 9}}
	c, err := d.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, p.hopError(ctx, "connecting to the upstream proxy "+p.addr, err)
	}
	if err := p.handshake(ctx, c, target); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// hopError classifies a failure to reach or talk to the proxy itself.
func (p *Proxy) hopError(ctx context.Context, what string, err error) error {
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return &record.Denial{Reason: record.ReasonUpstreamTimeout, Detail: what + ": no answer in time", Err: err}
	}
	return &record.Denial{Reason: record.ReasonUpstreamUnreachable, Detail: what + ": " + err.Error(), Err: err}
}

// handshake sends the CONNECT and reads the answer's head, byte by byte
// so that nothing past it (the tunnel's first bytes) is taken from c.
func (p *Proxy) handshake(ctx context.Context, c net.Conn, target string) error {
	bound := p.Timeout
	if bound <= 0 {
		bound = DefaultHandshakeTimeout
	}
	deadline := time.Now().Add(bound)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = c.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var req bytes.Buffer
	fmt.Fprintf(&req, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n", target, target)
	if p.auth != "" {
		req.WriteString("Proxy-Authorization: " + p.auth + "\r\n")
	}
	req.WriteString("\r\n")
	if _, err := c.Write(req.Bytes()); err != nil {
		return p.hopError(ctx, "sending CONNECT to the upstream proxy "+p.addr, err)
	}
	head, err := readHead(c)
	if errors.Is(err, errHeadTooLarge) {
		return &record.Denial{Reason: record.ReasonUpstreamBadResponse, Detail: "the upstream proxy " + p.addr + "'s answer to CONNECT: " + err.Error(), Err: err}
	}
	if err != nil {
		return p.hopError(ctx, "reading the upstream proxy "+p.addr+"'s answer", err)
	}
	_ = c.SetDeadline(time.Time{})
	code, status, err := statusOf(head, p.scrub)
	if err != nil {
		return &record.Denial{Reason: record.ReasonUpstreamBadResponse, Detail: "the upstream proxy " + p.addr + " " + err.Error(), Err: err}
	}
	if code/100 != 2 {
		return record.Deny(record.ReasonUpstreamProxyRefused, "the upstream proxy %s answered %q to CONNECT %s", p.addr, status, target)
	}
	return nil
}

// errHeadTooLarge is an answer head past MaxResponseHead.
var errHeadTooLarge = fmt.Errorf("answer head longer than %d bytes", MaxResponseHead)

func readHead(c net.Conn) ([]byte, error) {
	var head []byte
	one := make([]byte, 1)
	for !bytes.HasSuffix(head, []byte("\r\n\r\n")) && !bytes.HasSuffix(head, []byte("\n\n")) {
		if len(head) >= MaxResponseHead {
			return nil, errHeadTooLarge
		}
		if _, err := io.ReadFull(c, one); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return nil, errors.New("closed before its answer ended")
			}
			return nil, err
		}
		head = append(head, one[0])
	}
	return head, nil
}

// scrub replaces the credentials in s, which a proxy may have repeated
// in its answer, before the answer is quoted where a Trial reads it.
func (p *Proxy) scrub(s string) string {
	for _, h := range p.hide {
		s = strings.ReplaceAll(s, h, "[credentials]")
	}
	return s
}

// statusOf parses the status line of head: its code, and the line
// itself, scrubbed, cut short and made printable for a detail.
func statusOf(head []byte, scrub func(string) string) (int, string, error) {
	line, _, _ := bufio.NewReader(bytes.NewReader(head)).ReadLine()
	s := string(line)
	printable := strings.Map(func(r rune) rune {
		if r < 0x20 || r >= 0x7f {
			return '?'
		}
		return r
	}, scrub(s))
	if len(printable) > 80 {
		printable = printable[:80]
	}
	proto, rest, _ := strings.Cut(s, " ")
	codeStr, _, _ := strings.Cut(rest, " ")
	code, err := strconv.Atoi(codeStr)
	if !strings.HasPrefix(proto, "HTTP/1.") || err != nil || len(codeStr) != 3 {
		return 0, printable, fmt.Errorf("answered CONNECT with no HTTP status line (%q)", printable)
	}
	return code, printable, nil
}
