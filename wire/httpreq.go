package wire

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/trialnet/trialnet/record"
)

// forwardedMethods are the methods forwarded in absolute form.
var forwardedMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodOptions: true,
}

const forwardedMethodList = "GET, HEAD, POST, PUT, PATCH, DELETE and OPTIONS"

// ErrClientDone is a keep-alive connection that ended cleanly between
// requests.
var ErrClientDone = errors.New("client closed the connection between requests")

// PeekHead waits until r holds a whole request head (up to and including
// its empty line) and returns it without consuming it, so that the
// strict reader can judge a copy before net/http frames the original. A
// head over MaxHeaderBytes, one that does not arrive before the read
// deadline, and a connection ending inside it are refusals; a connection
// ending before any byte is errClientDone.
func PeekHead(r *bufio.Reader) ([]byte, error) {
	for {
		b, _ := r.Peek(r.Buffered())
		if i := headEnd(b); i > 0 {
			return b[:i], nil
		}
		if len(b) >= MaxHeaderBytes {
			return nil, record.Deny(record.ReasonRequestTooLarge, "a request head over %d bytes", MaxHeaderBytes)
		}
		if _, err := r.Peek(len(b) + 1); err != nil {
			var ne net.Error
			switch {
			case errors.As(err, &ne) && ne.Timeout():
				return nil, &record.Denial{Reason: record.ReasonHeaderTimeout, Detail: "the request head did not arrive in time", Err: err}
			case len(b) == 0 && (errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed)):
				return nil, ErrClientDone
			case errors.Is(err, io.EOF):
				return nil, &record.Denial{Reason: record.ReasonBadRequest, Detail: "the connection closed before the request head ended", Err: err}
			}
			return nil, &record.Denial{Reason: record.ReasonBadRequest, Detail: "reading the request head", Err: err}
		}
	}
}

// headEnd is the length of the head at the start of b, through its first
// empty line ("\r\n\r\n", or a bare "\n\n" that the strict reader then
// refuses), or 0 if the head is not complete.
func headEnd(b []byte) int {
	end := 0
	if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
		end = i + 4
	}
	if i := bytes.Index(b, []byte("\n\n")); i >= 0 && (end == 0 || i+2 < end) {
		end = i + 2
	}
	return end
}

// ParseHTTPHead validates a peeked head as a request to forward: strict
// lines (readHead, as for CONNECT), a forwarded method, an absolute-form
// http:// target naming a DNS name (the same rules as a CONNECT target;
// port 80 by default), a Host field that agrees with it, and none of the
// framing shapes that let a request be smuggled past a proxy: both
// Content-Length and Transfer-Encoding, more than one Content-Length, a
// Content-Length that is not a plain decimal, or any Transfer-Encoding
// but a single "chunked" on HTTP/1.1.
func ParseHTTPHead(raw []byte) (*Request, error) {
	h, err := readHead(bufio.NewReader(bytes.NewReader(raw)))
	if h == nil {
		return nil, err
	}
	req := &Request{Method: h.method, Target: h.target, Version: h.version}
	if err != nil {
		return req, err
	}
	if h.method == "CONNECT" {
		return req, record.Deny(record.ReasonBadRequest, "CONNECT after a forwarded request on the same connection; open a new connection to tunnel")
	}
	if !forwardedMethods[h.method] {
		return req, record.Deny(record.ReasonMethodNotAllowed, "method %q: this proxy tunnels with CONNECT host:port and forwards %s with an http:// URL", Truncate(h.method), forwardedMethodList)
	}
	if err := checkVersion(h.version); err != nil {
		return req, err
	}
	if req.Host, req.Port, err = parseAbsoluteTarget(h.target); err != nil {
		return req, err
	}
	if err := checkHostField(h.host, req); err != nil {
		return req, err
	}
	return req, checkFraming(h)
}

// parseAbsoluteTarget validates an absolute-form request-target and
// returns its normalised name and port.
func parseAbsoluteTarget(target string) (string, uint16, error) {
	scheme, rest, ok := strings.Cut(target, "://")
	switch {
	case ok && strings.EqualFold(scheme, "https"):
		return "", 0, record.Deny(record.ReasonHTTPSNeedsConnect, "%q is an https:// URL: send CONNECT %s and speak TLS through the tunnel (set HTTPS_PROXY, not only HTTP_PROXY)", Truncate(target), Truncate(authorityOf(rest)))
	case !ok || !strings.EqualFold(scheme, "http"):
		return "", 0, record.Deny(record.ReasonBadTarget, "target %q: a proxy forwards only absolute-form http://host[:port]/path (or tunnels with CONNECT host:port)", Truncate(target))
	}
	// readHead refused non-ASCII already.
	if strings.IndexByte(target, '#') >= 0 {
		return "", 0, record.Deny(record.ReasonBadTarget, "target %q holds a fragment", Truncate(target))
	}
	authority := authorityOf(rest)
	if path := rest[len(authority):]; path != "" && path[0] != '/' && path[0] != '?' {
		return "", 0, record.Deny(record.ReasonBadTarget, "target %q: the path must start with '/'", Truncate(target))
	}
	if authority != "" && authority[0] != '[' && !strings.Contains(authority, ":") {
		authority += ":80"
	}
	return parseTarget(authority)
}

// authorityOf is the authority at the start of what follows "scheme://".
func authorityOf(s string) string {
	if i := strings.IndexAny(s, "/?#"); i >= 0 {
		return s[:i]
	}
	return s
}

func checkFraming(h *head) error {
	if len(h.contentLength) > 0 && len(h.transferEncoding) > 0 {
		return record.Deny(record.ReasonBadRequest, "both Content-Length and Transfer-Encoding: a request smuggling shape")
	}
	if len(h.contentLength) > 1 {
		return record.Deny(record.ReasonBadRequest, "%d Content-Length fields: a request smuggling shape", len(h.contentLength))
	}
	if len(h.contentLength) == 1 {
		v := h.contentLength[0]
		if v == "" || len(v) > 18 || strings.Trim(v, "0123456789") != "" {
			return record.Deny(record.ReasonBadRequest, "Content-Length %q is not a decimal number", Truncate(v))
		}
	}
	if len(h.transferEncoding) > 0 {
		if h.version != "HTTP/1.1" {
			return record.Deny(record.ReasonBadRequest, "Transfer-Encoding in an %s request", h.version)
		}
		if len(h.transferEncoding) > 1 || !strings.EqualFold(h.transferEncoding[0], "chunked") {
			return record.Deny(record.ReasonBadRequest, "Transfer-Encoding %q: only a single \"chunked\" is forwarded", Truncate(strings.Join(h.transferEncoding, ", ")))
		}
	}
	return nil
}

// ParseTransparentHead validates a peeked head sent to a transparent
// address, which stands for host:port: the same strict lines, methods,
// versions and framing as ParseHTTPHead, an origin-form target ("/path")
// or an absolute-form one naming host:port, and a Host field (required
// on HTTP/1.1) naming host, with port if it names one. A Host or target
// naming anything else is ReasonHostMismatch: the upstream reached is
// host's, and a shared front there would route by the other name. The
// returned Request carries host and port, and the target as sent.
func ParseTransparentHead(raw []byte, host string, port uint16) (*Request, error) {
	h, err := readHead(bufio.NewReader(bytes.NewReader(raw)))
	if h == nil {
		return nil, err
	}
	req := &Request{Method: h.method, Target: h.target, Version: h.version, Host: host, Port: port}
	if err != nil {
		return req, err
	}
	if !forwardedMethods[h.method] {
		return req, record.Deny(record.ReasonMethodNotAllowed, "method %q: plain HTTP to %s forwards %s", Truncate(h.method), req.HostPort(), forwardedMethodList)
	}
	if err := checkVersion(h.version); err != nil {
		return req, err
	}
	switch {
	case strings.IndexByte(h.target, '#') >= 0:
		return req, record.Deny(record.ReasonBadTarget, "target %q holds a fragment", Truncate(h.target))
	case strings.HasPrefix(h.target, "/"):
	case strings.Contains(h.target, "://"):
		th, tp, err := parseAbsoluteTarget(h.target)
		if err != nil {
			return req, err
		}
		if th != host || tp != port {
			return req, record.Deny(record.ReasonHostMismatch, "target %q names another host than %s, which this address stands for", Truncate(h.target), req.HostPort())
		}
	default:
		return req, record.Deny(record.ReasonBadTarget, "target %q: want a path starting with '/'", Truncate(h.target))
	}
	if h.host == "" && h.version == "HTTP/1.1" {
		return req, record.Deny(record.ReasonBadRequest, "an HTTP/1.1 request without a Host field")
	}
	if h.host != "" {
		hh, hp, err := splitHostHeader(h.host)
		if err != nil || hh != host || (hp != 0 && hp != port) {
			return req, record.Deny(record.ReasonHostMismatch, "Host %q names another host than %s, which this address stands for", Truncate(h.host), req.HostPort())
		}
	}
	return req, checkFraming(h)
}

// h2cPreface is the first line of HTTP/2 with prior knowledge, and
// h2cPrefaceWhole the whole client preface it starts.
const (
	h2cPreface      = "PRI * HTTP/2.0"
	h2cPrefaceWhole = h2cPreface + "\r\n\r\nSM\r\n\r\n"
)

// proxyV2Signature starts a PROXY protocol v2 header.
const proxyV2Signature = "\r\n\r\n\x00\r\nQUIT\n"

// ClassifyHTTP says whether the first bytes a client sent to a
// transparent address may be an HTTP/1 request, which the forwarder must
// judge: false only once b shows it is not one, more while more bytes
// could tell. Servers differ in what they take as a request (blank lines
// before it, any method token, any whitespace Python's str.split knows
// for a space, before the method too) and a request line may come in
// pieces, so b is HTTP unless it starts with a byte no method starts
// with, its first token ends in anything but such whitespace (a CR not
// before LF included), or its whole first line names neither an HTTP
// version (nor RTSP's, nor Icecast's after SOURCE) nor a target of
// HTTP/0.9 ("GET /x", "GET http://host/": no version, and a front that
// still takes it routes by the absolute target's host). The h2c preface,
// all of it, is not HTTP/1: it is tunnelled, as through CONNECT. ended
// says no more bytes will come: a bare token is then no request, and the
// line is whole.
func ClassifyHTTP(b []byte, ended bool) (isHTTP, more bool) {
	// A PROXY protocol header is judged as HTTP, and so refused: a front
	// that takes one from its client reads the request after it, with any
	// Host, and the address the header claims.
	if n := min(len(b), len(proxyV2Signature)); string(b[:n]) == proxyV2Signature[:n] && n > 4 {
		return true, n < len(proxyV2Signature) && !ended
	}
	for len(b) > 0 && (b[0] == '\r' || b[0] == '\n' || lenientSpace(b[0])) {
		b = b[1:]
	}
	n := 0
	for n < len(b) && isTokenChar(b[n]) {
		n++
	}
	switch {
	case n == len(b), b[n] == '\r' && n+1 == len(b): // a line end, or a bare CR: a space to some
		return !ended, !ended
	case n == 0 || !lenientSpace(b[n]) && (b[n] != '\r' || b[n+1] == '\n'):
		return false, false
	}
	line, _, ok := bytes.Cut(b, []byte("\n"))
	if !ok && !ended {
		return true, true
	}
	line = bytes.TrimSuffix(line, []byte("\r"))
	if string(line) == h2cPreface {
		// Only the whole preface is h2c: Go's net/http takes its first
		// line with fields after it as a request, its handler seeing
		// their Host.
		k := min(len(b), len(h2cPrefaceWhole))
		switch {
		case string(b[:k]) != h2cPrefaceWhole[:k]:
			return true, false
		case k < len(h2cPrefaceWhole) && !ended:
			return true, true
		}
		return false, false
	}
	up := bytes.ToUpper(line)
	if bytes.HasPrefix(up, []byte("PROXY ")) { // PROXY protocol v1
		return true, false
	}
	// RTSP's version too: Node's parser (llhttp) takes "RTSP/1.0" in a
	// request line as HTTP's, with any target, and routes by Host; and
	// Icecast's "ICE/1.0" after a SOURCE method ("SOURCE * ICE/1.0").
	icecast := string(up[:n]) == "SOURCE" && bytes.Contains(up, []byte("ICE/"))
	return bytes.Contains(up, []byte("HTTP/")) || bytes.Contains(up, []byte("RTSP/")) || icecast || http09Target(line[:n], line[n:]), false
}

// llhttpMethod reports whether m is a method Node's parser (llhttp)
// knows, as it spells it: after one, it takes a line with no version
// whose target starts with '*' as HTTP/0.9, reads the fields after it,
// and the server routes by Host (Node 20 served "GET *" and "OPTIONS *x"
// as another Host). Redis's inline "KEYS *" and memcached's "get *" are
// not among them. A switch, not a map: no table built at every start.
func llhttpMethod(m string) bool {
	switch m {
	case "ACL", "BIND", "CHECKOUT", "CONNECT", "COPY", "DELETE",
		"GET", "HEAD", "LINK", "LOCK", "M-SEARCH", "MERGE",
		"MKACTIVITY", "MKCALENDAR", "MKCOL", "MOVE", "NOTIFY",
		"OPTIONS", "PATCH", "POST", "PRI", "PROPFIND", "PROPPATCH",
		"PURGE", "PUT", "QUERY", "REBIND", "REPORT", "SEARCH",
		"SOURCE", "SUBSCRIBE", "TRACE", "UNBIND", "UNLINK",
		"UNLOCK", "UNSUBSCRIBE":
		return true
	}
	return false
}

// http09Target reports whether rest, the request line after its method,
// starts with a target HTTP/0.9 has: a path, an absolute http(s) URI, or
// after a method llhttp knows, one starting with '*'; or is only an
// absolute URI of any scheme, which nginx takes as HTTP/0.9 and routes
// by its host ("GET x://other/"; with another word after it, nginx
// refuses the line). A bare CR ends the target too, as some servers end
// a line there.
func http09Target(method, rest []byte) bool {
	for len(rest) > 0 && lenientSpace(rest[0]) {
		rest = rest[1:]
	}
	end := 0
	for end < len(rest) && rest[end] != '\r' && !lenientSpace(rest[end]) {
		end++
	}
	t := bytes.ToLower(rest[:end])
	if bytes.HasPrefix(t, []byte("/")) || bytes.HasPrefix(t, []byte("http://")) || bytes.HasPrefix(t, []byte("https://")) ||
		bytes.HasPrefix(t, []byte("*")) && llhttpMethod(string(method)) {
		return true
	}
	after := rest[end:]
	for len(after) > 0 && lenientSpace(after[0]) {
		after = after[1:]
	}
	return absoluteURI(t) && (len(after) == 0 || after[0] == '\r')
}

// absoluteURI reports whether t starts with a scheme (RFC 3986: a letter,
// then letters, digits, '+', '-' or '.') and "://", as nginx reads one.
func absoluteURI(t []byte) bool {
	scheme, _, ok := bytes.Cut(t, []byte("://"))
	if !ok || len(scheme) == 0 || scheme[0] < 'a' || scheme[0] > 'z' {
		return false
	}
	for _, c := range scheme {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// lenientSpace reports the bytes, other than CR and LF, that some server
// splits a request line on: space and tab, and the rest of what Python's
// str.split takes for whitespace in a line decoded as Latin-1 (its
// http.server does): VT, FF, the separators 0x1c-0x1f, NEL and NBSP. A
// CR not before LF is one too, to the same server.
func lenientSpace(c byte) bool {
	switch c {
	case ' ', '\t', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x1f, 0x85, 0xa0:
		return true
	}
	return false
}
