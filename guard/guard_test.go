//go:build linux

package guard

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/record"
)

type fixedSet map[netip.Addr]bool

func (f fixedSet) Contains(a netip.Addr) (bool, error) { return f[a], nil }

func TestGuardClasses(t *testing.T) {
	host := fixedSet{netip.MustParseAddr("203.0.114.7"): true, netip.MustParseAddr("2a01:4f8::7"): true}
	g := New(nil, host)
	g.AddProxyAddr(netip.MustParseAddr("198.51.99.1"))
	cases := []struct {
		addr string
		ok   bool
		why  string // substring of the refusal
	}{
		{"93.184.216.34", true, ""},
		{"2606:2800:220:1:248:1893:25c8:1946", true, ""},
		{"127.0.0.1", false, "loopback"},
		{"127.255.255.254", false, "loopback"},
		{"::1", false, "loopback"},
		{"0.0.0.0", false, "unspecified"},
		{"0.1.2.3", false, "unspecified"},
		{"::", false, "unspecified"},
		{"10.1.2.3", false, "private"},
		{"172.16.0.1", false, "private"},
		{"172.31.255.255", false, "private"},
		{"192.168.1.1", false, "private"},
		{"fc00::1", false, "private"},
		{"fd12:3456::1", false, "private"},
		{"100.64.0.1", false, "carrier-grade"},
		{"100.127.255.255", false, "carrier-grade"},
		{"169.254.169.254", false, "metadata"},
		{"169.254.170.2", false, "metadata"},
		{"169.254.1.1", false, "link-local"},
		{"fe80::1", false, "link-local"},
		{"fe80::1%eth0", false, "link-local"},
		{"100.100.100.200", false, "metadata"},
		{"169.254.0.23", false, "metadata"},
		{"168.63.129.16", false, "metadata"},
		{"fd00:ec2::254", false, "metadata"},
		{"224.0.0.1", false, "multicast"},
		{"239.255.255.250", false, "multicast"},
		{"ff02::1", false, "multicast"},
		{"255.255.255.255", false, "broadcast"},
		{"240.0.0.1", false, "reserved"},
		{"192.0.2.1", false, "reserved"},
		{"198.18.0.1", false, "reserved"},
		{"2001:db8::1", false, "reserved"},
		{"203.0.114.7", false, "own address"},
		{"2a01:4f8::7", false, "own address"},
		{"198.51.99.1", false, "proxy's own"},
		// IPv6 forms that carry IPv4.
		{"::ffff:127.0.0.1", false, "loopback"},
		{"::ffff:169.254.169.254", false, "metadata"},
		{"::ffff:93.184.216.34", true, ""},
		{"::127.0.0.1", false, "embeds 127.0.0.1"},
		{"::10.0.0.1", false, "embeds 10.0.0.1"},
		{"::93.184.216.34", false, "reserved"}, // deprecated IPv4-compatible form
		{"::ffff:0:127.0.0.1", false, "embeds 127.0.0.1"},
		{"64:ff9b::127.0.0.1", false, "embeds 127.0.0.1"},
		{"64:ff9b::169.254.169.254", false, "metadata"},
		{"64:ff9b::93.184.216.34", true, ""},
		{"64:ff9b:1:7f00:0:100::", false, "64:ff9b:1:7f00:0:100::"}, // /48 layout: never allowed
		{"64:ff9b:1::7f00:1", false, "embeds 127.0.0.1"},
		{"64:ff9b:1::5db8:d822", false, "local-use NAT64"},
		{"2002:7f00:1::1", false, "embeds 127.0.0.1"},
		{"2002:a9fe:a9fe::1", false, "metadata"},
		{"2002:5db8:d822::1", true, ""},
		{"2001:0:7f00:1::1", false, "embeds 127.0.0.1"},                 // Teredo server
		{"2001:0:5db8:d822::80ff:fffe", false, "embeds 127.0.0.1"},      // Teredo client, obfuscated
		{"2001:0:5db8:d822:8000:f227:a201:dde5", false, "reserved"},     // a clean Teredo address is still not global
		{"2a00:1450:4001:800:0:5efe:7f00:1", false, "embeds 127.0.0.1"}, // ISATAP
		{"2a00:1450:4001:800:200:5efe:a00:1", false, "embeds 10.0.0.1"},
		{"2a00:1450:4001:800::200e", true, ""},
		{"4000::1", false, "reserved"}, // outside 2000::/3
	}
	for _, tc := range cases {
		err := g.Check(netip.MustParseAddr(tc.addr))
		if tc.ok != (err == nil) {
			t.Errorf("%s: got %v, want ok=%v", tc.addr, err, tc.ok)
			continue
		}
		if err != nil {
			if record.ReasonOf(err) != record.ReasonAddressDenied || !strings.Contains(err.Error(), tc.why) {
				t.Errorf("%s: got %q, want address_denied mentioning %q", tc.addr, err, tc.why)
			}
		}
	}
}

func TestGuardAllowCIDR(t *testing.T) {
	p, err := CheckAllowCIDR("10.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	ll, _ := CheckAllowCIDR("169.254.0.0/16")
	host := fixedSet{netip.MustParseAddr("10.9.9.9"): true}
	g := New([]netip.Prefix{p, ll}, host)
	for addr, ok := range map[string]bool{
		"10.1.2.3":           true,
		"::ffff:10.1.2.3":    true,
		"2002:a01:203::1":    true,
		"10.9.9.9":           false, // this host's own address: never
		"169.254.1.1":        true,
		"169.254.169.254":    false, // metadata: never
		"192.168.1.1":        false,
		"::ffff:127.0.0.1":   false,
		"64:ff9b::127.0.0.1": false,
	} {
		if err := g.Check(netip.MustParseAddr(addr)); (err == nil) != ok {
			t.Errorf("%s: got %v, want ok=%v", addr, err, ok)
		}
	}
	for _, bad := range []string{"0.0.0.0/0", "::/0", "127.0.0.0/8", "126.0.0.0/7", "::/64", "10.1.2.3/8", "::ffff:10.0.0.0/104", "fe80::/10%eth0", "10.0.0.0"} {
		if _, err := CheckAllowCIDR(bad); err == nil {
			t.Errorf("CheckAllowCIDR(%q) accepted it", bad)
		}
	}
}

// Cloud metadata addresses stay refused under allowed CIDRs that cover
// them: Scaleway's 169.254.42.42 was reached through the proxy and
// transparent mode under --allow-cidr 169.254.0.0/16.
func TestGuardMetadataUnderAllowedCIDRs(t *testing.T) {
	var allow []netip.Prefix
	for _, s := range []string{"169.254.0.0/16", "100.64.0.0/10", "192.0.0.0/24", "fc00::/7", "fe80::/10"} {
		p, err := CheckAllowCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		allow = append(allow, p)
	}
	g := New(allow, fixedSet{})
	if err := g.Check(netip.MustParseAddr("169.254.1.1")); err != nil {
		t.Fatalf("169.254.1.1 under 169.254.0.0/16: %v (the CIDRs must admit their ranges for this test to mean anything)", err)
	}
	for _, addr := range []string{
		"169.254.169.254", "169.254.169.253", "169.254.169.123", "169.254.170.2", "169.254.170.23", "169.254.0.23",
		"100.100.100.200", "fd00:ec2::254", "fd00:ec2::23",
		"169.254.42.42", "fd00:42::42", // Scaleway
		"169.254.169.252",    // GKE
		"fd20:ce::254",       // GCP IPv6
		"fd00:c1::a9fe:a9fe", // OCI IPv6
		"fe80::a9fe:a9fe",    // OpenStack IPv6
		"fd00:a9fe:a9fe::1",  // Akamai (Linode) IPv6
		"fd00:100::100:200",  // Alibaba IPv6
		"192.0.0.192",        // Oracle Cloud Classic
		"100.96.0.96",        // Volcengine, BytePlus
		"100.80.80.80",       // UCloud
		"::ffff:169.254.42.42", "64:ff9b::169.254.42.42", "::ffff:100.96.0.96", "64:ff9b::100.80.80.80",
	} {
		if err := g.Check(netip.MustParseAddr(addr)); err == nil || !strings.Contains(err.Error(), "metadata") {
			t.Errorf("%s: got %v, want refused as a cloud metadata address", addr, err)
		}
	}
}

// Tailscale's Quad100 addresses are answered by the host's own tailscaled
// through its tun device (MagicDNS, its web client, Taildrive), with no
// interface address or local route for the host set to learn: refused
// as the host's own under the CIDRs a tailnet lives in, which still admit
// the tailnet's other addresses.
func TestGuardTailscaleQuad100IsTheHost(t *testing.T) {
	allow := []netip.Prefix{netip.MustParsePrefix("100.64.0.0/10"), netip.MustParsePrefix("fd7a:115c:a1e0::/48")}
	g := New(allow, fixedSet{})
	for _, ok := range []string{"100.100.100.101", "100.101.102.103", "fd7a:115c:a1e0::54"} {
		if err := g.Check(netip.MustParseAddr(ok)); err != nil {
			t.Fatalf("%s under the tailnet's CIDRs: %v (they must admit their ranges for this test to mean anything)", ok, err)
		}
	}
	for _, addr := range []string{"100.100.100.100", "fd7a:115c:a1e0::53", "::ffff:100.100.100.100", "64:ff9b::100.100.100.100"} {
		if err := g.Check(netip.MustParseAddr(addr)); err == nil || !strings.Contains(err.Error(), "this host's own") {
			t.Errorf("%s: got %v, want refused as this host's own address", addr, err)
		}
	}
}

// A host address set that cannot answer makes the guard refuse.
func TestGuardFailsClosedWithoutHostAddrs(t *testing.T) {
	g := New(nil, brokenSet{})
	if err := g.Check(netip.MustParseAddr("93.184.216.34")); record.ReasonOf(err) != record.ReasonAddressDenied {
		t.Fatalf("got %v, want address_denied", err)
	}
}

type brokenSet struct{}

func (brokenSet) Contains(netip.Addr) (bool, error) { return false, errBroken }

var errBroken = &record.Denial{Reason: record.ReasonAddressDenied, Detail: "test: host set unavailable"}

// embed6052 puts v4 into prefix p as RFC 6052 lays it out: after the
// prefix, skipping bits 64–71; the host part ends in 1 where it can.
func embed6052(p netip.Prefix, v4 netip.Addr) netip.Addr {
	b := p.Addr().As16()
	x := v4.As4()
	i := p.Bits() / 8
	for n := range x {
		if i == 8 {
			i++
		}
		b[i] = x[n]
		i++
	}
	if i < 16 {
		b[15] = 1
	}
	return netip.AddrFrom16(b)
}

// What the operator says about the host: an address that hairpins back
// to it is refused as the host's own (whatever a Trial's allowed CIDRs),
// and an address under the network's own NAT64 prefix is judged by the
// IPv4 it carries, in each RFC 6052 layout. The facts reach guards
// already derived (live Trials).
func TestGuardHostFacts(t *testing.T) {
	base := New(nil, noHost{})
	g := base.WithAllow([]netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")})
	hairpin, lan := netip.MustParseAddr("93.184.216.50"), netip.MustParseAddr("10.1.2.3")
	public := netip.MustParseAddr("93.184.216.34")
	var nat64 []netip.Prefix
	for _, s := range []string{"2a01:4f8::/32", "2a01:4f8:100::/40", "2a01:4f8:200::/48", "2a01:4f8:300::/56", "2a01:4f8:400::/64", "2a01:4f8:500::/96", "64:ff9b:1::/48"} {
		nat64 = append(nat64, netip.MustParsePrefix(s))
	}
	for _, a := range []netip.Addr{hairpin, lan} {
		if err := g.Check(a); err != nil {
			t.Fatalf("%s refused before the facts said anything: %v", a, err)
		}
	}
	if err := g.Check(embed6052(nat64[6], public)); record.ReasonOf(err) != record.ReasonAddressDenied {
		t.Fatalf("local-use NAT64 with no layout configured: %v, want refused", err)
	}
	facts := HostFacts{Addrs: []netip.Prefix{netip.PrefixFrom(hairpin, 32), netip.PrefixFrom(lan, 32)}, NAT64: nat64}
	if err := facts.Check(); err != nil {
		t.Fatal(err)
	}
	base.SetHostFacts(facts)
	for _, a := range []netip.Addr{hairpin, lan} {
		if err := g.Check(a); record.ReasonOf(err) != record.ReasonAddressDenied || !strings.Contains(err.Error(), "this host's own") {
			t.Fatalf("%s is the host's by the facts: %v", a, err)
		}
	}
	for _, p := range nat64 {
		if err := g.Check(embed6052(p, public)); err != nil {
			t.Fatalf("%s under %s carries a public address: %v", embed6052(p, public), p, err)
		}
		for _, inner := range []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("169.254.169.254"), hairpin, netip.MustParseAddr("192.168.1.1")} {
			a := embed6052(p, inner)
			if err := g.Check(a); record.ReasonOf(err) != record.ReasonAddressDenied || !strings.Contains(err.Error(), "embeds "+inner.String()) {
				t.Fatalf("%s under %s carries %s: %v, want refused naming it", a, p, inner, err)
			}
		}
	}
}

func TestHostFactsCheck(t *testing.T) {
	for _, bad := range []HostFacts{
		{Addrs: []netip.Prefix{netip.MustParsePrefix("93.184.216.1/24")}},
		{NAT64: []netip.Prefix{netip.MustParsePrefix("2a01:4f8::/33")}},
		{NAT64: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}},
		{NAT64: []netip.Prefix{netip.MustParsePrefix("2a01:4f8::1/96")}},
	} {
		if err := bad.Check(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// noHost: a host with no addresses of its own.
type noHost struct{}

func (noHost) Contains(netip.Addr) (bool, error) { return false, nil }
