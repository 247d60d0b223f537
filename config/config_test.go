package config

import (
	"strings"
	"testing"
)

func TestExampleConfigAndProfiles(t *testing.T) {
	f, err := LoadFile("../examples/trialnet.yaml")
	if err != nil {
		t.Fatal(err)
	}
	a, err := f.Allowlist([]string{"claude"}, []string{"extra.example.com:443"}, false)
	if err != nil {
		t.Fatal(err)
	}
	if e, ok := a.Match("api.anthropic.com", 443); !ok || !e.RequireTLS {
		t.Fatalf("claude profile: %v %v", e, ok)
	}
	if e, ok := a.Match("extra.example.com", 443); !ok || e.RequireTLS {
		t.Fatalf("explicit entry: %v %v", e, ok)
	}
	if _, ok := a.Match("api.openai.com", 443); ok {
		t.Fatal("another profile's host leaked in")
	}
	if _, err := f.Allowlist([]string{"nosuch"}, nil, false); err == nil || !strings.Contains(err.Error(), "claude") {
		t.Fatalf("unknown profile: %v", err)
	}
	var none *File
	if _, err := none.Allowlist([]string{"claude"}, nil, false); err == nil {
		t.Fatal("a profile without a config file was accepted")
	}
}

func TestParseFileRefusals(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown key":         "profilez: {}\n",
		"unknown profile key": "profiles:\n  x:\n    allow: [a.example.com:443]\n    requiretls: true\n",
		"too broad":           "profiles:\n  x: ['*.com:443']\n",
		"empty profile":       "profiles:\n  x: []\n",
		"bad profile name":    "profiles:\n  X Y: [a.example.com:443]\n",
		"scalar profile":      "profiles:\n  x: a.example.com:443\n",
		"open CIDR":           "allow_cidrs: [0.0.0.0/0]\n",
		"loopback CIDR":       "allow_cidrs: [127.0.0.0/8]\n",
		"bad resolver":        "resolvers: [dns.google]\n",
		"negative limit":      "limits: {max_tunnels: -1}\n",
		"negative prepared":   "prepared: -1\n",
		// A NaN rate refused every CONNECT; an infinite one bounded none.
		"NaN rate":          "limits: {connects_per_second: .nan}\n",
		"infinite rate":     "limits: {connects_per_second: .inf}\n",
		"NaN records":       "limits: {records_per_second: .NaN}\n",
		"too many prepared": "prepared: 17\n",
		"not yaml":          "profiles: [\n",
		// Read by no one: the agent ran without what it says.
		"second document":     "profiles:\n  x: [a.example.com:443]\n---\nlimits: {max_tunnels: 4}\n",
		"bad second document": "profiles:\n  x: [a.example.com:443]\n---\nlimits: [\n",
		// Resolved against whatever directory trialnet starts in.
		"relative state_dir": "paths: {state_dir: state}\n",
		"relative socket":    "paths: {socket: ./agent.sock}\n",
	} {
		if _, err := ParseFile([]byte(doc)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if f, err := ParseFile(nil); err != nil || len(f.Profiles) != 0 {
		t.Fatalf("empty file: %v", err)
	}
}

// prepared: absent is the default, 0 is none.
func TestPreparedShells(t *testing.T) {
	for doc, want := range map[string]int{"": DefaultPrepared, "prepared: 0\n": 0, "prepared: 16\n": 16} {
		f, err := ParseFile([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		if got := f.PreparedShells(); got != want {
			t.Errorf("%q: %d shells, want %d", doc, got, want)
		}
	}
	var none *File
	if none.PreparedShells() != DefaultPrepared {
		t.Error("no file: not the default")
	}
}

// Entries remember the profile they came from: the first in name order
// when several list one, whatever the request's order; none when given
// directly.
func TestAllowlistEntryProfile(t *testing.T) {
	f, err := ParseFile([]byte(`profiles:
  zeta: ["shared.example.com:443", "z.example.com:443", "*.w.example.com:443"]
  alpha: ["shared.example.com:443", "*.w.example.com:443"]
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, order := range [][]string{{"zeta", "alpha"}, {"alpha", "zeta"}} {
		a, err := f.Allowlist(order, []string{"direct.example.com:443", "z.example.com:443"}, false)
		if err != nil {
			t.Fatal(err)
		}
		for host, want := range map[string]string{
			"shared.example.com": "alpha", "z.example.com": "zeta", "x.w.example.com": "alpha", "direct.example.com": "",
		} {
			if e, ok := a.Match(host, 443); !ok || e.Profile != want {
				t.Errorf("profiles %v: %s matched %+v, %v; want profile %q", order, host, e, ok, want)
			}
		}
		if n := len(a.Entries()); n != 4 {
			t.Errorf("profiles %v: %d entries, want 4 (merged): %v", order, n, a.Entries())
		}
	}
}

// Host facts in the config file are checked as the guard checks them.
func TestConfigHostFacts(t *testing.T) {
	if _, err := ParseFile([]byte("host_addresses: [203.0.113.9/32]\nnat64_prefixes: [\"2a01:4f8::/33\"]\n")); err == nil || !strings.Contains(err.Error(), "RFC 6052") {
		t.Fatalf("a /33 NAT64 prefix: %v", err)
	}
	f, err := ParseFile([]byte("host_addresses: [203.0.113.9/32, \"2a01:4f8::9/128\"]\nnat64_prefixes: [\"2a01:4f8:64::/96\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if hf := f.hostFacts(); len(hf.Addrs) != 2 || len(hf.NAT64) != 1 {
		t.Fatalf("read %+v", hf)
	}
}
