package dnsstub

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/trialnet/trialnet/wire"
)

// DefaultPoolCIDR is the range a Trial's names get their addresses from:
// inside 127.0.0.0/8, so every address is local to the Trial's own
// loopback, and clear of what else lives there (the proxy endpoint
// 127.0.0.1:3128, this stub's own DefaultListen, the 127.0.0.2 tests use).
const DefaultPoolCIDR = "127.100.0.0/16"

// DefaultMaxNames bounds the names one Trial is given addresses for.
const DefaultMaxNames = 4096

// ErrPoolFull means a Trial has been given addresses for as many names as
// it may have; names it already has keep theirs.
var ErrPoolFull = errors.New("address pool full")

// Pool hands out loopback addresses to names: each name gets one, the same
// for the pool's life, and the reverse map says which name an address was
// given to (what the connection side needs to turn a connection back into
// name:port). Safe for concurrent use.
type Pool struct {
	prefix netip.Prefix
	max    int

	// record, if set, is told each new name and address before Assign
	// returns it; when it fails, the name gets none.
	record func(name string, addr netip.Addr) error

	mu     sync.Mutex
	byName map[string]netip.Addr
	byAddr map[netip.Addr]string
	next   netip.Addr
}

// Assigned is one name and the address it was given.
type Assigned struct {
	Name string
	Addr netip.Addr
}

// NewPool returns a pool over prefix, an IPv4 range inside 127.0.0.0/8
// that leaves out 127.0.0.1 and the stub's own address, handing out at
// most maxNames addresses (at most all but the prefix's first, which is
// never given out).
func NewPool(prefix netip.Prefix, maxNames int) (*Pool, error) {
	loopback := netip.MustParsePrefix("127.0.0.0/8")
	if !prefix.IsValid() || !prefix.Addr().Is4() || prefix.Bits() < loopback.Bits() || !loopback.Contains(prefix.Addr()) {
		return nil, fmt.Errorf("address pool %s: want an IPv4 range inside 127.0.0.0/8 (such as %s), so that every address is local to the Trial's loopback", prefix, DefaultPoolCIDR)
	}
	if prefix != prefix.Masked() {
		return nil, fmt.Errorf("address pool %s: has host bits set; did you mean %s?", prefix, prefix.Masked())
	}
	// A name given one of these would be a way to the proxy endpoint and
	// the Trial's own services, or to the stub, by an allowed name.
	for _, a := range []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddrPort(DefaultListen).Addr()} {
		if prefix.Contains(a) {
			return nil, fmt.Errorf("address pool %s: holds %s, which is not the pool's to give; use a range clear of it, such as %s", prefix, a, DefaultPoolCIDR)
		}
	}
	if size := 1<<(32-prefix.Bits()) - 1; maxNames <= 0 || maxNames > size {
		return nil, fmt.Errorf("address pool %s: %d names asked for, but it holds 1 to %d", prefix, maxNames, size)
	}
	return &Pool{
		prefix: prefix,
		max:    maxNames,
		byName: make(map[string]netip.Addr),
		byAddr: make(map[netip.Addr]string),
		next:   prefix.Addr().Next(),
	}, nil
}

// Prefix is the pool's range.
func (p *Pool) Prefix() netip.Prefix { return p.prefix }

// Assign returns name's address, giving it the next free one when it has
// none yet (fresh reports that). Past the pool's bound it returns
// ErrPoolFull.
func (p *Pool) Assign(name string) (addr netip.Addr, fresh bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if a, ok := p.byName[name]; ok {
		return a, false, nil
	}
	if len(p.byName) >= p.max {
		return netip.Addr{}, false, fmt.Errorf("%q: %w (%d names, the bound)", name, ErrPoolFull, p.max)
	}
	a := p.next
	if !p.prefix.Contains(a) {
		// Restored names may sit at the range's end, leaving gaps below:
		// an address past the range is one the steering does not cover.
		return netip.Addr{}, false, fmt.Errorf("%q: %w (no address left after %s in %s)", name, ErrPoolFull, a.Prev(), p.prefix)
	}
	if p.record != nil {
		if err := p.record(name, a); err != nil {
			return netip.Addr{}, false, fmt.Errorf("%q: the address is not given, as it could not be recorded: %w", name, err)
		}
	}
	p.next = a.Next()
	p.byName[name] = a
	p.byAddr[a] = name
	return a, true, nil
}

// Restore gives name the address a, as an earlier pool of the same Trial
// did, so that a connection to a keeps meaning name: an agent that
// restarts restores what its predecessor handed out. Addresses handed
// out later follow the highest restored one. It refuses what this pool
// could not have handed out: a name that is not one, an address outside
// its range or its first, a name or address it has already, or one past
// its bound.
func (p *Pool) Restore(name string, a netip.Addr) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n, err := wire.NormaliseName(name); err != nil || n != name {
		return fmt.Errorf("restore %q: not a normalised host name", name)
	}
	switch _, have := p.byName[name]; {
	case !p.prefix.Contains(a) || a == p.prefix.Addr():
		return fmt.Errorf("restore %q: %s is not an address this pool (%s) hands out", name, a, p.prefix)
	case have || p.byAddr[a] != "":
		return fmt.Errorf("restore %q at %s: the name or the address is given already", name, a)
	case len(p.byName) >= p.max:
		return fmt.Errorf("restore %q: %w (%d names, the bound)", name, ErrPoolFull, p.max)
	}
	p.byName[name] = a
	p.byAddr[a] = name
	if a.Compare(p.next) >= 0 {
		p.next = a.Next()
	}
	return nil
}

// Name is the name addr was given to; false for an address never handed
// out (inside the pool or not).
func (p *Pool) Name(addr netip.Addr) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, ok := p.byAddr[addr.Unmap()]
	return n, ok
}

// Len is how many names have an address.
func (p *Pool) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.byName)
}
