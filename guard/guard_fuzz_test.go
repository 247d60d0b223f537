//go:build linux

package guard

import (
	"net/netip"
	"testing"
)

func FuzzGuard(f *testing.F) {
	f.Add(netip.MustParseAddr("::ffff:127.0.0.1").AsSlice())
	g := New(nil, nil)
	f.Fuzz(func(t *testing.T, b []byte) {
		a, ok := netip.AddrFromSlice(b)
		if !ok {
			return
		}
		if g.Check(a) != nil {
			return
		}
		// An allowed address, and every IPv4 address it carries, is
		// globally routable unicast by netip's own predicates too.
		for _, x := range append([]netip.Addr{a.Unmap()}, embedded4(a.Unmap())...) {
			if x.IsLoopback() || x.IsPrivate() || x.IsUnspecified() || x.IsMulticast() ||
				x.IsLinkLocalUnicast() || x.IsLinkLocalMulticast() || x.IsInterfaceLocalMulticast() || !x.IsGlobalUnicast() {
				t.Fatalf("%s allowed but %s is not global unicast", a, x)
			}
		}
	})
}
