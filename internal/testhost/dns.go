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
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	known := func(q string) bool {
		if len(names) == 0 {
			return true
		}
		for _, n := range names {
			if strings.EqualFold(q, dns.Fqdn(n)) {
				return true
			}
		}
		return false
	}
	mux := dns.NewServeMux()
	mux.HandleFunc(".", func(w dns.ResponseWriter, r *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(r)
		q := r.Question[0]
		switch {
		case !known(q.Name):
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
