//go:build linux

package proxy

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	trialspec "github.com/trialnet/trialnet/trial"
)

// BenchmarkGatewayVsDirectTLS is one small Messages request through a
// gateway route against the same request made directly over TLS to the
// same loopback upstream: "reuse" keeps the client's connection (and the
// gateway its upstream one), "fresh" opens a new one each time (so the
// gateway does its DNS, guard, dial and TLS handshake each time, as the
// direct client does its handshake).
func BenchmarkGatewayVsDirectTLS(b *testing.B) {
	g := newGatewayWorldLimits(b, withCA, &trialspec.ProxyLimits{ConnectRate: 1e9, ConnectBurst: 1 << 30, MaxTunnels: 1 << 20,
		MaxClientConns: 1 << 20, MaxPendingHeads: 1 << 20, RecordRate: 1e9, RecordBurst: 1 << 30})
	go func() {
		for range g.lines {
		}
	}()
	go func() {
		for range g.tp.events {
		}
	}()
	body := `{"model":"m","stream":false,"messages":[]}`
	direct := func(reuse bool) *http.Client {
		return &http.Client{Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: withCA(g.ca), ServerName: gwHost}, DisableKeepAlives: !reuse,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", g.upTLS)
			}}}
	}
	gateway := func(reuse bool) *http.Client {
		return &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: !reuse}}
	}
	for _, c := range []struct {
		name   string
		client func(bool) *http.Client
		url    string
		header string
	}{
		{"direct", direct, "https://" + gwHost + "/v1/messages", gwSecret},
		{"gateway", gateway, "http://" + g.addr + "/a/v1/messages", GatewayPlaceholder},
	} {
		for _, reuse := range []bool{true, false} {
			name := c.name + "/fresh"
			if reuse {
				name = c.name + "/reuse"
			}
			b.Run(name, func(b *testing.B) {
				cl := c.client(reuse)
				defer cl.CloseIdleConnections()
				for range b.N {
					req, _ := http.NewRequest(http.MethodPost, c.url, strings.NewReader(body))
					req.Header.Set("X-Api-Key", c.header)
					resp, err := cl.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						b.Fatalf("status %d (%s)", resp.StatusCode, resp.Header.Get("Trialnet-Reason"))
					}
				}
			})
		}
	}
}
