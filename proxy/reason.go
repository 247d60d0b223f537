// Package proxy is trialnet's allowlisting HTTP CONNECT proxy: it checks
// the requested name against a Trial's allowlist before any DNS, checks
// every resolved address, dials only the addresses it checked, and relays
// the tunnel like TCP (half-close, no idle timeout). One Proxy serves many
// Trials; every listener belongs to one Trial and every decision names it.
package proxy

import (
	"errors"
	"fmt"
	"net/http"
)

// Reason is the stable, machine-readable cause of a decision. It is sent
// in the Trialnet-Reason response header and recorded in the decision
// event, so a runner can tell a refused request from a broken network.
type Reason string

// Reasons. Their spelling is an interface: never change one.
const (
	ReasonAllowed Reason = "allowed"

	// The request itself.
	ReasonMethodNotAllowed Reason = "method_not_allowed" // not CONNECT
	ReasonBadRequest       Reason = "bad_request"        // malformed HTTP
	ReasonBadVersion       Reason = "bad_version"        // not HTTP/1.0 or HTTP/1.1
	ReasonBadTarget        Reason = "bad_target"         // not a clean host:port authority
	ReasonIPLiteral        Reason = "ip_literal"         // an address in any spelling instead of a name
	ReasonBadPort          Reason = "bad_port"           // port not a number in 1-65535
	ReasonRequestTooLarge  Reason = "request_too_large"  // request line or header block over the limit
	ReasonTooManyHeaders   Reason = "too_many_headers"
	ReasonHeaderTimeout    Reason = "header_timeout" // the head did not arrive in time (slowloris)

	// Policy and DNS.
	ReasonPolicyDenied   Reason = "policy_denied"    // host:port is not on the Trial's allowlist
	ReasonAddressDenied  Reason = "address_denied"   // an answer is loopback, private, metadata, ...
	ReasonDNSNXDomain    Reason = "dns_nxdomain"     // the name does not exist
	ReasonDNSFailed      Reason = "dns_failed"       // SERVFAIL, REFUSED, timeout, unreachable resolver
	ReasonDNSNoAddresses Reason = "dns_no_addresses" // the name exists but has no A/AAAA

	// Upstream.
	ReasonUpstreamUnreachable Reason = "upstream_unreachable"
	ReasonUpstreamTimeout     Reason = "upstream_timeout"

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
)

// status is the HTTP status a refusal is answered with.
func (r Reason) status() int {
	switch r {
	case ReasonMethodNotAllowed:
		return http.StatusMethodNotAllowed
	case ReasonBadRequest, ReasonBadTarget, ReasonBadPort:
		return http.StatusBadRequest
	case ReasonBadVersion:
		return http.StatusHTTPVersionNotSupported
	case ReasonRequestTooLarge, ReasonTooManyHeaders:
		return http.StatusRequestHeaderFieldsTooLarge
	case ReasonHeaderTimeout:
		return http.StatusRequestTimeout
	case ReasonIPLiteral, ReasonPolicyDenied, ReasonAddressDenied:
		return http.StatusForbidden
	case ReasonDNSNXDomain, ReasonDNSFailed, ReasonDNSNoAddresses, ReasonUpstreamUnreachable:
		return http.StatusBadGateway
	case ReasonUpstreamTimeout:
		return http.StatusGatewayTimeout
	case ReasonTunnelLimit, ReasonRateLimited, ReasonTrialConnLimit, ReasonPendingHeadLimit:
		return http.StatusTooManyRequests
	default:
		return http.StatusServiceUnavailable
	}
}

// Denial is a refusal with its reason and a human-readable detail. Every
// refusal the proxy makes is a *Denial; test with errors.As.
type Denial struct {
	Reason Reason
	Detail string
	Err    error // the underlying error, if any
}

func (d *Denial) Error() string {
	if d.Detail == "" {
		return string(d.Reason)
	}
	return string(d.Reason) + ": " + d.Detail
}

func (d *Denial) Unwrap() error { return d.Err }

func deny(r Reason, format string, args ...any) *Denial {
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
