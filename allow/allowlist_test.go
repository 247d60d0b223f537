package allow

import (
	"strings"
	"testing"

	"github.com/trialnet/trialnet/wire"
)

func TestParseEntry(t *testing.T) {
	for in, want := range map[string]string{
		"api.anthropic.com:443":   "api.anthropic.com:443",
		"API.Anthropic.COM.:443":  "api.anthropic.com:443",
		"*.example.com:443":       "*.example.com:443",
		"bücher.example.com:443":  "xn--bcher-kva.example.com:443",
		"*.corp.example.co.uk:80": "*.corp.example.co.uk:80",
	} {
		e, err := ParseEntry(in)
		if err != nil || e.String() != want {
			t.Errorf("ParseEntry(%q) = %v, %v; want %s", in, e, err, want)
		}
	}
	for _, bad := range []string{
		"", "api.anthropic.com", "api.anthropic.com:", "api.anthropic.com:0", "api.anthropic.com:65536", "api.anthropic.com:https",
		"*:443", "*.com:443", "*.co.uk:443", "*.github.io:443", "*.internal:443", "**.example.com:443", "a.*.example.com:443",
		"*example.com:443", "127.0.0.1:443", "[::1]:443", "2130706433:443", "localhost:443", "exa_mple.com:443",
		"-bad.example.com:443", "http://api.anthropic.com:443", "api.anthropic.com:443/x", "user@api.anthropic.com:443",
	} {
		if e, err := ParseEntry(bad); err == nil {
			t.Errorf("ParseEntry(%q) accepted it as %v", bad, e)
		}
	}
}

func TestAllowlistMatch(t *testing.T) {
	a, err := Parse([]string{"api.example.com:443", "*.svc.example.com:443"}, false)
	if err != nil {
		t.Fatal(err)
	}
	for hp, want := range map[string]bool{
		"api.example.com:443":         true,
		"api.example.com:80":          false,
		"x.svc.example.com:443":       true,
		"x.y.svc.example.com:443":     true,
		"svc.example.com:443":         false,
		"xsvc.example.com:443":        false,
		"api.example.com.evil.io:443": false,
		"example.com:443":             false,
	} {
		host, port, _ := strings.Cut(hp, ":")
		p, _ := wire.ParsePort(port)
		if _, ok := a.Match(host, p); ok != want {
			t.Errorf("Match(%s) = %v, want %v", hp, ok, want)
		}
	}
	if _, ok := New().Match("api.example.com", 443); ok {
		t.Fatal("an empty allowlist allowed something")
	}
}

// TestWildcardsStopAtPublicSuffixes checks wildcards against names from
// the public suffix list, its private section included.
func TestWildcardsStopAtPublicSuffixes(t *testing.T) {
	for _, c := range []struct {
		entry string
		why   string // substring of the load error; "" when the entry loads
	}{
		{"*.co.uk:443", "is a public suffix (ICANN"},
		{"*.github.io:443", "is a public suffix (private"},
		{"*.s3.amazonaws.com:443", "is a public suffix (private"},
		{"*.blogspot.com:443", "is a public suffix (private"},
		{"*.appspot.com:443", "is a public suffix (private"},
		{"*.githubusercontent.com:443", "is a public suffix (private"},
		{"*.kawasaki.jp:443", "every name directly under \"kawasaki.jp\" is itself a public suffix (rule *.kawasaki.jp, ICANN"},
		{"*.compute.amazonaws.com:443", "every name directly under \"compute.amazonaws.com\" is itself a public suffix (rule *.compute.amazonaws.com, private"},
		{"*.amazonaws.com:443", ""},
		{"*.alice.github.io:443", ""},
		{"*.example.co.uk:443", ""},
	} {
		_, err := ParseEntry(c.entry)
		switch {
		case c.why == "" && err != nil:
			t.Errorf("ParseEntry(%q): %v", c.entry, err)
		case c.why != "" && (err == nil || !strings.Contains(err.Error(), c.why)):
			t.Errorf("ParseEntry(%q) = %v, want an error saying %q", c.entry, err, c.why)
		}
	}

	a, err := Parse([]string{"*.amazonaws.com:443", "*.alice.github.io:443", "*.example.co.uk:443", "*.corp.example.com:443"}, false)
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]bool{
		"foo.amazonaws.com":                  true,  // no suffix between
		"s3.amazonaws.com":                   true,  // a suffix itself, but none strictly between
		"x.s3.amazonaws.com":                 false, // s3.amazonaws.com (private) is between
		"bucket.s3.us-east-1.amazonaws.com":  false, // s3.us-east-1.amazonaws.com
		"x.us-east-1.elb.amazonaws.com":      false, // us-east-1.elb.amazonaws.com
		"i-1.x.compute.amazonaws.com":        false, // x.compute.amazonaws.com by the *.compute rule
		"compute.amazonaws.com":              true,
		"www.alice.github.io":                true,
		"a.b.alice.github.io":                true,
		"www.example.co.uk":                  true,
		"deep.er.example.co.uk":              true,
		"x.corp.example.com":                 true,
		"amazonaws.com":                      false, // never the suffix itself
		"foo.amazonaws.com.evil.example":     false,
		"bob.github.io":                      false,
		"x.alice.github.io.s3.amazonaws.com": false,
	} {
		if _, ok := a.Match(host, 443); ok != want {
			t.Errorf("Match(%s) = %v, want %v", host, ok, want)
		}
		if ok := a.AdmitsName(host); ok != want {
			t.Errorf("AdmitsName(%s) = %v, want %v", host, ok, want)
		}
	}
}

// A DNS question has no port: a name any entry matches, on any port, is
// admitted, and nothing else is.
func TestAdmitsNameOnAnyPort(t *testing.T) {
	a, err := Parse([]string{"api.example.com:443", "db.example.com:5432", "*.svc.example.com:22"}, false)
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]bool{
		"api.example.com":         true,
		"db.example.com":          true,
		"x.svc.example.com":       true,
		"x.y.svc.example.com":     true,
		"svc.example.com":         false,
		"example.com":             false,
		"api.example.com.evil.io": false,
		"evil.io":                 false,
	} {
		if got := a.AdmitsName(host); got != want {
			t.Errorf("AdmitsName(%s) = %v, want %v", host, got, want)
		}
	}
	if New().AdmitsName("api.example.com") || (*List)(nil).AdmitsName("api.example.com") {
		t.Fatal("an empty allowlist admitted a name")
	}
}
