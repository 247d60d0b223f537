//go:build linux

package agent

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/miekg/dns"
	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/dnsstub"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testhost"
	"github.com/trialnet/trialnet/netns"
	"github.com/trialnet/trialnet/proxy"
	"github.com/trialnet/trialnet/record"
	trialspec "github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

const tlsPort = 8443

// serveTLS serves the world's handler over TLS on tlsPort of its test
// host, with a certificate for every name (the client does not verify).
func (w *world) serveTLS(t *testing.T, h http.Handler) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := w.host.NS.Listen(context.Background(), "tcp", netip.AddrPortFrom(w.host.Addr4, tlsPort).String())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, TLSConfig: &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
}

// stubLookup asks the Trial's stub for name's A record over network
// (udp or tcp), from inside the Trial's namespace, and returns the one
// address, or the answer's code.
func stubLookup(t *testing.T, nsPath, network, name string) (netip.Addr, int) {
	t.Helper()
	var in *dns.Msg
	err := netns.Do(nsPath, func() error {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		c := &dns.Client{Net: network, Timeout: 5 * time.Second}
		var err error
		in, _, err = c.Exchange(m, "127.0.0.53:53")
		return err
	})
	if err != nil {
		t.Fatalf("%s query for %s: %v", network, name, err)
	}
	if len(in.Answer) != 1 {
		return netip.Addr{}, in.Rcode
	}
	a, _ := netip.AddrFromSlice(in.Answer[0].(*dns.A).A.To4())
	return a, in.Rcode
}

// transparentCurl runs curl in the Trial with no proxy in its
// environment or its arguments, name resolved to addr (as the Trial's
// resolv.conf leads to the stub; curl here cannot be pointed at it).
func transparentCurl(t *testing.T, info client.TrialInfo, args ...string) (int, string) {
	t.Helper()
	info.ProxyURL = ""
	return curlIn(t, info, append([]string{"--noproxy", "*"}, args...)...)
}

// lastRecord waits for the Trial's last decision record to have reason.
func lastRecord(t *testing.T, a *Agent, id string, reason record.Reason) record.Event {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		recs, err := a.Audit(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(recs); n > 0 && recs[n-1].Reason == reason {
			return recs[n-1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no record with reason %s last: %+v", reason, recs)
		}
	}
}

// TestPrivilegedTransparent: a Trial with no proxy variables looks a name
// up at its stub (UDP and TCP) and connects to the address it got, on the
// allowed port; what a CONNECT would be refused is refused, and counted.
func TestPrivilegedTransparent(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 223, "upstream.example.test", "other.example.test")
	w.serveTLS(t, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if w.hold(rw, r) {
			return
		}
		fmt.Fprintf(rw, "tls hello from %s", r.Host)
	}))
	a := startAgent(t, w.config(t))
	httpEntry, tlsEntry := fmt.Sprintf("upstream.example.test:%d", upstreamPort), fmt.Sprintf("upstream.example.test:%d", tlsPort)
	info, err := a.Create(context.Background(), trialspec.Request{ID: "agt-transp", Allow: []string{httpEntry, tlsEntry}})
	if err != nil {
		t.Fatal(err)
	}
	if !info.Transparent {
		t.Fatal("transparent mode is not on by default")
	}
	addr, _ := stubLookup(t, info.Netns, "udp", "upstream.example.test")
	if byTCP, _ := stubLookup(t, info.Netns, "tcp", "Upstream.Example.Test."); !addr.IsValid() || byTCP != addr || !netip.MustParsePrefix("127.100.0.0/16").Contains(addr) {
		t.Fatalf("the stub gave %s over UDP, %s over TCP; want one pool address", addr, byTCP)
	}
	if _, rcode := stubLookup(t, info.Netns, "udp", "other.example.test"); rcode != dns.RcodeNameError {
		t.Fatalf("a name off the allowlist: rcode %d, want NXDOMAIN", rcode)
	}
	resolve := func(port int) string { return fmt.Sprintf("upstream.example.test:%d:%s", port, addr) }

	t.Run("plain HTTP with the name's Host", func(t *testing.T) {
		code, out := transparentCurl(t, info, "--resolve", resolve(upstreamPort), fmt.Sprintf("http://upstream.example.test:%d/", upstreamPort))
		if code != 0 || !strings.Contains(out, "hello from upstream.example.test") {
			t.Fatalf("curl exit %d: %s", code, out)
		}
		if ev := lastRecord(t, a, info.ID, record.ReasonAllowed); !ev.Transparent || ev.Method != "GET" || ev.Host != "upstream.example.test" {
			t.Fatalf("record %+v", ev)
		}
	})
	t.Run("plain HTTP naming another Host", func(t *testing.T) {
		before := w.requests.Load()
		code, out := transparentCurl(t, info, "-i", "-H", "Host: other.example.test", fmt.Sprintf("http://%s:%d/", addr, upstreamPort))
		if !strings.Contains(out, "403") || !strings.Contains(out, string(record.ReasonHostMismatch)) {
			t.Fatalf("curl exit %d: %s", code, out)
		}
		if w.requests.Load() != before {
			t.Fatal("the request reached the upstream")
		}
		if ev := lastRecord(t, a, info.ID, record.ReasonHostMismatch); !ev.Transparent {
			t.Fatalf("record %+v", ev)
		}
	})
	t.Run("TLS with the name's SNI", func(t *testing.T) {
		code, out := transparentCurl(t, info, "-k", "--resolve", resolve(tlsPort), fmt.Sprintf("https://upstream.example.test:%d/", tlsPort))
		if code != 0 || !strings.Contains(out, "tls hello from upstream.example.test") {
			t.Fatalf("curl exit %d: %s", code, out)
		}
		if ev := lastRecord(t, a, info.ID, record.ReasonAllowed); !ev.Transparent || ev.SNI != "upstream.example.test" || ev.Method != "" {
			t.Fatalf("record %+v", ev)
		}
	})
	t.Run("TLS naming another host (fronting)", func(t *testing.T) {
		code, out := transparentCurl(t, info, "-k", "--resolve", fmt.Sprintf("other.example.test:%d:%s", tlsPort, addr), fmt.Sprintf("https://other.example.test:%d/", tlsPort))
		if code == 0 {
			t.Fatalf("fronting through an allowed name's address: %s", out)
		}
		if ev := lastRecord(t, a, info.ID, record.ReasonSNIMismatch); !ev.Transparent {
			t.Fatalf("record %+v", ev)
		}
	})
	t.Run("a port the allowlist does not name", func(t *testing.T) {
		if code, out := transparentCurl(t, info, "--resolve", resolve(9999), "http://upstream.example.test:9999/"); code == 0 {
			t.Fatalf("reached: %s", out)
		}
		if ev := lastRecord(t, a, info.ID, record.ReasonPolicyDenied); !ev.Transparent || ev.Port != 9999 {
			t.Fatalf("record %+v", ev)
		}
	})
	t.Run("an address never handed out", func(t *testing.T) {
		if code, out := transparentCurl(t, info, fmt.Sprintf("http://127.100.0.200:%d/", upstreamPort)); code == 0 {
			t.Fatalf("reached: %s", out)
		}
		lastRecord(t, a, info.ID, record.ReasonUnknownAddress)
	})
	t.Run("deny --cut ends a transparent tunnel", func(t *testing.T) {
		done := make(chan string, 1)
		go func() {
			_, out := transparentCurl(t, info, "-k", "--resolve", resolve(tlsPort), fmt.Sprintf("https://upstream.example.test:%d/hold", tlsPort))
			done <- out
		}()
		w.waitHolding(t, 1)
		ch, err := a.ChangeAllow(context.Background(), info.ID, client.AllowChange{Remove: []string{tlsEntry}, Cut: true})
		if err != nil || ch.TunnelsCut != 1 {
			t.Fatalf("cut %d, %v; want 1", ch.TunnelsCut, err)
		}
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("the tunnel was not cut")
		}
		if _, rcode := stubLookup(t, info.Netns, "udp", "upstream.example.test"); rcode != dns.RcodeSuccess {
			t.Fatalf("the name is still allowed on port %d, yet the stub answers %d", upstreamPort, rcode)
		}
		// The stub follows the live allowlist: its last entry for the
		// name gone, the name is gone.
		if _, err := a.ChangeAllow(context.Background(), info.ID, client.AllowChange{Remove: []string{httpEntry}}); err != nil {
			t.Fatal(err)
		}
		if _, rcode := stubLookup(t, info.Netns, "tcp", "upstream.example.test"); rcode != dns.RcodeNameError {
			t.Fatalf("a name the allowlist no longer names: rcode %d, want NXDOMAIN", rcode)
		}
	})
	// Each decision is counted as its record is written, after the answer.
	st := waitStats(t, a, info.ID, func(st client.Stats) bool {
		return st.Proxy.ByReason[record.ReasonUnknownAddress] == 1 && st.Proxy.ByReason[record.ReasonPolicyDenied] == 1
	})
	if st.DNS == nil || st.DNS.Answered < 2 || st.DNS.NXDomain < 1 || st.DNS.Names != 1 {
		t.Fatalf("stub counts %+v", st.DNS)
	}
	pin := a.host.BPF.SteerPin(info.CgroupID)
	if _, err := os.Stat(pin + "_link"); err != nil {
		t.Fatalf("the steering is not pinned: %v", err)
	}
	if _, err := a.Destroy(context.Background(), info.ID); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{pin + "_link", pin + "_map", a.namesFile(info.ID)} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s outlives the Trial: %v", p, err)
		}
	}
}

// TestPrivilegedTransparentNamesAcrossAPause: from the offer of a
// hand-over until it stops accepting, an agent's stub is paused while it
// still accepts pool connections, and the successor's stub answers: a
// name first handed out there (written to the names file before its
// answer, as every stub does) must map for a connection this agent
// accepts. After a hand-over that failed, the stub serving again hands
// out names that map too.
func TestPrivilegedTransparentNamesAcrossAPause(t *testing.T) {
	privtest.Require(t)
	names := []string{"upstream.example.test", "second.example.test", "third.example.test"}
	w := newWorld(t, 243, names...)
	a := startAgent(t, w.config(t))
	var allowed []string
	for _, n := range names {
		allowed = append(allowed, fmt.Sprintf("%s:%d", n, upstreamPort))
	}
	info, err := a.Create(context.Background(), trialspec.Request{ID: "agt-transp-pause", Allow: allowed})
	if err != nil {
		t.Fatal(err)
	}
	get := func(addr netip.Addr, host string) {
		t.Helper()
		code, out := transparentCurl(t, info, "-i", fmt.Sprintf("http://%s:%d/", addr, upstreamPort), "-H", "Host: "+host)
		if code != 0 || !strings.Contains(out, "hello from "+host) {
			t.Fatalf("%s at %s: curl exit %d: %s", host, addr, code, out)
		}
	}
	first, _ := stubLookup(t, info.Netns, "udp", names[0])
	if err := a.pauseStubs(); err != nil {
		t.Fatal(err)
	}
	// The successor's stub gives the second name the next address.
	second := first.Next()
	f, err := os.OpenFile(a.namesFile(info.ID), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = fmt.Fprintf(f, "%s %s\n", second, names[1])
	if cerr := f.Close(); err != nil || cerr != nil {
		t.Fatal(err, cerr)
	}
	get(second, names[1])
	a.resumeStubs() // the hand-over failed
	third, _ := stubLookup(t, info.Netns, "udp", names[2])
	if third != second.Next() {
		t.Fatalf("the stub serving again gave %s %s, want %s", names[2], third, second.Next())
	}
	get(third, names[2])
	get(first, names[0])
}

// TestPrivilegedTransparentRestart: an agent that ends without tearing
// its Trials down leaves the steering pinned; the next one adopts it and
// gives each address handed out before the same name.
func TestPrivilegedTransparentRestart(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 224, "upstream.example.test", "second.example.test")
	cfg := w.config(t)
	a, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	allowed := []string{fmt.Sprintf("upstream.example.test:%d", upstreamPort), fmt.Sprintf("second.example.test:%d", upstreamPort)}
	info, err := a.Create(context.Background(), trialspec.Request{ID: "agt-transp-rs", Allow: allowed})
	if err != nil {
		a.Close(true)
		t.Fatal(err)
	}
	first, _ := stubLookup(t, info.Netns, "udp", "upstream.example.test")
	a.Close(false)

	// No agent: the steering stays (pinned), with no listener in its map:
	// the pool is refused, never left to a socket of the Trial's.
	var dialErr error
	_ = netns.Do(info.Netns, func() error {
		_, dialErr = net.DialTimeout("tcp4", netip.AddrPortFrom(first, upstreamPort).String(), 5*time.Second)
		return nil
	})
	if dialErr == nil {
		t.Fatal("a pool connection was accepted with no agent and no keeper")
	}

	b := startAgent(t, cfg)
	second, _ := stubLookup(t, info.Netns, "udp", "second.example.test")
	if again, _ := stubLookup(t, info.Netns, "tcp", "upstream.example.test"); again != first || second == first || !second.IsValid() {
		t.Fatalf("after the restart upstream is %s (was %s), second got %s", again, first, second)
	}
	// A connection to the address handed out before the restart maps to
	// the same name, and reaches it.
	code, out := transparentCurl(t, info, "-i", fmt.Sprintf("http://%s:%d/", first, upstreamPort), "-H", "Host: upstream.example.test")
	if code != 0 || !strings.Contains(out, "hello from upstream.example.test") {
		t.Fatalf("curl exit %d: %s", code, out)
	}
	if _, err := b.Destroy(context.Background(), info.ID); err != nil {
		t.Fatal(err)
	}
}

// TestPrivilegedTransparentHandover: a new agent takes over while a
// transparent tunnel is open; the tunnel stays (the old agent drains
// it), and a connection after the hand-over to an address handed out
// before it maps to the same name, through the new agent.
func TestPrivilegedTransparentHandover(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 225, "upstream.example.test")
	echoLn, err := w.host.NS.Listen(context.Background(), "tcp", netip.AddrPortFrom(w.host.Addr4, 8082).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = echoLn.Close() })
	go testhost.Echo(echoLn)
	p := startAgentWithTrial(t, w, "agt-transp-ho")
	if _, err := p.c.ChangeAllow(context.Background(), p.info.ID, client.AllowChange{Add: []string{"upstream.example.test:8082"}}); err != nil {
		t.Fatal(err)
	}
	addr, _ := stubLookup(t, p.info.Netns, "udp", "upstream.example.test")
	if !addr.IsValid() {
		t.Fatal("the stub gave no address")
	}
	var c net.Conn
	if err := netns.Do(p.info.Netns, func() error {
		var err error
		c, err = net.DialTimeout("tcp4", netip.AddrPortFrom(addr, 8082).String(), 5*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	echoes := func(s string) error {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, s); err != nil {
			return err
		}
		b := make([]byte, len(s))
		if _, err := io.ReadFull(c, b); err != nil || string(b) != s {
			return fmt.Errorf("echo %q: %v", b, err)
		}
		return nil
	}
	if err := echoes("before\n"); err != nil {
		t.Fatal(err)
	}
	if _, rcode := stubLookup(t, p.info.Netns, "udp", "off.example.test"); rcode != dns.RcodeNameError {
		t.Fatalf("an off-list name: rcode %d, want NXDOMAIN", rcode)
	}
	next := runAgent(t, p.bin, p.args...)
	waitLog(t, p.first, "the new agent serves every listener", 1)
	if err := echoes("after\n"); err != nil {
		t.Fatalf("the open transparent tunnel after the hand-over: %v\n%s", err, p.first.stderr.String())
	}
	// Before any lookup at the new agent's stub: the address means what
	// it meant because the names were kept, not because it was asked again.
	code, out := transparentCurl(t, p.info, "-H", "Host: upstream.example.test", fmt.Sprintf("http://%s:%d/", addr, upstreamPort))
	if code != 0 || !strings.Contains(out, "hello from upstream.example.test") {
		t.Fatalf("a new connection after the hand-over: curl exit %d: %s\n%s", code, out, next.stderr.String())
	}
	if again, _ := stubLookup(t, p.info.Netns, "tcp", "upstream.example.test"); again != addr {
		t.Fatalf("after the hand-over the stub gives %s, before %s", again, addr)
	}
	// Its counts went on from the predecessor's: one name refused before
	// the hand-over, one after; one address given before, one after.
	if _, rcode := stubLookup(t, p.info.Netns, "udp", "other.example.test"); rcode != dns.RcodeNameError {
		t.Fatalf("an off-list name after the hand-over: rcode %d, want NXDOMAIN", rcode)
	}
	if st, err := p.c.Stats(context.Background(), p.info.ID); err != nil {
		t.Fatal(err)
	} else if d := st.DNS; d == nil || d.Denied != 2 || d.Answered != 2 {
		t.Fatalf("the stub's counts after the hand-over: %+v, want 2 denied and 2 answered", d)
	}
	_ = c.Close()
	if _, err := p.c.Destroy(context.Background(), p.info.ID); err != nil {
		t.Fatal(err)
	}
}

// A names file on a full disk keeps whole lines only: the line that did
// not fit is cut off, so a name written once there is room again is read
// by the next agent, with every name before it.
func TestPrivilegedNamesFileOnAFullDisk(t *testing.T) {
	privtest.Require(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=16k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "t.names"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tp := &transparent{names: f}
	name := func(i int) string { return fmt.Sprintf("n%d.%s.example.com", i, strings.Repeat("x", 40)) }
	addr := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{127, 100, byte(i >> 8), byte(i)}) }
	written := 0
	for ; written < 1000; written++ {
		if err := tp.recordName(name(written), addr(written)); err != nil {
			break
		}
	}
	if written == 1000 {
		t.Fatal("16 KiB held 1,000 names: the disk never filled, the test shows nothing")
	}
	if err := os.Remove(filler); err != nil { // room again
		t.Fatal(err)
	}
	if err := tp.recordName(name(written), addr(written)); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	names, err := readNames(bytes.NewReader(got))
	if err != nil || len(names) != written+1 || names[written].Name != name(written) || names[written].Addr != addr(written) {
		t.Fatalf("read %d names (%v), want the %d written whole, the last %s at %s", len(names), err, written+1, name(written), addr(written))
	}
}

// A draining agent's keeper tending, after the hand-over took the stub's
// sockets, finds none to give (it once called File on a nil socket and
// the draining agent crashed, cutting the tunnels it was draining).
func TestTransparentFilesAfterHandOver(t *testing.T) {
	lt := &trial{tp: &transparent{}}
	lt.info.ID = "handed-over"
	names, files, err := (&Agent{}).transparentFiles(lt)
	if err != nil || len(names) != 0 || len(files) != 0 {
		t.Fatalf("a handed-over Trial's transparent files: %v %v %v", names, files, err)
	}
}

// An embedded agent (trialnet run's) loads its Trial's steering while it
// starts, and its transparent Trial is steered by that one (OpenSteer's
// loaded: TestPrivilegedSteerLoadedAhead), not by a program loaded on
// the way to the command.
func TestPrivilegedEmbeddedAgentSteersWithWhatItLoadedAhead(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 227, "upstream.example.test")
	cfg := w.config(t)
	cfg.Ephemeral, cfg.SteerAhead = true, true
	a := startAgent(t, cfg)
	if a.ahead == nil {
		t.Fatal("an embedded agent started with no steering loading ahead")
	}
	entry := fmt.Sprintf("upstream.example.test:%d", upstreamPort)
	info, err := a.Create(context.Background(), trialspec.Request{ID: "agt-ahead", Allow: []string{entry}})
	if err != nil {
		t.Fatal(err)
	}
	if !a.ahead.taken.Load() || a.ahead.s == nil || a.ahead.err != nil {
		t.Fatalf("the transparent Trial's create did not take the steering loaded ahead (taken %v, loaded %v, error %v)", a.ahead.taken.Load(), a.ahead.s != nil, a.ahead.err)
	}
	addr, _ := stubLookup(t, info.Netns, "udp", "upstream.example.test")
	code, out := transparentCurl(t, info, "--resolve", fmt.Sprintf("%s:%s", entry, addr), fmt.Sprintf("http://%s/", entry))
	if code != 0 || !strings.Contains(out, "hello from upstream.example.test") {
		t.Fatalf("curl through the steering loaded ahead: exit %d: %s", code, out)
	}
}

// The keeper's tending counts, without copying them, the sockets it would
// copy: a count below what it copies would have it give a keeper that
// lost some nothing back, one above would copy every Trial's sockets
// each time for nothing.
func TestKeptCountIsWhatTendingCopies(t *testing.T) {
	listen := func() *net.TCPListener {
		l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return l
	}
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = udp.Close() })
	a := &Agent{trials: map[string]*trial{}}
	add := func(id string, st trialState, lns []net.Listener, tp *transparent) {
		lt := &trial{state: st, lns: lns, tp: tp}
		lt.info.ID = id
		a.trials[id] = lt
	}
	add("plain", stateLive, []net.Listener{listen(), listen()}, nil)
	add("transparent", stateLive, []net.Listener{listen()}, &transparent{socks: transparentSockets{udp: udp, tcp: listen(), steered: listen()}})
	add("handed-over", stateLive, []net.Listener{listen()}, &transparent{})
	add("going", stateDestroying, []net.Listener{listen()}, nil)
	copied := 0
	for _, tl := range a.trialListeners() {
		copied += len(tl)
	}
	for _, lt := range a.liveTrials() {
		names, files, err := a.transparentFiles(lt)
		if err != nil {
			t.Fatal(err)
		}
		closeAll(files)
		copied += len(names)
	}
	if got := a.keptCount(); got != copied || copied != 7 {
		t.Fatalf("keptCount %d, tending copies %d (want 7: 2 + 1 + 3 + 1)", got, copied)
	}
}

// An embedded agent that fails to start frees the steering it loaded
// ahead: Start is a library call, and a caller that goes on after the
// failure would hold the program (and its map) until it exits.
func TestPrivilegedStartFailureFreesSteerAhead(t *testing.T) {
	privtest.Require(t)
	held := func() int {
		ents, err := os.ReadDir("/proc/self/fdinfo")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join("/proc/self/fdinfo", e.Name()))
			if err == nil && strings.Contains(string(b), fmt.Sprintf("prog_type:\t%d\n", unix.BPF_PROG_TYPE_SK_LOOKUP)) {
				n++
			}
		}
		return n
	}
	before := held()
	cfg := AgentConfig{Host: isolatedHost(t), DataDir: t.TempDir(), ReceiptKey: filepath.Join(t.TempDir(), "receipt.key"),
		Ephemeral: true, SteerAhead: true, File: &config.File{}}
	cfg.File.Limits.MaxProcesses = -1 // refused by the proxy's settings, after the host opened
	if a, err := Start(cfg); err == nil {
		a.Close(true)
		t.Fatal("an agent started with max_processes -1")
	}
	// The load runs beside the start: a second is ample for one to end
	// that Start left running.
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if n := held(); n != before {
			t.Fatalf("%d steer programs held after a failed start, %d before", n, before)
		}
	}
}

// The stub's counts file keeps its counts for the next process that maps
// it; a file of another layout is counted anew, with a warning, never
// read as the wrong counts.
func TestDNSCountsFile(t *testing.T) {
	var log bytes.Buffer
	a := &Agent{log: slog.New(slog.NewTextHandler(&log, nil))}
	a.cfg.Host.StateDir = t.TempDir()
	mapped := func() (*dnsstub.Counts, func()) {
		mem, err := a.mapDNSCounts("agt-counts")
		if err != nil {
			t.Fatal(err)
		}
		return (*dnsstub.Counts)(unsafe.Pointer(&mem[dnsCountsHeader])), func() { _ = unix.Munmap(mem) }
	}
	c, unmap := mapped()
	c[1].Add(5)
	unmap()
	c, unmap = mapped()
	if got := c[1].Load(); got != 5 {
		t.Fatalf("a count after mapping again: %d, want 5", got)
	}
	unmap()
	if log.Len() != 0 {
		t.Fatalf("the agent's own file was warned about: %s", log.String())
	}
	// An agent whose stub counted one word fewer wrote this file.
	path := a.dnsCountsFile("agt-counts")
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{byte(dnsstub.CountsSize - 8)}, int64(len(dnsCountsMagic))); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	c, unmap = mapped()
	defer unmap()
	if got := c[1].Load(); got != 0 || !strings.Contains(log.String(), "counting anew") {
		t.Fatalf("a file of another layout: count %d, log %q; want 0 and a warning", got, log.String())
	}
}

// A link or a FIFO where the counts file goes is refused, the file it
// leads to left as it was: the agent, root, would truncate and map it.
func TestDNSCountsFileNotALink(t *testing.T) {
	a := &Agent{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	a.cfg.Host.StateDir = t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, a.dnsCountsFile("link")); err != nil {
		t.Fatal(err)
	}
	if mem, err := a.mapDNSCounts("link"); err == nil {
		_ = unix.Munmap(mem)
		t.Error("a counts file that is a link was mapped")
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "kept" {
		t.Errorf("the link's target: %d bytes, %v; want it kept", len(b), err)
	}
	if err := unix.Mkfifo(a.dnsCountsFile("fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if mem, err := a.mapDNSCounts("fifo"); err == nil || !strings.Contains(err.Error(), "not the agent's file") {
		if err == nil {
			_ = unix.Munmap(mem)
		}
		t.Errorf("a FIFO for the counts file: %v", err)
	}
}

// The stub's names and counts of a Trial no record names (an agent
// stopped in its create or destroy) are removed at the start: a later
// Trial given the same id would begin with another's names and refused
// count. An adopted Trial's, and anything else by those names, stay.
func TestSweepRemovesLeftoverStubFiles(t *testing.T) {
	a := &Agent{log: slog.New(slog.NewTextHandler(io.Discard, nil)), trials: map[string]*trial{"live": nil}}
	dir := t.TempDir()
	a.cfg.Host.StateDir = dir
	a.cfg.Host.NetnsDir = t.TempDir()
	// Another process's Trial (an ephemeral run beside this one): its
	// record, or only its namespace file while it is made.
	for _, p := range []string{filepath.Join(dir, "other.json"), filepath.Join(a.cfg.Host.NetnsDir, "making")} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"gone" + namesSuffix, "gone" + dnsCountsSuffix, "live" + namesSuffix, "live" + dnsCountsSuffix,
		"other" + namesSuffix, "making" + dnsCountsSuffix} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "odd"+namesSuffix), 0o700); err != nil {
		t.Fatal(err)
	}
	a.sweepLedgers()
	var left []string
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		left = append(left, e.Name())
	}
	want := []string{"live" + dnsCountsSuffix, "live" + namesSuffix, "making" + dnsCountsSuffix, "odd" + namesSuffix, "other.json", "other" + namesSuffix}
	if !slices.Equal(left, want) {
		t.Fatalf("left after the sweep: %v; want %v", left, want)
	}
}

// A Trial that ends with questions still queued in its stub's UDP socket
// (sent in a burst just before it exits, or while the stub was busy) has
// each of them in its final counts, which its receipt signs: an
// attacker's review saw 273 of 300 off-list questions in a receipt. The
// stub here is held inside its first question while the rest queue, and
// the Trial's transparent mode is then stopped as a destroy stops it.
// Stopped for the next agent instead (a restart), the queue is left to
// that agent's stub, on the copy of the socket the keeper holds.
func TestStopCountsQueuedQuestions(t *testing.T) {
	for _, ending := range []bool{true, false} {
		t.Run(fmt.Sprint("ending=", ending), func(t *testing.T) { stopWithQueuedQuestions(t, ending) })
	}
}

func stopWithQueuedQuestions(t *testing.T, ending bool) {
	tp, ask, release := heldStub(t, func(*transparent) func(string) bool { return func(string) bool { return false } })
	kept, err := tp.socks.udp.File() // the keeper's copy
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Close()
	const sent = 50
	names := make([]string, sent)
	for i := range names {
		names[i] = fmt.Sprintf("off%d.example.net.", i)
	}
	ask(names)
	final := make(chan *dnsstub.Stats, 1)
	go func() { final <- tp.finish(ending) }()
	time.Sleep(50 * time.Millisecond) // the stub is stopped while it answers the first
	release()
	st := <-final
	tp.close()
	queued := 0
	for buf := make([]byte, 1024); ; queued++ {
		if _, _, err := unix.Recvfrom(int(kept.Fd()), buf, unix.MSG_DONTWAIT); err != nil {
			break
		}
	}
	want, left := uint64(sent), 0
	if !ending {
		want, left = 1, sent-1
	}
	if st == nil || st.Denied != want || queued != left {
		t.Fatalf("final counts %+v, %d questions left queued: want %d denied, %d left", st, queued, want, left)
	}
}

// The stub judges the questions it answers or counts as the Trial
// stops, after the proxy has removed it, by the allowlist the Trial
// had: an attacker's review saw every queued question for an allowed
// name signed into the receipt as denied.
func TestStopJudgesQueuedQuestionsByTheTrialsList(t *testing.T) {
	a := &Agent{log: slog.New(slog.DiscardHandler), trials: make(map[string]*trial)}
	var err error
	a.proxy, err = proxy.New(proxy.Config{ProxySettings: config.ProxySettings{Resolver: manyAddrs(1)}, HostAddrs: noHostAddrs{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.proxy.Close() })
	list, err := allow.Parse([]string{"allowed.example.net:443"}, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.proxy.AddTrial(proxy.TrialPolicy{Spec: trialspec.Spec{ID: "t1"}, Allow: list}); err != nil {
		t.Fatal(err)
	}
	tp, ask, release := heldStub(t, func(tp *transparent) func(string) bool {
		tp.id = "t1"
		return a.admitter(tp)
	})
	const sent = 10
	ask(slices.Repeat([]string{"allowed.example.net."}, sent))
	lt := &trial{a: a, info: client.TrialInfo{Spec: trialspec.Spec{ID: "t1"}}, tp: tp}
	done := make(chan struct{})
	go func() { defer close(done); lt.Stop() }()
	time.Sleep(50 * time.Millisecond) // the Trial is removed from the proxy while the stub answers the first
	release()
	<-done
	st := lt.dnsStats()
	if st == nil || st.Denied != 0 || st.Answered != sent {
		t.Fatalf("final counts %+v: want %d answered, none denied", st, sent)
	}
}

// heldStub serves a Trial's stub on a UDP socket of its own, admitting
// by what admitter makes for it, but holding the stub inside the first
// question it judges until release. ask sends an A question for each
// name, the first alone: the rest queue in the socket behind it.
func heldStub(t *testing.T, admitter func(*transparent) func(string) bool) (tp *transparent, ask func(names []string), release func()) {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tp = &transparent{stubDone: make(chan struct{}), socks: transparentSockets{udp: pc.(*net.UDPConn)}}
	admit := admitter(tp)
	held, hold := make(chan struct{}), make(chan struct{})
	var first bool
	stub, err := dnsstub.New(dnsstub.Config{Rate: 1e6, Burst: 1e6, Admit: func(name string) bool {
		if !first {
			first = true
			close(held)
			<-hold
		}
		return admit(name)
	}})
	if err != nil {
		t.Fatal(err)
	}
	tp.stub = stub
	tp.last.Store(stub)
	go func() {
		defer close(tp.stubDone)
		_ = stub.ServeUDP(pc)
	}()
	ask = func(names []string) {
		c, err := net.Dial("udp4", pc.LocalAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for i, name := range names {
			m := new(dns.Msg)
			m.SetQuestion(name, dns.TypeA)
			b, err := m.Pack()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Write(b); err != nil {
				t.Fatal(err)
			}
			if i == 0 {
				<-held // the stub is busy: the rest queue in its socket
			}
		}
	}
	return tp, ask, func() { close(hold) }
}
