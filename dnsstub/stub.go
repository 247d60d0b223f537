//go:build linux

// Package dnsstub is a Trial's DNS server, and its only one: it gives the
// names the Trial's policy admits an address from a per-Trial loopback
// pool and refuses every other question. It has no upstream: no query, and
// no part of one, is ever sent anywhere.
package dnsstub

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/trialnet/trialnet/internal/ratelimit"
)

// DefaultListen is where a Trial's stub listens, UDP and TCP, on the
// Trial's own loopback: the address systemd-resolved's stub-resolv.conf
// names, so that a Trial that reads the host's resolv.conf through a
// symlink still asks this stub, and nothing else, in its namespace.
const DefaultListen = "127.0.0.53:53"

// Bounds, each overridable in Config; what a Trial sees when it meets one
// is in docs/transparent.md.
const (
	DefaultMaxTCPConns   = 16               // open TCP connections; more are closed on accept
	DefaultTCPIdle       = 10 * time.Second // per query on a TCP connection, its read and answer
	DefaultMaxTCPQueries = 256              // queries on one TCP connection, then it is closed
	DefaultRate          = 200              // queries per second, UDP and TCP together...
	DefaultBurst         = 400              // ...with this many at once; past it, REFUSED
)

// maxQuery is the largest query answered: a question is at most 12+255+4
// bytes, and an EDNS OPT record with a cookie fits in what is left. A
// larger UDP datagram gets FORMERR; a TCP length prefix past it closes
// the connection before any of the body is read.
const maxQuery = 512

// answerTTL is what an answer says it may be cached for. The address is
// the name's for the Trial's life; a short TTL only makes a name the
// Trial loses (deny) fail at its next lookup rather than at connect.
const answerTTL = 60

// Config is one Trial's stub.
type Config struct {
	// Admit is the Trial's policy: whether name (normalised: lower case,
	// no trailing dot) may have an address. Nil admits nothing. Called
	// concurrently; it must not block.
	Admit func(name string) bool
	// Learn, when not nil, makes this a learning Trial's stub: every
	// valid name is admitted, and Learn is told each name the first time
	// it is given an address. Called concurrently; it must not block.
	Learn func(name string)
	// Restore are the names an earlier stub of the same Trial gave
	// addresses (Pool.Restore): they keep them.
	Restore []Assigned
	// Record, when not nil, is told each name given an address, and the
	// address, before the answer is sent, so that it can be kept for
	// Restore; a name it fails to record is answered REFUSED. Called
	// one at a time; it must not block for long.
	Record func(name string, addr netip.Addr) error

	// Counts, when not nil, is where the stub counts (Stats): memory an
	// agent maps from a file, so that a stub of the same Trial in a later
	// process, after a restart or a hand-over, counts on from it. Nil: a
	// Counts of the stub's own.
	Counts *Counts

	Pool          netip.Prefix  // zero: DefaultPoolCIDR
	MaxNames      int           // zero: DefaultMaxNames
	MaxTCPConns   int           // zero: DefaultMaxTCPConns
	TCPIdle       time.Duration // zero: DefaultTCPIdle
	MaxTCPQueries int           // zero: DefaultMaxTCPQueries
	Rate          float64       // zero: DefaultRate
	Burst         int           // zero: DefaultBurst
}

// Stats counts what the stub answered. Every query is counted once.
type Stats struct {
	Answered    uint64 `json:"answered"`      // an address given
	NoData      uint64 `json:"nodata"`        // an admitted name, a type other than A (AAAA among them)
	NXDomain    uint64 `json:"nxdomain"`      // a name the policy does not admit, or a reverse name
	Refused     uint64 `json:"refused"`       // a class, type or name this stub never answers
	Denied      uint64 `json:"denied"`        // questions for a name the Trial may not resolve, whatever their type: off its allowlist, or no host name (reverse names and the root are not counted)
	FormErr     uint64 `json:"formerr"`       // not one parsable question, or larger than maxQuery
	NotImp      uint64 `json:"notimp"`        // an opcode other than QUERY
	RateLimited uint64 `json:"rate_limited"`  // REFUSED: past the query rate
	PoolFull    uint64 `json:"pool_full"`     // REFUSED: a new name past MaxNames, or one Record failed for
	Dropped     uint64 `json:"dropped"`       // not answered: shorter than a header, or itself a response
	TCPRefused  uint64 `json:"tcp_refused"`   // TCP connections closed on accept: MaxTCPConns open
	TCPTooLarge uint64 `json:"tcp_too_large"` // TCP connections closed: a length prefix past maxQuery
	Names       uint64 `json:"names"`         // names with an address (restored ones included)
}

// Server is a Trial's stub; it serves the sockets it is given with Serve*
// until Close.
type Server struct {
	admit         func(string) bool
	learn         func(string)
	pool          *Pool
	bucket        *ratelimit.Bucket
	maxTCPConns   int
	tcpIdle       time.Duration
	maxTCPQueries int

	mu      sync.Mutex
	closed  bool
	closers map[io.Closer]struct{} // sockets being served, TCP connections included
	tcpOpen int
	wg      sync.WaitGroup

	stats *Counts
}

// New makes a stub; it serves nothing until Serve* is called.
func New(cfg Config) (*Server, error) {
	prefix := cfg.Pool
	if !prefix.IsValid() {
		prefix = netip.MustParsePrefix(DefaultPoolCIDR)
	}
	pool, err := NewPool(prefix, orDefault(cfg.MaxNames, DefaultMaxNames))
	if err != nil {
		return nil, fmt.Errorf("dns stub: %w", err)
	}
	for _, r := range cfg.Restore {
		if err := pool.Restore(r.Name, r.Addr); err != nil {
			return nil, fmt.Errorf("dns stub: %w", err)
		}
	}
	pool.record = cfg.Record
	admit := cfg.Admit
	if admit == nil {
		admit = func(string) bool { return false }
	}
	if cfg.Rate < 0 || cfg.Burst < 0 || cfg.MaxTCPConns < 0 || cfg.MaxTCPQueries < 0 || cfg.TCPIdle < 0 {
		return nil, errors.New("dns stub: a negative bound; give a positive one, or zero for the default")
	}
	rate := cfg.Rate
	if rate == 0 {
		rate = DefaultRate
	}
	counts := cfg.Counts
	if counts == nil {
		counts = new(Counts)
	}
	return &Server{
		stats:         counts,
		admit:         admit,
		learn:         cfg.Learn,
		pool:          pool,
		bucket:        ratelimit.New(rate, orDefault(cfg.Burst, DefaultBurst)),
		maxTCPConns:   orDefault(cfg.MaxTCPConns, DefaultMaxTCPConns),
		tcpIdle:       orDefault(cfg.TCPIdle, DefaultTCPIdle),
		maxTCPQueries: orDefault(cfg.MaxTCPQueries, DefaultMaxTCPQueries),
		closers:       make(map[io.Closer]struct{}),
	}, nil
}

func orDefault[T int | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// Lookup is the name addr was given to, for the connection side: false
// for an address this stub never handed out.
func (s *Server) Lookup(addr netip.Addr) (string, bool) { return s.pool.Name(addr) }

// Pool is the range the stub's addresses come from.
func (s *Server) Pool() netip.Prefix { return s.pool.Prefix() }

// Stats are the counts so far.
func (s *Server) Stats() Stats {
	c := func(i stat) uint64 { return s.stats[i].Load() }
	return Stats{
		Answered: c(statAnswered), NoData: c(statNoData), NXDomain: c(statNXDomain),
		Refused: c(statRefused), Denied: c(statDenied), FormErr: c(statFormErr), NotImp: c(statNotImp),
		RateLimited: c(statRateLimited), PoolFull: c(statPoolFull), Dropped: c(statDropped),
		TCPRefused: c(statTCPRefused), TCPTooLarge: c(statTCPTooLarge), Names: uint64(s.pool.Len()),
	}
}

// Counts are the counters behind Stats, one word each, in the order of
// the stat constants: a layout that a file mapped by one process and
// then another keeps (CountsSize bytes).
type Counts [statsLen]atomic.Uint64

// CountsSize is the size of Counts in memory (TestCountsSize).
const CountsSize = int(statsLen) * 8

type stat int

const (
	statAnswered stat = iota
	statNoData
	statNXDomain
	statRefused
	statDenied
	statFormErr
	statNotImp
	statRateLimited
	statPoolFull
	statDropped
	statTCPRefused
	statTCPTooLarge
	statsLen
)

func (s *Server) count(i stat) { s.stats[i].Add(1) }

// track registers c to be closed by Close; false when the server is
// already closed (c is then closed here).
func (s *Server) track(c io.Closer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = c.Close()
		return false
	}
	s.closers[c] = struct{}{}
	return true
}

func (s *Server) untrack(c io.Closer) {
	s.mu.Lock()
	delete(s.closers, c)
	s.mu.Unlock()
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// Close stops serving: every socket given to Serve* and every TCP
// connection is closed, and Close returns when their goroutines have.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	var errs []error
	for c := range s.closers {
		errs = append(errs, c.Close())
	}
	clear(s.closers)
	s.mu.Unlock()
	s.wg.Wait()
	return errors.Join(errs...)
}

// ServeUDP answers the datagrams pc receives, one at a time, until Close
// (then it returns nil) or a read fails. One goroutine and two buffers
// whatever arrives: a flood queues in the socket, not here.
func (s *Server) ServeUDP(pc net.PacketConn) error {
	if !s.track(pc) {
		return nil
	}
	defer s.untrack(pc)
	in := make([]byte, maxQuery+1) // one byte more, to see that a datagram was larger
	out := make([]byte, 0, maxQuery)
	for {
		n, from, err := pc.ReadFrom(in)
		if err != nil {
			if s.isClosed() {
				return nil
			}
			return fmt.Errorf("dns stub: read a UDP query: %w", err)
		}
		if reply := s.answer(in[:n], n > maxQuery, out); reply != nil {
			_, _ = pc.WriteTo(reply, from) // the client's loss: it asks again
		}
	}
}

// Tally counts a query that will never be answered, as answering it
// would have counted it: one a Trial sent just before it ended, still
// queued in the stub's UDP socket when the stub was stopped (the agent
// reads those from a copy of the socket). Without it, a burst sent as
// the Trial exits would be missing from the counts its receipt signs.
func (s *Server) Tally(datagram []byte) {
	n := len(datagram)
	_ = s.answer(datagram[:min(n, maxQuery)], n > maxQuery, make([]byte, 0, maxQuery))
}

// ServeTCP answers queries on the connections ln accepts, until Close
// (then it returns nil) or an accept fails.
func (s *Server) ServeTCP(ln net.Listener) error {
	if !s.track(ln) {
		return nil
	}
	defer s.untrack(ln)
	for {
		c, err := ln.Accept()
		if err != nil {
			if s.isClosed() {
				return nil
			}
			return fmt.Errorf("dns stub: accept a TCP connection: %w", err)
		}
		if !s.openTCP(c) {
			continue
		}
		go func() {
			defer s.wg.Done()
			defer s.closeTCP(c)
			s.serveConn(c)
		}()
	}
}

// openTCP admits c within MaxTCPConns, or closes it. Admitted, it is
// counted in wg under the same lock as Close takes, so that Close never
// returns with its goroutine yet to start.
func (s *Server) openTCP(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
	case s.tcpOpen >= s.maxTCPConns:
		s.count(statTCPRefused)
	default:
		s.tcpOpen++
		s.closers[c] = struct{}{}
		s.wg.Add(1)
		return true
	}
	_ = c.Close()
	return false
}

func (s *Server) closeTCP(c net.Conn) {
	s.mu.Lock()
	delete(s.closers, c)
	s.tcpOpen--
	s.mu.Unlock()
	_ = c.Close()
}

// serveConn answers up to MaxTCPQueries queries on c (RFC 7766 framing:
// a two-byte length, then the message), each read and answered within
// TCPIdle. Once an answer cannot be written (the client left without
// reading), the queries it pipelined are still read and counted, as
// every query is, unanswered.
func (s *Server) serveConn(c net.Conn) {
	in := make([]byte, maxQuery)
	reply := make([]byte, 0, maxQuery)
	out := make([]byte, 0, 2+maxQuery)
	var size [2]byte
	writable := true
	for range s.maxTCPQueries {
		if err := c.SetDeadline(time.Now().Add(s.tcpIdle)); err != nil {
			return
		}
		if _, err := io.ReadFull(c, size[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(size[:]))
		if n > maxQuery {
			s.count(statTCPTooLarge)
			return
		}
		if _, err := io.ReadFull(c, in[:n]); err != nil {
			return
		}
		r := s.answer(in[:n], false, reply[:0])
		if r == nil || !writable {
			continue
		}
		msg := append(binary.BigEndian.AppendUint16(out[:0], uint16(len(r))), r...)
		if _, err := c.Write(msg); err != nil {
			writable = false
		}
	}
}
