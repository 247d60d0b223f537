//go:build linux

package dnsstub

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/miekg/dns"
	"github.com/trialnet/trialnet/allow"
)

// testPolicy is the allowlist the tests' stubs admit names from.
var testPolicy = []string{"api.example.com:443", "db.example.com:5432", "*.svc.example.com:22", "*.amazonaws.com:443"}

func testAllowlist(t *testing.T) *allow.List {
	t.Helper()
	list, err := allow.Parse(testPolicy, false)
	if err != nil {
		t.Fatal(err)
	}
	return list
}

// stubAddrs are where a test stub listens, UDP and TCP.
type stubAddrs struct{ udp, tcp string }

// startStub serves s on 127.0.0.1 (UDP and TCP, ports of their own)
// until the test ends; Serve* must return nil when it is closed.
func startStub(t *testing.T, s *Server) stubAddrs {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		_ = pc.Close()
		t.Fatal(err)
	}
	errc := make(chan error, 2)
	go func() { errc <- s.ServeUDP(pc) }()
	go func() { errc <- s.ServeTCP(ln) }()
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		for range 2 {
			if err := <-errc; err != nil {
				t.Errorf("Serve after Close: %v, want nil", err)
			}
		}
	})
	return stubAddrs{udp: pc.LocalAddr().String(), tcp: ln.Addr().String()}
}

// newStub makes a stub over testPolicy with cfg's bounds (a rate no test
// meets unless it sets one) and serves it.
func newStub(t *testing.T, cfg Config) (*Server, stubAddrs) {
	t.Helper()
	list := testAllowlist(t)
	if cfg.Admit == nil {
		cfg.Admit = list.AdmitsName
	}
	if cfg.Rate == 0 {
		cfg.Rate, cfg.Burst = 1e6, 1e6
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, startStub(t, s)
}

// ask sends one query over net ("udp" or "tcp") and returns the reply.
func ask(t *testing.T, network, addr string, m *dns.Msg) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: 10 * time.Second}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s query %s: %v", network, m.Question[0].String(), err)
	}
	if r.Id != m.Id || !r.Response {
		t.Fatalf("reply id %d response %v to query %d", r.Id, r.Response, m.Id)
	}
	return r
}

func query(name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	return m
}

func (a stubAddrs) of(network string) string {
	if network == "tcp" {
		return a.tcp
	}
	return a.udp
}

var transports = []string{"udp", "tcp"}

func TestAnswers(t *testing.T) {
	s, addrs := newStub(t, Config{})
	chaos := query("api.example.com.", dns.TypeA)
	chaos.Question[0].Qclass = dns.ClassCHAOS
	notify := query("api.example.com.", dns.TypeSOA)
	notify.Opcode = dns.OpcodeNotify
	update := query("api.example.com.", dns.TypeA)
	update.Opcode = dns.OpcodeUpdate
	two := query("api.example.com.", dns.TypeA)
	two.Question = append(two.Question, two.Question[0])
	for _, c := range []struct {
		name   string
		q      *dns.Msg
		rcode  int
		answer bool // an A record in the pool
	}{
		{"exact name", query("api.example.com.", dns.TypeA), dns.RcodeSuccess, true},
		{"another port's name", query("db.example.com.", dns.TypeA), dns.RcodeSuccess, true},
		{"upper case", query("API.Example.COM.", dns.TypeA), dns.RcodeSuccess, true},
		{"wildcard", query("a.b.svc.example.com.", dns.TypeA), dns.RcodeSuccess, true},
		{"wildcard's own name", query("svc.example.com.", dns.TypeA), dns.RcodeNameError, false},
		{"across a public suffix", query("bucket.s3.amazonaws.com.", dns.TypeA), dns.RcodeNameError, false},
		{"unlisted", query("evil.example.", dns.TypeA), dns.RcodeNameError, false},
		{"below an exact name", query("x.api.example.com.", dns.TypeA), dns.RcodeNameError, false},
		{"AAAA of an admitted name", query("api.example.com.", dns.TypeAAAA), dns.RcodeSuccess, false},
		{"TXT of an admitted name", query("api.example.com.", dns.TypeTXT), dns.RcodeSuccess, false},
		{"HTTPS of an admitted name", query("api.example.com.", dns.TypeHTTPS), dns.RcodeSuccess, false},
		{"MX of an admitted name", query("api.example.com.", dns.TypeMX), dns.RcodeSuccess, false},
		{"AAAA unlisted", query("evil.example.", dns.TypeAAAA), dns.RcodeNameError, false},
		{"TXT unlisted", query("evil.example.", dns.TypeTXT), dns.RcodeNameError, false},
		{"reverse of a pool address", query("1.0.100.127.in-addr.arpa.", dns.TypePTR), dns.RcodeNameError, false},
		{"reverse IPv6", query("1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.ip6.arpa.", dns.TypePTR), dns.RcodeNameError, false},
		{"ANY of an admitted name", query("api.example.com.", dns.TypeANY), dns.RcodeRefused, false},
		{"AXFR", query("api.example.com.", dns.TypeAXFR), dns.RcodeRefused, false},
		{"CHAOS class", chaos, dns.RcodeRefused, false},
		{"SRV name with underscores", query("_ssh._tcp.api.example.com.", dns.TypeSRV), dns.RcodeRefused, false},
		{"binary label", query("\\000\\255.example.com.", dns.TypeA), dns.RcodeRefused, false},
		{"IP address as a name", query("127.0.0.1.", dns.TypeA), dns.RcodeRefused, false},
		{"root", query(".", dns.TypeA), dns.RcodeRefused, false},
		{"NOTIFY", notify, dns.RcodeNotImplemented, false},
		{"UPDATE", update, dns.RcodeNotImplemented, false},
		{"two questions", two, dns.RcodeFormatError, false},
	} {
		for _, network := range transports {
			t.Run(c.name+"/"+network, func(t *testing.T) {
				r := ask(t, network, addrs.of(network), c.q)
				if r.Rcode != c.rcode {
					t.Fatalf("rcode %s, want %s\n%v", dns.RcodeToString[r.Rcode], dns.RcodeToString[c.rcode], r)
				}
				if len(r.Ns) != 0 || len(r.Extra) != 0 {
					t.Fatalf("authority or additional records in\n%v", r)
				}
				if !c.answer {
					if len(r.Answer) != 0 {
						t.Fatalf("an answer, want none:\n%v", r)
					}
					return
				}
				checkAnswer(t, s, c.q, r)
			})
		}
	}
}

// checkAnswer checks r answers q with one A record from s's pool that
// s maps back to q's name, spelt as q spelt it.
func checkAnswer(t *testing.T, s *Server, q, r *dns.Msg) netip.Addr {
	t.Helper()
	if len(r.Answer) != 1 {
		t.Fatalf("%d answers, want one A:\n%v", len(r.Answer), r)
	}
	a, ok := r.Answer[0].(*dns.A)
	if !ok || a.Hdr.Name != q.Question[0].Name {
		t.Fatalf("answer %v to %s: want an A record for the name as asked", r.Answer[0], q.Question[0].Name)
	}
	if len(r.Question) != 1 || r.Question[0] != q.Question[0] {
		t.Fatalf("question came back as %v, want %v", r.Question, q.Question)
	}
	addr, _ := netip.AddrFromSlice(a.A.To4())
	if !s.Pool().Contains(addr) {
		t.Fatalf("address %s outside the pool %s", addr, s.Pool())
	}
	want := strings.ToLower(strings.TrimSuffix(q.Question[0].Name, "."))
	if name, ok := s.Lookup(addr); !ok || name != want {
		t.Fatalf("Lookup(%s) = %q, %v; want %q", addr, name, ok, want)
	}
	return addr
}

// A name keeps its address, whatever the transport, case or order.
func TestAddressStablePerName(t *testing.T) {
	s, addrs := newStub(t, Config{})
	got := map[string]netip.Addr{}
	for range 3 {
		for _, network := range transports {
			for _, n := range []string{"api.example.com.", "x.svc.example.com.", "API.EXAMPLE.COM.", "y.svc.example.com."} {
				q := query(n, dns.TypeA)
				a := checkAnswer(t, s, q, ask(t, network, addrs.of(network), q))
				key := strings.ToLower(n)
				if old, ok := got[key]; ok && old != a {
					t.Fatalf("%s got %s, then %s", n, old, a)
				}
				got[key] = a
			}
		}
	}
	if got["api.example.com."] == got["x.svc.example.com."] || got["x.svc.example.com."] == got["y.svc.example.com."] {
		t.Fatalf("two names share an address: %v", got)
	}
	if _, ok := s.Lookup(netip.MustParseAddr("127.100.200.1")); ok {
		t.Fatal("Lookup named an address never handed out")
	}
}

func TestLearningAnswersAndReportsEveryName(t *testing.T) {
	learned := make(chan string, 16)
	s, addrs := newStub(t, Config{Learn: func(n string) { learned <- n }})
	for _, n := range []string{"unlisted.example.", "unlisted.example.", "API.example.com."} {
		q := query(n, dns.TypeA)
		checkAnswer(t, s, q, ask(t, "udp", addrs.udp, q))
	}
	for _, c := range []struct {
		q     *dns.Msg
		rcode int
	}{
		{query("1.0.100.127.in-addr.arpa.", dns.TypePTR), dns.RcodeNameError},
		{query("_x._tcp.example.com.", dns.TypeSRV), dns.RcodeRefused},
		{query("unlisted.example.", dns.TypeANY), dns.RcodeRefused},
	} {
		if r := ask(t, "udp", addrs.udp, c.q); r.Rcode != c.rcode || len(r.Answer) != 0 {
			t.Fatalf("learning stub, %v: got\n%v", c.q.Question[0], r)
		}
	}
	// Drained, not closed: the race detector cannot see that every Learn
	// happened before the answer the test read over a socket.
	var got []string
	for len(learned) > 0 {
		got = append(got, <-learned)
	}
	if want := []string{"unlisted.example", "api.example.com"}; !slices.Equal(got, want) {
		t.Fatalf("learned %q, want %q (each name once, normalised; no reverse or non-host names)", got, want)
	}
}

// Every question for a name off the list is counted as denied, whatever
// its type or class (an ANY or a CH question refused before the policy
// is read is no less an attempt), as is a name that is no host name;
// admitted names, reverse names and the root are not.
func TestDeniedNamesCounted(t *testing.T) {
	s, addrs := newStub(t, Config{})
	chaos := query("off.example.net.", dns.TypeA)
	chaos.Question[0].Qclass = dns.ClassCHAOS
	for _, q := range []*dns.Msg{
		query("off.example.net.", dns.TypeA), query("off.example.net.", dns.TypeAAAA),
		query("off.example.net.", dns.TypeANY), chaos, query("_x.example.net.", dns.TypeTXT),
		query("api.example.com.", dns.TypeA), query("api.example.com.", dns.TypeANY),
		query("1.0.100.127.in-addr.arpa.", dns.TypePTR), query(".", dns.TypeNS),
	} {
		ask(t, "udp", addrs.udp, q)
	}
	if st := s.Stats(); st.Denied != 5 || st.NXDomain != 3 {
		t.Fatalf("stats %+v: want 5 denied, 3 NXDOMAIN", st)
	}
}

// A Trial that asks for more names than its bound is refused the new
// ones, keeps the ones it has, and the pool holds no more than the bound.
func TestPoolExhaustion(t *testing.T) {
	const bound = 64
	s, addrs := newStub(t, Config{MaxNames: bound})
	first := query("n0.svc.example.com.", dns.TypeA)
	firstAddr := checkAnswer(t, s, first, ask(t, "udp", addrs.udp, first))
	c := &dns.Client{Net: "udp", Timeout: 10 * time.Second}
	conn, err := c.Dial(addrs.udp)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	refused := 0
	for i := 1; i < 1000; i++ {
		q := query("n"+strconv.Itoa(i)+".svc.example.com.", dns.TypeA)
		r, _, err := c.ExchangeWithConn(q, conn)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case i < bound && (r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1):
			t.Fatalf("name %d of %d refused:\n%v", i+1, bound, r)
		case i >= bound && (r.Rcode != dns.RcodeRefused || len(r.Answer) != 0):
			t.Fatalf("name %d past the bound of %d:\n%v", i+1, bound, r)
		case i >= bound:
			refused++
		}
	}
	if n := s.pool.Len(); n != bound {
		t.Fatalf("pool holds %d names, bound %d", n, bound)
	}
	if st := s.Stats(); st.PoolFull != uint64(refused) {
		t.Fatalf("PoolFull %d, refused %d", st.PoolFull, refused)
	}
	// The names it has still resolve, to the same address.
	if a := checkAnswer(t, s, first, ask(t, "tcp", addrs.tcp, first)); a != firstAddr {
		t.Fatalf("after exhaustion %s moved from %s to %s", first.Question[0].Name, firstAddr, a)
	}
}

func TestRateLimit(t *testing.T) {
	// A rate that refills one token in about 16 minutes: the burst is all
	// the test gets.
	s, addrs := newStub(t, Config{Rate: 0.001, Burst: 5})
	q := query("api.example.com.", dns.TypeA)
	for i := range 5 {
		if r := ask(t, transports[i%2], addrs.of(transports[i%2]), q); r.Rcode != dns.RcodeSuccess {
			t.Fatalf("query %d within the burst:\n%v", i, r)
		}
	}
	for _, network := range transports {
		r := ask(t, network, addrs.of(network), q)
		if r.Rcode != dns.RcodeRefused || len(r.Answer) != 0 {
			t.Fatalf("%s past the rate: want REFUSED, got\n%v", network, r)
		}
	}
	if st := s.Stats(); st.RateLimited != 2 || st.Answered != 5 {
		t.Fatalf("stats %+v: want 5 answered, 2 rate limited", st)
	}
}

// rawUDP sends datagrams to addr from one socket and reads replies.
type rawUDP struct {
	t *testing.T
	c net.Conn
}

func dialRaw(t *testing.T, addr string) rawUDP {
	t.Helper()
	c, err := net.Dial("udp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return rawUDP{t, c}
}

func (u rawUDP) send(b []byte) {
	u.t.Helper()
	if _, err := u.c.Write(b); err != nil {
		u.t.Fatal(err)
	}
}

func (u rawUDP) recv() *dns.Msg {
	u.t.Helper()
	_ = u.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, 2048)
	n, err := u.c.Read(b)
	if err != nil {
		u.t.Fatal(err)
	}
	m := new(dns.Msg)
	if err := m.Unpack(b[:n]); err != nil {
		u.t.Fatalf("reply does not parse: %v", err)
	}
	return m
}

// Malformed datagrams: too short to answer and responses get nothing
// (the next reply on the socket is the next query's), the rest FORMERR.
func TestMalformedUDP(t *testing.T) {
	s, addrs := newStub(t, Config{})
	u := dialRaw(t, addrs.udp)
	valid, _ := query("api.example.com.", dns.TypeA).Pack()
	resp := append([]byte(nil), valid...)
	resp[2] |= 0x80 // QR
	for _, c := range []struct {
		name  string
		pkt   []byte
		rcode int // -1: no reply
	}{
		{"empty", nil, -1},
		{"short header", valid[:11], -1},
		{"a response", resp, -1},
		{"header only", valid[:12], dns.RcodeFormatError},
		{"cut question", valid[:20], dns.RcodeFormatError},
		{"pointer loop", append(append([]byte(nil), valid[:12]...), 0xc0, 12, 0, 1, 0, 1), dns.RcodeFormatError},
		{"oversized", append(append([]byte(nil), valid...), make([]byte, maxQuery)...), dns.RcodeFormatError},
		{"65k datagram", append(append([]byte(nil), valid...), make([]byte, 65000)...), dns.RcodeFormatError},
	} {
		t.Run(c.name, func(t *testing.T) {
			pkt := append([]byte(nil), c.pkt...)
			if len(pkt) >= 2 {
				pkt[0], pkt[1] = 0xab, 0xcd
			}
			u.send(pkt)
			marker := query("api.example.com.", dns.TypeA)
			m, _ := marker.Pack()
			u.send(m)
			r := u.recv()
			if c.rcode < 0 {
				if r.Id != marker.Id {
					t.Fatalf("a reply to the %s packet: %v", c.name, r)
				}
				return
			}
			if r.Id != 0xabcd || r.Rcode != c.rcode || len(r.Answer) != 0 {
				t.Fatalf("reply %v, want id 0xabcd, %s", r, dns.RcodeToString[c.rcode])
			}
			if r = u.recv(); r.Id != marker.Id {
				t.Fatalf("second reply %v, want the marker's", r)
			}
		})
	}
	if st := s.Stats(); st.Dropped != 3 {
		t.Fatalf("stats %+v: want 3 dropped", st)
	}
}

// tcpConn is a raw TCP connection to the stub.
func tcpConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// closedByPeer reports whether c is closed by the stub: a read ends in
// EOF or a reset (bounded, so that a connection left open fails the test
// rather than hangs it).
func closedByPeer(t *testing.T, c net.Conn) bool {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var b [512]byte
	for {
		_, err := c.Read(b[:])
		switch {
		case err == nil:
			continue // a reply before the close
		case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed), strings.Contains(err.Error(), "reset"):
			return true
		default:
			t.Logf("read: %v", err)
			return false
		}
	}
}

func TestTCPBounds(t *testing.T) {
	t.Run("connections", func(t *testing.T) {
		s, addrs := newStub(t, Config{MaxTCPConns: 2})
		q := query("api.example.com.", dns.TypeA)
		var held []*dns.Conn
		for range 2 {
			c, err := dns.Dial("tcp", addrs.tcp)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := c.WriteMsg(q); err != nil {
				t.Fatal(err)
			}
			if _, err := c.ReadMsg(); err != nil {
				t.Fatal(err)
			}
			held = append(held, c)
		}
		if !closedByPeer(t, tcpConn(t, addrs.tcp)) {
			t.Fatal("a third connection stayed open past MaxTCPConns 2")
		}
		if st := s.Stats(); st.TCPRefused != 1 {
			t.Fatalf("TCPRefused %d, want 1", st.TCPRefused)
		}
		// One closed makes room for another.
		_ = held[0].Close()
		deadline := time.Now().Add(10 * time.Second)
		for {
			c, err := dns.Dial("tcp", addrs.tcp)
			if err != nil {
				t.Fatal(err)
			}
			_ = c.WriteMsg(q)
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			_, err = c.ReadMsg()
			_ = c.Close()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no room after a connection closed: %v", err)
			}
		}
	})
	t.Run("queries per connection", func(t *testing.T) {
		_, addrs := newStub(t, Config{MaxTCPQueries: 3})
		c, err := dns.Dial("tcp", addrs.tcp)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for i := range 3 {
			if err := c.WriteMsg(query("api.example.com.", dns.TypeA)); err != nil {
				t.Fatal(err)
			}
			if _, err := c.ReadMsg(); err != nil {
				t.Fatalf("query %d: %v", i, err)
			}
		}
		_ = c.WriteMsg(query("api.example.com.", dns.TypeA))
		if !closedByPeer(t, c.Conn) {
			t.Fatal("a fourth query on a connection bounded to 3 was answered or left open")
		}
	})
	t.Run("idle", func(t *testing.T) {
		_, addrs := newStub(t, Config{TCPIdle: 50 * time.Millisecond})
		if !closedByPeer(t, tcpConn(t, addrs.tcp)) {
			t.Fatal("an idle connection stayed open")
		}
	})
	t.Run("oversized length", func(t *testing.T) {
		s, addrs := newStub(t, Config{})
		c := tcpConn(t, addrs.tcp)
		if _, err := c.Write([]byte{0xff, 0xff, 1, 2, 3}); err != nil {
			t.Fatal(err)
		}
		if !closedByPeer(t, c) {
			t.Fatal("a 65535-byte length prefix did not close the connection")
		}
		if st := s.Stats(); st.TCPTooLarge != 1 {
			t.Fatalf("TCPTooLarge %d, want 1", st.TCPTooLarge)
		}
	})
}

func TestConfigRefusesWhatItCannotBound(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Pool: netip.MustParsePrefix("10.0.0.0/16")}, "inside 127.0.0.0/8"},
		{Config{Pool: netip.MustParsePrefix("127.100.0.1/16")}, "host bits"},
		{Config{Pool: netip.MustParsePrefix("127.100.0.0/30"), MaxNames: 4}, "holds 1 to 3"},
		{Config{Pool: netip.MustParsePrefix("::1/128")}, "IPv4"},
		// The first name would get 127.0.0.1, where the proxy and the
		// Trial's own services listen; or the stub's own address.
		{Config{Pool: netip.MustParsePrefix("127.0.0.0/8")}, "127.0.0.1"},
		{Config{Pool: netip.MustParsePrefix("127.0.0.0/24"), MaxNames: 8}, "127.0.0.1"},
		{Config{Pool: netip.MustParsePrefix("127.0.0.32/27"), MaxNames: 8}, "127.0.0.53"},
		{Config{MaxTCPConns: -1}, "negative"},
	} {
		if _, err := New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v, want an error saying %q", c.cfg, err, c.want)
		}
	}
}

// TestRestoreAndRecord: what a stub records is what a later stub of the
// same Trial restores, so an address keeps its name across a restart.
func TestRestoreAndRecord(t *testing.T) {
	var kept []Assigned
	record := func(name string, a netip.Addr) error {
		kept = append(kept, Assigned{name, a})
		return nil
	}
	s, err := New(Config{Admit: func(string) bool { return true }, Record: record})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a.example.com", "b.example.com", "a.example.com"} {
		if _, _, err := s.pool.Assign(n); err != nil {
			t.Fatal(err)
		}
	}
	if len(kept) != 2 {
		t.Fatalf("recorded %v, want each new name once", kept)
	}
	later, err := New(Config{Restore: kept})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kept {
		if n, ok := later.Lookup(k.Addr); !ok || n != k.Name {
			t.Fatalf("after a restore %s is %q (%v), want %s", k.Addr, n, ok, k.Name)
		}
	}
	if a, fresh, err := later.pool.Assign("c.example.com"); err != nil || !fresh || a != netip.MustParseAddr("127.100.0.3") {
		t.Fatalf("the next name got %s %v %v, want 127.100.0.3, after the restored ones", a, fresh, err)
	}
	// A name the record fails for gets no address.
	failing, _ := New(Config{Record: func(string, netip.Addr) error { return errors.New("disk full") }})
	if _, _, err := failing.pool.Assign("d.example.com"); err == nil {
		t.Fatal("a name whose address could not be recorded got one")
	}
	if _, ok := failing.Lookup(netip.MustParseAddr("127.100.0.1")); ok {
		t.Fatal("an unrecorded address maps to a name")
	}
	for _, bad := range []Assigned{
		{"A.example.com", netip.MustParseAddr("127.100.0.9")},  // not normalised
		{"x.example.com", netip.MustParseAddr("127.100.0.0")},  // the pool's first
		{"x.example.com", netip.MustParseAddr("127.0.0.1")},    // outside it
		{"a.example.com", netip.MustParseAddr("127.100.0.20")}, // the name twice
		{"y.example.com", kept[0].Addr},                        // the address twice
	} {
		if _, err := New(Config{Restore: append(slices.Clone(kept), bad)}); err == nil {
			t.Errorf("restored %v", bad)
		}
	}
	if _, err := New(Config{MaxNames: 1, Restore: kept}); !errors.Is(err, ErrPoolFull) {
		t.Errorf("restored %d names into a pool of 1: %v", len(kept), err)
	}
}

// TestPoolNeverHandsOutPastItsRange: a name restored at the pool's last
// address leaves no next address in the range; a new name is then
// refused, never given the address after the range, which the steering
// does not cover (a connection to it would reach the Trial's own
// listener, or nothing, instead of the agent).
func TestPoolNeverHandsOutPastItsRange(t *testing.T) {
	p, err := NewPool(netip.MustParsePrefix("127.100.0.0/30"), 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Restore("last.example.com", netip.MustParseAddr("127.100.0.3")); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"a.example.com", "b.example.com"} {
		a, _, err := p.Assign(n)
		if err == nil && !p.Prefix().Contains(a) {
			t.Fatalf("%s was given %s, outside the pool %s", n, a, p.Prefix())
		}
		if err == nil {
			continue
		}
		if !errors.Is(err, ErrPoolFull) {
			t.Fatalf("%s: %v, want ErrPoolFull", n, err)
		}
	}
	if a, _, err := p.Assign("last.example.com"); err != nil || a != netip.MustParseAddr("127.100.0.3") {
		t.Fatalf("the restored name now has %s, %v", a, err)
	}
}

// CountsSize is what an agent maps a file for: the words themselves.
func TestCountsSize(t *testing.T) {
	if got := int(unsafe.Sizeof(Counts{})); got != CountsSize {
		t.Fatalf("Counts is %d bytes, CountsSize says %d", got, CountsSize)
	}
}

// Questions pipelined on one TCP connection by a client that leaves
// without reading the answers are counted, each of them: the stub reads
// on after an answer it cannot write. An attacker's review sent 250
// off-list questions that way from a Trial and exited; its receipt
// counted 31 to 67 of them.
func TestTCPQuestionsCountedWhenAnswersCannotBeWritten(t *testing.T) {
	s, addrs := newStub(t, Config{})
	c, err := net.Dial("tcp4", addrs.tcp)
	if err != nil {
		t.Fatal(err)
	}
	const sent = 200
	var b []byte
	for i := range sent {
		m, err := query("off"+strconv.Itoa(i)+".example.net.", dns.TypeA).Pack()
		if err != nil {
			t.Fatal(err)
		}
		b = append(append(b, byte(len(m)>>8), byte(len(m))), m...)
	}
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	// Gone without reading: the first answers written make the kernel
	// reset the connection, and the next writes fail.
	if err := c.(*net.TCPConn).SetLinger(0); err != nil {
		t.Fatal(err)
	}
	_ = c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for s.Stats().Denied < sent && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if st := s.Stats(); st.Denied != sent {
		t.Fatalf("stats %+v: want all %d questions denied", st, sent)
	}
}
