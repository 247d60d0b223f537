//go:build linux

package proxy

import (
	"io"
	"maps"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trialnet/trialnet/allow"
	trialspec "github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

// TestConnectionFloodBounded: a Trial connecting as fast as it can, past
// its caps, holds no more of the proxy's connections (each a descriptor
// and a goroutine of the agent's) than its pending-head cap and the
// fixed bounds on connections being admitted (maxAdmitting) and being
// refused (maxClosing), and another Trial's CONNECTs go on. Half of the
// flood is idle connections (refused at admission), half CONNECTs to a
// name off the list (admitted, then refused); none reads its answer.
func TestConnectionFloodBounded(t *testing.T) {
	lim := &trialspec.ProxyLimits{MaxClientConns: 16, MaxPendingHeads: 8}
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, limits: lim,
		configure: func(c *Config) { c.OnEvent = nil }}) // thousands of records: none is read here
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	t2 := tp.addTrial(t, "t2", "api.example.com:443")
	tp.mu.Lock()
	t1 := tp.trials["t1"]
	tp.mu.Unlock()

	stop := make(chan struct{})
	var flood sync.WaitGroup
	var made atomic.Int64
	for i := range 4 {
		flood.Go(func() {
			var held []net.Conn
			defer func() {
				for _, c := range held {
					_ = c.Close()
				}
			}()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.Dial("tcp", tp.addr)
				if err != nil {
					continue
				}
				made.Add(1)
				if i%2 == 1 {
					_, _ = io.WriteString(c, connectHead("denied.example.com:443"))
				}
				held = append(held, c)
				if len(held) > 500 {
					_ = held[0].Close()
					held = held[1:]
				}
			}
		})
	}
	var peak atomic.Int64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			t1.mu.Lock()
			n := int64(len(t1.conns))
			t1.mu.Unlock()
			if n > peak.Load() {
				peak.Store(n)
			}
		}
	}()
	for range 40 {
		resp, c, _ := t2.connect(t, connectHead("api.example.com:443"))
		if resp.StatusCode != 200 {
			t.Errorf("t2's CONNECT during t1's flood: %s %s", resp.Status, resp.Header.Get("Trialnet-Detail"))
		}
		_ = c.Close()
		time.Sleep(25 * time.Millisecond)
	}
	close(stop)
	flood.Wait()
	<-sampled
	// The accept loop's own connection, waiting for a token, and the
	// refused ones between their token and their reset, are the slack.
	bound := int64(lim.MaxPendingHeads + maxAdmitting + maxClosing + 32)
	t.Logf("t1 made %d connections; the proxy held at most %d of them at once (bound %d)", made.Load(), peak.Load(), bound)
	if peak.Load() > bound {
		t.Fatalf("the proxy held %d of t1's connections at once, past %d", peak.Load(), bound)
	}
}

// TestStalledTunnelsHoldBoundedSocketMemory: tunnels whose client reads
// nothing of what a fast upstream sends hold a bounded amount of the
// proxy's socket memory each (clientBuffer, upstreamBuffer), not what
// the kernel's autotuning grows to; another Trial's CONNECTs go on.
func TestStalledTunnelsHoldBoundedSocketMemory(t *testing.T) {
	hose := func(c *net.TCPConn) {
		b := make([]byte, 64<<10)
		for {
			if _, err := c.Write(b); err != nil {
				return
			}
		}
	}
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, upstream: hose})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	t2 := tp.addTrial(t, "t2", "api.example.com:443")
	tp.mu.Lock()
	t1 := tp.trials["t1"]
	tp.mu.Unlock()
	const tunnels = 16
	for range tunnels {
		resp, _, _ := tp.connect(t, connectHead("api.example.com:443")) // never read again
		if resp.StatusCode != 200 {
			t.Fatal(resp.Status)
		}
	}
	// What the proxy's sockets of t1 hold unread (its upstream sides) and
	// unsent (its client sides), once that stops growing.
	queued := func() int {
		t1.mu.Lock()
		defer t1.mu.Unlock()
		n := 0
		for c := range t1.conns {
			rc, err := c.(*net.TCPConn).SyscallConn()
			if err != nil {
				continue
			}
			_ = rc.Control(func(fd uintptr) {
				in, _ := unix.IoctlGetInt(int(fd), unix.SIOCINQ)
				out, _ := unix.IoctlGetInt(int(fd), unix.SIOCOUTQ)
				n += in + out
			})
		}
		return n
	}
	held := 0
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		time.Sleep(300 * time.Millisecond)
		n := queued()
		if n == held {
			break
		}
		held = n
	}
	for range 5 {
		resp, c, _ := t2.connect(t, connectHead("api.example.com:443"))
		if resp.StatusCode != 200 {
			t.Errorf("t2's CONNECT beside t1's stalled tunnels: %s", resp.Status)
		}
		_ = c.Close()
	}
	// Each direction's buffer holds at most twice what was set (the
	// kernel's doubling, part of it its own overhead), and a send buffer
	// may pass its size by the segment that filled it.
	bound := tunnels * (2*(clientBuffer+upstreamBuffer) + 64<<10)
	t.Logf("%d stalled tunnels hold %d KiB in the proxy's sockets (%d KiB each; bound %d KiB)", tunnels, held>>10, held/tunnels>>10, bound>>10)
	if held > bound {
		t.Fatalf("%d stalled tunnels hold %d KiB in the proxy's sockets, past %d KiB", tunnels, held>>10, bound>>10)
	}
}

// TestAcceptedConnectionsHaveBoundedBuffers: every client connection a
// Trial's listener hands the proxy has the client side's buffer bounds,
// the ones made while the listener waited to be served (queued before
// Serve set the bounds on the listening socket, as after a hand-over)
// and the ones made after (which inherit them from it).
func TestAcceptedConnectionsHaveBoundedBuffers(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}})
	al, err := allow.Parse([]string{"api.example.com:443"}, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := tp.AddTrial(TrialPolicy{Spec: trialspec.Spec{ID: "t2"}, Allow: al}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const each = 4
	var clients []net.Conn
	defer func() {
		for _, c := range clients {
			_ = c.Close()
		}
	}()
	dial := func() {
		for range each {
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			clients = append(clients, c)
		}
	}
	dial() // queued: the kernel made them from the listener as it was
	served := make(chan struct{})
	go func() { defer close(served); _ = tp.Serve(ln, "t2") }()
	defer func() { tp.RemoveTrial("t2"); <-served }()
	tp.mu.Lock()
	t2 := tp.trials["t2"]
	tp.mu.Unlock()
	tracked := func() []net.Conn {
		t2.mu.Lock()
		defer t2.mu.Unlock()
		return slices.Collect(maps.Keys(t2.conns))
	}
	for deadline := time.Now().Add(10 * time.Second); len(tracked()) < each; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of the %d queued connections accepted after 10 s", len(tracked()), each)
		}
	}
	dial() // made from the listener once Serve set its bounds
	for deadline := time.Now().Add(10 * time.Second); len(tracked()) < 2*each; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of the %d connections accepted after 10 s", len(tracked()), 2*each)
		}
	}
	for _, c := range tracked() {
		rc, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var rcv, snd int
		var rerr, serr error
		if err := rc.Control(func(fd uintptr) {
			rcv, rerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
			snd, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
		}); err != nil || rerr != nil || serr != nil {
			t.Fatal(err, rerr, serr)
		}
		if rcv != 2*clientBuffer || snd != 2*clientBuffer { // the kernel doubles what is set
			t.Errorf("client connection from %s: receive buffer %d, send buffer %d, want %d each", c.RemoteAddr(), rcv, snd, 2*clientBuffer)
		}
	}
}

// TestRemoveWhileAcceptWaits: a Trial whose accept loop waits for an
// admitting token (maxAdmitting refusals being closed, their clients
// neither reading nor closing) is removed at once: the refusals give
// their tokens back as RemoveTrial closes them, the loop hands on the
// connection it holds and ends, and no token is left taken.
func TestRemoveWhileAcceptWaits(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, configure: func(c *Config) { c.OnEvent = nil }})
	al, err := allow.Parse([]string{"api.example.com:443"}, false)
	if err != nil {
		t.Fatal(err)
	}
	lim := &trialspec.ProxyLimits{MaxClientConns: 1}
	if err := tp.AddTrial(TrialPolicy{Spec: trialspec.Spec{ID: "t2", Limits: proxyHalf(lim)}, Allow: al}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = tp.Serve(ln, "t2") }()
	tp.mu.Lock()
	t2 := tp.trials["t2"]
	tp.mu.Unlock()
	// One connection admitted (its head never sent), then refusals past
	// its cap, held open and unread.
	var held []net.Conn
	defer func() {
		for _, c := range held {
			_ = c.Close()
		}
	}()
	for range maxAdmitting + 16 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	// The loop waits: every token taken, and one more connection tracked
	// than the admitted one and the refusals holding them.
	tracked := func() int {
		t2.mu.Lock()
		defer t2.mu.Unlock()
		return len(t2.conns)
	}
	for deadline := time.Now().Add(10 * time.Second); len(t2.admitting) < maxAdmitting || tracked() < maxAdmitting+2; {
		if time.Now().After(deadline) {
			t.Fatalf("%d admitting tokens taken, %d connections tracked: want the accept loop waiting at %d", len(t2.admitting), tracked(), maxAdmitting)
		}
		time.Sleep(time.Millisecond)
	}
	removed := make(chan struct{})
	go func() { defer close(removed); tp.RemoveTrial("t2") }()
	select {
	case <-removed:
	case <-time.After(10 * time.Second):
		t.Fatal("RemoveTrial still waiting 10 s after it began, the Trial's accept loop waiting for a token")
	}
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("the removed Trial's accept loop still running after 10 s")
	}
	if n := len(t2.admitting); n != 0 {
		t.Errorf("%d admitting tokens still taken after the Trial's removal", n)
	}
}
