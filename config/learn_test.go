//go:build linux

package config

import (
	"strings"
	"testing"

	"github.com/trialnet/trialnet/record"
)

// Learn, then Profile, then enforce: the profile allows what the records
// show was let through, under the TLS requirement it was let through
// with, never weaker.
func TestLearnedProfileKeepsRequireTLS(t *testing.T) {
	allow := func(host string, port uint16, tls bool) record.Event {
		return record.Event{Trial: "t1", Decision: record.DecisionAllow, Reason: record.ReasonAllowed, Host: host, Port: port, RequireTLS: tls}
	}
	for _, c := range []struct {
		name     string
		recs     []record.Event
		profiles []string
		want     map[string]bool // host:port → require_tls when enforced
	}{
		{"all under require_tls", []record.Event{allow("api.example.com", 443, true), allow("cdn.example.net", 443, true)},
			[]string{"learned"}, map[string]bool{"api.example.com:443": true, "cdn.example.net:443": true}},
		{"mixed", []record.Event{allow("api.example.com", 443, true), allow("plain.example.org", 80, false)},
			[]string{"learned", "learned_tls"}, map[string]bool{"api.example.com:443": true, "plain.example.org:80": false}},
		{"once without it", []record.Event{allow("api.example.com", 443, true), allow("api.example.com", 443, false)},
			[]string{"learned"}, map[string]bool{"api.example.com:443": false}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := Learn(c.recs, 0).Profile("learned")
			if err != nil {
				t.Fatal(err)
			}
			f, err := ParseFile(b)
			if err != nil {
				t.Fatal(err)
			}
			l, err := f.Allowlist(c.profiles, nil, false)
			if err != nil {
				t.Fatalf("%v\n%s", err, b)
			}
			for hp, tls := range c.want {
				host, port, _ := strings.Cut(hp, ":")
				var p uint16
				for _, d := range port {
					p = p*10 + uint16(d-'0')
				}
				e, ok := l.Match(host, p)
				if !ok || e.RequireTLS != tls {
					t.Errorf("%s: allowed %v, require_tls %v, want require_tls %v\n%s", hp, ok, e.RequireTLS, tls, b)
				}
			}
		})
	}
}

// A wildcard is offered only in the profile that holds every host it
// covers: never one that would carry a TLS host into the plain profile;
// and a name whose _tls companion is not valid is refused up front.
func TestLearnedProfileTLSEdges(t *testing.T) {
	allow := func(host string, tls bool) record.Event {
		return record.Event{Trial: "t1", Decision: record.DecisionAllow, Reason: record.ReasonAllowed, Host: host, Port: 443, RequireTLS: tls}
	}
	mixed := Learn([]record.Event{allow("a.svc.example.com", false), allow("b.svc.example.com", false), allow("c.svc.example.com", true)}, 0)
	b, err := mixed.Profile("learned")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "offered") {
		t.Errorf("a wildcard over hosts with and without TLS was offered:\n%s", b)
	}
	same := Learn([]record.Event{allow("a.svc.example.com", true), allow("b.svc.example.com", true), allow("c.svc.example.com", true)}, 0)
	if b, err := same.Profile("learned"); err != nil || !strings.Contains(string(b), "offered") {
		t.Errorf("no wildcard offered over three TLS hosts: %v\n%s", err, b)
	}
	if _, err := mixed.Profile(strings.Repeat("n", 62)); err == nil || !strings.Contains(err.Error(), "shorter name") {
		t.Errorf("a name too long for its _tls companion: %v", err)
	}
}
