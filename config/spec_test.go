package config

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/trialnet/trialnet/trial"
)

// File.Spec makes a Trial's description from a request and the profiles
// it names: the profiles' entries, learning and nesting, the file's
// limits (the proxy's at their defaults) unless the request gives its
// own, and the request's process limit over both.
func TestSpecFromRequest(t *testing.T) {
	f, err := ParseFile([]byte(`profiles:
  learner: {learn: true, allow: [a.example.com:443]}
  nester: {nested: true, allow: [b.example.com:443]}
limits:
  max_tunnels: 9
  max_pids: 100
  max_processes: 50
`))
	if err != nil {
		t.Fatal(err)
	}
	cidrs := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	s, list, err := f.Spec(trial.Request{ID: "x", Profiles: []string{"learner", "nester"}, Allow: []string{"c.example.com:443"},
		Strict: true, UnixAllow: []string{"/run/s"}, Nonce: "n", Report: "/r"}, cidrs)
	if err != nil {
		t.Fatal(err)
	}
	if s.Schema != trial.Schema || s.ID != "x" || !s.Learning || !s.Nested || !s.Strict || s.Nonce != "n" || s.Report != "/r" ||
		!slices.Equal(s.UnixAllow, []string{"/run/s"}) || !slices.Equal(s.AllowCIDRs, cidrs) || s.Created.IsZero() {
		t.Errorf("spec: %+v", s)
	}
	if len(s.Allow) != 3 || len(list.Entries()) != 3 || s.Allow[0].Profile != "learner" {
		t.Errorf("allowlist: %+v (parsed %v)", s.Allow, list.Entries())
	}
	want := trial.Limits{ProxyLimits: trial.ProxyLimits{MaxTunnels: 9}.WithDefaults(), PoolLimits: trial.PoolLimits{MaxProcesses: 50, MaxPids: 100}}
	if *s.Limits != want {
		t.Errorf("limits %+v, want the file's %+v", *s.Limits, want)
	}

	own := trial.Limits{ProxyLimits: trial.ProxyLimits{MaxTunnels: 2}}
	s, _, err = f.Spec(trial.Request{ID: "y", Limits: &own, MaxProcesses: 7}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := (trial.Limits{ProxyLimits: trial.ProxyLimits{MaxTunnels: 2}, PoolLimits: trial.PoolLimits{MaxProcesses: 7}}); *s.Limits != want || s.Learning || s.Nested {
		t.Errorf("a request's own limits: %+v (learning %v, nested %v), want %+v", *s.Limits, s.Learning, s.Nested, want)
	}
	if _, _, err := f.Spec(trial.Request{ID: "z", Profiles: []string{"nope"}}, nil); !errors.Is(err, ErrUnknownProfile) {
		t.Errorf("an unknown profile: %v", err)
	}
	var none *File
	if s, _, err := none.Spec(trial.Request{ID: "w", Allow: []string{"d.example.com:443"}}, nil); err != nil || s.Limits.ProxyLimits != (trial.ProxyLimits{}).WithDefaults() {
		t.Errorf("no file: %+v, %v", s.Limits, err)
	}
}

// Transparent mode is on unless the request or one of its profiles
// turns it off; a profile that says nothing, or true, leaves it on.
func TestSpecTransparent(t *testing.T) {
	f, err := ParseFile([]byte(`profiles:
  plain: [a.example.com:443]
  on: {transparent: true, allow: [b.example.com:443]}
  off: {transparent: false, allow: [c.example.com:443]}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		req  trial.Request
		want bool
	}{
		{trial.Request{ID: "a"}, true},
		{trial.Request{ID: "b", Profiles: []string{"plain", "on"}}, true},
		{trial.Request{ID: "c", NoTransparent: true, Profiles: []string{"on"}}, false},
		{trial.Request{ID: "d", Profiles: []string{"on", "off"}}, false},
	} {
		s, _, err := f.Spec(c.req, nil)
		if err != nil {
			t.Fatal(err)
		}
		if s.Transparent != c.want {
			t.Errorf("%+v: transparent %v, want %v", c.req, s.Transparent, c.want)
		}
	}
	if s, _, err := (*File)(nil).Spec(trial.Request{ID: "e"}, nil); err != nil || !s.Transparent {
		t.Errorf("no config file: transparent %v (%v), want on", s.Transparent, err)
	}
	if _, err := ParseFile([]byte("profiles:\n  x: {transparent: maybe}\n")); err == nil {
		t.Error("transparent: maybe was accepted")
	}
}
