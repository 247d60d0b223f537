// Package wire parses what a Trial's client sends the proxy and what
// an upstream answers, strictly and within fixed bounds: the CONNECT
// request and its head, a forwarded request's HTTP head, and the TLS
// ClientHello and ServerHello the proxy checks names in. Every refusal
// is a *record.Denial with its reason.
package wire

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/trialnet/trialnet/record"
	"golang.org/x/net/idna"
)

// Fixed bounds on a request head. A CONNECT head is a request line and a
// few headers; anything larger is a mistake or an attack.
const (
	MaxRequestLine = 1024    // bytes, CRLF included
	MaxHeaderBytes = 8 << 10 // the whole head, request line included
	MaxHeaders     = 32      // header fields
	maxNameLength  = 253     // a DNS name in presentation form, no trailing dot
	maxLabelLength = 63      // one DNS label
)

// Request is a parsed, validated request: a CONNECT, or an HTTP request
// in absolute form (http://host[:port]/path) to forward.
type Request struct {
	Method  string // "CONNECT", or the forwarded method
	Host    string // normalised: lower case, no trailing dot, ASCII (punycode)
	Port    uint16
	Target  string // the request-target exactly as sent
	Version string // "HTTP/1.1" or "HTTP/1.0"
	// TLS: the proxy itself speaks TLS to the upstream (a credential
	// gateway route), so an entry that requires TLS admits it.
	TLS bool
}

// HostPort is the normalised "host:port".
func (r *Request) HostPort() string { return r.Host + ":" + strconv.Itoa(int(r.Port)) }

// head is a request head as the strict reader saw it: the request line
// and the fields that decide framing and the destination.
type head struct {
	method, target, version string
	host                    string   // the Host field, "" if absent
	contentLength           []string // every Content-Length field
	transferEncoding        []string // every Transfer-Encoding field
}

// readHead reads one request head from br strictly, for CONNECT and
// forwarded requests alike: CRLF lines only, no control characters, no
// obsolete line folding, bounded line, head and field counts, one Host
// at most. It consumes exactly the head. A refusal is a *Denial; the
// returned head carries whatever was parsed so far (nil if the request
// line did not parse).
func readHead(br *bufio.Reader) (*head, error) { return readHeadCheck(br, nil) }

// readHeadCheck is readHead, with check (if not nil) called on the
// request line and each field line as read: its error refuses the head.
func readHeadCheck(br *bufio.Reader, check func(line string) error) (*head, error) {
	budget := MaxHeaderBytes
	line, err := readLine(br, MaxRequestLine, &budget)
	if err != nil {
		return nil, err
	}
	if check != nil {
		if err := check(line); err != nil {
			return nil, err
		}
	}
	method, rest, ok1 := strings.Cut(line, " ")
	target, version, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || method == "" || strings.Contains(version, " ") {
		return nil, record.Deny(record.ReasonBadRequest, "request line is not METHOD SP TARGET SP VERSION")
	}
	// A request line is ASCII (a name travels as punycode): refused here,
	// no other byte reaches a record or a terminal as a method or target.
	if !IsASCII(target) {
		return nil, record.Deny(record.ReasonBadTarget, "non-ASCII target %+q: send the name in its ASCII (punycode) form", Truncate(target))
	}
	if !IsASCII(method) || !IsASCII(version) {
		return nil, record.Deny(record.ReasonBadRequest, "non-ASCII request line %+q", Truncate(line))
	}
	h := &head{method: method, target: target, version: version}
	sawHost, fields := false, 0
	for {
		l, err := readLine(br, MaxRequestLine, &budget)
		if err != nil {
			return h, err
		}
		if l == "" {
			return h, nil
		}
		if check != nil {
			if err := check(l); err != nil {
				return h, err
			}
		}
		if fields++; fields > MaxHeaders {
			return h, record.Deny(record.ReasonTooManyHeaders, "more than %d header fields", MaxHeaders)
		}
		name, value, err := parseHeader(l)
		if err != nil {
			return h, err
		}
		switch strings.ToLower(name) {
		case "host":
			if sawHost {
				return h, record.Deny(record.ReasonBadRequest, "more than one Host header")
			}
			sawHost, h.host = true, value
		case "content-length":
			h.contentLength = append(h.contentLength, value)
		case "transfer-encoding":
			h.transferEncoding = append(h.transferEncoding, value)
		}
	}
}

// ReadRequest reads one request head from br and validates it as a
// CONNECT to host:port. It consumes exactly the head; bytes the client
// pipelined after it stay buffered in br. A refusal is a *Denial, and the
// returned Request carries whatever was parsed so far (for the event).
func ReadRequest(br *bufio.Reader) (*Request, error) { return ReadRequestCheck(br, nil) }

// ReadRequestCheck is ReadRequest with check (if not nil) called on
// each line of the head as it is read (the request line, then each
// field); its error refuses the request.
func ReadRequestCheck(br *bufio.Reader, check func(line string) error) (*Request, error) {
	h, err := readHeadCheck(br, check)
	if h == nil {
		return nil, err
	}
	req := &Request{Method: h.method, Target: h.target, Version: h.version}
	if err != nil {
		return req, err
	}
	for _, v := range h.contentLength {
		if v != "0" {
			return req, record.Deny(record.ReasonBadRequest, "a CONNECT request cannot carry a body (Content-Length: %q)", Truncate(v))
		}
	}
	if len(h.transferEncoding) > 0 {
		return req, record.Deny(record.ReasonBadRequest, "a CONNECT request cannot carry a body (Transfer-Encoding)")
	}
	if h.method != "CONNECT" {
		return req, record.Deny(record.ReasonMethodNotAllowed, "method %q: this proxy tunnels with CONNECT host:port and forwards %s with an http:// URL", Truncate(h.method), forwardedMethodList)
	}
	if err := checkVersion(h.version); err != nil {
		return req, err
	}
	if req.Host, req.Port, err = parseTarget(h.target); err != nil {
		return req, err
	}
	if err := checkHostField(h.host, req); err != nil {
		return req, err
	}
	return req, nil
}

func checkVersion(v string) error {
	if v != "HTTP/1.1" && v != "HTTP/1.0" {
		return record.Deny(record.ReasonBadVersion, "version %q: use HTTP/1.1", Truncate(v))
	}
	return nil
}

// checkHostField refuses a Host field naming anything but the target (a
// Host without a port matches any port).
func checkHostField(host string, req *Request) error {
	if host == "" {
		return nil
	}
	hh, hp, err := splitHostHeader(host)
	if err != nil || hh != req.Host || (hp != 0 && hp != req.Port) {
		return record.Deny(record.ReasonBadRequest, "Host header %q differs from the target %q", Truncate(host), req.HostPort())
	}
	return nil
}

// readLine reads one CRLF-terminated line of at most max bytes, charged to
// *budget, and returns it without the CRLF.
func readLine(br *bufio.Reader, max int, budget *int) (string, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		line = append(line, frag...)
		if len(line) > max || len(line) > *budget {
			return "", record.Deny(record.ReasonRequestTooLarge, "a request line or header field over %d bytes, or a head over %d bytes", max, MaxHeaderBytes)
		}
		if err == nil {
			break
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return "", &record.Denial{Reason: record.ReasonHeaderTimeout, Detail: "the request head did not arrive in time", Err: err}
		}
		if errors.Is(err, io.EOF) {
			return "", &record.Denial{Reason: record.ReasonBadRequest, Detail: "the connection closed before the request head ended", Err: err}
		}
		return "", &record.Denial{Reason: record.ReasonBadRequest, Detail: "reading the request head", Err: err}
	}
	*budget -= len(line)
	if !bytes.HasSuffix(line, []byte("\r\n")) {
		return "", record.Deny(record.ReasonBadRequest, "line not terminated by CRLF")
	}
	line = line[:len(line)-2]
	for _, c := range line {
		if c < 0x20 && c != '\t' || c == 0x7f {
			return "", record.Deny(record.ReasonBadRequest, "control character 0x%02x in the request head", c)
		}
	}
	return string(line), nil
}

func parseHeader(h string) (name, value string, err error) {
	if h[0] == ' ' || h[0] == '\t' {
		return "", "", record.Deny(record.ReasonBadRequest, "obsolete header line folding")
	}
	name, value, ok := strings.Cut(h, ":")
	if !ok || name == "" {
		return "", "", record.Deny(record.ReasonBadRequest, "header line without a name")
	}
	for i := 0; i < len(name); i++ {
		if !isTokenChar(name[i]) {
			return "", "", record.Deny(record.ReasonBadRequest, "invalid character in header name %q", Truncate(name))
		}
	}
	return name, strings.Trim(value, " \t"), nil
}

func isTokenChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func splitHostHeader(h string) (string, uint16, error) {
	host, port := h, uint16(0)
	if i := strings.LastIndexByte(h, ':'); i >= 0 {
		p, err := ParsePort(h[i+1:])
		if err != nil {
			return "", 0, err
		}
		host, port = h[:i], p
	}
	n, err := NormaliseName(host)
	return n, port, err
}

// parseTarget validates a CONNECT request-target and returns the
// normalised name and port. Only a DNS name and a decimal port pass: no
// scheme, path, userinfo, query, fragment or percent-encoding, and no IP
// address in any spelling (dotted, decimal, octal, hex, short, bracketed,
// with a zone).
func parseTarget(target string) (string, uint16, error) {
	if target == "" {
		return "", 0, record.Deny(record.ReasonBadTarget, "empty request target")
	}
	for i := 0; i < len(target); i++ {
		switch c := target[i]; {
		case c <= ' ' || c == 0x7f:
			return "", 0, record.Deny(record.ReasonBadTarget, "control character or space in the target")
		case c >= 0x80:
			return "", 0, record.Deny(record.ReasonBadTarget, "non-ASCII target: send the name in its ASCII (punycode) form")
		}
	}
	if target[0] == '[' {
		return "", 0, record.Deny(record.ReasonIPLiteral, "target %q is an IPv6 literal; only names on the allowlist are tunnelled", Truncate(target))
	}
	if h, _, ok := strings.Cut(target, "%"); ok && strings.Count(h, ":") >= 2 {
		return "", 0, record.Deny(record.ReasonIPLiteral, "target %q is an IPv6 literal with a zone; only names on the allowlist are tunnelled", Truncate(target))
	}
	if strings.Contains(target, "://") || target[0] == '/' || target == "*" {
		return "", 0, record.Deny(record.ReasonBadTarget, "target %q is a URL; CONNECT takes host:port", Truncate(target))
	}
	if i := strings.IndexAny(target, "@/?#%\\"); i >= 0 {
		what := map[byte]string{'@': "userinfo", '/': "a path", '?': "a query", '#': "a fragment", '%': "percent-encoding", '\\': "a backslash"}[target[i]]
		return "", 0, record.Deny(record.ReasonBadTarget, "target %q contains %s; CONNECT takes host:port", Truncate(target), what)
	}
	i := strings.LastIndexByte(target, ':')
	if i < 0 {
		return "", 0, record.Deny(record.ReasonBadPort, "target %q has no port; use host:port", Truncate(target))
	}
	host, portStr := target[:i], target[i+1:]
	if strings.IndexByte(host, ':') >= 0 {
		if _, err := netip.ParseAddr(host); err == nil || strings.Count(target, ":") > 2 {
			return "", 0, record.Deny(record.ReasonIPLiteral, "target %q is an IPv6 literal; only names on the allowlist are tunnelled", Truncate(target))
		}
		return "", 0, record.Deny(record.ReasonBadTarget, "target %q has more than one ':'", Truncate(target))
	}
	name, err := NormaliseName(host)
	if err != nil {
		return "", 0, err
	}
	port, err := ParsePort(portStr)
	if err != nil {
		return "", 0, err
	}
	return name, port, nil
}

func ParsePort(s string) (uint16, error) {
	if s == "" || len(s) > 5 || s[0] == '0' {
		return 0, record.Deny(record.ReasonBadPort, "port %q: want a decimal number in 1-65535 without leading zeros", Truncate(s))
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, record.Deny(record.ReasonBadPort, "port %q: want a decimal number in 1-65535", Truncate(s))
		}
	}
	n, _ := strconv.Atoi(s)
	if n > 65535 {
		return 0, record.Deny(record.ReasonBadPort, "port %d is outside 1-65535", n)
	}
	return uint16(n), nil
}

// NormaliseName lower-cases a DNS name, drops one trailing dot, and checks
// it is a well-formed ASCII host name that is not an IP address in any
// spelling the C library, browsers or Go would accept.
func NormaliseName(s string) (string, error) {
	if s == "" {
		return "", record.Deny(record.ReasonBadTarget, "empty host name")
	}
	// Before lower-casing: strings.ToLower maps the Kelvin sign (U+212A)
	// to 'k', so a name holding it would pass as another, ASCII, name.
	if !IsASCII(s) {
		return "", record.Deny(record.ReasonBadTarget, "host name %+q is not ASCII: send it in its ASCII (punycode) form", Truncate(s))
	}
	name := strings.ToLower(strings.TrimSuffix(s, "."))
	if isIPLiteral(name) {
		return "", record.Deny(record.ReasonIPLiteral, "%q is an IP address; only names on the allowlist are tunnelled", Truncate(s))
	}
	if name == "" || len(name) > maxNameLength {
		return "", record.Deny(record.ReasonBadTarget, "host name %q is empty or longer than %d bytes", Truncate(s), maxNameLength)
	}
	for _, label := range strings.Split(name, ".") {
		if err := checkLabel(label); err != nil {
			return "", record.Deny(record.ReasonBadTarget, "host name %q: %s", Truncate(s), err)
		}
	}
	return name, nil
}

func checkLabel(l string) error {
	if l == "" {
		return errors.New("empty label")
	}
	if len(l) > maxLabelLength {
		return errors.New("label longer than 63 bytes")
	}
	for i := 0; i < len(l); i++ {
		c := l[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return errors.New("labels hold only letters, digits and '-'")
		}
	}
	if l[0] == '-' || l[len(l)-1] == '-' {
		return errors.New("a label cannot start or end with '-'")
	}
	if strings.HasPrefix(l, "xn--") {
		if _, err := idna.Lookup.ToUnicode(l); err != nil {
			return errors.New("invalid punycode label")
		}
	}
	return nil
}

// isIPLiteral reports whether a lower-cased host is an IP address in any
// form: what netip parses, and every name whose last label is a number
// (decimal, 0-prefixed octal or 0x hex), which inet_aton and the WHATWG URL
// parser read as IPv4 ("127.1", "2130706433", "0x7f.1", "017700000001").
func isIPLiteral(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if _, err := netip.ParseAddr(h); err == nil {
		return true
	}
	last := h[strings.LastIndexByte(h, '.')+1:]
	if last == "" {
		return false
	}
	if strings.HasPrefix(last, "0x") {
		last = last[2:]
		return strings.Trim(last, "0123456789abcdef") == ""
	}
	return strings.Trim(last, "0123456789") == ""
}

func IsASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

func Truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
