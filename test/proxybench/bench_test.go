//go:build linux

// Package proxybench compares trialnet's CONNECT proxy, side by side in
// one run, with a direct TCP connection (the physical limit here) and
// with tinyproxy (Debian's package, started by the benchmark). The
// upstream is a test host in its own network namespace behind a veth.
//
//	make bench    # or: go test -run '^$' -bench . -benchtime 1x ./test/proxybench
package proxybench

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/internal/testhost"
)

const (
	upstreamName = "upstream.bench.example"
	benchPort    = 9000 // on the test host: 'U' sink, 'D' source, 'E' echo
	chunk        = 64 << 20
)

// env is shared by every benchmark in one run: one test host, one DNS
// server, one trialnet proxy process and one tinyproxy process.
type env struct {
	host      *testhost.Host
	upstream  netip.AddrPort
	trialnet  *process
	tinyproxy *process
	cleanup   []func()

	dir, bin, dnsAddr string
}

type process struct {
	cmd  *exec.Cmd
	addr string
	stop func()
}

var (
	envOnce sync.Once
	shared  *env
	envErr  error
)

func setup(b *testing.B) *env {
	b.Helper()
	privtest.Require(b)
	envOnce.Do(func() { shared, envErr = newEnv() })
	if envErr != nil {
		b.Fatal(envErr)
	}
	return shared
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil {
		for i := len(shared.cleanup) - 1; i >= 0; i-- {
			shared.cleanup[i]()
		}
	}
	os.Exit(code)
}

func newEnv() (_ *env, err error) {
	e := &env{}
	defer func() {
		if err != nil {
			for i := len(e.cleanup) - 1; i >= 0; i-- {
				e.cleanup[i]()
			}
		}
	}()
	if e.host, err = testhost.New(180); err != nil {
		return nil, err
	}
	e.cleanup = append(e.cleanup, e.host.Close)
	e.upstream = netip.AddrPortFrom(e.host.Addr4, benchPort)
	ln, err := e.host.NS.Listen(context.Background(), "tcp", e.upstream.String())
	if err != nil {
		return nil, err
	}
	e.cleanup = append(e.cleanup, func() { _ = ln.Close() })
	go serveUpstream(ln)

	dnsAddr, stopDNS, err := testhost.ServeDNS(e.host.Addr4, upstreamName)
	if err != nil {
		return nil, err
	}
	e.cleanup = append(e.cleanup, stopDNS)

	dir, err := os.MkdirTemp("", "trialnet-bench-")
	if err != nil {
		return nil, err
	}
	e.cleanup = append(e.cleanup, func() { _ = os.RemoveAll(dir) })
	bin := filepath.Join(dir, "trialnet")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/trialnet").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build trialnet: %v\n%s", err, out)
	}
	e.dir, e.bin, e.dnsAddr = dir, bin, dnsAddr
	if e.trialnet, err = e.startTrialnet(); err != nil {
		return nil, err
	}
	e.tinyproxy, err = e.startTinyproxy()
	return e, err
}

// startTrialnet starts a `trialnet proxy` process allowing the upstream
// by name.
func (e *env) startTrialnet() (*process, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	// Limits far above what the benchmark does: it measures speed, not limits.
	cfg := filepath.Join(e.dir, "trialnet.yaml")
	if err := os.WriteFile(cfg, []byte("limits: {max_tunnels: 100000, max_client_connections: 100000, max_pending_heads: 100000, connects_per_second: 1000000, connect_burst: 1000000}\nmax_connections: 100000\n"), 0o644); err != nil {
		return nil, err
	}
	return start(e, exec.Command(e.bin, "proxy", "--config", cfg, "--listen", addr, "--trial", "bench",
		"--allow", fmt.Sprintf("%s:%d", upstreamName, benchPort), "--resolver", e.dnsAddr, "--allow-cidr", "198.18.0.0/15"), addr)
}

// startTinyproxy starts tinyproxy allowing CONNECT to the upstream port.
func (e *env) startTinyproxy() (*process, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(e.dir, "tinyproxy-"+strings.ReplaceAll(addr, ":", "_")+".conf")
	port := addr[strings.LastIndexByte(addr, ':')+1:]
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(
		"Port %s\nListen 127.0.0.1\nTimeout 600\nMaxClients 4096\nConnectPort %d\nAllow 127.0.0.1\nLogLevel Critical\nDisableViaHeader Yes\n",
		port, benchPort)), 0o644); err != nil {
		return nil, err
	}
	tiny, err := exec.LookPath("tinyproxy")
	if err != nil {
		return nil, fmt.Errorf("tinyproxy is not installed (make bench installs it): %w", err)
	}
	return start(e, exec.Command(tiny, "-d", "-c", conf), addr)
}

// start runs a proxy process and waits until it accepts connections.
func start(e *env, cmd *exec.Cmd, addr string) (*process, error) {
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, addr: addr}
	p.stop = func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	e.cleanup = append(e.cleanup, sync.OnceFunc(p.stop))
	p.stop = sync.OnceFunc(p.stop)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			_ = c.Close()
			return p, nil
		}
	}
	return nil, fmt.Errorf("%s did not start listening on %s: %s", cmd.Path, addr, stderr.String())
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// serveUpstream: the first byte picks the service. 'U' then an 8-byte
// length reads that many bytes and answers the count (no half-close:
// tinyproxy does not forward it); 'e' echoes one byte and closes; 'D' then an 8-byte length sends that many
// bytes; 'E' echoes until EOF.
func serveUpstream(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			var op [1]byte
			if _, err := io.ReadFull(c, op[:]); err != nil {
				return
			}
			switch op[0] {
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
				_ = c.(*net.TCPConn).CloseWrite()
				_, _ = io.Copy(io.Discard, c)
			case 'E':
				_, _ = c.Write(op[:])
				_, _ = io.Copy(c, c)
			case 'e': // one byte back, then the upstream closes first
				_, _ = c.Write(op[:])
			}
		}()
	}
}

type zeros struct{}

func (zeros) Read(b []byte) (int, error) { clear(b); return len(b), nil }

// route is one way to reach the upstream: directly or via a proxy.
type route struct {
	name  string
	proxy string // "" for direct
	// target is what the CONNECT asks for: trialnet takes names only;
	// tinyproxy gets the address, so that it needs no DNS at all.
	target string
}

func routes(e *env) []route {
	return []route{
		{"direct", "", ""},
		{"trialnet", e.trialnet.addr, fmt.Sprintf("%s:%d", upstreamName, benchPort)},
		{"tinyproxy", e.tinyproxy.addr, e.upstream.String()},
	}
}

// dial opens a connection to the upstream over r, through the proxy's
// CONNECT when there is one.
func (r route) dial(e *env) (net.Conn, io.Reader, error) {
	if r.proxy == "" {
		c, err := net.Dial("tcp", e.upstream.String())
		return c, c, err
	}
	c, err := net.Dial("tcp", r.proxy)
	if err != nil {
		return nil, nil, err
	}
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", r.target, r.target); err != nil {
		_ = c.Close()
		return nil, nil, err
	}
	br := bufio.NewReaderSize(c, 512)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		_ = c.Close()
		return nil, nil, fmt.Errorf("%s CONNECT: %v %v", r.name, resp, err)
	}
	if br.Buffered() > 0 {
		return c, io.MultiReader(br, c), nil
	}
	return c, c, nil
}

// closeNow closes with a reset. The upstream closes first ('e'), so no
// side is left in TIME_WAIT: thousands of short connections per run must
// not exhaust the ephemeral ports toward the one upstream address.
func closeNow(c net.Conn) {
	_ = c.(*net.TCPConn).SetLinger(0)
	_ = c.Close()
}

// BenchmarkThroughput moves 64 MiB per iteration through one tunnel, up
// (client to upstream) and down.
func BenchmarkThroughput(b *testing.B) {
	e := setup(b)
	for _, dir := range []string{"up", "down"} {
		for _, r := range routes(e) {
			b.Run(dir+"/"+r.name, func(b *testing.B) {
				b.SetBytes(chunk)
				for range b.N {
					c, rd, err := r.dial(e)
					if err != nil {
						b.Fatal(err)
					}
					if dir == "up" {
						_, _ = c.Write(binary.BigEndian.AppendUint64([]byte{'U'}, chunk))
						if _, err := io.CopyN(c, zeros{}, chunk); err != nil {
							b.Fatal(err)
						}
						var n int64
						if err := binary.Read(rd, binary.BigEndian, &n); err != nil || n != chunk {
							b.Fatalf("upstream got %d bytes, %v", n, err)
						}
					} else {
						hdr := binary.BigEndian.AppendUint64([]byte{'D'}, chunk)
						_, _ = c.Write(hdr)
						if n, err := io.Copy(io.Discard, rd); err != nil || n != chunk {
							b.Fatalf("got %d bytes, %v", n, err)
						}
					}
					_ = c.Close()
				}
			})
		}
	}
}

// BenchmarkFirstByte measures dial (and CONNECT) to the first echoed
// byte, DNS cache warm, and reports p50/p99.
func BenchmarkFirstByte(b *testing.B) {
	e := setup(b)
	for _, r := range routes(e) {
		b.Run(r.name, func(b *testing.B) {
			if c, _, err := r.dial(e); err == nil { // warms the DNS cache
				closeNow(c)
			}
			lat := make([]time.Duration, 0, b.N)
			for range b.N {
				t0 := time.Now()
				c, rd, err := r.dial(e)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = c.Write([]byte{'e'})
				var one [1]byte
				if _, err := io.ReadFull(rd, one[:]); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
				closeNow(c)
			}
			reportPercentiles(b, lat)
		})
	}
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	p := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(p(0.50), "p50-µs")
	b.ReportMetric(p(0.99), "p99-µs")
}

// BenchmarkTunnelsPerSecond opens, uses once and closes tunnels from 64
// concurrent clients.
func BenchmarkTunnelsPerSecond(b *testing.B) {
	e := setup(b)
	for _, r := range routes(e) {
		b.Run(r.name, func(b *testing.B) {
			var next atomic.Int64
			var failed atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			for range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= int64(b.N) {
						c, rd, err := r.dial(e)
						if err != nil {
							failed.Add(1)
							continue
						}
						_, _ = c.Write([]byte{'e'})
						var one [1]byte
						if _, err := io.ReadFull(rd, one[:]); err != nil {
							failed.Add(1)
						}
						closeNow(c)
					}
				}()
			}
			wg.Wait()
			if f := failed.Load(); f > 0 {
				b.Fatalf("%d of %d tunnels failed", f, b.N)
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "tunnels/s")
		})
	}
}

// BenchmarkIdleTunnelMemory opens 1,000 tunnels to a freshly started
// proxy, each used once and then idle, and reports the proxy's resident
// memory growth per tunnel (its whole process tree for tinyproxy).
func BenchmarkIdleTunnelMemory(b *testing.B) {
	e := setup(b)
	const n = 1000
	for _, name := range []string{"trialnet", "tinyproxy"} {
		b.Run(name, func(b *testing.B) {
			{ // measured once whatever b.N: a size, not a rate (repeated rounds would only exhaust ports)
				startFn := e.startTrialnet
				if name == "tinyproxy" {
					startFn = e.startTinyproxy
				}
				p, err := startFn()
				if err != nil {
					b.Fatal(err)
				}
				r := route{name, p.addr, fmt.Sprintf("%s:%d", upstreamName, benchPort)}
				if name == "tinyproxy" {
					r.target = e.upstream.String()
				}
				if c, _, err := r.dial(e); err == nil { // warm: DNS cache, first-use allocations
					closeNow(c)
				}
				time.Sleep(100 * time.Millisecond)
				before := treeRSS(p.cmd.Process.Pid)
				conns := make([]net.Conn, 0, n)
				for range n {
					c, rd, err := r.dial(e)
					if err != nil {
						b.Fatal(err)
					}
					_, _ = c.Write([]byte{'E'})
					var one [1]byte
					if _, err := io.ReadFull(rd, one[:]); err != nil {
						b.Fatal(err)
					}
					conns = append(conns, c)
				}
				time.Sleep(300 * time.Millisecond)
				after := treeRSS(p.cmd.Process.Pid)
				for _, c := range conns {
					_ = c.Close()
				}
				p.stop()
				b.ReportMetric(float64(after-before)/n, "KiB/tunnel")
				b.ReportMetric(float64(after), "KiB-rss")
			}
		})
	}
}

// treeRSS sums VmRSS (KiB) of pid and its descendants.
func treeRSS(pid int) int64 {
	total := int64(0)
	for _, p := range append([]int{pid}, descendants(pid)...) {
		total += testenv.RSS(p)
	}
	return total
}

func descendants(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, t := range tasks {
		data, _ := os.ReadFile(t)
		for _, f := range strings.Fields(string(data)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
				out = append(out, descendants(c)...)
			}
		}
	}
	return out
}
