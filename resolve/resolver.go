// Package resolve is the proxy's DNS resolver: A and AAAA together,
// CNAME chains followed within bounds, answers cached by TTL, concurrent
// lookups of one name shared, and every failure a *record.Denial that
// says what DNS answered.
package resolve

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
	"github.com/trialnet/trialnet/record"
)

// Resolver turns an allowed name into addresses. Errors are *Denial with
// reason dns_nxdomain, dns_failed or dns_no_addresses.
type Resolver interface {
	Resolve(ctx context.Context, name string) (Answer, error)
}

// Answer is a resolved name: every A and AAAA address, after CNAMEs.
type Answer struct {
	Addrs  []netip.Addr
	CNAMEs []string // the chain followed, in order
	Cached bool
}

// Resolver defaults.
const (
	// QueryTimeout is how long one question to one server is waited for.
	QueryTimeout        = 2 * time.Second
	defaultMaxCNAMEs    = 8 // chain length followed before giving up
	defaultCacheEntries = 4096
	// defaultCacheAddrs bounds the addresses the cache holds, every
	// entry together (1.5 MiB): one Trial, through names under its
	// wildcard each answering with 4,000 addresses, held 335 MiB of the
	// agent's memory in 4,080 entries, the bound on entries alone.
	defaultCacheAddrs = 1 << 16
	// maxCachedAddrs: an answer with more addresses is used once, not
	// cached, so that a few such names do not push every other name out.
	maxCachedAddrs = defaultCacheAddrs / 64
	// smallAnswer: answers of at most this many addresses, as many as
	// the entries bound leaves each, never fill the addresses bound alone.
	smallAnswer    = defaultCacheAddrs / defaultCacheEntries
	maxCacheTTL    = time.Hour
	maxNegativeTTL = time.Minute
)

// DNSResolver queries A and AAAA with github.com/miekg/dns: over UDP,
// again over TCP when the answer is truncated, against each server in
// turn, with a small cache that honours TTLs (positive and RFC 2308
// negative). It never consults /etc/hosts: names are looked up in DNS.
type DNSResolver struct {
	servers  []string
	timeout  time.Duration
	mu       sync.Mutex
	cache    map[cacheKey]cacheEntry
	addrs    int                  // the addresses the cache holds
	tick     uint64               // counts cache uses: an entry's used is the last
	inflight map[cacheKey]*flight // one query per name and type at a time
}

// flight is a lookup in progress that later askers wait for.
type flight struct {
	done      chan struct{}
	res       lookupResult
	abandoned bool // the leader's context ended: the result is not the name's
}

type cacheKey struct {
	name  string
	qtype uint16
}

type cacheEntry struct {
	res     lookupResult
	expires time.Time
	used    uint64 // the tick of its last use
}

// NewDNSResolver returns a resolver for the given servers ("host:port" or
// a bare address, port 53). With no servers it reads /etc/resolv.conf.
func NewDNSResolver(servers []string) (*DNSResolver, error) {
	if len(servers) == 0 {
		cc, err := dns.ClientConfigFromFile("/etc/resolv.conf")
		if err != nil {
			return nil, fmt.Errorf("read the host's resolvers from /etc/resolv.conf: %w (give resolvers explicitly)", err)
		}
		for _, s := range cc.Servers {
			servers = append(servers, net.JoinHostPort(s, cc.Port))
		}
		if len(servers) == 0 {
			return nil, errors.New("/etc/resolv.conf lists no nameserver; give resolvers explicitly")
		}
	}
	r := &DNSResolver{timeout: QueryTimeout, cache: make(map[cacheKey]cacheEntry), inflight: make(map[cacheKey]*flight)}
	for _, s := range servers {
		ap, err := ParseServer(s)
		if err != nil {
			return nil, err
		}
		r.servers = append(r.servers, ap.String())
	}
	return r, nil
}

func ParseServer(s string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.AddrPortFrom(a, 53), nil
	}
	return netip.AddrPort{}, fmt.Errorf("resolver %q: want an IP address with an optional port (1.1.1.1, 127.0.0.53:53, [::1]:53)", s)
}

type lookupKind uint8

const (
	lookupOK lookupKind = iota
	lookupNXDomain
	lookupNoData
	lookupFailed
)

type lookupResult struct {
	kind   lookupKind
	addrs  []netip.Addr
	cnames []string
	detail string
	dns    record.DNSFailure // for lookupFailed
}

// errDNSTimeout marks a lookup that failed because no answer came in time.
var errDNSTimeout = errors.New("timeout")

// Resolve implements Resolver. A and AAAA are asked at once; the answer
// is every address either returned.
func (r *DNSResolver) Resolve(ctx context.Context, name string) (Answer, error) {
	fqdn := dns.Fqdn(strings.ToLower(name))
	var res [2]lookupResult
	var cached [2]bool
	var wg sync.WaitGroup
	for i, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
		// A cache hit is answered here; only misses pay for a goroutine.
		if res[i], cached[i] = r.cached(fqdn, qt); cached[i] {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], cached[i] = r.lookup(ctx, fqdn, qt)
		}()
	}
	wg.Wait()
	return answer(name, res, cached[0] && cached[1])
}

// FromCache answers name from the cache alone, as Resolve would, without
// asking anything: false unless both its A and AAAA results are cached.
// A caller that must wait its turn to ask (a Trial's lookup slots) needs
// no turn for these.
func (r *DNSResolver) FromCache(name string) (Answer, bool, error) {
	fqdn := dns.Fqdn(strings.ToLower(name))
	var res [2]lookupResult
	for i, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
		var ok bool
		if res[i], ok = r.cached(fqdn, qt); !ok {
			return Answer{}, false, nil
		}
	}
	ans, err := answer(name, res, true)
	return ans, true, err
}

// answer is the Answer to name, or its refusal, from its A and AAAA
// results.
func answer(name string, res [2]lookupResult, cached bool) (Answer, error) {
	ans := Answer{Cached: cached}
	for _, x := range res {
		ans.Addrs = append(ans.Addrs, x.addrs...)
		if len(x.cnames) > len(ans.CNAMEs) {
			ans.CNAMEs = x.cnames
		}
	}
	if len(ans.Addrs) > 0 {
		return ans, nil
	}
	switch {
	case res[0].kind == lookupNXDomain && res[1].kind == lookupNXDomain:
		return ans, record.Deny(record.ReasonDNSNXDomain, "%s does not exist (NXDOMAIN)", name)
	case res[0].kind == lookupFailed || res[1].kind == lookupFailed:
		d := res[0].detail
		if res[0].kind != lookupFailed {
			d = res[1].detail
		}
		f := res[0].dns
		if res[0].kind != lookupFailed {
			f = res[1].dns
		}
		return ans, &record.Denial{Reason: record.ReasonDNSFailed, Detail: fmt.Sprintf("resolving %s: %s", name, d), DNS: f}
	default:
		return ans, record.Deny(record.ReasonDNSNoAddresses, "%s has no A or AAAA records", name)
	}
}

func (r *DNSResolver) cached(fqdn string, qtype uint16) (lookupResult, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hit(cacheKey{fqdn, qtype})
}

// hit is key's cached result, if it has one still valid, which is then
// marked used; r.mu is held.
func (r *DNSResolver) hit(key cacheKey) (lookupResult, bool) {
	e, ok := r.cache[key]
	if !ok || !time.Now().Before(e.expires) {
		return lookupResult{}, false
	}
	r.tick++
	e.used = r.tick
	r.cache[key] = e
	return e.res, true
}

// lookup answers from the cache, joins a query already in flight for the
// same name and type (a burst of CONNECTs to a cold name asks once), or
// asks.
func (r *DNSResolver) lookup(ctx context.Context, fqdn string, qtype uint16) (lookupResult, bool) {
	key := cacheKey{fqdn, qtype}
	for {
		r.mu.Lock()
		if res, ok := r.hit(key); ok {
			r.mu.Unlock()
			return res, true
		}
		f, joined := r.inflight[key]
		if !joined {
			f = &flight{done: make(chan struct{})}
			r.inflight[key] = f
		}
		r.mu.Unlock()
		if !joined {
			return r.lead(ctx, key, f), false
		}
		select {
		case <-f.done:
			// A leader whose own caller gave up (its Trial removed, its
			// deadline passed) says nothing about the name: ask again.
			if !f.abandoned {
				return f.res, false
			}
		case <-ctx.Done():
			return lookupResult{kind: lookupFailed, detail: fmt.Sprintf("timed out (%v)", ctx.Err()),
				dns: record.DNSFailure{Timeout: errors.Is(ctx.Err(), context.DeadlineExceeded)}}, false
		}
	}
}

// lead asks for key on behalf of everyone waiting on f.
func (r *DNSResolver) lead(ctx context.Context, key cacheKey, f *flight) lookupResult {
	res, ttl := r.follow(ctx, key.name, key.qtype)
	r.mu.Lock()
	if ttl > 0 && res.kind != lookupFailed && len(res.addrs) <= maxCachedAddrs {
		r.store(key, res, ttl)
	}
	delete(r.inflight, key)
	r.mu.Unlock()
	f.res, f.abandoned = res, ctx.Err() != nil
	close(f.done)
	return res
}

// store caches res under key for ttl; r.mu is held.
func (r *DNSResolver) store(key cacheKey, res lookupResult, ttl time.Duration) {
	if e, ok := r.cache[key]; ok { // expired, or it would not be asked
		r.drop(key, e)
	}
	r.makeRoom(len(res.addrs))
	r.tick++
	r.cache[key] = cacheEntry{res, time.Now().Add(ttl), r.tick}
	r.addrs += len(res.addrs)
}

func (r *DNSResolver) drop(key cacheKey, e cacheEntry) {
	delete(r.cache, key)
	r.addrs -= len(e.res.addrs)
}

// makeRoom makes room for an entry of n addresses within the cache's
// bounds: it drops the expired entries, then, if that is not enough,
// the least recently used, down to seven eighths of each bound. The cache
// is every Trial's: emptying it whole when full let one Trial that asks
// for new names under its wildcard make every other Trial's names be
// asked again; a name in use stays. Seven eighths whatever it drops: it
// walks the whole cache under the lock every lookup takes, and stopping
// once one entry fitted (a few expired answers) had a Trial whose names
// live a second make each of its lookups walk it again.
func (r *DNSResolver) makeRoom(n int) {
	fits := func(entries, addrs int) bool { return len(r.cache) < entries && r.addrs+n <= addrs }
	if fits(defaultCacheEntries, defaultCacheAddrs) {
		return
	}
	now := time.Now()
	for k, e := range r.cache {
		if now.After(e.expires) {
			r.drop(k, e)
		}
	}
	if fits(defaultCacheEntries*7/8, defaultCacheAddrs*7/8) {
		return
	}
	type use struct {
		key  cacheKey
		used uint64
	}
	uses := make([]use, 0, len(r.cache))
	for k, e := range r.cache {
		uses = append(uses, use{k, e.used})
	}
	slices.SortFunc(uses, func(a, b use) int { return cmp.Compare(a.used, b.used) })
	// Addresses short, large answers go first: 56 of 1,024 fill that
	// bound, and pushed out every name least recently used before them,
	// where answers of at most smallAnswer are pushed out only by the
	// entries bound, some 3,500 new answers.
	for _, u := range uses {
		if r.addrs+n <= defaultCacheAddrs*7/8 {
			break
		}
		if e := r.cache[u.key]; len(e.res.addrs) > smallAnswer {
			r.drop(u.key, e)
		}
	}
	for _, u := range uses {
		if fits(defaultCacheEntries*7/8, defaultCacheAddrs*7/8) {
			return
		}
		if e, ok := r.cache[u.key]; ok {
			r.drop(u.key, e)
		}
	}
}

// follow asks for qtype at fqdn and follows CNAMEs, within the answer
// and with new queries, up to defaultMaxCNAMEs. It returns the result and
// how long it may be cached.
func (r *DNSResolver) follow(ctx context.Context, fqdn string, qtype uint16) (lookupResult, time.Duration) {
	var res lookupResult
	ttl := maxCacheTTL
	target := fqdn
	for range defaultMaxCNAMEs + 1 {
		msg, err := r.exchange(ctx, target, qtype)
		if err != nil {
			return lookupResult{kind: lookupFailed, detail: err.Error(), dns: record.DNSFailure{Timeout: errors.Is(err, errDNSTimeout)}}, 0
		}
		switch msg.Rcode {
		case dns.RcodeSuccess:
		case dns.RcodeNameError:
			res.kind = lookupNXDomain
			return res, min(ttl, negativeTTL(msg))
		default:
			rcode := dns.RcodeToString[msg.Rcode]
			return lookupResult{kind: lookupFailed, detail: rcode + " from the resolver", dns: record.DNSFailure{Rcode: rcode}}, 0
		}
		addrs, next, t, err := walkAnswer(msg.Answer, target, qtype, &res.cnames)
		if err != nil {
			return lookupResult{kind: lookupFailed, detail: err.Error()}, 0
		}
		ttl = min(ttl, t)
		if len(addrs) > 0 {
			res.addrs = addrs
			return res, ttl
		}
		if next == target {
			res.kind = lookupNoData
			return res, min(ttl, negativeTTL(msg))
		}
		target = next
	}
	return lookupResult{kind: lookupFailed, detail: fmt.Sprintf("CNAME chain longer than %d", defaultMaxCNAMEs)}, 0
}

// walkAnswer follows the CNAME chain from owner within one answer section
// and returns the addresses of its end, the name it ends at, and the
// smallest TTL used. Records for names not on the chain are ignored, so
// an answer cannot smuggle in addresses for other names. A chain longer
// than defaultMaxCNAMEs (over all queries) or a loop is an error.
func walkAnswer(rrs []dns.RR, owner string, qtype uint16, cnames *[]string) ([]netip.Addr, string, time.Duration, error) {
	ttl := maxCacheTTL
	for {
		var addrs []netip.Addr
		next := ""
		for _, rr := range rrs {
			h := rr.Header()
			if !strings.EqualFold(h.Name, owner) {
				continue
			}
			switch v := rr.(type) {
			case *dns.A:
				if qtype == dns.TypeA {
					if a, ok := netip.AddrFromSlice(v.A.To4()); ok {
						addrs = append(addrs, a)
						ttl = min(ttl, time.Duration(h.Ttl)*time.Second)
					}
				}
			case *dns.AAAA:
				if qtype == dns.TypeAAAA {
					if a, ok := netip.AddrFromSlice(v.AAAA); ok && len(v.AAAA) == net.IPv6len {
						addrs = append(addrs, a)
						ttl = min(ttl, time.Duration(h.Ttl)*time.Second)
					}
				}
			case *dns.CNAME:
				next = strings.ToLower(v.Target)
				ttl = min(ttl, time.Duration(h.Ttl)*time.Second)
			}
		}
		if len(addrs) > 0 || next == "" {
			return addrs, owner, ttl, nil
		}
		name := strings.TrimSuffix(next, ".")
		if slices.Contains(*cnames, name) || strings.EqualFold(next, owner) {
			return nil, "", 0, fmt.Errorf("CNAME loop at %s", name)
		}
		*cnames = append(*cnames, name)
		if len(*cnames) > defaultMaxCNAMEs {
			return nil, "", 0, fmt.Errorf("CNAME chain longer than %d", defaultMaxCNAMEs)
		}
		owner = next
	}
}

func negativeTTL(m *dns.Msg) time.Duration {
	for _, rr := range m.Ns {
		if soa, ok := rr.(*dns.SOA); ok {
			return min(time.Duration(min(soa.Hdr.Ttl, soa.Minttl))*time.Second, maxNegativeTTL)
		}
	}
	return 0 // no SOA: do not cache the negative answer
}

// exchange sends one query to each server in turn until one answers with
// something other than SERVFAIL or REFUSED; truncated UDP answers are
// asked again over TCP.
func (r *DNSResolver) exchange(ctx context.Context, name string, qtype uint16) (*dns.Msg, error) {
	q := new(dns.Msg)
	q.SetQuestion(name, qtype)
	q.SetEdns0(1232, false)
	var last error
	var lastMsg *dns.Msg
	for _, server := range r.servers {
		if err := ctx.Err(); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				return nil, fmt.Errorf("timed out (%v): %w", err, errDNSTimeout)
			}
			return nil, fmt.Errorf("timed out (%v)", err)
		}
		m, err := r.exchange1(ctx, q, server)
		if err != nil {
			last = err
			continue
		}
		if m.Rcode == dns.RcodeServerFailure || m.Rcode == dns.RcodeRefused {
			lastMsg = m
			continue
		}
		return m, nil
	}
	if lastMsg != nil {
		return lastMsg, nil
	}
	return nil, last
}

// query sends q over one connection that is closed as soon as ctx ends:
// miekg/dns only applies ctx's deadline, and a lookup whose Trial is
// removed must stop waiting at once.
func query(ctx context.Context, c *dns.Client, q *dns.Msg, server string) (*dns.Msg, error) {
	conn, err := c.DialContext(ctx, server)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()
	m, _, err := c.ExchangeWithConnContext(ctx, q, conn)
	return m, err
}

func (r *DNSResolver) exchange1(ctx context.Context, q *dns.Msg, server string) (*dns.Msg, error) {
	for _, network := range []string{"udp", "tcp"} {
		m, err := query(ctx, &dns.Client{Net: network, Timeout: r.timeout}, q, server)
		if err != nil {
			var ne net.Error
			if ctx.Err() != nil {
				if errors.Is(ctx.Err(), context.DeadlineExceeded) {
					return nil, fmt.Errorf("query %s over %s: %w (%w)", server, network, context.Cause(ctx), errDNSTimeout)
				}
				return nil, fmt.Errorf("query %s over %s: %w", server, network, context.Cause(ctx))
			}
			if errors.As(err, &ne) && ne.Timeout() {
				return nil, fmt.Errorf("no answer from %s over %s (%w)", server, network, errDNSTimeout)
			}
			return nil, fmt.Errorf("query %s over %s: %v", server, network, err)
		}
		if len(m.Question) != 1 || !strings.EqualFold(m.Question[0].Name, q.Question[0].Name) || m.Question[0].Qtype != q.Question[0].Qtype {
			return nil, fmt.Errorf("%s answered a different question", server)
		}
		if !m.Truncated {
			return m, nil
		}
	}
	return nil, fmt.Errorf("%s sent a truncated answer over TCP", server)
}
