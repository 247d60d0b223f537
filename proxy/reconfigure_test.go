//go:build linux

package proxy

import (
	"net/http"
	"net/netip"
	"testing"

	trialspec "github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/resolve"
)

// Reconfigure applies to Trials added after it; a Trial added before
// keeps the allowed CIDRs, resolver and limits it was added with.
func TestReconfigureAppliesToNewTrialsOnly(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{allow: []string{"lan.example.test:443"}})
	tp.dns.set("lan.example.test.", 60, "10.1.2.3")
	other := newDNSServer(t)
	other.set("lan.example.test.", 60, "10.9.9.9")
	res, err := resolve.NewDNSResolver([]string{other.Addr})
	if err != nil {
		t.Fatal(err)
	}
	tp.Reconfigure(config.ProxySettings{AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Resolver: res, Limits: trialspec.ProxyLimits{MaxTunnels: 1}})
	after := tp.addTrial(t, "t2", "lan.example.test:443")

	tests := []struct {
		name   string
		tp     *testProxy
		status int
		reason record.Reason
		dialed string
	}{
		{"added before: old CIDRs", tp, http.StatusForbidden, record.ReasonAddressDenied, ""},
		{"added after: new CIDRs and resolver", after, http.StatusOK, record.ReasonAllowed, "10.9.9.9:443"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, c, _ := tc.tp.connect(t, connectHead("lan.example.test:443"))
			_ = c.Close() // an allowed tunnel's event comes when it closes
			ev := tc.tp.event(t)
			if resp.StatusCode != tc.status || ev.Reason != tc.reason {
				t.Fatalf("status %d reason %s, want %d %s", resp.StatusCode, ev.Reason, tc.status, tc.reason)
			}
			if tc.dialed != "" && ev.Dialed.String() != tc.dialed {
				t.Fatalf("dialed %s, want %s (the new resolver's answer)", ev.Dialed, tc.dialed)
			}
		})
	}
	// The new default limits reached the new Trial only.
	_, c1, _ := after.connect(t, connectHead("lan.example.test:443"))
	defer c1.Close()
	if resp, c2, _ := after.connect(t, connectHead("lan.example.test:443")); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second tunnel of the new Trial: %d, want 429 (max_tunnels 1)", resp.StatusCode)
	} else {
		_ = c2.Close()
	}
}
