package config

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/trial"
)

// A profile's host services become allowlist entries for
// host.trialnet.internal and the Trial's HostServices; bad ones, and two
// profiles that give one port two addresses, are refused.
func TestHostServices(t *testing.T) {
	f, err := ParseFile([]byte(`
profiles:
  db:
    host_services:
      - port: 5432
  model:
    allow: [api.example.com:443]
    host_services:
      - {port: 11434, address: "::1"}
  otherdb:
    allow: [a.example.com:443]
    host_services:
      - {port: 5432, address: 10.0.0.5}
`))
	if err != nil {
		t.Fatal(err)
	}
	spec, list, err := f.Spec(trial.Request{Profiles: []string{"db", "model"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []trial.HostService{{Port: 5432, Address: netip.MustParseAddr("127.0.0.1")}, {Port: 11434, Address: netip.MustParseAddr("::1")}}
	if len(spec.HostServices) != 2 || spec.HostServices[0] != want[0] || spec.HostServices[1] != want[1] {
		t.Fatalf("host services %v, want %v", spec.HostServices, want)
	}
	for _, e := range []string{"host.trialnet.internal:5432", "host.trialnet.internal:11434"} {
		i := strings.LastIndexByte(e, ':')
		if _, ok := list.Match(e[:i], map[string]uint16{"5432": 5432, "11434": 11434}[e[i+1:]]); !ok {
			t.Errorf("%s is not on the allowlist", e)
		}
	}
	if _, ok := list.Match("host.trialnet.internal", 22); ok {
		t.Error("another port of the host service name is on the allowlist")
	}
	if _, _, err := f.Spec(trial.Request{Profiles: []string{"db", "otherdb"}}, nil); err == nil || !strings.Contains(err.Error(), "different addresses") {
		t.Fatalf("two addresses for one port: %v", err)
	}
	for _, bad := range []string{
		"profiles: {p: {host_services: [{port: 0}]}}",
		"profiles: {p: {host_services: [{port: 70000}]}}",
		"profiles: {p: {host_services: [{port: 80, address: 0.0.0.0}]}}",
		"profiles: {p: {host_services: [{port: 80, address: '::ffff:127.0.0.1'}]}}",
		"profiles: {p: {host_services: [{port: 80, address: 'fe80::1%eth0'}]}}",
		"profiles: {p: {host_services: [{port: 80, address: localhost}]}}",
		"profiles: {p: {host_services: [{port: 80}, {port: 80}]}}",
		"profiles: {p: {host_services: [{port: 80, host: x}]}}",
		"profiles: {p: {allow: [host.trialnet.internal:80]}}",
	} {
		if _, err := ParseFile([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
}

func TestUpstreamProxyConfig(t *testing.T) {
	f, err := ParseFile([]byte(`
upstream_proxy:
  address: proxy.corp.example:3128
  direct: [registry.corp.example, "*.git.corp.example", 10.0.0.0/8]
  resolve: local
`))
	if err != nil {
		t.Fatal(err)
	}
	s, err := f.ProxySettings(nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.Upstream == nil || s.Upstream.Address() != "proxy.corp.example:3128" || !s.Upstream.ResolvesLocally() || !s.Upstream.DirectName("a.git.corp.example") {
		t.Fatalf("upstream %+v", s.Upstream)
	}
	if s, _ := (&File{}).ProxySettings(nil, nil, nil); s.Upstream != nil {
		t.Fatal("an upstream proxy without configuration")
	}
	for _, bad := range []string{
		"upstream_proxy: {address: proxy.corp.example}",
		"upstream_proxy: {address: 'p:1', resolve: remote}",
		"upstream_proxy: {address: 'p:1', user: x}",
		"upstream_proxy: {address: 'p:1', credentials_file: relative}",
	} {
		if _, err := ParseFile([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", bad)
		}
	}
	f, err = ParseFile([]byte("upstream_proxy: {address: 'p.example:1', credentials_file: /nonexistent/cred}"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.ProxySettings(nil, nil, nil); err == nil || !strings.Contains(err.Error(), "credentials_file") {
		t.Fatalf("an unreadable credentials file: %v", err)
	}
}
