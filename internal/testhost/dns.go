//go:build linux

package testhost

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"

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

// ServeDNSHandler serves h on 127.0.0.1, UDP and TCP on one port (tried
// again when the TCP port of a free UDP one is taken), and returns its
// address and a function that stops it.
func ServeDNSHandler(h dns.Handler) (string, func(), error) {
	var pc net.PacketConn
	var ln net.Listener
	for try := 0; ln == nil; try++ {
		var err error
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			return "", nil, err
		}
		if ln, err = net.Listen("tcp", pc.LocalAddr().String()); err != nil {
			_ = pc.Close()
			if try == 20 {
				return "", nil, err
			}
		}
	}
	udp := &dns.Server{PacketConn: pc, Handler: h}
	tcp := &dns.Server{Listener: ln, Handler: h}
	go func() { _ = udp.ActivateAndServe() }()
	go func() { _ = tcp.ActivateAndServe() }()
	return pc.LocalAddr().String(), func() { _ = udp.Shutdown(); _ = tcp.Shutdown() }, nil
}

// DNSLog is every question a test host's DNS server was asked, UDP and
// TCP, in arrival order.
type DNSLog struct {
	mu sync.Mutex
	qs []dns.Question
}

// Questions is a copy of the log so far.
func (l *DNSLog) Questions() []dns.Question {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.qs)
}

// Asked reports the questions whose name contains s (compared without
// case: a resolver may randomise it).
func (l *DNSLog) Asked(s string) []dns.Question {
	var out []dns.Question
	for _, q := range l.Questions() {
		if strings.Contains(strings.ToLower(q.Name), strings.ToLower(s)) {
			out = append(out, q)
		}
	}
	return out
}

// ServeDNS runs a DNS server on the test host itself, at its IPv4
// address, port 53, UDP and TCP, in its namespace: it answers A queries
// for every name with answer, NODATA for other types, and logs every
// question. Close stops it. It is both a resolver an agent may use and a
// server a Trial must never reach: its log says what reached it.
func (h *Host) ServeDNS(answer netip.Addr) (*DNSLog, error) {
	log := &DNSLog{}
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, r *dns.Msg) {
		log.mu.Lock()
		log.qs = append(log.qs, r.Question...)
		log.mu.Unlock()
		m := new(dns.Msg)
		m.SetReply(r)
		if len(r.Question) == 1 && r.Question[0].Qtype == dns.TypeA && answer.Is4() {
			q := r.Question[0]
			m.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 3600}, A: answer.AsSlice()}}
		}
		_ = w.WriteMsg(m)
	})
	addr := netip.AddrPortFrom(h.Addr4, 53).String()
	ln, err := h.NS.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, err
	}
	var pc net.PacketConn
	if err := h.NS.Do(func() (err error) { pc, err = net.ListenPacket("udp", addr); return }); err != nil {
		_ = ln.Close()
		return nil, err
	}
	for _, srv := range []*dns.Server{{Listener: ln, Handler: handler}, {PacketConn: pc, Handler: handler}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go func() { _ = srv.ActivateAndServe() }()
		<-started
		h.closers = append(h.closers, srv.Shutdown)
	}
	return log, nil
}
