// Package record is trialnet's decision record: the Event every request
// ends in, its JSON codec and schemas, the reasons a request is refused
// for, the per-Trial counters, the Gate that bounds what one Trial may
// write, and the JSONL writer and reader of decision logs.
package record

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
)

// Reason is the stable, machine-readable cause of a decision. It is sent
// in the Trialnet-Reason response header and recorded in the decision
// event, so a runner can tell a refused request from a broken network.
type Reason string

// Reasons. Their spelling is an interface: never change one.
const (
	ReasonAllowed Reason = "allowed"

	// The request itself.
	ReasonMethodNotAllowed Reason = "method_not_allowed" // not CONNECT or a forwarded method
	// An https:// URL in absolute form: HTTPS goes through CONNECT.
	ReasonHTTPSNeedsConnect Reason = "https_needs_connect"
	ReasonBadRequest        Reason = "bad_request"       // malformed HTTP
	ReasonBadVersion        Reason = "bad_version"       // not HTTP/1.0 or HTTP/1.1
	ReasonBadTarget         Reason = "bad_target"        // not a clean host:port authority
	ReasonIPLiteral         Reason = "ip_literal"        // an address in any spelling instead of a name
	ReasonBadPort           Reason = "bad_port"          // port not a number in 1-65535
	ReasonRequestTooLarge   Reason = "request_too_large" // request line or header block over the limit
	ReasonTooManyHeaders    Reason = "too_many_headers"
	ReasonHeaderTimeout     Reason = "header_timeout" // the head did not arrive in time (slowloris)

	// Policy and DNS.
	ReasonPolicyDenied Reason = "policy_denied" // host:port is not on the Trial's allowlist
	// A transparent connection to a pool address the Trial's DNS stub
	// never handed out: it names nothing the allowlist could judge.
	ReasonUnknownAddress Reason = "unknown_address"
	// Plain HTTP on a transparent connection whose Host (or absolute
	// target) names another host than the address was handed out for.
	ReasonHostMismatch   Reason = "host_mismatch"
	ReasonAddressDenied  Reason = "address_denied"   // an answer is loopback, private, metadata, ...
	ReasonDNSNXDomain    Reason = "dns_nxdomain"     // the name does not exist
	ReasonDNSFailed      Reason = "dns_failed"       // SERVFAIL, REFUSED, timeout, unreachable resolver
	ReasonDNSNoAddresses Reason = "dns_no_addresses" // the name exists but has no A/AAAA

	// Upstream.
	ReasonUpstreamUnreachable Reason = "upstream_unreachable"
	ReasonUpstreamTimeout     Reason = "upstream_timeout"
	// A forwarded request's upstream closed or spoke malformed HTTP
	// before its response head.
	ReasonUpstreamBadResponse Reason = "upstream_bad_response"
	// The configured upstream proxy answered a CONNECT with other than
	// 2xx (407: its credentials; 403: its own policy; 502: its next hop).
	ReasonUpstreamProxyRefused Reason = "upstream_proxy_refused"

	// Limits and lifecycle.
	ReasonTunnelLimit Reason = "tunnel_limit" // the Trial's concurrent tunnel limit
	ReasonRateLimited Reason = "rate_limited" // the Trial's CONNECT rate limit
	ReasonGlobalLimit Reason = "global_limit" // the proxy-wide connection limit
	// The Trial's client connections of every kind (Limits.MaxClientConns).
	ReasonTrialConnLimit Reason = "trial_connection_limit"
	// The Trial's connections still sending their request head
	// (Limits.MaxPendingHeads).
	ReasonPendingHeadLimit Reason = "pending_head_limit"
	ReasonShutdown         Reason = "shutting_down"

	// TLS checks on the first bytes through an allowed tunnel.
	ReasonSNIMismatch  Reason = "sni_mismatch"  // ClientHello names another host (domain fronting)
	ReasonSNIMissing   Reason = "sni_missing"   // ClientHello names no host
	ReasonTLSMalformed Reason = "tls_malformed" // not a well-formed ClientHello
	ReasonTLSRequired  Reason = "tls_required"  // require_tls and the first bytes are not TLS
	ReasonTLSECH       Reason = "tls_ech"       // encrypted ClientHello: the real name cannot be checked
	// A TLS stream whose first records are not the ClientHello's: an
	// alert, change_cipher_spec, application data or an empty handshake
	// record before the ClientHello is complete (a way around the name
	// check if the upstream skips them).
	ReasonTLSRecordBeforeHello Reason = "tls_record_before_hello"
	ReasonTLSSSLv2             Reason = "tls_sslv2" // an SSLv2-style ClientHello, which carries no server name

	// The credential gateway (docs/gateway.md).
	ReasonGatewayNoRoute Reason = "gateway_no_route" // the path is under no route of the Trial's
	// The gateway's placeholder credential anywhere but the header of
	// the route it was sent to: a client configured to send its key
	// somewhere else.
	ReasonPlaceholderMisused Reason = "placeholder_misused"
	ReasonBodyTooLarge       Reason = "request_body_too_large" // a gateway request body over its bound
	// The gateway's TLS connection to the route's upstream failed: its
	// certificate did not verify, or the handshake did not complete.
	ReasonUpstreamTLS Reason = "upstream_tls_failed"
)

// reasonInfo is how a refusal is answered: its HTTP status (a number:
// record links no net/http, which trialnet-oci, on every container's
// start path, would pay for in initialisation) and its RFC 9209 Proxy-Status error type; and whether the request was charged to
// the CONNECT rate before it was decided (so its record is bounded by
// that rate) or its record is charged to the record rate instead.
type reasonInfo struct {
	status     int
	proxyError string
	charged    bool
}

// reasons is the one table of every reason's answer. A reason missing
// here is answered 503 proxy_internal_error; TestReasonTable keeps it
// complete. Built at its first use, by the first refusal: a package-level
// map is built by every start of the binary.
var reasons = sync.OnceValue(func() map[Reason]reasonInfo {
	return map[Reason]reasonInfo{
		ReasonAllowed: {200, "", true},

		ReasonMethodNotAllowed:  {405, "http_request_denied", false},
		ReasonHTTPSNeedsConnect: {400, "http_request_denied", false},
		ReasonBadRequest:        {400, "http_request_error", false},
		ReasonBadVersion:        {505, "http_request_error", false},
		ReasonBadTarget:         {400, "http_request_error", false},
		ReasonIPLiteral:         {403, "destination_ip_prohibited", true}, // charged where it is decided (chargeRefusal)
		ReasonBadPort:           {400, "http_request_error", false},
		ReasonRequestTooLarge:   {431, "http_request_error", false},
		ReasonTooManyHeaders:    {431, "http_request_error", false},
		ReasonHeaderTimeout:     {408, "http_request_error", false},

		ReasonPolicyDenied:        {403, "http_request_denied", true},
		ReasonUnknownAddress:      {403, "destination_ip_prohibited", false},
		ReasonHostMismatch:        {403, "http_request_denied", true}, // charged where it is decided (chargeRefusal)
		ReasonAddressDenied:       {403, "destination_ip_prohibited", true},
		ReasonDNSNXDomain:         {502, "dns_error", true},               // rcode="NXDOMAIN"
		ReasonDNSFailed:           {502, "dns_error", true},               // with the rcode, or dns_timeout
		ReasonDNSNoAddresses:      {502, "dns_error", true},               // rcode="NOERROR": no A/AAAA
		ReasonUpstreamUnreachable: {502, "destination_unavailable", true}, // connection_refused when it was
		ReasonUpstreamTimeout:     {504, "connection_timeout", true},
		ReasonUpstreamBadResponse: {502, "http_response_incomplete", true},
		// RFC 9209 has no "next proxy refused"; it is the destination that
		// is unavailable through it.
		ReasonUpstreamProxyRefused: {502, "destination_unavailable", true},

		ReasonTunnelLimit:      {429, "connection_limit_reached", true},
		ReasonRateLimited:      {429, "connection_limit_reached", false},
		ReasonGlobalLimit:      {503, "connection_limit_reached", false},
		ReasonTrialConnLimit:   {429, "connection_limit_reached", false},
		ReasonPendingHeadLimit: {429, "connection_limit_reached", false},
		ReasonShutdown:         {503, "proxy_internal_response", true},

		// Decided after the 200 and answered with a TLS alert, not HTTP; the
		// error type is recorded for completeness.
		ReasonSNIMismatch:          {403, "http_request_denied", true},
		ReasonSNIMissing:           {403, "http_request_denied", true},
		ReasonTLSMalformed:         {400, "tls_protocol_error", true},
		ReasonTLSRequired:          {403, "http_request_denied", true},
		ReasonTLSECH:               {403, "http_request_denied", true},
		ReasonTLSRecordBeforeHello: {400, "tls_protocol_error", true},
		ReasonTLSSSLv2:             {400, "tls_protocol_error", true},

		ReasonGatewayNoRoute:     {404, "http_request_denied", true}, // charged where it is decided (chargeRefusal)
		ReasonPlaceholderMisused: {403, "http_request_denied", true}, // charged where it is decided (chargeRefusal)
		ReasonBodyTooLarge:       {413, "http_request_error", true},
		ReasonUpstreamTLS:        {502, "tls_certificate_error", true},
	}
})

func (r Reason) info() reasonInfo {
	if i, ok := reasons()[r]; ok {
		return i
	}
	return reasonInfo{503, "proxy_internal_error", false}
}

// Decision is the decision a reason belongs to: allow for ReasonAllowed,
// deny for every other.
func (r Reason) Decision() Decision {
	if r == ReasonAllowed {
		return DecisionAllow
	}
	return DecisionDeny
}

// Status is the HTTP status a refusal is answered with.
func (r Reason) Status() int { return r.info().status }

// Charged reports whether a request refused for r was charged to the
// CONNECT rate before it was decided (see the table).
func (r Reason) Charged() bool { return r.info().charged }

// ProxyError is r's RFC 9209 Proxy-Status error type.
func (r Reason) ProxyError() string { return r.info().proxyError }

// Denial is a refusal with its reason and a human-readable detail. Every
// refusal the proxy makes is a *Denial; test with errors.As.
type Denial struct {
	Reason Reason
	Detail string
	Err    error // the underlying error, if any

	DNS DNSFailure // what DNS said, for Proxy-Status
}

// DNSFailure is what a failed lookup reports in Proxy-Status: the
// response code, or that no answer came in time.
type DNSFailure struct {
	Rcode   string // "SERVFAIL", "REFUSED", ...
	Timeout bool
}

func (d *Denial) Error() string {
	if d.Detail == "" {
		return string(d.Reason)
	}
	return string(d.Reason) + ": " + d.Detail
}

func (d *Denial) Unwrap() error { return d.Err }

func Deny(r Reason, format string, args ...any) *Denial {
	return &Denial{Reason: r, Detail: fmt.Sprintf(format, args...)}
}

// ReasonOf returns the reason carried by err, or "" if err is not a denial.
func ReasonOf(err error) Reason {
	var d *Denial
	if errors.As(err, &d) {
		return d.Reason
	}
	return ""
}

// ProxyStatus is the RFC 9209 Proxy-Status field value for the refusal:
// "trialnet; error=TYPE", the type's parameters (rcode for dns_error),
// and the detail as details, all in structured-field syntax (RFC 8941).
func (d *Denial) ProxyStatus() string {
	typ := d.Reason.info().proxyError
	var params [][2]string
	switch d.Reason {
	case ReasonDNSNXDomain:
		params = append(params, [2]string{"rcode", "NXDOMAIN"})
	case ReasonDNSNoAddresses:
		params = append(params, [2]string{"rcode", "NOERROR"})
	case ReasonDNSFailed:
		if d.DNS.Timeout {
			typ = "dns_timeout"
		} else if d.DNS.Rcode != "" {
			params = append(params, [2]string{"rcode", d.DNS.Rcode})
		}
	case ReasonUpstreamUnreachable:
		if errors.Is(d.Err, syscall.ECONNREFUSED) {
			typ = "connection_refused"
		}
	}
	var b strings.Builder
	b.WriteString("trialnet")
	if typ != "" {
		b.WriteString("; error=" + typ)
	}
	for _, p := range params {
		b.WriteString("; " + p[0] + "=" + sfString(p[1]))
	}
	if d.Detail != "" {
		b.WriteString("; details=" + sfString(d.Detail))
	}
	return b.String()
}

// sfString quotes s as a structured-field sf-string (RFC 8941 3.3.3):
// '"' and '\' escaped with a backslash; bytes outside printable ASCII,
// which an sf-string cannot hold, become '?'.
func sfString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
