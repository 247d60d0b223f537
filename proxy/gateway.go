//go:build linux

package proxy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/wire"
)

// GatewayPlaceholder is the credential a Trial's client is given instead
// of the real one (ANTHROPIC_API_KEY=trialnet-gateway-placeholder): the
// gateway strips it from its route's header and sets the secret there.
// Anywhere else the proxy sees it — another route's path, query or
// fields, a forwarded request, a CONNECT head — the request is refused
// (ReasonPlaceholderMisused): a client configured to send its key
// somewhere else.
const GatewayPlaceholder = "trialnet-gateway-placeholder"

// maxGatewayBody bounds a gateway request's body: a model request with
// a long context and images is tens of megabytes at most.
const maxGatewayBody = 32 << 20

// GatewayRoute is one credential gateway route as the proxy serves it.
type GatewayRoute struct {
	Path   string // the prefix it serves, "/name/"
	Host   string // the upstream, a DNS name the allowlist judges
	Port   uint16
	Header string // lower case; authorization gets "Bearer " + Secret
	Secret Secret // never written anywhere but the upstream request
}

// Secret is a route's credential. It prints, logs and encodes as
// "[secret]", so that no error or log line that names a route by
// mistake carries it.
type Secret []byte

func (Secret) String() string               { return "[secret]" }
func (Secret) GoString() string             { return "[secret]" }
func (Secret) LogValue() slog.Value         { return slog.StringValue("[secret]") }
func (Secret) MarshalJSON() ([]byte, error) { return []byte(`"[secret]"`), nil }

// value is what the route's header is set to.
func (r *GatewayRoute) value() string {
	if r.Header == "authorization" {
		return "Bearer " + string(r.Secret)
	}
	return string(r.Secret)
}

// gatewayTLS is the TLS configuration of a Trial's gateway upstreams:
// verified against roots (nil: the system's), HTTP/1.1 only.
func gatewayTLS(roots *x509.CertPool) *tls.Config {
	return &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
}

// originForm reports whether a request head's target is a path
// ("GET /route/... HTTP/1.1"): a request to the gateway, which a proxy
// client never sends (its targets are absolute or host:port).
func originForm(raw []byte) bool {
	_, rest, ok := bytes.Cut(raw, []byte(" "))
	return ok && len(rest) > 0 && rest[0] == '/'
}

// gatewayRequest validates a gateway request head and finds its route.
func (t *trial) gatewayRequest(raw []byte) (*wire.Request, *GatewayRoute, error) {
	req, err := wire.ParseGatewayHead(raw)
	if err != nil {
		return req, nil, err
	}
	path, _, _ := strings.Cut(req.Target, "?")
	for i := range t.gateway {
		r := &t.gateway[i]
		if strings.HasPrefix(path, r.Path) {
			if strings.HasPrefix(path[len(r.Path):], "/") {
				// "//name/..." upstream is a network-path reference to
				// any parser that resolves it against a base URL.
				return req, nil, record.Deny(record.ReasonBadTarget, "target %q: the path after the route %s starts with '/', which an upstream may read as another host (\"//host/...\"); drop the trailing '/' of the base URL", wire.Truncate(path), r.Path)
			}
			req.Host, req.Port, req.TLS = r.Host, r.Port, true
			return req, r, nil
		}
	}
	return req, nil, record.Deny(record.ReasonGatewayNoRoute, "no gateway route of this Trial serves %q (its routes: %s)", wire.Truncate(path), t.routeList())
}

func (t *trial) routeList() string {
	if len(t.gateway) == 0 {
		return "none"
	}
	var b strings.Builder
	for i, r := range t.gateway {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(r.Path)
	}
	return b.String()
}

// misplaced reports whether a request head carries the placeholder
// anywhere but in fields named own (lower case; "" for none), as sent or
// percent-decoded, in any case.
func misplaced(raw []byte, own string) bool {
	for line := range strings.Lines(string(raw)) {
		if own != "" {
			if name, _, ok := strings.Cut(line, ":"); ok && strings.EqualFold(strings.TrimSpace(name), own) {
				continue
			}
		}
		if lineMisplaces(line) {
			return true
		}
	}
	return false
}

// lineMisplaces reports whether one head line holds the placeholder, as
// sent, percent-decoded (up to maxDecodes rounds: a server may decode
// twice) or base64'd (Basic credentials, a token wrapping it), in any
// case. It allocates only for a line with a '%' or a long base64 run.
func lineMisplaces(line string) bool {
	for range maxDecodes {
		if containsFold(line, GatewayPlaceholder) || base64Holds(line) {
			return true
		}
		next := line
		if strings.IndexByte(line, '%') >= 0 {
			next = unescapeLenient(line)
		}
		if next == line {
			return false
		}
		line = next
	}
	return containsFold(line, GatewayPlaceholder) || base64Holds(line)
}

// maxDecodes bounds the rounds of percent-decoding lineMisplaces tries.
const maxDecodes = 3

// minBase64Run is the shortest run of base64 that can hold the
// placeholder's bytes.
var minBase64Run = (len(GatewayPlaceholder)*4 + 2) / 3

// base64Holds reports whether a run of base64 (standard or URL-safe,
// padded or not, from any of the four alignments) in s decodes to bytes
// holding the placeholder in any case.
func base64Holds(s string) bool {
	for i := 0; i < len(s); {
		j := i
		for j < len(s) && isBase64(s[j]) {
			j++
		}
		if j-i >= minBase64Run && runHolds(s[i:j]) {
			return true
		}
		i = j + 1
	}
	return false
}

func isBase64(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '/' || c == '-' || c == '_'
}

// runHolds reports whether one run of base64 holds the placeholder.
func runHolds(run string) bool {
	std := strings.NewReplacer("-", "+", "_", "/").Replace(run)
	for off := range 4 {
		r := std[off:]
		if len(r)%4 == 1 {
			r = r[:len(r)-1] // a lone last character decodes to nothing
		}
		if b, err := base64.RawStdEncoding.DecodeString(r); err == nil && containsFold(string(b), GatewayPlaceholder) {
			return true
		}
	}
	return false
}

// unescapeLenient decodes every well-formed %XX in s and keeps any other
// '%' as it is: one bad escape must not hide the others.
func unescapeLenient(s string) string {
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				b = append(b, byte(v))
				i += 2
				continue
			}
		}
		b = append(b, s[i])
	}
	return string(b)
}

// containsFold reports whether s holds sub (lower case) in any case.
func containsFold(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if strings.EqualFold(s[i:i+len(sub)], sub) {
			return true
		}
	}
	return false
}

// connectLineCheck refuses a CONNECT head line that carries the
// placeholder.
func connectLineCheck(line string) error {
	if lineMisplaces(line) {
		return placeholderDenial("in a CONNECT head")
	}
	return nil
}

// placeholderDenial is the refusal of a request that carries the
// placeholder where no route reads it.
func placeholderDenial(where string) error {
	return record.Deny(record.ReasonPlaceholderMisused, "the request carries the gateway's placeholder credential %s; send it only in the header of its own route ($TRIALNET_GATEWAY/route/), where the gateway replaces it", where)
}

// gatewayOutgoing points the upstream request of a gateway request at
// its route: https, the path after the route's prefix, and the route's
// header holding the secret instead of whatever the Trial sent in it.
func (h *httpConn) gatewayOutgoing(out *http.Request, in *url.URL) {
	r := h.route
	out.URL.Scheme = "https"
	out.URL.Path = "/" + strings.TrimPrefix(in.Path, r.Path)
	if in.RawPath != "" {
		out.URL.RawPath = "/" + strings.TrimPrefix(in.RawPath, r.Path)
	}
	if r.Port != 443 {
		out.Host = out.URL.Host
	} else {
		out.Host = r.Host
	}
	// The Trial's route field and gatewayRequestFields are dropped in any
	// spelling with '_' for '-' too: an upstream that reads fields as CGI
	// variables (HTTP_X_API_KEY, HTTP_ACCEPT_CHARSET) takes it for the
	// field, beside the secret or in its place, or as the charset asked.
	field := strings.ReplaceAll(r.Header, "_", "-")
	for name := range out.Header {
		n := strings.ReplaceAll(name, "_", "-")
		if strings.EqualFold(n, field) || slices.ContainsFunc(gatewayRequestFields, func(f string) bool { return strings.EqualFold(n, f) }) {
			delete(out.Header, name)
		}
	}
	// No field would leave any coding acceptable (RFC 9110 12.5.3).
	out.Header.Set("Accept-Encoding", "identity")
	for i, v := range out.Header["Accept"] {
		out.Header["Accept"][i] = withoutCharset(v)
	}
	out.Header.Set(r.Header, r.value())
}

// withoutCharset is an Accept value without its charset parameters,
// which ask for the answer in that charset as Accept-Charset does; its
// media ranges and other parameters are kept, and a value naming no
// charset is kept as it is.
func withoutCharset(v string) string {
	if !containsFold(v, "charset") {
		return v
	}
	ranges := strings.Split(v, ",")
	for i, mr := range ranges {
		params := strings.Split(mr, ";")
		kept := params[:1]
		for _, p := range params[1:] {
			key, _, _ := strings.Cut(p, "=")
			if !strings.EqualFold(strings.TrimSuffix(strings.TrimSpace(key), "*"), "charset") {
				kept = append(kept, p)
			}
		}
		ranges[i] = strings.Join(kept, ";")
	}
	return strings.Join(ranges, ",")
}

// boundedBody refuses a body past n bytes.
type boundedBody struct {
	r io.Reader
	n int64
}

func (b *boundedBody) Read(p []byte) (int, error) {
	if b.n < 0 {
		return 0, record.Deny(record.ReasonBodyTooLarge, "a gateway request body over %d bytes", maxGatewayBody)
	}
	if int64(len(p)) > b.n+1 {
		p = p[:b.n+1]
	}
	n, err := b.r.Read(p)
	b.n -= int64(n)
	if b.n < 0 {
		return 0, record.Deny(record.ReasonBodyTooLarge, "a gateway request body over %d bytes", maxGatewayBody)
	}
	return n, err
}

// dialTLS is the gateway Transport's way to an https upstream: the
// checked dial of the request being served (dial), then TLS with the
// route's name verified against the Trial's trust store.
func (h *httpConn) dialTLS(ctx context.Context, network, addr string) (net.Conn, error) {
	f, _ := ctx.Value(fwdKey{}).(*fwdReq)
	if f == nil || !f.req.TLS || h.t.gwTLS == nil {
		return nil, record.Deny(record.ReasonPolicyDenied, "TLS to %q outside a gateway request", wire.Truncate(addr))
	}
	c, err := h.dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	tc := c.(*trackedConn)
	cfg := h.t.gwTLS.Clone()
	cfg.ServerName = f.req.Host
	conn := tls.Client(tc.Conn, cfg)
	hctx, cancel := context.WithTimeout(ctx, h.p.cfg.TLSTimeout)
	defer cancel()
	if err := conn.HandshakeContext(hctx); err != nil {
		_ = tc.Close()
		return nil, &record.Denial{Reason: record.ReasonUpstreamTLS, Detail: fmt.Sprintf("TLS with %s: %v", f.req.HostPort(), err), Err: err}
	}
	tc.raw, tc.Conn = tc.Conn, conn
	return tc, nil
}
