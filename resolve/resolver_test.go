package resolve

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/trialnet/trialnet/internal/testhost"
)

// testServer answers every name under a test zone over UDP and TCP: each
// A question with addrs(name) addresses (a truncated UDP answer when they
// do not fit, as a real server does), each AAAA with none, and counts the
// questions by name.
type testServer struct {
	addr  string
	addrs func(name string) int

	mu      sync.Mutex
	queries map[string]int
}

func newTestServer(t *testing.T, addrs func(name string) int) *testServer {
	t.Helper()
	s := &testServer{addrs: addrs, queries: map[string]int{}}
	addr, stop, err := testhost.ServeDNSHandler(dns.HandlerFunc(s.serve))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	s.addr = addr
	return s
}

func (s *testServer) serve(w dns.ResponseWriter, r *dns.Msg) {
	q := r.Question[0]
	name := strings.ToLower(q.Name)
	s.mu.Lock()
	s.queries[name]++
	s.mu.Unlock()
	m := new(dns.Msg)
	m.SetReply(r)
	m.Compress = true
	if q.Qtype == dns.TypeA {
		for i := range s.addrs(name) {
			a := netip.AddrFrom4([4]byte{203, 0, byte(i >> 8), byte(i)})
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 3600}, A: a.AsSlice()})
		}
	}
	if len(m.Answer) == 0 {
		m.Ns = []dns.RR{&dns.SOA{Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: 3600},
			Ns: "ns.test.", Mbox: "root.test.", Minttl: 3600}}
	}
	if w.RemoteAddr().Network() == "udp" && m.Len() > 512 {
		m.Answer, m.Truncated = nil, true
	}
	_ = w.WriteMsg(m)
}

func (s *testServer) asked(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queries[dns.Fqdn(name)]
}

func resolveAll(t *testing.T, r *DNSResolver, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := r.Resolve(context.Background(), n); err != nil {
			t.Fatalf("resolve %s: %v", n, err)
		}
	}
}

// The cache is every Trial's: bounded by its entries alone, one Trial
// asking for names under its wildcard, each with thousands of addresses,
// made it hold hundreds of MiB of the agent's memory. It holds at most
// defaultCacheAddrs addresses, and none of an answer with more than
// maxCachedAddrs.
func TestCacheBoundedByAddresses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		each  int // addresses per name
		names int
	}{
		{"answers too large to cache", 4000, 20},
		{"answers just small enough", maxCachedAddrs, 2 * defaultCacheAddrs / maxCachedAddrs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newTestServer(t, func(string) int { return tc.each })
			r, err := NewDNSResolver([]string{srv.addr})
			if err != nil {
				t.Fatal(err)
			}
			for i := range tc.names {
				resolveAll(t, r, fmt.Sprintf("n%d.exfil.test", i))
			}
			r.mu.Lock()
			held := 0
			for _, e := range r.cache {
				held += len(e.res.addrs)
			}
			r.mu.Unlock()
			if held > defaultCacheAddrs {
				t.Fatalf("the cache holds %d addresses of %d names of %d each, past its bound of %d", held, tc.names, tc.each, defaultCacheAddrs)
			}
			t.Logf("%d names of %d addresses: %d held", tc.names, tc.each, held)
		})
	}
}

// One Trial asking for more new names than the cache holds must not push
// out a name another Trial uses all the while: the cache was emptied
// whole when full, and every name in use was asked again.
func TestCacheKeepsNamesInUse(t *testing.T) {
	srv := newTestServer(t, func(string) int { return 1 })
	r, err := NewDNSResolver([]string{srv.addr})
	if err != nil {
		t.Fatal(err)
	}
	const hot = "api.provider.test"
	resolveAll(t, r, hot)
	for i := range defaultCacheEntries {
		resolveAll(t, r, fmt.Sprintf("n%d.exfil.test", i))
		if i%256 == 0 {
			resolveAll(t, r, hot)
		}
	}
	resolveAll(t, r, hot)
	if n := srv.asked(hot); n != 2 { // its A and its AAAA, once each
		t.Fatalf("%s, in use throughout, was asked %d times, not once for each type: another name pushed it out of the cache", hot, n)
	}
}

// fillCache stores n answers of one address each, named fill<i>., the first
// expired ones already.
func fillCache(r *DNSResolver, n, expired int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range n {
		r.store(cacheKey{fmt.Sprintf("fill%d.", i), dns.TypeA}, lookupResult{addrs: []netip.Addr{netip.AddrFrom4([4]byte{203, 0, 113, 1})}}, time.Hour)
		if i < expired {
			e := r.cache[cacheKey{fmt.Sprintf("fill%d.", i), dns.TypeA}]
			e.expires = time.Now().Add(-time.Second)
			r.cache[cacheKey{fmt.Sprintf("fill%d.", i), dns.TypeA}] = e
		}
	}
}

// Making room walks the whole cache under the lock every lookup waits
// for, so it must leave room for many answers, not one: when a few
// expired answers were enough for the new one, it stopped there, and a
// Trial whose names live a second made every one of its lookups walk
// the whole cache again. It makes room down to seven eighths of each
// bound, whatever it drops.
func TestMakeRoomLeavesRoomForMore(t *testing.T) {
	for _, expired := range []int{0, 1, defaultCacheEntries / 16} {
		r, err := NewDNSResolver([]string{"127.0.0.1:53"})
		if err != nil {
			t.Fatal(err)
		}
		fillCache(r, defaultCacheEntries, expired)
		r.mu.Lock()
		r.store(cacheKey{"new.test.", dns.TypeA}, lookupResult{}, time.Hour)
		n := len(r.cache)
		r.mu.Unlock()
		if n > defaultCacheEntries*7/8+1 {
			t.Errorf("a full cache with %d expired answers, making room for one: %d answers held, want at most %d (seven eighths, and the new one)", expired, n, defaultCacheEntries*7/8+1)
		}
	}
}

// The addresses bound is reached by a few large answers: 56 of 1,024
// fill it, and least recently used first pushed out a name another
// Trial used all the while, far within the 3,500 new answers a name in
// use is said to stay for. Large answers make room among themselves.
func TestLargeAnswersKeepSmallNamesInUse(t *testing.T) {
	const hot = "api.provider.test"
	srv := newTestServer(t, func(name string) int {
		if name == dns.Fqdn(hot) {
			return 1
		}
		return maxCachedAddrs
	})
	r, err := NewDNSResolver([]string{srv.addr})
	if err != nil {
		t.Fatal(err)
	}
	resolveAll(t, r, hot)
	for i := range 4 * defaultCacheAddrs / maxCachedAddrs {
		resolveAll(t, r, fmt.Sprintf("n%d.exfil.test", i))
		if i%100 == 99 {
			resolveAll(t, r, hot)
		}
	}
	if n := srv.asked(hot); n != 2 { // its A and its AAAA, once each
		t.Fatalf("%s, used every 100 new answers, was asked %d times, not once for each type: large answers pushed it out of the cache", hot, n)
	}
}
