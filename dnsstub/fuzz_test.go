//go:build linux

package dnsstub

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/miekg/dns"
	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/wire"
)

// FuzzStub feeds packets to the stub's answer: it never panics, a reply
// is a well-formed response to the query's ID that another parser
// (miekg/dns) reads, fits a UDP datagram, and holds at most one record:
// an A record for a name the policy admits, from the pool, which the
// reverse map gives back.
func FuzzStub(f *testing.F) {
	for _, q := range []*dns.Msg{
		query("api.example.com.", dns.TypeA),
		query("a.svc.example.com.", dns.TypeA),
		query("API.example.COM.", dns.TypeAAAA),
		query("x.s3.amazonaws.com.", dns.TypeA),
		query("evil.example.", dns.TypeTXT),
		query("1.0.100.127.in-addr.arpa.", dns.TypePTR),
		query("api.example.com.", dns.TypeANY),
	} {
		b, err := q.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	edns := query("api.example.com.", dns.TypeA)
	edns.SetEdns0(1232, true)
	b, _ := edns.Pack()
	f.Add(b)
	f.Add([]byte{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1})
	f.Add([]byte{})

	list, err := allow.Parse(testPolicy, false)
	if err != nil {
		f.Fatal(err)
	}
	s, err := New(Config{Admit: list.AdmitsName, Rate: 1e9, Burst: 1e9, MaxNames: 1000})
	if err != nil {
		f.Fatal(err)
	}
	out := make([]byte, 0, maxQuery)
	f.Fuzz(func(t *testing.T, pkt []byte) {
		reply := s.answer(pkt, len(pkt) > maxQuery, out)
		if reply == nil {
			return
		}
		if len(reply) > maxQuery {
			t.Fatalf("reply of %d bytes, more than a plain UDP datagram holds", len(reply))
		}
		r := new(dns.Msg)
		if err := r.Unpack(reply); err != nil {
			t.Fatalf("reply does not parse: %v\n% x", err, reply)
		}
		if len(pkt) < 2 || r.Id != uint16(pkt[0])<<8|uint16(pkt[1]) || !r.Response {
			t.Fatalf("reply id %d response %v to % x", r.Id, r.Response, pkt)
		}
		if len(r.Ns) != 0 || len(r.Extra) != 0 || len(r.Answer) > 1 || len(r.Question) > 1 {
			t.Fatalf("reply carries more than one answer:\n%v", r)
		}
		if len(r.Answer) == 0 {
			return
		}
		a, ok := r.Answer[0].(*dns.A)
		if !ok || len(r.Question) != 1 || r.Question[0].Qtype != dns.TypeA {
			t.Fatalf("an answer that is not one A record to an A question:\n%v", r)
		}
		name, err := wire.NormaliseName(r.Question[0].Name)
		if err != nil || !list.AdmitsName(name) || !strings.EqualFold(a.Hdr.Name, r.Question[0].Name) {
			t.Fatalf("an address for %q, which the policy does not admit:\n%v", r.Question[0].Name, r)
		}
		addr, _ := netip.AddrFromSlice(a.A.To4())
		if got, ok := s.Lookup(addr); !ok || got != name {
			t.Fatalf("answer %s for %s, but Lookup gives %q, %v", addr, name, got, ok)
		}
	})
}
