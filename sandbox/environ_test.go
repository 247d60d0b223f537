//go:build linux

package sandbox

import (
	"slices"
	"strings"
	"testing"
)

// A Trial's environment points every client at the proxy, whatever the
// caller had: inherited proxy settings are replaced, never merged, and
// no ALL_PROXY is set (there is no SOCKS listener).
func TestEnvironProxyConventions(t *testing.T) {
	c := Command{
		Env: []string{"PATH=/usr/bin", "HTTPS_PROXY=http://elsewhere:1", "all_proxy=socks5://x:1080",
			"ALL_PROXY=socks5://x:1080", "no_proxy=*", "NODE_USE_ENV_PROXY=0", "HOME=/tmp"},
		ProxyURL: "http://127.0.0.1:3128",
	}
	env := c.environ()
	want := []string{
		"PATH=/usr/bin", "HOME=/tmp",
		"HTTPS_PROXY=http://127.0.0.1:3128", "HTTP_PROXY=http://127.0.0.1:3128",
		"https_proxy=http://127.0.0.1:3128", "http_proxy=http://127.0.0.1:3128",
		"NO_PROXY=127.0.0.1,localhost,::1", "no_proxy=127.0.0.1,localhost,::1",
		"NODE_USE_ENV_PROXY=1",
	}
	if !slices.Equal(env, want) {
		t.Fatalf("environ:\n got %q\nwant %q", env, want)
	}
	for _, kv := range env {
		if strings.HasPrefix(strings.ToUpper(kv), "ALL_PROXY=") {
			t.Errorf("%s: no SOCKS listener exists", kv)
		}
	}
	// Without a proxy, inherited proxy settings still go.
	c.ProxyURL = ""
	if env := c.environ(); !slices.Equal(env, []string{"PATH=/usr/bin", "HOME=/tmp"}) {
		t.Errorf("without a proxy: %q", env)
	}
}

// TRIALNET_GATEWAY is the Trial's own or absent: an inherited one could
// point a Harness's credential somewhere else.
func TestEnvironGateway(t *testing.T) {
	c := Command{Env: []string{"TRIALNET_GATEWAY=http://evil:1", "HOME=/tmp"}}
	if env := c.environ(); !slices.Equal(env, []string{"HOME=/tmp"}) {
		t.Errorf("without a gateway: %q", env)
	}
	c.GatewayURL = "http://127.0.0.1:3128"
	if env := c.environ(); !slices.Equal(env, []string{"HOME=/tmp", "TRIALNET_GATEWAY=http://127.0.0.1:3128"}) {
		t.Errorf("with a gateway: %q", env)
	}
}
