//go:build linux

package proxy

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	trialspec "github.com/trialnet/trialnet/trial"

	"github.com/miekg/dns"
	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/record"
)

func TestTunnelRequestResponseAndPipelinedBytes(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	// The first request bytes travel in the same segment as the head.
	resp, c, br := tp.connect(t, connectHead("api.example.com:443")+"early bytes;")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, resp.Header.Get("Trialnet-Detail"))
	}
	if _, err := io.WriteString(c, "later bytes"); err != nil {
		t.Fatal(err)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(br)
	if err != nil || string(got) != "early bytes;later bytes" {
		t.Fatalf("echo %q, %v", got, err)
	}
	ev := tp.event(t)
	if ev.Decision != record.DecisionAllow || ev.Reason != record.ReasonAllowed || ev.BytesUp != 23 || ev.BytesDown != 23 ||
		ev.Dialed.String() != "93.184.216.34:443" || ev.Host != "api.example.com" || ev.Trial != "t1" {
		t.Fatalf("event %+v", ev)
	}
	if len(ev.ID) < 16 || ev.Rule != "api.example.com:443" || ev.Method != "CONNECT" || ev.DNS <= 0 || ev.Dial <= 0 ||
		ev.FirstByte < ev.DNS+ev.Dial || ev.FirstByte > ev.Duration {
		t.Fatalf("event id, rule, method or timings: %+v", ev)
	}
	var rec map[string]any
	if b, err := json.Marshal(ev); err != nil || json.Unmarshal(b, &rec) != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"event_id", "rule", "method", "dns_us", "dial_us", "first_byte_us", "bytes_up", "reason", "start"} {
		if _, ok := rec[k]; !ok {
			t.Fatalf("JSON record lacks %q: %v", k, rec)
		}
	}
	st, _ := tp.Stats("t1")
	if st.Allowed != 1 || st.BytesUp != 23 || st.BytesDown != 23 || st.ByReason[record.ReasonAllowed] != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A tunnel idle for 20 s (a long model call) is still open both ways.
func TestTunnelIdle(t *testing.T) {
	t.Parallel()
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	resp, c, br := tp.connect(t, connectHead("api.example.com:443"))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	for i, pause := range []time.Duration{0, 20 * time.Second} {
		time.Sleep(pause)
		msg := []byte{'p', byte('0' + i)}
		if _, err := c.Write(msg); err != nil {
			t.Fatalf("write after %v idle: %v", pause, err)
		}
		got := make([]byte, 2)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(br, got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("read after %v idle: %q %v", pause, got, err)
		}
	}
}

// The client's EOF reaches the upstream, and the upstream's final bytes,
// sent after it saw that EOF, still reach the client.
func TestTunnelHalfCloseFromClient(t *testing.T) {
	sawEOF := make(chan bool, 1)
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, upstream: func(c *net.TCPConn) {
		req, err := io.ReadAll(c) // returns at the client's EOF
		sawEOF <- err == nil
		_, _ = io.WriteString(c, "final answer to "+string(req))
		_ = c.CloseWrite()
	}})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	resp, c, br := tp.connect(t, connectHead("api.example.com:443"))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	_, _ = io.WriteString(c, "question")
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	select {
	case ok := <-sawEOF:
		if !ok {
			t.Fatal("upstream read failed instead of seeing EOF")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the client's EOF never reached the upstream")
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(br)
	if err != nil || string(got) != "final answer to question" {
		t.Fatalf("got %q, %v", got, err)
	}
	if ev := tp.event(t); ev.BytesDown != int64(len(got)) || ev.BytesUp != 8 {
		t.Fatalf("event %+v", ev)
	}
}

// The upstream's EOF reaches the client while the client can still send.
func TestTunnelHalfCloseFromUpstream(t *testing.T) {
	got := make(chan string, 1)
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, upstream: func(c *net.TCPConn) {
		_, _ = io.WriteString(c, "banner")
		_ = c.CloseWrite()
		b, _ := io.ReadAll(c)
		got <- string(b)
	}})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	resp, c, br := tp.connect(t, connectHead("api.example.com:443"))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if b, err := io.ReadAll(br); err != nil || string(b) != "banner" {
		t.Fatalf("client read %q, %v", b, err)
	}
	_, _ = io.WriteString(c, "after EOF")
	_ = c.(*net.TCPConn).CloseWrite()
	select {
	case s := <-got:
		if s != "after EOF" {
			t.Fatalf("upstream got %q", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("upstream never got the client's bytes")
	}
}

// 256 MiB each way at once, checksummed at both ends.
func TestTunnelBulk(t *testing.T) {
	const size = 256 << 20
	upSum := make(chan [32]byte, 1)
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, upstream: func(c *net.TCPConn) {
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := sha256.New()
			_, _ = io.Copy(h, c)
			upSum <- [32]byte(h.Sum(nil))
		}()
		_, _ = io.Copy(c, io.LimitReader(newPRNG(2), size))
		_ = c.CloseWrite()
		wg.Wait()
	}})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	resp, c, br := tp.connect(t, connectHead("api.example.com:443"))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	go func() {
		_, _ = io.Copy(c, io.LimitReader(newPRNG(1), size))
		_ = c.(*net.TCPConn).CloseWrite()
	}()
	h := sha256.New()
	n, err := io.Copy(h, br)
	if err != nil || n != size {
		t.Fatalf("downstream: %d bytes, %v", n, err)
	}
	if [32]byte(h.Sum(nil)) != prngSum(2, size) {
		t.Fatal("downstream checksum differs")
	}
	if <-upSum != prngSum(1, size) {
		t.Fatal("upstream checksum differs")
	}
	if ev := tp.event(t); ev.BytesUp != size || ev.BytesDown != size {
		t.Fatalf("event bytes %d/%d", ev.BytesUp, ev.BytesDown)
	}
}

// prng is a deterministic byte stream, cheap enough for gigabytes.
type prng struct{ r *rand.ChaCha8 }

func newPRNG(seed byte) io.Reader { return prng{rand.NewChaCha8([32]byte{seed})} }

func (p prng) Read(b []byte) (int, error) { return p.r.Read(b) }

func prngSum(seed byte, n int64) [32]byte {
	h := sha256.New()
	_, _ = io.Copy(h, io.LimitReader(newPRNG(seed), n))
	return [32]byte(h.Sum(nil))
}

func TestLimits(t *testing.T) {
	t.Run("tunnels", func(t *testing.T) {
		tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, limits: &trialspec.ProxyLimits{MaxTunnels: 2}})
		tp.dns.set("api.example.com", 60, "93.184.216.34")
		var open []net.Conn
		for range 2 {
			resp, c, _ := tp.connect(t, connectHead("api.example.com:443"))
			if resp.StatusCode != 200 {
				t.Fatal(resp.Status)
			}
			open = append(open, c)
		}
		resp, _, _ := tp.connect(t, connectHead("api.example.com:443"))
		if resp.StatusCode != 429 || record.Reason(resp.Header.Get("Trialnet-Reason")) != record.ReasonTunnelLimit {
			t.Fatalf("third tunnel: %d %s", resp.StatusCode, resp.Header.Get("Trialnet-Reason"))
		}
		if ev := tp.event(t); ev.Reason != record.ReasonTunnelLimit {
			t.Fatalf("event %+v", ev)
		}
		_ = open[0].Close()
		tp.event(t) // the closed tunnel's event: its slot is free again
		if resp, _, _ := tp.connect(t, connectHead("api.example.com:443")); resp.StatusCode != 200 {
			t.Fatalf("after one closed: %s", resp.Status)
		}
	})
	t.Run("rate", func(t *testing.T) {
		tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, limits: &trialspec.ProxyLimits{ConnectRate: 0.5, ConnectBurst: 3}})
		tp.dns.set("api.example.com", 60, "93.184.216.34")
		for i := range 4 {
			resp, c, _ := tp.connect(t, connectHead("api.example.com:443"))
			_ = c.Close()
			want, reason := 200, ""
			if i == 3 {
				want, reason = 429, string(record.ReasonRateLimited)
			}
			if resp.StatusCode != want || resp.Header.Get("Trialnet-Reason") != reason {
				t.Fatalf("CONNECT %d: %d %s", i, resp.StatusCode, resp.Header.Get("Trialnet-Reason"))
			}
		}
	})
	t.Run("global", func(t *testing.T) {
		tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, configure: func(c *Config) { c.MaxConnections = 1 }})
		tp.dns.set("api.example.com", 60, "93.184.216.34")
		if resp, _, _ := tp.connect(t, connectHead("api.example.com:443")); resp.StatusCode != 200 {
			t.Fatal(resp.Status)
		}
		resp, _, _ := tp.connect(t, connectHead("api.example.com:443"))
		if resp.StatusCode != 503 || record.Reason(resp.Header.Get("Trialnet-Reason")) != record.ReasonGlobalLimit {
			t.Fatalf("second connection: %d %s", resp.StatusCode, resp.Header.Get("Trialnet-Reason"))
		}
	})
}

// Two Trials on one proxy: each gets only its own allowlist, and each
// decision names its Trial. Removing a Trial closes its live tunnels.
func TestTrialsAreSeparate(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{allow: []string{"one.example.com:443"}})
	tp.dns.set("one.example.com", 60, "93.184.216.34")
	tp.dns.set("two.example.com", 60, "93.184.216.35")
	allow, _ := allow.Parse([]string{"two.example.com:443"}, false)
	if err := tp.AddTrial(TrialPolicy{Spec: trialspec.Spec{ID: "t2"}, Allow: allow}); err != nil {
		t.Fatal(err)
	}
	if err := tp.AddTrial(TrialPolicy{Spec: trialspec.Spec{ID: "t2"}}); err == nil {
		t.Fatal("a second Trial with the same id was accepted")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- tp.Serve(ln, "t2") }()
	t2 := &testProxy{Proxy: tp.Proxy, addr: ln.Addr().String(), events: tp.events}

	for _, c := range []struct {
		p      *testProxy
		target string
		status int
		trial  string
	}{
		{tp, "one.example.com:443", 200, "t1"},
		{tp, "two.example.com:443", 403, "t1"},
		{t2, "two.example.com:443", 200, "t2"},
		{t2, "one.example.com:443", 403, "t2"},
	} {
		resp, conn, _ := c.p.connect(t, connectHead(c.target))
		if resp.StatusCode != c.status {
			t.Fatalf("%s via %s: %d", c.target, c.trial, resp.StatusCode)
		}
		_ = conn.Close()
		if ev := tp.event(t); ev.Trial != c.trial || ev.Host != c.target[:len(c.target)-4] {
			t.Fatalf("event %+v, want Trial %s", ev, c.trial)
		}
	}

	resp, live, br := t2.connect(t, connectHead("two.example.com:443"))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	if _, ok := tp.RemoveTrial("t2"); !ok {
		t.Fatal("RemoveTrial: not found")
	}
	_ = live.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := bufio.NewReader(br).ReadByte(); err == nil {
		t.Fatal("a removed Trial's tunnel stayed open")
	}
	if err := <-served; err != nil {
		t.Fatalf("Serve after RemoveTrial: %v", err)
	}
	if _, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		t.Fatal("a removed Trial's listener still accepts")
	}
}

// Removing a Trial ends even a tunnel whose client has half-closed and
// whose upstream stays silent: nothing is left waiting on the upstream.
func TestRemoveTrialEndsHalfClosedTunnel(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, upstream: func(c *net.TCPConn) {
		_, _ = io.ReadAll(c)
		<-release // never answers
	}})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	resp, c, br := tp.connect(t, connectHead("api.example.com:443"))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	_ = c.(*net.TCPConn).CloseWrite()
	time.Sleep(50 * time.Millisecond)
	removed := make(chan struct{})
	go func() { tp.RemoveTrial("t1"); close(removed) }()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("read data from a removed Trial's tunnel")
	}
	if ev := tp.event(t); ev.Decision != record.DecisionAllow {
		t.Fatalf("event %+v", ev)
	}
	<-removed
}

// An upstream that resets mid-tunnel: the client gets the bytes sent
// before the reset, then the tunnel ends (it never hangs), and the
// decision event records the bytes.
func TestTunnelUpstreamReset(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, upstream: func(c *net.TCPConn) {
		_, _ = io.WriteString(c, "partial")
		time.Sleep(50 * time.Millisecond)
		_ = c.SetLinger(0) // close with a reset
	}})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	resp, c, br := tp.connect(t, connectHead("api.example.com:443"))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(br)
	if string(got) != "partial" {
		t.Fatalf("got %q before the reset", got)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the tunnel hung after the upstream reset")
	}
	if ev := tp.event(t); ev.BytesDown != 7 {
		t.Fatalf("event %+v", ev)
	}
}

// Removing a Trial cuts its CONNECTs that are still resolving or dialing:
// it does not wait out their timeouts.
func TestRemoveTrialCutsPendingConnect(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{allow: []string{"slow.example.com:443"}})
	tp.dns.handle("slow.example.com", func(dns.Question, string) (*dns.Msg, bool) { return nil, false })
	c, err := net.Dial("tcp", tp.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, connectHead("slow.example.com:443"))
	for deadline := time.Now().Add(5 * time.Second); tp.dns.count("slow.example.com") == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the CONNECT never reached DNS")
		}
	}
	start := time.Now()
	tp.RemoveTrial("t1")
	if d := time.Since(start); d > time.Second {
		t.Fatalf("RemoveTrial waited %v for a CONNECT stuck in DNS (the DNS timeout is %v)", d, defaultDNSTimeout)
	}
	if ev := tp.event(t); ev.Reason != record.ReasonShutdown {
		t.Fatalf("event %+v, want %s", ev, record.ReasonShutdown)
	}
}

// A Trial at its connection caps cannot make another Trial's CONNECT
// fail: its caps are charged before the proxy-wide limit, and what they
// refuse holds none of the proxy's connections.
func TestTrialCapsComeBeforeGlobalLimit(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, limits: &trialspec.ProxyLimits{MaxClientConns: 4, MaxPendingHeads: 2},
		configure: func(c *Config) { c.MaxConnections = 6 }})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	t2 := tp.addTrial(t, "t2", "api.example.com:443")
	tp.mu.Lock()
	t1 := tp.trials["t1"]
	tp.mu.Unlock()
	waitFor := func(what string, f func() bool) {
		t.Helper()
		for i := 0; !f(); i++ {
			if i == 500 {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	idle := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", tp.addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	wantRefused := func(resp *http.Response, reason record.Reason) {
		t.Helper()
		if resp.StatusCode != 429 || record.Reason(resp.Header.Get("Trialnet-Reason")) != reason {
			t.Fatalf("%d %s, want 429 %s", resp.StatusCode, resp.Header.Get("Trialnet-Reason"), reason)
		}
		if ev := tp.event(t); ev.Reason != reason || ev.Trial != "t1" {
			t.Fatalf("event %+v", ev)
		}
	}

	var tunnels []net.Conn
	for range 2 {
		resp, c, _ := tp.connect(t, connectHead("api.example.com:443"))
		if resp.StatusCode != 200 {
			t.Fatal(resp.Status)
		}
		tunnels = append(tunnels, c)
	}
	idle()
	idle()
	waitFor("two pending heads", func() bool { return t1.pending.Load() == 2 })

	// A flood of idle connections from t1, each refused by its caps
	// (without them, these would take the proxy's last two connections
	// and t2 would get global_limit).
	for range 8 {
		idle()
	}
	for i := 0; len(tp.events) < 8 && i < 200; i++ {
		time.Sleep(5 * time.Millisecond)
	}
	resp, c, _ := t2.connect(t, connectHead("api.example.com:443"))
	if resp.StatusCode != 200 {
		t.Fatalf("t2's CONNECT while t1 is at its caps: %s %s", resp.Status, resp.Header.Get("Trialnet-Detail"))
	}
	for range 8 {
		if ev := tp.event(t); ev.Trial != "t1" || ev.Reason != record.ReasonTrialConnLimit {
			t.Fatalf("event %+v", ev)
		}
	}
	_ = c.Close()
	if ev := tp.event(t); ev.Trial != "t2" || ev.Reason != record.ReasonAllowed {
		t.Fatalf("event %+v", ev)
	}
	if n := tp.conns.Load(); n != 4 {
		t.Fatalf("the proxy counts %d connections, want t1's 4", n)
	}

	resp, _, _ = tp.connect(t, connectHead("api.example.com:443"))
	wantRefused(resp, record.ReasonTrialConnLimit) // 2 tunnels + 2 idle = 4

	_ = tunnels[0].Close()
	tp.event(t)
	waitFor("the closed tunnel to be given back", func() bool { return t1.clients.Load() == 3 })
	resp, _, _ = tp.connect(t, connectHead("api.example.com:443"))
	wantRefused(resp, record.ReasonPendingHeadLimit) // 3 connections, but 2 heads pending
}

// An upstream that is not a socket (a Dialer may return any net.Conn)
// cannot be peeked: its first byte is read on its own, still timed.
func TestPumpDownWithoutSocket(t *testing.T) {
	upNear, upFar := net.Pipe()
	clientNear, clientFar := net.Pipe()
	defer clientFar.Close()
	go func() {
		_, _ = upFar.Write([]byte("hello"))
		_ = upFar.Close()
	}()
	got := make(chan string, 1)
	go func() { b, _ := io.ReadAll(clientFar); got <- string(b) }()
	ev := &record.Event{Time: time.Now()}
	n, err := pumpDown(clientNear, upNear, ev, new(helloWatch))
	_ = clientNear.Close()
	if err != nil || n != 5 || ev.FirstByte <= 0 {
		t.Fatalf("pumpDown: %d bytes, %v, first byte after %v", n, err, ev.FirstByte)
	}
	if s := <-got; s != "hello" {
		t.Fatalf("client got %q", s)
	}
}

// A Trial removed while its tunnel moves bytes both ways: the flow stops
// (the relay ends with the proxy's sockets) and both ends see the tunnel
// end.
func TestRemoveTrialCutsLiveTransfer(t *testing.T) {
	var upBytes atomic.Int64
	upDone := make(chan struct{})
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, upstream: func(c *net.TCPConn) {
		go func() { _, _ = io.Copy(c, newPRNG(4)) }()
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			upBytes.Add(int64(n))
			if err != nil {
				close(upDone)
				return
			}
		}
	}})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	resp, c, br := tp.connect(t, connectHead("api.example.com:443"))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	go func() { _, _ = io.Copy(c, newPRNG(5)) }()
	if _, err := io.CopyN(io.Discard, br, 8<<20); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); upBytes.Load() < 8<<20; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("upstream got only %d bytes", upBytes.Load())
		}
	}
	removed := make(chan struct{})
	go func() { tp.RemoveTrial("t1"); close(removed) }()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, br); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal("the client still receives after its Trial was removed")
	}
	select {
	case <-upDone:
	case <-time.After(5 * time.Second):
		t.Fatalf("the upstream still receives after the Trial was removed (%d bytes)", upBytes.Load())
	}
	<-removed
}

// Half-close both ways on a tunnel that has carried bytes both ways: each
// side's EOF reaches the other, which can still answer.
func TestTunnelHalfCloseMidStream(t *testing.T) {
	for _, first := range []string{"client", "upstream"} {
		t.Run(first+" first", func(t *testing.T) {
			upGot := make(chan string, 1)
			tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, upstream: func(c *net.TCPConn) {
				var b [5]byte
				if _, err := io.ReadFull(c, b[:]); err != nil {
					return
				}
				_, _ = c.Write(b[:]) // the client's hello back: both directions have carried bytes
				if first == "upstream" {
					_ = c.CloseWrite()
				}
				rest, _ := io.ReadAll(c)
				upGot <- string(rest)
				if first == "client" {
					_, _ = io.WriteString(c, "answer after EOF")
					_ = c.CloseWrite()
				}
			}})
			tp.dns.set("api.example.com", 60, "93.184.216.34")
			resp, c, br := tp.connect(t, connectHead("api.example.com:443"))
			if resp.StatusCode != 200 {
				t.Fatal(resp.Status)
			}
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			var b [5]byte
			if _, err := io.WriteString(c, "hello"); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(br, b[:]); err != nil || string(b[:]) != "hello" {
				t.Fatalf("echo %q, %v", b, err)
			}
			if first == "upstream" {
				if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
					t.Fatalf("after the upstream's EOF: %q, %v", rest, err)
				}
			}
			if _, err := io.WriteString(c, "last words"); err != nil {
				t.Fatal(err)
			}
			_ = c.(*net.TCPConn).CloseWrite()
			select {
			case s := <-upGot:
				if s != "last words" {
					t.Fatalf("upstream got %q", s)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the client's EOF never reached the upstream")
			}
			want := ""
			if first == "client" {
				want = "answer after EOF"
			}
			if rest, err := io.ReadAll(br); err != nil || string(rest) != want {
				t.Fatalf("client got %q, %v; want %q", rest, err, want)
			}
			if ev := tp.event(t); ev.BytesUp != 15 || ev.BytesDown != int64(5+len(want)) {
				t.Fatalf("event bytes %d up, %d down", ev.BytesUp, ev.BytesDown)
			}
		})
	}
}

// waitReadable waits for a socket's first byte without taking it (the
// relay then splices it with the rest), reports EOF as no byte, and
// leaves a connection that is not a socket to the plain read.
func TestWaitReadablePeeks(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	far, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer far.Close()
	near, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer near.Close()
	go func() {
		time.Sleep(20 * time.Millisecond) // the wait blocks first
		_, _ = io.WriteString(far, "abc")
		_ = far.(*net.TCPConn).CloseWrite()
	}()
	if ready, ok := waitReadable(near); !ready || !ok {
		t.Fatalf("with a byte waiting: ready %v, ok %v", ready, ok)
	}
	if b, err := io.ReadAll(near); err != nil || string(b) != "abc" {
		t.Fatalf("after the wait the socket holds %q (%v), want all of abc", b, err)
	}
	if ready, ok := waitReadable(near); ready || !ok {
		t.Fatalf("at EOF: ready %v, ok %v", ready, ok)
	}
	p1, p2 := net.Pipe()
	defer p1.Close()
	defer p2.Close()
	if _, ok := waitReadable(p1); ok {
		t.Fatal("a pipe was taken for a socket")
	}
}
