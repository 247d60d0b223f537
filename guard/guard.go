// Package guard decides which addresses the proxy may dial: never
// loopback, this host's own addresses (interfaces and local routes,
// watched live over netlink), metadata endpoints, or private, reserved
// and link-local ranges unless allowed, seen through IPv4-mapped, NAT64
// and other embeddings.
package guard

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/trialnet/trialnet/record"
)

// addrClass is what an address is, as far as the guard is concerned.
type addrClass uint8

// Address classes. Only classPublic passes without configuration;
// classPrivate, classCGNAT, classReserved and classLinkLocal pass when an
// allowed CIDR covers them; the rest never pass.
const (
	classPublic addrClass = iota
	classLoopback
	classUnspecified
	classHost // one of this host's own addresses
	classProxy
	classMetadata // cloud metadata and similar link-local services
	classLinkLocal
	classMulticast
	classBroadcast
	classPrivate
	classCGNAT
	classReserved
)

var classNames = [...]string{
	classPublic:      "public",
	classLoopback:    "loopback",
	classUnspecified: "unspecified",
	classHost:        "this host's own address",
	classProxy:       "the proxy's own listening address",
	classMetadata:    "a cloud metadata address",
	classLinkLocal:   "link-local",
	classMulticast:   "multicast",
	classBroadcast:   "broadcast",
	classPrivate:     "private",
	classCGNAT:       "carrier-grade NAT (100.64.0.0/10)",
	classReserved:    "reserved or special-purpose",
}

func (c addrClass) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", c)
}

// allowable reports whether an allowed CIDR may let this class through.
func (c addrClass) allowable() bool {
	switch c {
	case classPrivate, classCGNAT, classReserved, classLinkLocal:
		return true
	}
	return false
}

type prefixClass struct {
	p netip.Prefix
	c addrClass
}

func classes(c addrClass, prefixes ...string) []prefixClass {
	out := make([]prefixClass, len(prefixes))
	for i, s := range prefixes {
		out[i] = prefixClass{netip.MustParsePrefix(s), c}
	}
	return out
}

// metadata are well-known cloud metadata and platform service addresses;
// they can never be allowed, whatever the configuration. Most lie in
// ranges an allowed CIDR may admit (link-local, unique-local, CGNAT), so
// one missing here is reachable under such a CIDR.
var metadata = classes(classMetadata,
	"169.254.169.254/32", "169.254.169.253/32", "169.254.169.123/32", // AWS/GCP/Azure/OCI metadata, AWS DNS and time
	"169.254.170.2/32", "169.254.170.23/32", // ECS task credentials, EKS pod identity
	"169.254.0.23/32",                                                                 // Tencent Cloud
	"100.100.100.200/32",                                                              // Alibaba Cloud
	"168.63.129.16/32",                                                                // Azure wireserver
	"fd00:ec2::254/128", "fd00:ec2::253/128", "fd00:ec2::123/128", "fd00:ec2::23/128", // AWS IPv6 metadata, DNS, time, EKS
	"169.254.42.42/32", "fd00:42::42/128", // Scaleway
	"169.254.169.252/32",     // GKE's metadata server, behind 169.254.169.254
	"fd20:ce::254/128",       // GCP IPv6 metadata
	"fd00:c1::a9fe:a9fe/128", // OCI IPv6 metadata
	"fe80::a9fe:a9fe/128",    // OpenStack IPv6 metadata
	"fd00:a9fe:a9fe::1/128",  // Akamai (Linode) IPv6 metadata
	"fd00:100::100:200/128",  // Alibaba Cloud IPv6 metadata
	"192.0.0.192/32",         // Oracle Cloud Classic metadata
	"100.96.0.96/32",         // Volcengine (BytePlus) metadata and role credentials
	"100.80.80.80/32",        // UCloud metadata and user data
)

// tunnelledHost are addresses at which a daemon of this host answers
// through its tun device, with no interface address or local route for
// the host set to learn: Tailscale's Quad100, intercepted by tailscaled
// and never leaving the machine (MagicDNS on :53, its web client on :80,
// Taildrive on :8080). Refused as the host's own whatever the allowed
// CIDRs: 100.64.0.0/10, a tailnet's range, holds the IPv4 one.
var tunnelledHost = []netip.Prefix{
	netip.MustParsePrefix("100.100.100.100/32"), netip.MustParsePrefix("fd7a:115c:a1e0::53/128"),
}

// special is the IANA special-purpose registry, most specific entries
// first where they nest. Anything in it is refused unless allowed.
var special = slicesConcat(
	classes(classUnspecified, "0.0.0.0/8", "::/128"),
	classes(classLoopback, "127.0.0.0/8", "::1/128"),
	classes(classBroadcast, "255.255.255.255/32"),
	classes(classMulticast, "224.0.0.0/4", "ff00::/8"),
	classes(classLinkLocal, "169.254.0.0/16", "fe80::/10"),
	classes(classPrivate, "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"),
	classes(classCGNAT, "100.64.0.0/10"),
	classes(classReserved,
		"192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "198.18.0.0/15", "198.51.100.0/24",
		"203.0.113.0/24", "240.0.0.0/4",
		"100::/64", "2001::/23", "2001:db8::/32", "3fff::/20", "5f00::/16", "fec0::/10"),
)

func slicesConcat(parts ...[]prefixClass) []prefixClass {
	var out []prefixClass
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

var (
	globalUnicast6 = netip.MustParsePrefix("2000::/3")
	nat64WKP       = netip.MustParsePrefix("64:ff9b::/96")
	nat64Local     = netip.MustParsePrefix("64:ff9b:1::/48")
	sixToFour      = netip.MustParsePrefix("2002::/16")
	teredo         = netip.MustParsePrefix("2001::/32")
	ipv4Compat     = netip.MustParsePrefix("::/96")
	ipv4Translated = netip.MustParsePrefix("::ffff:0:0:0/96") // RFC 2765 ::ffff:0:a.b.c.d
)

// classify returns the class of a single address, without unwrapping.
func classify(a netip.Addr) addrClass {
	for _, m := range metadata {
		if m.p.Contains(a) {
			return classMetadata
		}
	}
	for _, s := range special {
		if s.p.Contains(a) {
			return s.c
		}
	}
	if a.Is6() {
		switch {
		case nat64WKP.Contains(a), ipv4Translated.Contains(a):
			return classPublic // judged by the IPv4 address it carries
		case !globalUnicast6.Contains(a):
			return classReserved // outside 2000::/3: unassigned, or IPv4-compatible ::a.b.c.d
		}
	}
	return classPublic
}

// embedded4 returns the IPv4 addresses an IPv6 address carries in any of
// the forms a router or the kernel may translate: IPv4-compatible,
// IPv4-translated, NAT64 (well-known prefix; local-use in its /96 layout),
// 6to4, Teredo (server and de-obfuscated client) and ISATAP.
func embedded4(a netip.Addr) []netip.Addr {
	if !a.Is6() || a.Is4In6() {
		return nil
	}
	b := a.As16()
	v4 := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{b[i], b[i+1], b[i+2], b[i+3]}) }
	var out []netip.Addr
	switch {
	case ipv4Compat.Contains(a) && a != netip.IPv6Unspecified() && a != netip.IPv6Loopback():
		out = append(out, v4(12))
	case ipv4Translated.Contains(a), nat64WKP.Contains(a), nat64Local.Contains(a):
		out = append(out, v4(12))
	case sixToFour.Contains(a):
		out = append(out, v4(2))
	case teredo.Contains(a):
		out = append(out, v4(4), netip.AddrFrom4([4]byte{^b[12], ^b[13], ^b[14], ^b[15]}))
	}
	// ISATAP interface identifier ::0:5efe:a.b.c.d or ::200:5efe:a.b.c.d.
	if (b[8] == 0 || b[8] == 2) && b[9] == 0 && b[10] == 0x5e && b[11] == 0xfe {
		out = append(out, v4(12))
	}
	return out
}

// AddrSet is a set of addresses that may change while the proxy runs,
// such as the host's own addresses.
type AddrSet interface {
	// Contains reports whether a (unmapped, without zone) is in the set.
	// A set that cannot answer (its source failed) returns an error, and
	// the guard then refuses: it never guesses.
	Contains(a netip.Addr) (bool, error)
}

// HostFacts are what the operator knows about this host's network that
// its interfaces and routes do not show.
type HostFacts struct {
	// Addrs reach this host by another way: a public address that NAT
	// hairpins back to it, a load balancer's address in front of it. They
	// are refused as this host's own, whatever a Trial's allowed CIDRs.
	Addrs []netip.Prefix
	// NAT64 are the network's own NAT64 prefixes (RFC 6052: /32, /40,
	// /48, /56, /64 or /96). An address under one is judged by the IPv4
	// address it carries, as one under 64:ff9b::/96 is.
	NAT64 []netip.Prefix
}

// Check validates the facts: canonical prefixes, NAT64 ones IPv6 of a
// length RFC 6052 defines.
func (f HostFacts) Check() error {
	for _, p := range f.Addrs {
		if !p.IsValid() || p.Masked() != p || p.Addr().Zone() != "" || p.Addr().Is4In6() {
			return fmt.Errorf("host address %s: write a canonical prefix (IPv4 in IPv4 form, no host bits, no zone)", p)
		}
	}
	for _, p := range f.NAT64 {
		if !p.IsValid() || !p.Addr().Is6() || p.Addr().Is4In6() || p.Masked() != p || !slices.Contains([]int{32, 40, 48, 56, 64, 96}, p.Bits()) {
			return fmt.Errorf("NAT64 prefix %s: want an IPv6 prefix of length 32, 40, 48, 56, 64 or 96 (RFC 6052), without host bits", p)
		}
	}
	return nil
}

// Guard decides whether an address may be dialed.
type Guard struct {
	allow []netip.Prefix
	host  AddrSet
	proxy *proxyAddrs // shared by every guard WithAllow derives
	// facts are shared the same way, and replaced whole: facts about the
	// host apply to live Trials too.
	facts *atomic.Pointer[HostFacts]
}

// proxyAddrs are the proxy's own listening addresses.
type proxyAddrs struct {
	mu sync.RWMutex
	m  map[netip.Addr]struct{}
}

// New returns a guard allowing the given CIDRs in addition to public
// addresses. host is the host's own address set (nil: no host check,
// for tests only; production passes WatchHostAddrs).
func New(allow []netip.Prefix, host AddrSet) *Guard {
	g := &Guard{allow: allow, host: host, proxy: &proxyAddrs{m: make(map[netip.Addr]struct{})}, facts: new(atomic.Pointer[HostFacts])}
	g.facts.Store(&HostFacts{})
	return g
}

// WithAllow returns a guard with other allowed CIDRs that shares g's
// host and proxy addresses and host facts (a proxy address recorded on
// either is refused by both).
func (g *Guard) WithAllow(allow []netip.Prefix) *Guard {
	return &Guard{allow: allow, host: g.host, proxy: g.proxy, facts: g.facts}
}

// SetHostFacts replaces the host facts of g and of every guard sharing
// them; f must have passed Check.
func (g *Guard) SetHostFacts(f HostFacts) {
	f.Addrs, f.NAT64 = slices.Clone(f.Addrs), slices.Clone(f.NAT64)
	g.facts.Store(&f)
}

// Allowed is a copy of the CIDRs this guard allows beyond the default.
func (g *Guard) Allowed() []netip.Prefix {
	return append(make([]netip.Prefix, 0, len(g.allow)), g.allow...)
}

// AddProxyAddr records an address the proxy listens on; it is never
// dialed. Unspecified listen addresses are covered by the host check.
func (g *Guard) AddProxyAddr(a netip.Addr) {
	g.proxy.mu.Lock()
	g.proxy.m[a.Unmap().WithZone("")] = struct{}{}
	g.proxy.mu.Unlock()
}

// Check returns nil if a may be dialed, else a *Denial with reason
// address_denied naming the address and why.
func (g *Guard) Check(a netip.Addr) error {
	if !a.IsValid() {
		return record.Deny(record.ReasonAddressDenied, "invalid address")
	}
	a = a.WithZone("").Unmap()
	facts := g.facts.Load()
	// The embedded IPv4 first: "embeds 127.0.0.1" says more than "reserved".
	operatorNAT64 := false
	for _, p := range facts.NAT64 {
		if p.Contains(a) {
			operatorNAT64 = true
			if err := g.check1(rfc6052IPv4(a, p.Bits()), a, facts); err != nil {
				return err
			}
		}
	}
	for _, e := range embedded4(a) {
		if operatorNAT64 && nat64Local.Contains(a) {
			break // the operator gave its layout: the /96 guess is not it
		}
		if err := g.check1(e, a, facts); err != nil {
			return err
		}
	}
	if operatorNAT64 {
		// Judged by the IPv4 it carries, as 64:ff9b::/96 is; still never
		// the host's or the proxy's own.
		return g.judge(a, a, classPublic, facts)
	}
	if nat64Local.Contains(a) {
		// RFC 8215 leaves the IPv4 position inside 64:ff9b:1::/48 to the
		// operator, so the IPv4 address cannot be known: never allowed.
		return record.Deny(record.ReasonAddressDenied, "%s is local-use NAT64 (64:ff9b:1::/48), whose embedded IPv4 address cannot be checked", a)
	}
	return g.check1(a, a, facts)
}

// rfc6052IPv4 is the IPv4 address that a, under a NAT64 prefix of bits
// bits, carries: the 32 bits after the prefix, skipping bits 64–71.
func rfc6052IPv4(a netip.Addr, bits int) netip.Addr {
	b := a.As16()
	var v4 [4]byte
	i := bits / 8
	for n := range v4 {
		if i == 8 {
			i++
		}
		v4[n] = b[i]
		i++
	}
	return netip.AddrFrom4(v4)
}

func (g *Guard) check1(a, outer netip.Addr, facts *HostFacts) error {
	return g.judge(a, outer, classify(a), facts)
}

// judge decides for a of class c, found in outer.
func (g *Guard) judge(a, outer netip.Addr, c addrClass, facts *HostFacts) error {
	if c == classPublic || c.allowable() {
		if g.isProxy(a) {
			c = classProxy
		} else if g.host != nil {
			own, err := g.host.Contains(a)
			if err != nil {
				return &record.Denial{Reason: record.ReasonAddressDenied, Detail: fmt.Sprintf("%s: the host's own addresses are unknown, so nothing is dialed", outer), Err: err}
			}
			if own {
				c = classHost
			}
		}
		if covers(facts.Addrs, a) || covers(tunnelledHost, a) {
			c = classHost
		}
	}
	if c == classPublic || c.allowable() && g.allowed(a) {
		return nil
	}
	what := a.String()
	if a != outer {
		what = fmt.Sprintf("%s embeds %s, which", outer, a)
	}
	hint := ""
	if c.allowable() {
		hint = "; allow it with an explicit CIDR if this is intended"
	}
	return record.Deny(record.ReasonAddressDenied, "%s is %s%s", what, c, hint)
}

// covers reports whether a prefix of ps contains a.
func covers(ps []netip.Prefix, a netip.Addr) bool {
	return slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(a) })
}

func (g *Guard) allowed(a netip.Addr) bool {
	for _, p := range g.allow {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func (g *Guard) isProxy(a netip.Addr) bool {
	g.proxy.mu.RLock()
	defer g.proxy.mu.RUnlock()
	_, ok := g.proxy.m[a]
	return ok
}

// CheckHostService returns nil if a may be dialed as a host service
// the configuration names: loopback or one of this host's own addresses
// (never another machine's). The proxy's own addresses are not refused
// here as Check refuses them: the proxy listens in the Trials'
// namespaces, so their 127.0.0.1 is not the host's, and only the one
// port the operator named is dialed.
func (g *Guard) CheckHostService(a netip.Addr) error {
	a = a.WithZone("")
	if !a.IsValid() || a.Is4In6() {
		return record.Deny(record.ReasonAddressDenied, "host service address %s: want an IPv4 or IPv6 address, IPv4 written as IPv4", a)
	}
	if a.IsLoopback() {
		return nil
	}
	for _, p := range g.facts.Load().Addrs {
		if p.Contains(a) {
			return nil
		}
	}
	if g.host != nil {
		own, err := g.host.Contains(a)
		if err != nil {
			return &record.Denial{Reason: record.ReasonAddressDenied, Detail: fmt.Sprintf("host service address %s: the host's own addresses are unknown, so nothing is dialed", a), Err: err}
		}
		if own {
			return nil
		}
	}
	return record.Deny(record.ReasonAddressDenied, "host service address %s is not loopback nor one of this host's addresses", a)
}

// CheckAllowCIDR validates a CIDR for the allow list: it must be in
// canonical form and must not reach loopback or unspecified addresses,
// which can never be allowed (so "0.0.0.0/0" is refused, not widened).
func CheckAllowCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("allowed CIDR %q: %v", s, err)
	}
	if p.Addr().Zone() != "" || p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("allowed CIDR %q: write IPv4 prefixes in IPv4 form, without a zone", s)
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("allowed CIDR %q has host bits set; did you mean %s?", s, p.Masked())
	}
	for _, s2 := range special {
		if (s2.c == classLoopback || s2.c == classUnspecified) && s2.p.Overlaps(p) {
			return netip.Prefix{}, fmt.Errorf("allowed CIDR %q covers %s (%s), which can never be allowed; list narrower prefixes", s, s2.p, s2.c)
		}
	}
	return p, nil
}
