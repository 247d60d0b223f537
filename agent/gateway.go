//go:build linux

package agent

import (
	"crypto/x509"
	"fmt"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/proxy"
	trialspec "github.com/trialnet/trialnet/trial"
)

// trialInfo is a Trial's description as the API gives it, with where
// its proxy and its credential gateway (if it has routes) are.
func trialInfo(spec trialspec.Spec) client.TrialInfo {
	info := client.TrialInfo{Spec: spec, ProxyURL: ProxyURL}
	if len(spec.Gateway) > 0 {
		info.GatewayURL = ProxyURL // the endpoint serves the routes' paths
	}
	return info
}

// gatewayRoutes reads the secret of each of a Trial's gateway routes and
// the trust store their upstreams are verified against. The secrets stay
// in this process: none is written to a record, a description or an
// error.
func gatewayRoutes(routes []trialspec.GatewayRoute) ([]proxy.GatewayRoute, *x509.CertPool, error) {
	if len(routes) == 0 {
		return nil, nil, nil
	}
	roots, _, err := config.TrustStore()
	if err != nil {
		return nil, nil, fmt.Errorf("credential gateway: %w", err)
	}
	out := make([]proxy.GatewayRoute, 0, len(routes))
	for _, r := range routes {
		up, err := config.ParseUpstream(r.Upstream)
		if err != nil {
			return nil, nil, fmt.Errorf("credential gateway route %s: %w", r.Path, err)
		}
		secret, err := config.ReadSecret(r.SecretFile)
		if err != nil {
			return nil, nil, fmt.Errorf("credential gateway route %s: %w", r.Path, err)
		}
		out = append(out, proxy.GatewayRoute{Path: r.Path, Host: up.Host, Port: up.Port, Header: r.Header, Secret: secret})
	}
	return out, roots, nil
}

// GatewayChecks are the doctor's lines for the credential gateway routes
// f configures: each secret file readable and safe as the agent requires
// it, and the trust store the upstreams are verified against. None when
// f configures no route; none is required to enforce a Trial, but a
// Trial whose profile has a failing route cannot be created.
func GatewayChecks(f *config.File) []bpf.Check {
	var checks []bpf.Check
	for _, name := range f.ProfileNames() {
		for _, r := range f.Profiles[name].Gateway {
			_, err := config.ReadSecret(r.SecretFile)
			checks = append(checks, bpf.Check{Name: fmt.Sprintf("credential gateway %s %s: secret file %s (root's alone)", name, r.Path, r.SecretFile), Err: err})
		}
	}
	if len(checks) == 0 {
		return nil
	}
	_, where, err := config.TrustStore()
	name := "credential gateway trust store (SSL_CERT_FILE, SSL_CERT_DIR or the system's)"
	if err == nil {
		name = "credential gateway trust store: " + where
	}
	return append(checks, bpf.Check{Name: name, Err: err})
}
