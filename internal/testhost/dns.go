//go:build linux

package testhost

import (
	"net"
	"net/netip"
	"strings"

	"github.com/miekg/dns"
)

// ServeDNS runs a DNS server on 127.0.0.1 (UDP) that answers A queries
// for names (every name when none are given) with addr, NODATA with an
// SOA for other types of those names (so negative answers are cached),
// and NXDOMAIN for anything else. It returns the server's address and a
// function that stops it.
func ServeDNS(addr netip.Addr, names ...string) (string, func(), error) {
	return serveDNS(func(q string) (netip.Addr, bool) {
		if len(names) == 0 {
			return addr, true
		}
		for _, n := range names {
			if strings.EqualFold(q, dns.Fqdn(n)) {
				return addr, true
			}
		}
		return netip.Addr{}, false
	})
}

// ServeDNSMap is ServeDNS with an address of its own for each name (a
// loopback or metadata address, say, to test the proxy's guard).
func ServeDNSMap(names map[string]netip.Addr) (string, func(), error) {
	return serveDNS(func(q string) (netip.Addr, bool) {
		for n, a := range names {
			if strings.EqualFold(q, dns.Fqdn(n)) {
				return a, true
			}
		}
		return netip.Addr{}, false
	})
}

func serveDNS(lookup func(fqdn string) (netip.Addr, bool)) (string, func(), error) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	mux := dns.NewServeMux()
	mux.HandleFunc(".", func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		addr, known := lookup(q.Name)
		switch {
		case !known:
			m.Rcode = dns.RcodeNameError
		case q.Qtype == dns.TypeA && addr.Is4():
			m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 3600}, A: addr.AsSlice()}}
		default:
			m.Ns = []dns.RR{&dns.SOA{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: 3600}, Ns: "ns.test.", Mbox: "root.test.", Minttl: 3600}}
		}
		_ = w.WriteMsg(m)
	})
	srv := &dns.Server{PacketConn: pc, Handler: mux}
	go func() { _ = srv.ActivateAndServe() }()
	return pc.LocalAddr().String(), func() { _ = srv.Shutdown() }, nil
}
