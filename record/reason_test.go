package record

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"strings"
	"syscall"
	"testing"
)

// rfc9209Errors are the proxy error types registered by RFC 9209.
var rfc9209Errors = map[string]bool{
	"dns_timeout": true, "dns_error": true, "destination_not_found": true, "destination_unavailable": true,
	"destination_ip_prohibited": true, "destination_ip_unroutable": true, "connection_refused": true,
	"connection_terminated": true, "connection_timeout": true, "connection_read_timeout": true,
	"connection_write_timeout": true, "connection_limit_reached": true, "tls_protocol_error": true,
	"tls_certificate_error": true, "tls_alert_received": true, "http_request_error": true,
	"http_request_denied": true, "http_response_incomplete": true, "http_response_header_section_size": true,
	"http_response_header_size": true, "http_response_body_size": true, "http_response_trailer_section_size": true,
	"http_response_trailer_size": true, "http_response_transfer_coding": true, "http_response_content_coding": true,
	"http_response_timeout": true, "http_upgrade_failed": true, "http_protocol_error": true,
	"proxy_internal_response": true, "proxy_internal_error": true, "proxy_configuration_error": true,
	"proxy_loop_detected": true,
}

// TestReasonTable finds every Reason constant in reason.go and checks it
// has a row in the one table, with a status and a registered error type.
func TestReasonTable(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "reason.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || vs.Type == nil {
			return true
		}
		if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Reason" {
			return true
		}
		for i, name := range vs.Names {
			lit := vs.Values[i].(*ast.BasicLit)
			r := Reason(strings.Trim(lit.Value, `"`))
			found++
			info, ok := reasons()[r]
			switch {
			case !ok:
				t.Errorf("%s (%q) has no row in the reason table", name.Name, r)
			case r == ReasonAllowed:
				if info.status != http.StatusOK || info.proxyError != "" {
					t.Errorf("allowed: %+v", info)
				}
			case info.status < 400 || !rfc9209Errors[info.proxyError]:
				t.Errorf("%s: status %d, error type %q is not a refusal with a registered type", r, info.status, info.proxyError)
			}
		}
		return true
	})
	if found < 30 || found != len(reasons()) {
		t.Fatalf("found %d Reason constants, the table has %d rows", found, len(reasons()))
	}
}

func TestProxyStatus(t *testing.T) {
	for _, c := range []struct {
		d    *Denial
		want string
	}{
		{Deny(ReasonPolicyDenied, `evil.example:443 is "not" allowed \ here`), `trialnet; error=http_request_denied; details="evil.example:443 is \"not\" allowed \\ here"`},
		{Deny(ReasonAddressDenied, "x resolves to 127.0.0.1\r\nX: é"), `trialnet; error=destination_ip_prohibited; details="x resolves to 127.0.0.1??X: ??"`},
		{Deny(ReasonDNSNXDomain, ""), `trialnet; error=dns_error; rcode="NXDOMAIN"`},
		{&Denial{Reason: ReasonDNSFailed, DNS: DNSFailure{Rcode: "REFUSED"}}, `trialnet; error=dns_error; rcode="REFUSED"`},
		{&Denial{Reason: ReasonDNSFailed, DNS: DNSFailure{Timeout: true}}, `trialnet; error=dns_timeout`},
		{&Denial{Reason: ReasonUpstreamUnreachable, Err: errors.Join(errors.New("x"), syscall.ECONNREFUSED)}, `trialnet; error=connection_refused`},
		{&Denial{Reason: ReasonUpstreamUnreachable, Err: syscall.EHOSTUNREACH}, `trialnet; error=destination_unavailable`},
		{Deny(ReasonGlobalLimit, ""), `trialnet; error=connection_limit_reached`},
	} {
		if got := c.d.ProxyStatus(); got != c.want {
			t.Errorf("ProxyStatus(%v)\n got %s\nwant %s", c.d, got, c.want)
		}
	}
}
