//go:build linux

// Package proxybench compares trialnet's CONNECT proxy, side by side in
// one interleaved run, with a direct TCP connection (the physical limit
// here) and with its peers: tinyproxy and squid (Debian's packages),
// smokescreen (a Go module at a pinned version) and a naive net/http
// proxy, each a process started by the benchmark; and, as a reference
// that is not a peer, a CONNECT proxy on raw epoll without any checks
// (the "epoll ceiling", and the "reuseport ceiling": one such loop per
// CPU). The upstream is a test host in its own network
// namespace behind a veth; the DNS server answers as a real
// authoritative one does (NODATA with an SOA, so negative answers are
// cached).
//
//	make bench    # or: go test -run '^$' -bench Peers -benchtime 1x ./test/proxybench [-args -rounds N]
package proxybench

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testhost"
	"github.com/trialnet/trialnet/internal/testkit"
)

const (
	upstreamName = "upstream.bench.example"
	benchPort    = 9000 // on the test host; the first byte picks the service (serveUpstream)

	// What each route does per round; every loop is also bounded by
	// modeTimeout.
	seqTunnels     = 2000     // sequential handshakes (enough CPU ticks to divide)
	concClients    = 64       // concurrent clients ...
	concTunnels    = 4000     // ... sharing this many tunnels
	bulkBytes      = 64 << 20 // each way through one tunnel
	idleTunnels    = 1000     // held open on a fresh proxy
	halfCloseTries = 20       // each way
	modeTimeout    = 30 * time.Second
	ioTimeout      = 5 * time.Second // one dial, CONNECT or read
	halfCloseWait  = time.Second     // for a half-close to show at the far end
)

var (
	rounds   = flag.Int("rounds", 5, "interleaved rounds of BenchmarkPeers (at least 2)")
	onlyMode = flag.String("modes", "", "comma-separated modes of BenchmarkPeers to run (default: all), for profiling one")
	// reuseportThreads: the reuseport ceiling's event loops; more than
	// the CPUs tries what more threads than cores buy in the kernel's
	// scheduling (tinyproxy runs a thread per connection).
	reuseportThreads = flag.Int("reuseport-threads", runtime.NumCPU(), "event loops of the reuseport ceiling route")
	onlyPeer         = flag.String("peers", "", "comma-separated routes of BenchmarkPeers to run besides trialnet and its baselines (default: all), for comparing builds quickly")
)

// env is one run: a test host, a DNS server, and the peers' binaries and
// files in a temp dir.
type env struct {
	host     *testhost.Host
	upstream netip.AddrPort
	dir      string
	dnsAddr  string
	statsd   net.PacketConn // smokescreen's metrics sink, never read
	// halfClosed gets the byte the upstream read after its own
	// CloseWrite ('h'): proof that the client could still send.
	halfClosed chan byte
	cleanup    []func()
}

func newEnv(b *testing.B) *env {
	e := &env{halfClosed: make(chan byte, 16)}
	b.Cleanup(func() {
		for i := len(e.cleanup) - 1; i >= 0; i-- {
			e.cleanup[i]()
		}
	})
	var err error
	if e.host, err = testhost.New(180); err != nil {
		b.Fatal(err)
	}
	e.cleanup = append(e.cleanup, e.host.Close)
	e.upstream = netip.AddrPortFrom(e.host.Addr4, benchPort)
	ln, err := e.host.NS.Listen(context.Background(), "tcp", e.upstream.String())
	if err != nil {
		b.Fatal(err)
	}
	e.cleanup = append(e.cleanup, func() { _ = ln.Close() })
	go e.serveUpstream(ln)

	dnsAddr, stopDNS, err := testhost.ServeDNS(e.host.Addr4, upstreamName)
	if err != nil {
		b.Fatal(err)
	}
	e.cleanup = append(e.cleanup, stopDNS)
	e.dnsAddr = dnsAddr
	if e.statsd, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
		b.Fatal(err)
	}
	e.cleanup = append(e.cleanup, func() { _ = e.statsd.Close() })
	if e.dir, err = os.MkdirTemp("", "trialnet-bench-"); err != nil {
		b.Fatal(err)
	}
	// Registered before any process starts: runs after every one is stopped.
	e.cleanup = append(e.cleanup, func() { _ = os.RemoveAll(e.dir) })
	if err := e.build(); err != nil {
		b.Fatal(err)
	}
	return e
}

// serveUpstream runs the test host's services, picked by the first byte:
//   - 'e' echoes one byte and closes: the upstream closes first, so no
//     side of the host's namespace is left in TIME_WAIT (thousands of
//     short tunnels per run must not exhaust the ephemeral ports toward
//     the one upstream address);
//   - 'I' echoes one byte, then, on the next byte or EOF, resets (idle
//     tunnels, torn down from the upstream for the same reason);
//   - 'U' then an 8-byte length reads that many bytes and answers the
//     count; 'D' then an 8-byte length sends that many bytes, then EOF;
//   - 'H' reads until EOF, then answers the count (client half-close);
//   - 'h' sends one byte, then EOF, then reads one byte and hands it to
//     e.halfClosed (upstream half-close).
func (e *env) serveUpstream(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			tc := c.(*net.TCPConn)
			var op [1]byte
			if _, err := io.ReadFull(c, op[:]); err != nil {
				return
			}
			switch op[0] {
			case 'e':
				_, _ = c.Write(op[:])
			case 'I':
				_, _ = c.Write(op[:])
				_, _ = c.Read(op[:])
				_ = tc.SetLinger(0)
			case 'U':
				var want int64
				if binary.Read(c, binary.BigEndian, &want) == nil {
					n, _ := io.CopyN(io.Discard, c, want)
					_ = binary.Write(c, binary.BigEndian, n)
				}
			case 'D':
				var n int64
				if binary.Read(c, binary.BigEndian, &n) == nil {
					_, _ = io.CopyN(c, zeros{}, n)
				}
				_ = tc.CloseWrite()
				_, _ = io.Copy(io.Discard, c)
			case 'H':
				n, _ := io.Copy(io.Discard, c)
				_ = binary.Write(c, binary.BigEndian, n)
			case 'h':
				_, _ = c.Write(op[:])
				_ = tc.CloseWrite()
				if _, err := io.ReadFull(c, op[:]); err == nil {
					select {
					case e.halfClosed <- op[0]:
					default:
					}
				}
			}
		}()
	}
}

type zeros struct{}

func (zeros) Read(b []byte) (int, error) { clear(b); return len(b), nil }

// route is one way to reach the upstream: directly, or through a peer's
// long-running process.
type route struct {
	name string
	peer peer
	proc *process // nil for direct
}

func (r *route) dial(e *env) (net.Conn, io.Reader, error) {
	if r.proc == nil {
		return e.dial("", "")
	}
	return e.dial(r.proc.addr, r.peer.target)
}

// dial opens a connection to the upstream, through the CONNECT of the
// proxy at proxyAddr when there is one. The reader holds what the
// CONNECT's response left buffered.
func (e *env) dial(proxyAddr, target string) (net.Conn, io.Reader, error) {
	if proxyAddr == "" {
		c, err := net.DialTimeout("tcp", e.upstream.String(), ioTimeout)
		return c, c, err
	}
	c, err := net.DialTimeout("tcp", proxyAddr, ioTimeout)
	if err != nil {
		return nil, nil, err
	}
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target); err != nil {
		closeNow(c)
		return nil, nil, err
	}
	br := bufio.NewReaderSize(c, 512)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != http.StatusOK {
		closeNow(c)
		if err == nil {
			err = fmt.Errorf("status %s", resp.Status)
		}
		return nil, nil, fmt.Errorf("CONNECT via %s: %w", proxyAddr, err)
	}
	_ = c.SetDeadline(time.Time{})
	if br.Buffered() > 0 {
		return c, io.MultiReader(br, c), nil
	}
	return c, c, nil
}

// closeNow closes with a reset, leaving nothing in TIME_WAIT.
func closeNow(c net.Conn) {
	_ = c.(*net.TCPConn).SetLinger(0)
	_ = c.Close()
}

// echo opens a tunnel over r and waits for the upstream's one-byte echo
// of op.
func (r *route) echo(e *env, op byte) (net.Conn, error) {
	c, rd, err := r.dial(e)
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	var one [1]byte
	if _, err = c.Write([]byte{op}); err == nil {
		_, err = io.ReadFull(rd, one[:])
	}
	if err != nil {
		closeNow(c)
		return nil, fmt.Errorf("echo: %w", err)
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// mode is one figure-producing run; proxyOnly modes skip direct.
type mode struct {
	name      string
	run       func(*env, *route, *results) error
	proxyOnly bool
}

// BenchmarkPeers runs every mode against direct, trialnet and each peer,
// interleaved: in each round, each mode runs once per route, the routes
// in an order rotated by the round, so that the machine's noise (two
// cores shared with other work) falls on all of them alike. It prints a
// markdown table of the medians over rounds and reports trialnet's ratio
// to the best peer per figure.
func BenchmarkPeers(b *testing.B) {
	privtest.Require(b)
	e := newEnv(b)
	routes := []*route{{name: "direct"}}
	for _, p := range e.peers() {
		if *onlyPeer != "" && p.name != "trialnet" && !strings.HasPrefix(p.name, baselinePrefix) && !slices.Contains(strings.Split(*onlyPeer, ","), p.name) {
			continue
		}
		proc, err := p.start()
		if err != nil {
			b.Fatal(err)
		}
		routes = append(routes, &route{name: p.name, peer: p, proc: proc})
	}
	for _, r := range routes { // warm: DNS caches, first-use allocations
		c, err := r.echo(e, 'e')
		if err != nil {
			b.Fatalf("%s: %v", r.name, err)
		}
		closeNow(c)
	}
	res := &results{vals: map[string]map[string][]float64{}, half: map[string]map[string]*[2]int{}}
	modes := []mode{
		{"handshake", handshake, false},
		{"concurrent", concurrent, false},
		{"bulk", bulk, false},
		{"idle", idle, true},
		{"half-close", halfClose, false},
	}
	if *onlyMode != "" {
		want := strings.Split(*onlyMode, ",")
		for _, w := range want {
			if !slices.ContainsFunc(modes, func(m mode) bool { return m.name == w }) {
				b.Fatalf("-modes: no mode %q (the modes: handshake, concurrent, bulk, idle, half-close)", w)
			}
		}
		modes = slices.DeleteFunc(modes, func(m mode) bool { return !slices.Contains(want, m.name) })
	}
	n := max(*rounds, 2)
	start := time.Now()
	for round := range n {
		for _, m := range modes {
			for i := range routes {
				r := routes[(i+round)%len(routes)]
				if m.proxyOnly && r.proc == nil {
					continue
				}
				if err := m.run(e, r, res); err != nil {
					b.Fatalf("round %d, %s, %s: %v", round+1, m.name, r.name, err)
				}
			}
		}
	}
	order := []string{"direct", "tinyproxy", "squid", "smokescreen", "naive Go", ceilingRoute, reuseportRoute, "trialnet"}
	for _, bl := range baselines() {
		order = slices.Insert(order, len(order)-1, bl.route)
	}
	order = slices.DeleteFunc(order, func(rt string) bool { return !slices.ContainsFunc(routes, func(r *route) bool { return r.name == rt }) })
	table, ratios := res.table(order)
	fmt.Printf("\nproxybench: %d interleaved rounds in %s, %s; median over rounds\n\n%s\n",
		n, time.Since(start).Round(time.Second), time.Now().UTC().Format("2006-01-02"), table)
	fmt.Print(res.rounds(order))
	for _, k := range slices.Sorted(maps.Keys(ratios)) {
		b.ReportMetric(ratios[k], k)
	}
}

// handshake opens seqTunnels tunnels one after another, each to a
// one-byte echo, and records p50, p99 and the proxy's CPU per tunnel.
func handshake(e *env, r *route, res *results) error {
	var cpu0 time.Duration
	if r.proc != nil {
		cpu0 = treeCPU(r.proc.cmd.Process.Pid)
	}
	lat := make([]time.Duration, 0, seqTunnels)
	for deadline := time.Now().Add(modeTimeout); len(lat) < seqTunnels && time.Now().Before(deadline); {
		t0 := time.Now()
		c, err := r.echo(e, 'e')
		if err != nil {
			return err
		}
		lat = append(lat, time.Since(t0))
		closeNow(c)
	}
	if r.proc != nil {
		cpu := treeCPU(r.proc.cmd.Process.Pid) - cpu0
		res.add("cpu", r.name, us(cpu)/float64(len(lat)))
	}
	slices.Sort(lat)
	res.add("p50", r.name, us(lat[len(lat)/2]))
	res.add("p99", r.name, us(lat[len(lat)*99/100]))
	return nil
}

// concurrent has concClients clients share concTunnels one-byte-echo
// tunnels, and records tunnels per second and the proxy's CPU per
// tunnel: the two cores are busy throughout, so the proxy's share of
// them bounds the rate.
func concurrent(e *env, r *route, res *results) error {
	var cpu0 time.Duration
	if r.proc != nil {
		cpu0 = treeCPU(r.proc.cmd.Process.Pid)
	}
	busy0, idle0 := machineCPU()
	var next, done atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(modeTimeout)
	for range concClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= concTunnels && time.Now().Before(deadline) {
				c, err := r.echo(e, 'e')
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				closeNow(c)
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return fmt.Errorf("%d of %d tunnels done, then: %w", done.Load(), concTunnels, firstErr)
	}
	res.add("tps", r.name, float64(done.Load())/time.Since(start).Seconds())
	busy1, idle1 := machineCPU()
	if total := busy1 - busy0 + idle1 - idle0; total > 0 {
		res.add("idle64", r.name, 100*float64(idle1-idle0)/float64(total))
	}
	if r.proc != nil {
		cpu := treeCPU(r.proc.cmd.Process.Pid) - cpu0
		res.add("cpu64", r.name, us(cpu)/float64(done.Load()))
	}
	return nil
}

// machineCPU returns the jiffies all CPUs spent busy (steal included:
// a core the hypervisor gave to another guest was not free for this
// benchmark) and idle (iowait included), from /proc/stat. The
// concurrent mode's idle share says whether its 64 clients, the
// upstream and the proxy kept the cores busy, so that the tunnels/s
// measure what a tunnel costs the machine rather than a wait.
func machineCPU() (busy, idle int64) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(data), "\n")
	// cpu user nice system idle iowait irq softirq steal guest guest_nice;
	// guest time is already in user.
	for i, f := range strings.Fields(line)[1:] {
		n, _ := strconv.ParseInt(f, 10, 64)
		switch {
		case i == 3 || i == 4:
			idle += n
		case i < 8:
			busy += n
		}
	}
	return busy, idle
}

// bulk moves bulkBytes up (client to upstream), then down, each through
// one tunnel, and records MB/s (the CONNECT not included). The client
// reads and writes 256 KiB at a time, so that it is not what limits.
func bulk(e *env, r *route, res *results) error {
	buf := make([]byte, 256<<10)
	for _, dir := range []string{"up", "down"} {
		c, rd, err := r.dial(e)
		if err != nil {
			return err
		}
		_ = c.SetDeadline(time.Now().Add(modeTimeout))
		t0 := time.Now()
		var n int64
		if dir == "up" {
			_, err = c.Write(binary.BigEndian.AppendUint64([]byte{'U'}, bulkBytes))
			for sent := 0; err == nil && sent < bulkBytes; sent += len(buf) {
				_, err = c.Write(buf)
			}
			if err == nil {
				err = binary.Read(rd, binary.BigEndian, &n)
			}
		} else {
			_, err = c.Write(binary.BigEndian.AppendUint64([]byte{'D'}, bulkBytes))
			for m := 0; err == nil; n += int64(m) {
				m, err = rd.Read(buf)
			}
			if errors.Is(err, io.EOF) {
				err = nil
			}
		}
		elapsed := time.Since(t0)
		closeNow(c)
		if err != nil || n != bulkBytes {
			return fmt.Errorf("bulk %s: %d of %d bytes: %v", dir, n, bulkBytes, err)
		}
		res.add(dir, r.name, bulkBytes/elapsed.Seconds()/1e6)
	}
	return nil
}

// idle starts a fresh process of r's peer, holds idleTunnels tunnels
// open through it, each used once, and records its resident memory
// growth per tunnel (the whole process tree).
func idle(e *env, r *route, res *results) error {
	p, err := r.peer.start()
	if err != nil {
		return err
	}
	defer p.stop()
	fresh := &route{name: r.name, peer: r.peer, proc: p}
	c, err := fresh.echo(e, 'e') // warm: DNS cache, first-use allocations
	if err != nil {
		return err
	}
	closeNow(c)
	time.Sleep(100 * time.Millisecond)
	pid := p.cmd.Process.Pid
	before := treeRSSBytes(pid)
	conns := make([]net.Conn, 0, idleTunnels)
	// The upstream ends each tunnel (see 'I'), and the client waits for
	// that to arrive before it resets its side.
	defer func() {
		for _, c := range conns {
			_, _ = c.Write([]byte{'q'})
		}
		deadline := time.Now().Add(ioTimeout) // for all: 1,000 waits must not add up
		for _, c := range conns {
			_ = c.SetReadDeadline(deadline)
			_, _ = io.Copy(io.Discard, c)
			closeNow(c)
		}
	}()
	for deadline := time.Now().Add(modeTimeout); len(conns) < idleTunnels; {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d idle tunnels in %s", len(conns), idleTunnels, modeTimeout)
		}
		c, err := fresh.echo(e, 'I')
		if err != nil {
			return fmt.Errorf("idle tunnel %d: %w", len(conns)+1, err)
		}
		conns = append(conns, c)
	}
	time.Sleep(300 * time.Millisecond)
	res.add("idle", r.name, float64(treeRSSBytes(pid)-before)/(1<<10)/idleTunnels)
	return nil
}

// halfClose checks, halfCloseTries times each way, that a half-close
// crosses the tunnel with the other direction still open, and records
// how often it did and the median round trip of those that did. A peer
// that fails once is not tried again that round.
func halfClose(e *env, r *route, res *results) error {
	for _, dir := range []string{"hc-up", "hc-down"} {
		var lat []time.Duration
		tried := 0
		for i := range halfCloseTries {
			tried++
			d, ok, err := halfCloseOnce(e, r, dir, byte(i+1))
			if err != nil {
				return err
			}
			if !ok {
				break
			}
			lat = append(lat, d)
		}
		res.addHalf(dir, r.name, len(lat), tried)
		if len(lat) > 0 {
			slices.Sort(lat)
			res.add(dir, r.name, us(lat[len(lat)/2]))
		}
	}
	return nil
}

// halfCloseOnce: for hc-up, the client sends 1 KiB and half-closes, and
// must get the upstream's count of what it read back; for hc-down, the
// upstream sends a byte and half-closes, and the client must see EOF and
// then reach the upstream with token. ok is false when the half-close did
// not cross with the tunnel still usable; err is for what fails before.
func halfCloseOnce(e *env, r *route, dir string, token byte) (time.Duration, bool, error) {
	c, rd, err := r.dial(e)
	if err != nil {
		return 0, false, err
	}
	defer closeNow(c)
	_ = c.SetDeadline(time.Now().Add(halfCloseWait))
	t0 := time.Now()
	if dir == "hc-up" {
		msg := make([]byte, 1+1024)
		msg[0] = 'H'
		if _, err := c.Write(msg); err != nil {
			return 0, false, err
		}
		_ = c.(*net.TCPConn).CloseWrite()
		var n int64
		if err := binary.Read(rd, binary.BigEndian, &n); err != nil || n != 1024 {
			return 0, false, nil
		}
		return time.Since(t0), true, nil
	}
	for len(e.halfClosed) > 0 { // from an earlier try that timed out
		<-e.halfClosed
	}
	var one [1]byte
	if _, err := c.Write([]byte{'h'}); err != nil {
		return 0, false, err
	}
	if _, err := io.ReadFull(rd, one[:]); err != nil {
		return 0, false, nil
	}
	if n, err := rd.Read(one[:]); n != 0 || !errors.Is(err, io.EOF) {
		return 0, false, nil
	}
	if _, err := c.Write([]byte{token}); err != nil {
		return 0, false, nil
	}
	for timeout := time.After(halfCloseWait); ; {
		select {
		case got := <-e.halfClosed:
			if got == token {
				return time.Since(t0), true, nil
			}
		case <-timeout:
			return 0, false, nil
		}
	}
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// results holds one value per round for each figure and route, and for
// the half-close figures how many tries crossed out of how many.
type results struct {
	vals map[string]map[string][]float64
	half map[string]map[string]*[2]int
}

func (s *results) add(fig, route string, v float64) {
	if s.vals[fig] == nil {
		s.vals[fig] = map[string][]float64{}
	}
	s.vals[fig][route] = append(s.vals[fig][route], v)
}

func (s *results) addHalf(fig, route string, ok, tried int) {
	if s.half[fig] == nil {
		s.half[fig] = map[string]*[2]int{}
	}
	if s.half[fig][route] == nil {
		s.half[fig][route] = &[2]int{}
	}
	s.half[fig][route][0] += ok
	s.half[fig][route][1] += tried
}

// figure is one row of the table.
type figure struct {
	key, label  string
	lowerBetter bool
	decimals    int
	metric      string // trialnet / best peer, reported with b.ReportMetric
	// context: a figure of the run, not of the proxy: no best, no ratio
	context bool
}

var figures = []figure{
	{"p50", "handshake p50, µs (connect + CONNECT/200 + 1-byte echo)", true, 0, "handshake-p50/best-peer", false},
	{"p99", "handshake p99, µs", true, 0, "handshake-p99/best-peer", false},
	{"cpu", "proxy CPU per sequential tunnel, µs", true, 0, "cpu-per-tunnel/best-peer", false},
	{"tps", "tunnels/s, 64 concurrent clients", false, 0, "tunnels-per-s/best-peer", false},
	{"cpu64", "proxy CPU per tunnel, 64 concurrent clients, µs", true, 0, "cpu-per-tunnel-64/best-peer", false},
	{"idle64", "machine idle during the 64 clients, % of all CPUs", false, 1, "machine-idle-64/run", true},
	{"up", "bulk up (client → upstream), MB/s, one tunnel", false, 0, "bulk-up/best-peer", false},
	{"down", "bulk down (upstream → client), MB/s, one tunnel", false, 0, "bulk-down/best-peer", false},
	{"idle", "KiB per idle tunnel (1,000 open, fresh process)", true, 1, "idle-KiB/best-peer", false},
	{"hc-up", "half-close client → upstream forwarded; round trip µs", true, 0, "half-close-up/best-peer", false},
	{"hc-down", "half-close upstream → client forwarded; round trip µs", true, 0, "half-close-down/best-peer", false},
}

// table renders the medians as markdown, figures by routes, the best
// proxy's figure in bold, with trialnet's ratio to the best peer, and
// returns those ratios by metric name.
func (s *results) table(order []string) (string, map[string]float64) {
	var t strings.Builder
	ratios := map[string]float64{}
	fmt.Fprintf(&t, "| figure | %s | trialnet / best peer |\n|---|%s---|\n", strings.Join(order, " | "), strings.Repeat("---|", len(order)))
	for _, f := range figures {
		med := map[string]float64{}
		for rt, vs := range s.vals[f.key] {
			med[rt] = testkit.Median(vs)
		}
		better := func(a, b string) bool {
			return b == "" || (f.lowerBetter && med[a] < med[b]) || (!f.lowerBetter && med[a] > med[b])
		}
		best, bold := "", "" // the best peer; the best of the peers and trialnet
		for _, rt := range order {
			if _, ok := med[rt]; !ok || isReference(rt) || f.context {
				continue
			}
			if rt != "trialnet" && better(rt, best) {
				best = rt
			}
			if better(rt, bold) {
				bold = rt
			}
		}
		cells := make([]string, 0, len(order)+2)
		cells = append(cells, f.label)
		for _, rt := range order {
			cell := "–"
			if v, ok := med[rt]; ok {
				cell = num(v, f.decimals)
			}
			if h := s.half[f.key][rt]; h != nil {
				switch {
				case h[0] == 0:
					cell = "no"
				case h[0] < h[1]:
					cell = fmt.Sprintf("%d of %d, %s", h[0], h[1], cell)
				default:
					cell = "yes, " + cell
				}
			}
			if rt == bold {
				cell = "**" + cell + "**"
			}
			cells = append(cells, cell)
		}
		ratio := "–"
		if v, ok := med["trialnet"]; ok && best != "" {
			ratios[f.metric] = v / med[best]
			ratio = fmt.Sprintf("%.2f× (%s)", v/med[best], best)
		}
		cells = append(cells, ratio)
		fmt.Fprintf(&t, "| %s |\n", strings.Join(cells, " | "))
	}
	return t.String(), ratios
}

// rounds renders every round's figures in the benchmark format, one line
// per route and round, for benchstat (-col /route, with the route names'
// spaces and commas as dashes): the spread between builds in one run.
func (s *results) rounds(order []string) string {
	var b strings.Builder
	for _, rt := range order {
		name := strings.NewReplacer(" ", "-", ",", "").Replace(rt)
		for i := 0; ; i++ {
			var line strings.Builder
			for _, f := range figures {
				if vs := s.vals[f.key][rt]; i < len(vs) {
					fmt.Fprintf(&line, " %.*f %s", f.decimals+1, vs[i], f.metric[:strings.IndexByte(f.metric, '/')])
				}
			}
			if line.Len() == 0 {
				break
			}
			fmt.Fprintf(&b, "BenchmarkRound/route=%s 1%s\n", name, line.String())
		}
	}
	return b.String()
}

// num formats v with the given decimals and thousands separators.
func num(v float64, decimals int) string {
	s := fmt.Sprintf("%.*f", decimals, v)
	intPart, frac, _ := strings.Cut(s, ".")
	var out []byte
	for i, c := range []byte(intPart) {
		if i > 0 && (len(intPart)-i)%3 == 0 && intPart[i-1] != '-' {
			out = append(out, ',')
		}
		out = append(out, c)
	}
	if frac != "" {
		return string(out) + "." + frac
	}
	return string(out)
}
