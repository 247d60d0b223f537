//go:build linux

// Package proxy is trialnet's allowlisting HTTP CONNECT proxy: it checks
// the requested name against a Trial's allowlist before any DNS, checks
// every resolved address, dials only the addresses it checked, and relays
// the tunnel like TCP (half-close, no idle timeout). Plain http:// requests
// in absolute form are forwarded through the same checks, one decision per
// request. A Trial with credential gateway routes also gets path-only
// requests served on its endpoint: over TLS the proxy opens itself, with
// the route's secret set (gateway.go). One Proxy serves many Trials;
// every listener belongs to one Trial and every decision names it.
package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/guard"
	"github.com/trialnet/trialnet/internal/counts"
	"github.com/trialnet/trialnet/internal/ratelimit"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/resolve"
	trialspec "github.com/trialnet/trialnet/trial"
	uproxy "github.com/trialnet/trialnet/upstream"
	"github.com/trialnet/trialnet/wire"
	vns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Defaults for Config fields left zero.
const (
	defaultHeaderTimeout  = 10 * time.Second // the whole request head must arrive within this
	defaultDNSTimeout     = 5 * time.Second  // all DNS for one CONNECT
	defaultDialTimeout    = 10 * time.Second // all connection attempts for one CONNECT
	defaultTLSTimeout     = 10 * time.Second // a started ClientHello must complete within this
	defaultMaxConnections = 8192             // proxy-wide, every Trial together
)

// maxClosing bounds a Trial's refused connections being closed gently
// (lingerClose: the answer written, up to 500 ms for the client to read
// it). Its caps no longer count them, so a Trial connecting as fast as
// it could, past its caps, held one agent descriptor and goroutine per
// refusal of the last half second (4,300 at 4,000 connections a second
// here, 512 client connections its cap): past the bound a refusal is
// closed with a reset at once.
const maxClosing = 64

// maxAdmitting bounds a Trial's connections accepted and not yet
// admitted, or refused at admission and not yet closed. Accepting
// outran the handlers' start: 480 such goroutines, each holding a
// descriptor, under one Trial's flood here.
const maxAdmitting = 64

// maxLookups bounds a Trial's DNS lookups in flight at the agent (each
// an A and an AAAA question at the resolver). The host's resolver is
// shared by every Trial and by the host, and may forward only so many
// questions at once (dnsmasq: 150): one Trial connecting to names whose
// servers never answer held 406 questions outstanding there within 2 s
// before. A lookup past the bound waits for a slot while its Trial
// lasts, and has its whole DNS timeout once it has one; answers wholly
// in the agent's cache take no slot.
const maxLookups = 16

// Socket buffer sizes the proxy sets on each connection it relays
// (SO_SNDBUF and SO_RCVBUF; the kernel doubles them, and turns off its
// autotuning), so that a relay whose reader stalls holds a bounded
// amount of the agent's kernel memory. Autotuned, a tunnel whose client
// never read what a fast upstream sent held up to the host's tcp_rmem
// and tcp_wmem maxima (6 and 4 MiB by default, 32 and 4 here): 256 such
// tunnels of one Trial held 1.6 GB of socket memory charged to the
// agent and put the whole host's TCP under memory pressure, another
// Trial's CONNECTs taking seconds. The client side is loopback, where
// small buffers cost no throughput; the upstream side's bounds a
// tunnel's window, so a download over a 100 ms path runs at about 5 to
// 9 MB/s per tunnel.
const (
	clientBuffer   = 128 << 10
	upstreamBuffer = 512 << 10
)

// boundBuffers sets c's socket buffers to n each. Every connection the
// proxy relays is a socket, the one to an upstream proxy too (its Dial
// hands back the TCP connection once the CONNECT is answered); a
// net.Conn that is none (a test's pipe) keeps what it has.
func boundBuffers(c net.Conn, n int) {
	if b, ok := c.(interface {
		SetReadBuffer(int) error
		SetWriteBuffer(int) error
	}); ok {
		_ = b.SetReadBuffer(n)
		_ = b.SetWriteBuffer(n)
	}
}

// boundListener sets the client side's buffer bounds (n each) on ln's
// socket once, so that every connection the kernel makes from it from
// then on inherits them: two setsockopt(2) calls per listener instead of
// per accepted connection. A connection made before (queued while the
// listener was handed over, or before Serve) carries the listener's
// earlier buffers: queued is how many of those the accept queue held
// once the bounds were set, the first to be accepted (the queue is
// first in, first out), which are bounded one by one. ok is false when
// ln is not a listening TCP socket whose bounds could be set and whose
// queue could be read; then every connection is bounded one by one.
func boundListener(ln net.Listener, n int) (queued int, ok bool) {
	sc, isSocket := ln.(syscall.Conn)
	if !isSocket {
		return 0, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info *unix.TCPInfo
	var serr error
	err = rc.Control(func(fd uintptr) {
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, n); serr != nil {
			return
		}
		if serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, n); serr != nil {
			return
		}
		// Read after the bounds are set: a connection made in between
		// is counted too, and bounded twice.
		info, serr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	})
	if err != nil || serr != nil || info.State != tcpListen {
		return 0, false
	}
	return int(info.Unacked), true // a listener's tcpi_unacked is its accept queue's length
}

// tcpListen is TCP_LISTEN, a listening socket's tcpi_state.
const tcpListen = 10

// Config configures a Proxy. Nil and zero fields take the defaults.
type Config struct {
	// ProxySettings are the allowed CIDRs, host facts, resolver,
	// per-Trial limits and connection cap; Reconfigure replaces them.
	config.ProxySettings
	// HostAddrs is the host's own address set; nil watches this host's
	// namespace with netlink for the life of the Proxy.
	HostAddrs guard.AddrSet
	// Dialer connects to checked addresses; nil: a netDialer whose
	// Control hook re-checks every address with the guard.
	Dialer Dialer
	// Logger receives what goes wrong in serving (accept errors); nil
	// discards.
	Logger *slog.Logger
	// LogDecisions also writes every decision record to Logger (the
	// agent's journal); OnEvent gets them either way.
	LogDecisions bool
	// OnEvent, if set, is called with every decision record written, and
	// its JSON line (see Sink): ev and line are valid only during the
	// call.
	OnEvent record.Sink
	// Counts, if set, keeps the proxy's client connections (for
	// MaxConnections) in its slot Slot, where another process serving
	// the same Trials counts its own (Share). nil: memory of its own.
	Counts *counts.Region
	Slot   int

	HeaderTimeout, DNSTimeout, DialTimeout, TLSTimeout, FallbackDelay time.Duration
}

// Proxy is an allowlisting CONNECT proxy serving many Trials.
type Proxy struct {
	cfg      Config
	log      *slog.Logger
	stop     context.CancelFunc
	hostAddr *guard.HostAddrs

	// cur is what a Trial added now is served with; Reconfigure swaps it.
	cur      atomic.Pointer[settings]
	maxConns atomic.Int64  // proxy-wide, every Trial together
	conns    *atomic.Int64 // live client connections, all Trials (this process's, in cfg.Counts)
	draining atomic.Bool   // StopAccepting was called: serve what is open, no more
	// sharing: the other slot of every Region counts too (Share).
	sharing atomic.Bool

	mu     sync.Mutex
	trials map[string]*trial
	// removing are the Trials being removed, each closed once its
	// removal is done: another RemoveTrial of it, or Close, waits for
	// that, as its caller may unmap the Trial's counts after.
	removing map[string]chan struct{}
	closed   bool
	wg       sync.WaitGroup
}

// New returns a Proxy. It learns the host's addresses before returning.
func New(cfg Config) (*Proxy, error) {
	cfg.Limits = cfg.Limits.WithDefaults()
	if cfg.MaxConnections <= 0 {
		cfg.MaxConnections = defaultMaxConnections
	}
	for _, d := range []*time.Duration{&cfg.HeaderTimeout, &cfg.DNSTimeout, &cfg.DialTimeout, &cfg.TLSTimeout, &cfg.FallbackDelay} {
		if *d <= 0 {
			*d = map[*time.Duration]time.Duration{
				&cfg.HeaderTimeout: defaultHeaderTimeout, &cfg.DNSTimeout: defaultDNSTimeout,
				&cfg.DialTimeout: defaultDialTimeout, &cfg.TLSTimeout: defaultTLSTimeout,
				&cfg.FallbackDelay: defaultFallbackDelay,
			}[d]
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	p := &Proxy{cfg: cfg, stop: stop, trials: make(map[string]*trial), removing: make(map[string]chan struct{}), log: cfg.Logger}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	host := cfg.HostAddrs
	if host == nil {
		h, err := guard.WatchHostAddrs(ctx, vns.None())
		if err != nil {
			stop()
			return nil, err
		}
		p.hostAddr, host = h, h
	}
	resolver := cfg.Resolver
	if resolver == nil {
		r, err := resolve.NewDNSResolver(nil)
		if err != nil {
			p.Close()
			return nil, err
		}
		resolver = r
	}
	p.maxConns.Store(int64(cfg.MaxConnections))
	if p.cfg.Counts == nil {
		p.cfg.Counts, p.cfg.Slot = counts.Private(), 0
	}
	p.conns = &p.cfg.Counts.Slot(p.cfg.Slot).Clients
	g := guard.New(cfg.AllowCIDRs, host)
	g.SetHostFacts(cfg.HostFacts)
	p.cur.Store(p.settingsFor(g, resolver, cfg.Limits, cfg.Upstream))
	return p, nil
}

// settings are the proxy-wide choices a Trial is served with: captured
// when it is added, so that a reconfiguration applies to Trials added
// afterwards and never changes a live Trial's policy.
type settings struct {
	guard    *guard.Guard
	resolver resolve.Resolver
	dialer   Dialer
	limits   trialspec.ProxyLimits // the defaults, for a Trial without its own
	upstream *uproxy.Proxy         // nil: allowed connections are dialled directly
}

func (p *Proxy) settingsFor(g *guard.Guard, r resolve.Resolver, lim trialspec.ProxyLimits, up *uproxy.Proxy) *settings {
	d := p.cfg.Dialer
	if d == nil {
		d = newNetDialer(g)
	}
	return &settings{guard: g, resolver: r, dialer: d, limits: lim, upstream: up}
}

// Reconfigure applies s to the Trials added after it returns. Trials
// already added keep the allowed CIDRs, resolver and limits they were
// added with, and their open tunnels are not touched.
func (p *Proxy) Reconfigure(s config.ProxySettings) {
	cur := p.cur.Load()
	r := s.Resolver
	if r == nil {
		r = cur.resolver
	}
	mc := s.MaxConnections
	if mc <= 0 {
		mc = defaultMaxConnections
	}
	cur.guard.SetHostFacts(s.HostFacts)
	p.cur.Store(p.settingsFor(cur.guard.WithAllow(s.AllowCIDRs), r, s.Limits.WithDefaults(), s.Upstream))
	p.maxConns.Store(int64(mc))
}

// Guard returns the address guard of Trials added now.
func (p *Proxy) Guard() *guard.Guard { return p.cur.Load().guard }

// DefaultLimits are the limits of Trials added now without their own.
func (p *Proxy) DefaultLimits() trialspec.ProxyLimits { return p.cur.Load().limits }

// TrialPolicy is what the proxy enforces for one Trial.
type TrialPolicy struct {
	// Spec is the Trial's description. The proxy enforces its ID;
	// Learning, which lets names off Allow through, each recorded with
	// WouldDeny (every other check, address guard, TLS name, IP literals,
	// limits, still refuses); AllowCIDRs, if not nil, instead of the
	// proxy's current ones (a re-adopted Trial keeps what it was created
	// with, whatever the config says now); and the proxy half of Limits
	// (nil: the proxy's defaults).
	Spec trialspec.Spec
	// Allow is Spec.Allow parsed: the list the proxy matches, which
	// SetAllow replaces.
	Allow *allow.List
	// Stats, if set, are where the Trial's counters start: a restarted
	// agent continues them from the decision log.
	Stats *record.TrialStats
	// LogWritten is the size of the Trial's decision log already: a
	// restarted agent's Trial keeps to its max_log_bytes across restarts.
	LogWritten int64
	// Ledger, if set, is told of every tunnel and forwarded request while
	// it is open, so that a process that dies with them open leaves a
	// trace of them for its successor to record.
	Ledger Ledger
	// Counts, if set, keeps the counts behind the Trial's limits, this
	// process's open ones in slot Slot; another process serving the
	// Trial may map it too (Share). LogWritten raises its log bytes.
	// nil: memory of the Trial's own.
	Counts *counts.Region
	Slot   int
	// Gateway are the Trial's credential gateway routes, which
	// ServeGateway serves, verified against GatewayRoots (nil: the
	// system's trust store).
	Gateway      []GatewayRoute
	GatewayRoots *x509.CertPool
}

// Ledger keeps the open tunnels and requests of a Trial where they
// outlive the process: Open is called once the request is allowed and
// registered, with its record as it stands, and the function it returns
// once the request ends. It keeps the Trial's pending summary too
// (record.Keeper).
type Ledger interface {
	Open(ev *record.Event) (closed func())
	record.Keeper
}

type trial struct {
	id      string
	allow   atomic.Pointer[allow.List] // replaced whole by SetAllow, under mu
	learn   bool
	set     *settings                 // as the proxy's were when the Trial was added
	hosts   map[uint16]netip.AddrPort // its host services, by the port asked for
	limits  trialspec.ProxyLimits
	bucket  *ratelimit.Bucket
	records *record.Gate // bounds what its decision records cost
	// This process's counts, in its slot of counts: CONNECTs being served
	// (from parse to close); client connections admitted and not yet
	// closed; of those, the ones whose request head is not read yet.
	tunnels, clients, pending *atomic.Int64
	// closing are its refused connections being closed gently
	// (lingerClose), no longer counted in clients: at most maxClosing.
	closing atomic.Int64
	// admitting holds a token for each connection accepted and not yet
	// admitted, or refused at admission and not yet closed
	// (maxAdmitting): the accept loop waits for one,
	// so that a Trial connecting faster than its handlers start queues
	// in its own listener's backlog, not in the agent's descriptors.
	admitting chan struct{}
	// lookups holds a token for each of its DNS lookups in flight
	// (maxLookups).
	lookups lookupSlots
	counts  *counts.Region
	slot    int
	// peer is the other slot of counts while it counts too (Share): the
	// Trial's connections another agent process serves during a hand-over.
	peer atomic.Pointer[counts.Slot]
	// elsewhere are the Trial's tunnels another process serves, as it
	// says in messages (SetElsewhere): an agent of a build that shares no
	// counts, this one took over from, while it drains.
	elsewhere atomic.Int64
	ledger    Ledger
	// gateway are its credential gateway routes, gwTLS their TLS (nil:
	// none), and gwForms the forms of all their secrets, which every
	// route's answers are searched for: an upstream two routes share may
	// hand one route's request what the other's carried.
	gateway []GatewayRoute
	gwTLS   *tls.Config
	gwForms [][]byte

	handlers sync.WaitGroup // connections being handled; Add under mu, before removed is set
	// ctx ends when the Trial is removed, cutting its DNS and dials short
	// so that RemoveTrial does not wait out their timeouts.
	ctx    context.Context
	cancel context.CancelFunc

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[net.Conn]struct{}
	// idle are the forwarding connections waiting for their next
	// request, which StopAccepting ends (waitNext).
	idle    map[net.Conn]struct{}
	open    map[*openTunnel]struct{} // tunnels between their answer and their end
	stats   record.TrialStats
	removed bool
}

// AddTrial registers a Trial; its listeners are then served with Serve.
func (p *Proxy) AddTrial(tp TrialPolicy) error {
	spec := tp.Spec
	if spec.ID == "" {
		return errors.New("proxy: a Trial needs an id")
	}
	set := p.cur.Load()
	if spec.AllowCIDRs != nil {
		set = p.settingsFor(set.guard.WithAllow(spec.AllowCIDRs), set.resolver, set.limits, set.upstream)
	}
	lim := set.limits
	if spec.Limits != nil {
		lim = spec.Limits.ProxyLimits.WithDefaults()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("proxy: closed")
	}
	if _, ok := p.trials[spec.ID]; ok {
		return fmt.Errorf("proxy: Trial %q is already registered", spec.ID)
	}
	list := tp.Allow
	if list == nil {
		list = allow.New()
	}
	stats := record.TrialStats{ByReason: make(map[record.Reason]uint64)}
	if tp.Stats != nil {
		stats = tp.Stats.Clone()
		stats.Active = 0
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := tp.Counts
	if c == nil {
		c, tp.Slot = counts.Private(), 0
	}
	own := c.Slot(tp.Slot)
	t := &trial{
		id: spec.ID, learn: spec.Learning, set: set, limits: lim, bucket: ratelimit.NewShared(lim.ConnectRate, lim.ConnectBurst, c.ConnectRate()),
		tunnels: &own.Tunnels, clients: &own.Clients, pending: &own.Pending, counts: c, slot: tp.Slot,
		listeners: make(map[net.Listener]struct{}), conns: make(map[net.Conn]struct{}), idle: make(map[net.Conn]struct{}),
		open: make(map[*openTunnel]struct{}), stats: stats, ctx: ctx, cancel: cancel, ledger: tp.Ledger,
		hosts: make(map[uint16]netip.AddrPort, len(spec.HostServices)), admitting: make(chan struct{}, maxAdmitting),
		lookups: lookupSlots{make(chan struct{}, maxLookups), resolve.QueryTimeout},
	}
	for _, h := range spec.HostServices {
		t.hosts[h.Port] = netip.AddrPortFrom(h.Address, h.Port)
	}
	if len(tp.Gateway) > 0 {
		t.gateway, t.gwTLS, t.gwForms = tp.Gateway, gatewayTLS(tp.GatewayRoots), routesForms(tp.Gateway)
		quietStdLog()
	}
	if p.sharing.Load() {
		t.peer.Store(c.Slot(1 - tp.Slot))
	}
	bounds := record.Bounds{Rate: lim.RecordRate, Burst: lim.RecordBurst, MaxLogBytes: lim.MaxLogBytes, Written: tp.LogWritten,
		LogBytes: c.LogBytes(), RateWord: c.RecordRate()}
	if tp.Ledger != nil {
		bounds.Keep = tp.Ledger
	}
	t.records = record.NewGate(spec.ID, spec.Learning, bounds,
		func(ev *record.Event, line []byte) {
			t.mu.Lock()
			t.stats.CountWritten(ev) // as a replay of the log counts them
			t.mu.Unlock()
			p.write(ev, line)
		})
	t.allow.Store(list)
	p.trials[spec.ID] = t
	return nil
}

// SetAllow replaces a live Trial's allowlist; it applies to every CONNECT
// not yet answered. Open tunnels allowed by an entry of cut (matched by
// name, wildcard and port) are ended; other tunnels stay. It returns how
// many were cut.
func (p *Proxy) SetAllow(id string, l *allow.List, cut []allow.Entry) (int, error) {
	p.mu.Lock()
	t, ok := p.trials[id]
	p.mu.Unlock()
	if !ok {
		return 0, fmt.Errorf("proxy: Trial %q is not registered", id)
	}
	if l == nil {
		l = allow.New()
	}
	gone := make(map[string]bool, len(cut))
	for _, e := range cut {
		gone[e.String()] = true
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.allow.Store(l)
	n := 0
	for ot := range t.open {
		if ot.ruled && gone[ot.entry.String()] && ot.cut(record.ReasonPolicyDenied, "its allowlist entry "+ot.entry.String()+" was removed") {
			n++
		}
	}
	return n, nil
}

// Allow returns a Trial's allowlist as it is now.
func (p *Proxy) Allow(id string) (*allow.List, bool) {
	p.mu.Lock()
	t, ok := p.trials[id]
	p.mu.Unlock()
	if !ok {
		return nil, false
	}
	return t.allow.Load(), true
}

// openTunnel is an answered CONNECT, known to its Trial so that a policy
// change can end it: entry is the rule that allowed it (ruled is false
// for a name a learning Trial let through).
type openTunnel struct {
	entry      allow.Entry
	ruled      bool
	client, up net.Conn
	cutBecause atomic.Pointer[cutCause]
	unledger   func() // nil: no ledger
	// stop cancels a forwarded request's DNS, dial and upload; nil for
	// a CONNECT, which is registered once dialed.
	stop context.CancelFunc

	// mu orders a cut against the CONNECT's answer: a cut that comes
	// first leaves the client to get a refusal rather than a bare close.
	mu       sync.Mutex
	answered bool
}

// cutCause is why a tunnel or request was cut: a policy change
// (ReasonPolicyDenied) or the end of an agent's drain (ReasonShutdown).
type cutCause struct {
	reason record.Reason
	why    string
}

// detail is what an allowed tunnel's record says of its cut.
func (c *cutCause) detail() string {
	if c.reason == record.ReasonPolicyDenied {
		return "tunnel cut by a policy change: " + c.why
	}
	return "tunnel cut: " + c.why
}

// cut ends the tunnel or request; it reports false if an earlier change
// had cut it already (it is ending, and not this change's to count).
func (ot *openTunnel) cut(reason record.Reason, why string) bool {
	ot.mu.Lock()
	defer ot.mu.Unlock()
	if !ot.cutBecause.CompareAndSwap(nil, &cutCause{reason, why}) {
		return false
	}
	if ot.stop != nil {
		ot.stop()
	}
	if !ot.answered {
		return true // establish refuses it
	}
	_ = ot.client.Close()
	if ot.up != nil { // a forwarded request ends with its client connection
		// A reset: what is still in the send buffer is dropped, not
		// delivered after the change was answered.
		if tc, ok := ot.up.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = ot.up.Close()
	}
	return true
}

// attach gives a forwarded request its upstream connection, unless a
// policy change cut the request while it was being opened; from then on
// a cut closes that connection too, so nothing more reaches the upstream.
func (ot *openTunnel) attach(up net.Conn) error {
	ot.mu.Lock()
	defer ot.mu.Unlock()
	if c := ot.cutBecause.Load(); c != nil {
		return record.Deny(c.reason, "%s while the request was being opened", c.why)
	}
	ot.up = up
	return nil
}

// establish answers a registered CONNECT with answer (200; nothing for
// a transparent connection), unless a policy change cut it first: then
// the client is refused like a CONNECT decided after the change. The
// write is held under mu; it cannot block, as nothing was written on the
// fresh connection before.
func (ot *openTunnel) establish(answer string) error {
	ot.mu.Lock()
	defer ot.mu.Unlock()
	if c := ot.cutBecause.Load(); c != nil {
		// Still unanswered: a later cut (the entry removed again) must
		// not close the connection before the refusal is written.
		return record.Deny(c.reason, "%s while the tunnel was being opened", c.why)
	}
	var err error
	if answer != "" {
		_, err = io.WriteString(ot.client, answer)
	}
	ot.answered = true
	return err
}

// verdict is what a Trial's allowlist says of a request: the entry that
// allows it, or, on a learning Trial, a name let through by no entry
// (ruled false).
type verdict struct {
	entry allow.Entry
	ruled bool
}

// note records on ev what let the request through.
func (v verdict) note(ev *record.Event) {
	if v.ruled {
		ev.Rule, ev.Profile, ev.WouldDeny, ev.RequireTLS = v.entry.String(), v.entry.Profile, "", v.entry.RequireTLS
		return
	}
	ev.Rule, ev.Profile, ev.WouldDeny, ev.RequireTLS = "", "", record.ReasonPolicyDenied, false
}

// decide matches a request against the Trial's allowlist as it is now;
// ok is false when nothing lets it through.
func (t *trial) decide(req *wire.Request) (v verdict, ok bool) {
	v.entry, v.ruled = t.allow.Load().Match(req.Host, req.Port)
	return v, v.ruled || t.learn
}

// judge decides a request and notes the verdict on ev; what the list
// does not allow is a policy denial. A forwarded (plain HTTP) request to
// an entry that wants TLS is refused too: that entry is reached through
// CONNECT only, whatever the port.
func (t *trial) judge(req *wire.Request, ev *record.Event, forwarded bool) (verdict, error) {
	v, ok := t.decide(req)
	if !ok {
		return v, record.Deny(record.ReasonPolicyDenied, "%s is not on this Trial's allowlist", req.HostPort())
	}
	v.note(ev)
	if forwarded && !req.TLS && v.ruled && v.entry.RequireTLS {
		return v, record.Deny(record.ReasonTLSRequired, "%s requires TLS: use CONNECT (https://), not plain HTTP", req.HostPort())
	}
	return v, nil
}

// chargeRefusal charges a refusal decided while the request was read,
// before the CONNECT rate applies, to that rate when its reason is one
// the rate bounds (an IP literal: an attempt whose target an audit must
// see, so its record is never suppressed). Past the rate it is refused
// as rate limited instead, like any CONNECT.
func (t *trial) chargeRefusal(err error) error {
	var d *record.Denial
	if !errors.As(err, &d) || !d.Reason.Charged() {
		return err
	}
	if limited := t.takeConnect(); limited != nil {
		return limited
	}
	return err
}

// takeConnect charges one CONNECT or forwarded request to the Trial's
// rate: nil, or the refusal once it is spent. It is the one place that
// rate is charged.
func (t *trial) takeConnect() error {
	if !t.bucket.Take(time.Now()) {
		return record.Deny(record.ReasonRateLimited, "more than %g CONNECTs and forwarded requests per second (burst %d) from this Trial", t.limits.ConnectRate, t.limits.ConnectBurst)
	}
	return nil
}

// register decides a dialed CONNECT again, under mu so that no policy
// change falls between this decision and the tunnel being known, and
// tracks the tunnel until its end.
func (t *trial) register(req *wire.Request, ev *record.Event, client, up net.Conn, stop context.CancelFunc) (*openTunnel, error) {
	ot, err := t.registerLocked(req, ev, client, up, stop)
	// The ledger copy (an encode) is made outside the Trial's lock:
	// ot.unledger is read only by unregister, which the connection's end
	// runs after this returns.
	if err == nil && t.ledger != nil {
		ot.unledger = t.ledger.Open(ev)
	}
	return ot, err
}

func (t *trial) registerLocked(req *wire.Request, ev *record.Event, client, up net.Conn, stop context.CancelFunc) (*openTunnel, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.removed {
		return nil, record.Deny(record.ReasonShutdown, "the Trial is being removed")
	}
	v, err := t.judge(req, ev, up == nil) // no upstream yet: a forwarded request
	if err != nil {
		var d *record.Denial
		if errors.As(err, &d) {
			d.Detail += " (its entry was removed while the tunnel was being opened)"
		}
		return nil, err
	}
	// A forwarded request (no upstream yet) counts as answered: a cut
	// ends it by closing its client connection.
	ot := &openTunnel{entry: v.entry, ruled: v.ruled, client: client, up: up, answered: up == nil, stop: stop}
	t.open[ot] = struct{}{}
	return ot, nil
}

// redecide matches a forwarded request against the allowlist as it is
// after its DNS and dial, as register does for a CONNECT, and ties it to
// the entry that allows it now, which a later cut names.
func (t *trial) redecide(req *wire.Request, ev *record.Event, ot *openTunnel) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	v, err := t.judge(req, ev, true)
	var d *record.Denial
	if errors.As(err, &d) {
		d.Detail += " (its entry was removed or changed while the request was being opened)"
		return err
	}
	ot.mu.Lock()
	ot.entry, ot.ruled = v.entry, v.ruled
	ot.mu.Unlock()
	return nil
}

func (t *trial) unregister(ot *openTunnel) {
	t.mu.Lock()
	delete(t.open, ot)
	t.mu.Unlock()
	if ot.unledger != nil {
		ot.unledger()
	}
}

// RemoveTrial closes the Trial's listeners and every connection it has
// open, waits until each has emitted its decision event, writes the
// summary of its last suppressed records, and forgets the Trial. Its
// final stats are returned. If another call is removing the Trial, it
// waits until that is done and reports false, as for a Trial unknown:
// either way, the proxy no longer touches the Trial's counts on return.
func (p *Proxy) RemoveTrial(id string) (record.TrialStats, bool) {
	p.mu.Lock()
	t, ok := p.trials[id]
	if !ok {
		inProgress := p.removing[id]
		p.mu.Unlock()
		if inProgress != nil {
			<-inProgress
		}
		return record.TrialStats{}, false
	}
	delete(p.trials, id)
	done := make(chan struct{})
	p.removing[id] = done
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		if p.removing[id] == done { // not a later Trial of the same id's
			delete(p.removing, id)
		}
		p.mu.Unlock()
		close(done)
	}()
	t.shutdown()
	t.handlers.Wait()
	t.records.Flush(true)
	return t.snapshot(), true
}

func (t *trial) shutdown() {
	t.cancel()
	t.mu.Lock()
	t.removed = true
	for ln := range t.listeners {
		_ = ln.Close()
	}
	for c := range t.conns {
		_ = c.Close()
	}
	t.mu.Unlock()
}

// Serve accepts CONNECT and forwarded requests on ln for Trial id until
// ln is closed, the Trial is removed or the proxy is closed; then it
// returns nil.
func (p *Proxy) Serve(ln net.Listener, id string) error {
	return p.serve(ln, id, p.handle)
}

// serve accepts on ln for Trial id, handing each connection to handle on
// a goroutine of its own, which must call p.wg.Done and
// t.handlers.Done when it is done.
func (p *Proxy) serve(ln net.Listener, id string, handle func(net.Conn, *trial)) error {
	p.mu.Lock()
	t, ok := p.trials[id]
	if ok && !p.closed {
		p.wg.Add(1)
	}
	closed := p.closed
	p.mu.Unlock()
	if !ok || closed {
		_ = ln.Close()
		return fmt.Errorf("proxy: Trial %q is not registered (or the proxy is closed)", id)
	}
	defer p.wg.Done()
	if ap, err := netip.ParseAddrPort(ln.Addr().String()); err == nil {
		t.set.guard.AddProxyAddr(ap.Addr()) // shared by every guard
	}
	t.mu.Lock()
	if t.removed || p.draining.Load() { // StopAccepting ran: accept nothing more
		t.mu.Unlock()
		_ = ln.Close()
		return nil
	}
	t.listeners[ln] = struct{}{}
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		delete(t.listeners, ln)
		t.mu.Unlock()
	}()
	queued, inherited := boundListener(ln, clientBuffer)
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			// EMFILE and friends: wait and retry rather than spin or die.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			p.log.Warn("accept failed; retrying", "trial", id, "error", err, "backoff", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		switch {
		case !inherited:
			boundBuffers(c, clientBuffer)
		case queued > 0: // made before the listener's bounds
			boundBuffers(c, clientBuffer)
			queued--
		}
		if !t.trackClient(c) {
			_ = c.Close()
			continue
		}
		p.wg.Add(1)
		t.admitting <- struct{}{} // given back at admission, or at the close of a refusal
		go handle(c, t)
	}
}

func (t *trial) track(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.removed {
		return false
	}
	t.conns[c] = struct{}{}
	return true
}

// trackClient tracks a newly accepted connection and counts its handler,
// so that RemoveTrial can wait for every handler of the Trial to end.
func (t *trial) trackClient(c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.removed {
		return false
	}
	t.conns[c] = struct{}{}
	t.handlers.Add(1)
	return true
}

func (t *trial) untrack(c net.Conn) {
	t.mu.Lock()
	delete(t.conns, c)
	t.mu.Unlock()
}

// Close stops every listener and connection and waits for them, and for
// every removal in progress (RemoveTrial).
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	trials := p.trials
	p.trials = make(map[string]*trial)
	removing := make([]chan struct{}, 0, len(p.removing))
	for _, done := range p.removing {
		removing = append(removing, done)
	}
	p.mu.Unlock()
	for _, t := range trials {
		t.shutdown()
	}
	p.wg.Wait()
	for _, t := range trials {
		t.records.Flush(true)
	}
	for _, done := range removing {
		<-done
	}
	p.stop()
	if p.hostAddr != nil {
		p.hostAddr.Wait()
	}
	return nil
}

// clientConn is one client connection of a Trial as the proxy serves
// it: the connection, its pooled head reader, its record, and what to
// undo when it is done. handle undoes it, unless a CONNECT's tunnel was
// handed off, whose last pump then does.
type clientConn struct {
	p         *Proxy
	t         *trial
	c         net.Conn
	br        *bufio.Reader // pooled; nil once given back or kept by forwarding
	ev        *record.Event // nil: a forwarding connection ended between requests
	undo      []func()
	undoBuf   [10]func() // undo's first (a tunnel has nine): no slice grown
	handedOff bool
	// silent: a transparent connection whose client has not been
	// answered in HTTP, and must not be: a refusal resets it instead.
	silent bool
	reset  bool // refused silently: closed with a reset
	// refusedAtAdmission: it holds its Trial's admitting token until it
	// is closed.
	refusedAtAdmission bool
}

// onDone adds f to what is undone, in reverse order, when the
// connection is done.
func (k *clientConn) onDone(f func()) { k.undo = append(k.undo, f) }

// done undoes everything, the record first written (see handle).
func (k *clientConn) done() {
	for i := len(k.undo) - 1; i >= 0; i-- {
		k.undo[i]()
	}
}

// releaseReader gives the head reader back to the pool, once: a tunnel
// does as soon as the bytes read ahead of its first check are sent on.
func (k *clientConn) releaseReader() {
	if k.br != nil {
		putReader(k.br)
		k.br = nil
	}
}

// handle serves one client connection: admit it, then serve a CONNECT
// or forward plain HTTP requests.
func (p *Proxy) handle(c net.Conn, t *trial) {
	k := p.newClientConn(c, t)
	defer k.finish()
	if err := p.admit(t); err != nil {
		k.refusedAtAdmission = true
		p.refuse(c, k.ev, err)
		return
	}
	k.onDone(func() { p.conns.Add(-1); t.clients.Add(-1) })

	_ = c.SetReadDeadline(k.ev.Time.Add(p.cfg.HeaderTimeout))
	k.br = getReader(c)
	if !startsWithConnect(k.br) {
		// Forwarding: the reader stays with the connection (the
		// Transport may still read a request body from it after we are
		// done).
		br := k.br
		k.br = nil
		headDone := sync.OnceFunc(func() { t.pending.Add(-1) })
		k.ev = p.serveHTTP(c, t, br, k.ev, headDone, nil)
		headDone()
		return
	}
	k.onDone(k.releaseReader)
	p.serveConnect(k)
}

// newClientConn starts serving an accepted connection: its record, and
// what its end undoes (the record emitted, the connection closed, its
// handler counted out).
func (p *Proxy) newClientConn(c net.Conn, t *trial) *clientConn {
	k := &clientConn{p: p, t: t, c: c, ev: p.newEvent(t, c)}
	k.undo = k.undoBuf[:0]
	k.onDone(p.wg.Done)
	k.onDone(t.handlers.Done)
	k.onDone(func() { t.untrack(c) })
	k.onDone(func() {
		// A refusal answered in HTTP is closed gently, so that the client
		// reads the answer; past the Trial's share of such closes it is
		// reset (see maxClosing), and its record says so.
		gentle := false
		if ev := k.ev; ev != nil && !k.handedOff && !k.reset && ev.Decision == record.DecisionDeny {
			if gentle = t.closing.Add(1) <= maxClosing; !gentle {
				t.closing.Add(-1)
				ev.Detail += fmt.Sprintf(" (closed with a reset, the answer perhaps unread: %d refused connections of this Trial were already closing, its limit; open fewer connections at once)", maxClosing)
			}
		}
		if ev := k.ev; ev != nil {
			ev.Duration = time.Since(ev.Time)
			p.emit(t, ev)
		}
		switch {
		case k.handedOff:
		case gentle:
			lingerClose(c)
			t.closing.Add(-1)
		case k.reset || k.ev != nil && k.ev.Decision == record.DecisionDeny:
			resetClose(c)
		default:
			_ = c.Close()
		}
		if k.refusedAtAdmission {
			<-t.admitting
		}
	})
	return k
}

// finish undoes everything, unless a tunnel was handed off (its last
// pump then does).
func (k *clientConn) finish() {
	if !k.handedOff {
		k.done()
	}
}

// deny refuses the request: answered in HTTP, or on a silent
// (transparent) connection only recorded, and the connection reset.
func (k *clientConn) deny(err error) {
	if k.silent {
		denyEvent(k.ev, err)
		k.reset = true
		return
	}
	k.p.refuse(k.c, k.ev, err)
}

// serveConnect serves a CONNECT: parse, decide, dial, and hand an allowed
// tunnel to two fresh goroutines (setting k.handedOff first). Handing off
// keeps an idle tunnel's stacks small: the deep DNS and dial call chains
// stay on this goroutine, which then exits.
func (p *Proxy) serveConnect(k *clientConn) {
	c, t, ev := k.c, k.t, k.ev
	req, err := wire.ReadRequestCheck(k.br, connectLineCheck)
	t.pending.Add(-1)
	if req != nil {
		ev.Method, ev.Target, ev.Host, ev.Port = req.Method, req.Target, req.Host, req.Port
	}
	if err != nil {
		p.refuse(c, ev, t.chargeRefusal(err))
		return
	}
	// From here the reader holds only bytes pipelined after the head:
	// they belong to the tunnel.
	if err := t.takeConnect(); err != nil {
		p.refuse(c, ev, err)
		return
	}
	k.onDone(func() { t.tunnels.Add(-1) })
	up, err := p.judgeAndDial(t, req, ev)
	if err != nil {
		p.refuse(c, ev, err)
		return
	}
	k.onDone(func() { t.untrack(up) })
	_ = c.SetReadDeadline(time.Time{})
	p.openTunnel(k, req, up, connectAnswer)
}

// connectAnswer opens a CONNECT's tunnel.
const connectAnswer = "HTTP/1.1 200 Connection established\r\n\r\n"

// judgeAndDial takes a tunnel slot (the caller gives it back, whatever
// the outcome), decides req and dials it. The upstream connection it
// returns is tracked by the Trial (the caller untracks it).
func (p *Proxy) judgeAndDial(t *trial, req *wire.Request, ev *record.Event) (net.Conn, error) {
	if n := t.tunnels.Add(1) + t.otherTunnels(); n > int64(t.limits.MaxTunnels) {
		return nil, record.Deny(record.ReasonTunnelLimit, "this Trial already has %d tunnels open, its limit", t.limits.MaxTunnels)
	}
	if _, err := t.judge(req, ev, false); err != nil {
		return nil, err
	}
	up, err := p.connect(t.ctx, t, req, ev)
	if err == nil {
		boundBuffers(up, upstreamBuffer)
	}
	if err != nil {
		if t.ctx.Err() != nil {
			err = &record.Denial{Reason: record.ReasonShutdown, Detail: "the Trial is being removed", Err: err}
		}
		return nil, err
	}
	// Tracked like the client side, so that removing the Trial also ends
	// a tunnel whose client already half-closed.
	if !t.track(up) {
		_ = up.Close()
		return nil, record.Deny(record.ReasonShutdown, "the Trial is being removed")
	}
	return up, nil
}

// openTunnel registers a dialed tunnel, answers it (answer; "" for a
// transparent connection, which asked nothing) and hands it to the
// relay, or refuses it if a policy change came first.
func (p *Proxy) openTunnel(k *clientConn, req *wire.Request, up net.Conn, answer string) {
	t, ev := k.t, k.ev
	ot, err := t.register(req, ev, k.c, up, nil)
	if err != nil {
		_ = up.Close()
		k.deny(err)
		return
	}
	k.onDone(func() { t.unregister(ot) })
	if err := ot.establish(answer); err != nil {
		_ = up.Close()
		var d *record.Denial
		if errors.As(err, &d) {
			k.deny(err)
			return
		}
		ev.Reason, ev.Detail = record.ReasonAllowed, "client went away before the tunnel opened"
		ev.Decision = record.DecisionAllow
		return
	}
	k.handedOff = true
	p.tunnel(k, up, ot, req)
}

// startsWithConnect reports whether the request on br is a CONNECT. It
// waits for the first eight bytes (within the header deadline); a client
// that sends fewer gets the CONNECT reader's refusal.
func startsWithConnect(br *bufio.Reader) bool {
	b, _ := br.Peek(len("CONNECT "))
	return len(b) < len("CONNECT ") || string(b) == "CONNECT "
}

// admit charges a new client connection to its Trial's caps, then to the
// proxy-wide limit. The Trial's own caps come first, so that a Trial at
// its caps cannot use up the connections every Trial shares; a refused
// connection gives back what it was charged before it is answered.
//
// A refused connection keeps its admitting token until it is closed
// (clientConn.refusedAtAdmission); an admitted one gives it back here.
func (p *Proxy) admit(t *trial) error {
	if t.clients.Add(1)+t.otherClients() > int64(t.limits.MaxClientConns) {
		t.clients.Add(-1)
		return record.Deny(record.ReasonTrialConnLimit, "this Trial already has %d client connections open, its limit", t.limits.MaxClientConns)
	}
	if t.pending.Add(1)+t.otherPending() > int64(t.limits.MaxPendingHeads) {
		t.pending.Add(-1)
		t.clients.Add(-1)
		return record.Deny(record.ReasonPendingHeadLimit, "this Trial already has %d connections that have not sent their request head, its limit", t.limits.MaxPendingHeads)
	}
	if limit := p.maxConns.Load(); p.conns.Add(1)+p.otherConns() > limit {
		p.conns.Add(-1)
		t.pending.Add(-1)
		t.clients.Add(-1)
		return record.Deny(record.ReasonGlobalLimit, "the proxy is serving %d connections, its limit", limit)
	}
	<-t.admitting
	return nil
}

// resolveChecked resolves req's name and checks every address: one
// refused answer refuses the name. It returns the addresses to dial.
func (p *Proxy) resolveChecked(trialCtx context.Context, slots lookupSlots, set *settings, req *wire.Request, ev *record.Event) ([]netip.AddrPort, error) {
	t0 := time.Now()
	ans, err := slots.resolve(trialCtx, p.cfg.DNSTimeout, set.resolver, req.Host)
	ev.DNS = time.Since(t0)
	ev.SetResolved(ans.Addrs)
	if err != nil {
		if record.ReasonOf(err) == "" {
			err = &record.Denial{Reason: record.ReasonDNSFailed, Detail: err.Error(), Err: err}
		}
		return nil, err
	}
	if len(ans.Addrs) == 0 {
		return nil, record.Deny(record.ReasonDNSNoAddresses, "%s has no addresses", req.Host)
	}
	// One bad answer refuses the name: a mixed set is an attack.
	targets := make([]netip.AddrPort, 0, len(ans.Addrs))
	for _, a := range ans.Addrs {
		if err := set.guard.Check(a); err != nil {
			var d *record.Denial
			if errors.As(err, &d) {
				d.Detail = req.Host + " resolves to " + d.Detail
			}
			return nil, err
		}
		targets = append(targets, netip.AddrPortFrom(a.Unmap(), req.Port))
	}
	return targets, nil
}

// lookupSlots are a Trial's DNS lookups in flight, one token each.
type lookupSlots struct {
	ch chan struct{}
	// hold is how long a lookup that ended without an answer keeps its
	// slot, from its start: its questions may still be waiting at the
	// resolver (one whose Trial ended just after it started sent them
	// and returned at once), and they count until it gives up.
	hold time.Duration
}

// cacheReader is a resolver that can answer from its cache alone
// (resolve.DNSResolver).
type cacheReader interface {
	FromCache(name string) (resolve.Answer, bool, error)
}

// resolve looks name up with r: from r's cache at once when both its
// answers are there, else once a slot is free, within timeout from then.
// The wait for a slot is bounded by ctx (the Trial's) alone, not by
// timeout: a lookup queued behind the Trial's own slow but answering
// ones (50 names at once, each answered in 1.9 s: 18 refused before)
// needs its whole time to be asked, and the waiters are bounded by the
// Trial's tunnel limit. A lookup that finds no slot before ctx ends asks
// the resolver nothing.
func (s lookupSlots) resolve(ctx context.Context, timeout time.Duration, r resolve.Resolver, name string) (resolve.Answer, error) {
	if c, ok := r.(cacheReader); ok {
		if ans, ok, err := c.FromCache(name); ok {
			return ans, err
		}
	}
	select {
	case s.ch <- struct{}{}:
	case <-ctx.Done():
		return resolve.Answer{}, &record.Denial{Reason: record.ReasonDNSFailed,
			Detail: fmt.Sprintf("resolving %s: not asked: the Trial ended while its %d lookups in flight, its limit, had not ended (%v)", name, cap(s.ch), ctx.Err()),
			Err:    ctx.Err()}
	}
	if err := ctx.Err(); err != nil { // a slot freed as the Trial ended
		<-s.ch
		return resolve.Answer{}, &record.Denial{Reason: record.ReasonDNSFailed,
			Detail: fmt.Sprintf("resolving %s: not asked: a lookup slot of this Trial's came free only as the Trial ended (%v)", name, err),
			Err:    err}
	}
	lctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	ans, err := r.Resolve(lctx, name)
	var d *record.Denial
	if left := s.hold - time.Since(start); left > 0 && (lctx.Err() != nil || errors.As(err, &d) && d.DNS.Timeout) {
		time.AfterFunc(left, func() { <-s.ch })
	} else {
		<-s.ch
	}
	return ans, err
}

// dialChecked dials the first of the checked targets that answers, with
// d, within the dial timeout.
func (p *Proxy) dialChecked(trialCtx context.Context, d Dialer, targets []netip.AddrPort, ev *record.Event) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(trialCtx, p.cfg.DialTimeout)
	defer cancel()
	t0 := time.Now()
	up, dialed, err := dialAny(ctx, d, targets, p.cfg.FallbackDelay)
	ev.Dial = time.Since(t0)
	if err != nil {
		return nil, err
	}
	ev.Dialed = dialed
	return up, nil
}

// refuse answers a refused request with its status and reason, then
// closes without resetting, so the client reads the answer.
func (p *Proxy) refuse(c net.Conn, ev *record.Event, err error) {
	d := denyEvent(ev, err)
	status := d.Reason.Status()
	body := "trialnet: " + sanitize(d.Error()) + "\n"
	resp := fmt.Sprintf("HTTP/1.1 %d %s\r\nTrialnet-Reason: %s\r\nTrialnet-Detail: %s\r\nProxy-Status: %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), d.Reason, sanitize(d.Detail), d.ProxyStatus(), len(body), body)
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = io.WriteString(c, resp)
}

// denyEvent marks ev refused for err, and returns err as a denial.
func denyEvent(ev *record.Event, err error) *record.Denial {
	var d *record.Denial
	if !errors.As(err, &d) {
		d = &record.Denial{Reason: record.ReasonBadRequest, Detail: err.Error(), Err: err}
	}
	ev.Decision, ev.Reason, ev.Detail = record.DecisionDeny, d.Reason, d.Detail
	return d
}

// resetClose closes with a reset: a transparent client refused before
// any answer sees ECONNRESET at once, not an orderly end it might take
// for the server's.
func resetClose(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// lingerClose half-closes and drains briefly before closing: closing a
// socket with unread input sends a reset, which can destroy the answer
// before the client reads it.
func lingerClose(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
		_ = tc.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		_, _ = io.CopyN(io.Discard, tc, 64<<10)
	}
	_ = c.Close()
}

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c < 0x20 || c >= 0x7f {
			b[i] = '?'
		}
	}
	return string(b)
}

// emit counts a decision, then hands it to the Trial's record gate,
// which writes it unless the Trial's record bounds suppress it.
func (p *Proxy) emit(t *trial, ev *record.Event) {
	record.Clip(ev) // counted as recorded: a target by the name its record gives it
	t.mu.Lock()
	t.stats.Add(ev)
	t.mu.Unlock()
	t.records.Record(ev, time.Now())
}

// write hands a record to the journal (with LogDecisions) and OnEvent.
func (p *Proxy) write(ev *record.Event, line []byte) {
	if ctx := context.Background(); p.cfg.LogDecisions && p.log.Enabled(ctx, ev.Level()) {
		msg := "connect"
		switch {
		case ev.Decision == record.DecisionSuppressed:
			msg = "suppressed"
		case ev.Method != "" && ev.Method != "CONNECT":
			msg = "forward"
		}
		p.log.LogAttrs(ctx, ev.Level(), msg, ev.Attrs()...)
	}
	if p.cfg.OnEvent != nil {
		p.cfg.OnEvent(ev, line)
	}
}

// Stats returns a snapshot of a Trial's proxy counters.
func (p *Proxy) Stats(id string) (record.TrialStats, bool) {
	p.mu.Lock()
	t, ok := p.trials[id]
	p.mu.Unlock()
	if !ok {
		return record.TrialStats{}, false
	}
	return t.snapshot(), true
}

func (t *trial) snapshot() record.TrialStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.stats.Clone()
	s.Active = t.tunnels.Load() + t.otherTunnels()
	return s
}
