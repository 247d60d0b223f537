//go:build linux

package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	trialspec "github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/internal/tlstest"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/resolve"
	"github.com/trialnet/trialnet/wire"
)

// MemoryPerTrialBound is the documented bound on what one Trial can make
// the shared proxy hold, at the default caps (DefaultMaxTunnels requests
// and tunnels open, the rest of DefaultMaxClientConns kept alive),
// measured by TestProxyMemoryPerTrial as the proxy process's resident
// memory.
const MemoryPerTrialBound = 64 << 20

// The child process of TestProxyMemoryPerTrial: a proxy serving two
// Trials, t1 allowed hostile.test:80 and good.test:80, t2 good.test:80, each on
// a listener whose address it prints; it dials every checked address of
// hostile.test to the upstream at $MEMTEST_HOSTILE and good.test's to
// $MEMTEST_GOOD, and serves until its stdin closes.
const memChildEnv = "TRIALNET_MEMTEST_CHILD"

var (
	hostileAddr = netip.MustParseAddr("93.184.216.34")
	goodAddr    = netip.MustParseAddr("93.184.216.35")
)

type nameMap map[string]netip.Addr

func (m nameMap) Resolve(_ context.Context, name string) (resolve.Answer, error) {
	if a, ok := m[name]; ok {
		return resolve.Answer{Addrs: []netip.Addr{a}}, nil
	}
	return resolve.Answer{}, record.Deny(record.ReasonDNSNXDomain, "no such name")
}

type addrMap map[netip.Addr]string

func (m addrMap) Dial(ctx context.Context, a netip.AddrPort) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", m[a.Addr()])
}

func memChild() error {
	p, err := New(Config{
		ProxySettings: config.ProxySettings{Resolver: nameMap{"hostile.test": hostileAddr, "good.test": goodAddr}},
		Dialer:        addrMap{hostileAddr: os.Getenv("MEMTEST_HOSTILE"), goodAddr: os.Getenv("MEMTEST_GOOD")},
	})
	if err != nil {
		return err
	}
	for _, tr := range []struct{ id, allow string }{{"t1", "hostile.test:80 hostile.test:443 good.test:80"}, {"t2", "good.test:80"}} {
		al, err := allow.Parse(strings.Fields(tr.allow), false)
		if err != nil {
			return err
		}
		// The CONNECT burst raised: a Trial reaches its caps at the
		// default rate too, only more slowly.
		if err := p.AddTrial(TrialPolicy{Spec: trialspec.Spec{ID: tr.id, Limits: proxyHalf(&trialspec.ProxyLimits{ConnectBurst: 10000})}, Allow: al}); err != nil {
			return err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		go func() { _ = p.Serve(ln, tr.id) }()
		fmt.Println(ln.Addr())
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	return p.Close()
}

// hostileUpstream answers a request for /cap with a response head just
// under MaxResponseHeaderBytes and then a body without end, one for
// /stall with a head that stops short of its end, and one for /over with
// a head over the cap; it holds each connection until stop closes.
func hostileUpstream(t *testing.T, stop <-chan struct{}) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				go func() { <-stop; _ = c.Close() }()
				br := bufio.NewReader(c)
				if b, err := br.Peek(1); err == nil && b[0] == 0x16 {
					// A tunnel: after the ClientHello, a ServerHello that
					// never completes, in records as small as they come.
					_, _ = c.Write(stalledHello(2))
					<-stop
					return
				}
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				bw := bufio.NewWriterSize(c, 64<<10)
				fmt.Fprint(bw, "HTTP/1.1 200 OK\r\n")
				pad := strings.Repeat("p", 1000)
				lines := maxResponseHeaderBytes/1012 - 2
				if req.URL.Path == "/over" {
					lines = 2 * maxResponseHeaderBytes / 1012
				}
				for i := range lines {
					fmt.Fprintf(bw, "X-Pad-%03d: %s\r\n", i, pad)
				}
				if req.URL.Path == "/stall" {
					_ = bw.Flush()
					<-stop
					return
				}
				fmt.Fprint(bw, "Content-Length: 1000000000000\r\n\r\n")
				body := make([]byte, 32<<10)
				for range 1 << 15 { // 1 GiB at most; the client reads none
					if _, err := bw.Write(body); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	return ln.Addr().String()
}

// stalledHello is a TLS handshake message of type typ (1 ClientHello,
// 2 ServerHello) that declares wire.MaxClientHello bytes and stops
// short of them, sent one byte a record: it fills the buffer the proxy
// holds for an incomplete hello, which then waits for the rest.
func stalledHello(typ byte) []byte {
	l := wire.MaxClientHello
	b := []byte{0x16, 0x03, 0x01, 0x00, 0x04, typ, byte(l >> 16), byte(l >> 8), byte(l)}
	for len(b)+6 < wire.MaxHelloBuffer {
		b = append(b, 0x16, 0x03, 0x01, 0x00, 0x01, 0x00)
	}
	return b
}

// connectTLS opens a tunnel to hostile.test:443 through proxyAddr and
// sends first, the start of a ClientHello or all of one.
func connectTLS(t *testing.T, proxyAddr string, first []byte) {
	t.Helper()
	c := dialProxy(t, proxyAddr)
	br := bufio.NewReader(c)
	if _, err := io.WriteString(c, connectHead("hostile.test:443")); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT hostile.test:443: %+v, %v", resp, err)
	}
	if _, err := c.Write(first); err != nil {
		t.Fatal(err)
	}
}

// dialProxy connects to the proxy process, closed when the test ends.
func dialProxy(t *testing.T, proxyAddr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	return c
}

// forwardGET sends one forwarded GET of url through proxyAddr and
// returns the connection after its request is written.
func forwardGET(t *testing.T, proxyAddr, url string) net.Conn {
	t.Helper()
	c := dialProxy(t, proxyAddr)
	if _, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", url, strings.Split(url, "/")[2]); err != nil {
		t.Fatal(err)
	}
	return c
}

// The finding: 200 forwarded requests to an upstream sending ~9 MB of
// headers, never read by the client, took the proxy to 2.3 GB. Now one
// Trial at its tunnel cap, its upstreams answering with heads at the cap,
// heads that never end, heads over it and bodies its clients never read,
// grows the proxy process by less than MemoryPerTrialBound; and the
// other Trial's requests succeed throughout.
//
// Both ways a Trial holds tunnels are measured, at the full tunnel cap
// each: forwarded requests (responses at the head cap, heads that never
// end, bodies never read) and CONNECT tunnels in the TLS check (a
// ClientHello that stops short at the buffer's bound, an upstream's
// ServerHello that does).
func TestProxyMemoryPerTrial(t *testing.T) {
	hello := tlstest.ClientHello(t, "hostile.test")
	for _, tc := range []struct {
		name string
		hold func(t *testing.T, addr string, i int)
	}{
		{"forwarded", func(t *testing.T, addr string, i int) {
			_ = forwardGET(t, addr, "http://hostile.test"+[]string{"/cap", "/stall"}[i%2]) // read nothing
		}},
		{"tls", func(t *testing.T, addr string, i int) {
			connectTLS(t, addr, [][]byte{stalledHello(1), hello}[i%2])
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { testProxyMemory(t, tc.hold) })
	}
}

func testProxyMemory(t *testing.T, hold func(t *testing.T, addr string, i int)) {
	stop := make(chan struct{})
	release := sync.OnceFunc(func() { close(stop) })
	t.Cleanup(release)
	hostile := hostileUpstream(t, stop)
	good := newUpstream(t, func(c *net.TCPConn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_ = req.Body.Close()
			if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
				return
			}
		}
	})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), memChildEnv+"=1", "MEMTEST_HOSTILE="+hostile, "MEMTEST_GOOD="+good.ln.Addr().String())
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	var addrs []string
	for len(addrs) < 2 && sc.Scan() {
		addrs = append(addrs, sc.Text())
	}
	if len(addrs) < 2 {
		t.Fatalf("the proxy process printed %q", addrs)
	}
	t1, t2 := addrs[0], addrs[1]
	// get makes one forwarded request to good.test through Trial addr
	// and leaves its connection open, kept alive, if keep.
	get := func(addr string, keep bool) {
		t.Helper()
		c := forwardGET(t, addr, "http://good.test/")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("request through %s: %v", addr, err)
		}
		_ = resp.Body.Close()
		if !keep {
			_ = c.Close()
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request through %s: %s", addr, resp.Status)
		}
	}
	goodRequest := func() { t.Helper(); get(t2, false) }
	for range 20 {
		goodRequest()
	}
	// The proxy process's resident memory; none means it is gone.
	rssBytes := func() int64 {
		t.Helper()
		r := testkit.RSSBytes(cmd.Process.Pid)
		if r == 0 {
			t.Fatalf("no resident memory for the proxy process %d: it is gone", cmd.Process.Pid)
		}
		return r
	}
	base := rssBytes()
	// Half of t1's client connections kept alive, each with its buffer
	// and its idle upstream connection; the other half, its tunnel cap,
	// held by hostile responses.
	for range trialspec.DefaultMaxClientConns - trialspec.DefaultMaxTunnels {
		get(t1, true)
	}

	var peak int64
	sample := func() {
		if r := rssBytes(); r > peak {
			peak = r
		}
	}
	for i := range 64 { // refused: a head over the cap
		c := forwardGET(t, t1, "http://hostile.test/over")
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("a response head over the cap: %+v, %v; want 502", resp, err)
		}
		_ = c.Close()
		if i%16 == 0 {
			sample()
		}
	}
	for i := range trialspec.DefaultMaxTunnels {
		hold(t, t1, i)
		if i%16 == 0 {
			sample()
			goodRequest()
		}
	}
	// Every hostile request is held; t2 keeps working while the proxy
	// holds them.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		sample()
		goodRequest()
		time.Sleep(50 * time.Millisecond)
	}
	// Past its caps, t1 is refused, with the reason.
	c := forwardGET(t, t1, "http://hostile.test/cap")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil || resp.StatusCode != http.StatusTooManyRequests ||
		(resp.Header.Get("Trialnet-Reason") != string(record.ReasonTrialConnLimit) && resp.Header.Get("Trialnet-Reason") != string(record.ReasonTunnelLimit)) {
		t.Fatalf("a request past t1's caps: %+v, %v; want 429 with trial_connection_limit or tunnel_limit", resp, err)
	}
	release()
	grew := peak - base
	t.Logf("proxy RSS %d MiB before, %d MiB at peak: one Trial's %d kept-alive connections and %d hostile requests grew it by %.1f MiB (bound %d MiB)",
		base>>20, peak>>20, trialspec.DefaultMaxClientConns-trialspec.DefaultMaxTunnels, trialspec.DefaultMaxTunnels, float64(grew)/(1<<20), MemoryPerTrialBound>>20)
	if grew > MemoryPerTrialBound {
		t.Fatalf("one Trial grew the proxy by %d MiB, over the documented %d MiB", grew>>20, MemoryPerTrialBound>>20)
	}
}

func TestMain(m *testing.M) {
	if os.Getenv(memChildEnv) != "" {
		if err := memChild(); err != nil {
			fmt.Fprintln(os.Stderr, "proxy process:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
