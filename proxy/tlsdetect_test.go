//go:build linux

package proxy

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/tlstest"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/wire"
)

// testCA is a throwaway CA with a leaf certificate per name, so a real
// crypto/tls client can verify the upstream it reaches through a tunnel.
type testCA struct {
	pool  *x509.CertPool
	certs []tls.Certificate
}

func newTestCA(t *testing.T, names ...string) *testCA {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "trialnet test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	ca := &testCA{pool: x509.NewCertPool()}
	ca.pool.AddCert(caCert)
	for i, name := range names {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		ca.certs = append(ca.certs, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key})
	}
	return ca
}

// frontedUpstream is one TLS server for every name the CA issued (a CDN
// front), echoing after the handshake. It counts the bytes it received
// and the handshakes it completed.
func frontedUpstream(ca *testCA, received, handshakes *atomic.Int64) func(*net.TCPConn) {
	cfg := &tls.Config{Certificates: ca.certs} // picked by SNI
	return func(c *net.TCPConn) {
		s := tls.Server(&countConn{Conn: c, n: received}, cfg)
		_ = s.SetDeadline(time.Now().Add(10 * time.Second))
		if s.Handshake() != nil {
			return
		}
		handshakes.Add(1)
		_ = s.SetDeadline(time.Time{})
		_, _ = io.Copy(s, s)
	}
}

// TestTLSDetectionCannotBeSteppedAround sends, after the 200, a record
// that is not a handshake record, then a ClientHello for another name
// served by the same upstream. Each is refused before anything reaches
// the upstream; an honest ClientHello, whole or in one-byte fragments,
// completes a real handshake.
func TestTLSDetectionCannotBeSteppedAround(t *testing.T) {
	ca := newTestCA(t, "a.test", "b.test")
	var received, handshakes atomic.Int64
	tp := newTestProxy(t, proxyOpts{allow: []string{"a.test:443"}, upstream: frontedUpstream(ca, &received, &handshakes)})
	tp.dns.set("a.test", 60, "93.184.216.34")
	fronted := tlstest.ClientHello(t, "b.test")

	for _, c := range []struct {
		name   string
		prefix []byte
		want   record.Reason
	}{
		{"warning alert", []byte{0x15, 0x03, 0x01, 0x00, 0x02, 0x01, 0x5a}, record.ReasonTLSRecordBeforeHello},
		{"change_cipher_spec", []byte{0x14, 0x03, 0x03, 0x00, 0x01, 0x01}, record.ReasonTLSRecordBeforeHello},
		{"empty handshake record", []byte{0x16, 0x03, 0x01, 0x00, 0x00}, record.ReasonTLSRecordBeforeHello},
		{"application data", []byte{0x17, 0x03, 0x03, 0x00, 0x03, 'a', 'b', 'c'}, record.ReasonTLSRecordBeforeHello},
		{"heartbeat", []byte{0x18, 0x03, 0x03, 0x00, 0x01, 0x01}, record.ReasonTLSRecordBeforeHello},
		{"alert between two fragments", append(tlstest.ReRecord(tlstest.ClientHello(t, "a.test"), 40)[:45], 0x15, 0x03, 0x03, 0x00, 0x02, 0x01, 0x00), record.ReasonTLSRecordBeforeHello},
		{"SSLv2-style hello", []byte{0x80, 0x2e, 0x01, 0x00, 0x02, 0x00, 0x15, 0x00, 0x00, 0x00, 0x10}, record.ReasonTLSSSLv2},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := sendInPiecesTo(t, tp, "a.test:443", append(append([]byte(nil), c.prefix...), fronted...), 3)
			if string(got) != string(tlsAccessDenied) {
				t.Fatalf("client got %x, want an access_denied alert", got)
			}
			if ev := tp.event(t); ev.Decision != record.DecisionDeny || ev.Reason != c.want {
				t.Fatalf("event %+v, want %s", ev, c.want)
			}
			if n := received.Load(); n != 0 {
				t.Fatalf("%d bytes reached the upstream", n)
			}
		})
	}

	for _, c := range []struct {
		name  string
		split int // payload bytes per record; 0: as crypto/tls sends it
	}{{"honest ClientHello", 0}, {"honest ClientHello in 1-byte records", 1}} {
		t.Run(c.name, func(t *testing.T) {
			resp, conn, br := tp.connect(t, connectHead("a.test:443"))
			if resp.StatusCode != 200 {
				t.Fatal(resp.Status)
			}
			raw := &bufConn{Conn: conn, r: br}
			var hc net.Conn = raw
			if c.split > 0 {
				hc = &reRecordConn{Conn: raw, n: c.split}
			}
			tc := tls.Client(hc, &tls.Config{ServerName: "a.test", RootCAs: ca.pool})
			_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
			if err := tc.Handshake(); err != nil {
				t.Fatalf("handshake: %v", err)
			}
			pingEcho(t, tc)
			_ = tc.Close()
			if ev := tp.event(t); ev.Reason != record.ReasonAllowed || ev.SNI != "a.test" {
				t.Fatalf("event %+v", ev)
			}
		})
	}
	if handshakes.Load() != 2 {
		t.Fatalf("%d handshakes completed, want 2", handshakes.Load())
	}
}

// sendInPiecesTo is sendInPieces for any target.
func sendInPiecesTo(t *testing.T, tp *testProxy, target string, data []byte, pieces int) []byte {
	t.Helper()
	resp, c, br := tp.connect(t, connectHead(target))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	step := (len(data) + pieces - 1) / pieces
	for i := 0; i < len(data); i += step {
		_, _ = c.Write(data[i:min(i+step, len(data))])
		time.Sleep(20 * time.Millisecond)
	}
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	got := make([]byte, 64)
	n, _ := br.Read(got)
	return got[:n]
}

// bufConn reads through the reader that parsed the CONNECT response.
type bufConn struct {
	net.Conn
	r io.Reader
}

func (c *bufConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// reRecordConn re-frames the client's first flight (its ClientHello
// record) into records of n payload bytes, each written on its own; with
// every set, each plaintext handshake flight (a second ClientHello too).
type reRecordConn struct {
	net.Conn
	n     int
	every bool
	done  bool
}

func (c *reRecordConn) Write(b []byte) (int, error) {
	if c.done || len(b) < 5 || b[0] != wire.RecordTypeHandshake {
		return c.Conn.Write(b)
	}
	c.done = !c.every
	recLen := 5 + (int(b[3])<<8 | int(b[4]))
	if recLen > len(b) {
		recLen = len(b)
	}
	if _, err := c.Conn.Write(tlstest.ReRecord(b[:recLen], c.n)); err != nil {
		return 0, err
	}
	if recLen < len(b) {
		if _, err := c.Conn.Write(b[recLen:]); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}

// sniRouter is a front that routes by the name in the ClientHello's
// first record, in any case but otherwise as sent, as nginx's
// ssl_preread into a map and HAProxy's req.ssl_sni -i do (a front that
// minds case is left to the front: SECURITY.md): "a.test" to its
// tenant, anything else (a name it does not know, or none in that
// record) to the default route, another tenant's. Each route answers its
// name and closes; the bytes the default route received are counted.
func sniRouter(defaultGot *atomic.Int64) func(*net.TCPConn) {
	return func(c *net.TCPConn) {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		rec := make([]byte, 5)
		if _, err := io.ReadFull(c, rec); err != nil {
			return
		}
		rec = append(rec, make([]byte, int(rec[3])<<8|int(rec[4]))...)
		if _, err := io.ReadFull(c, rec[5:]); err != nil {
			return
		}
		_, _, info, err := wire.ReadClientHello(bytes.NewReader(rec), nil, false)
		if err == nil && strings.EqualFold(info.ServerName, "a.test") {
			_, _ = c.Write([]byte("tenant a"))
			return
		}
		defaultGot.Add(int64(len(rec)))
		_, _ = c.Write([]byte("tenant b"))
	}
}

// frontThrough opens a tunnel to a.test, sends hello and returns what
// the client got back, to the end.
func frontThrough(t *testing.T, tp *testProxy, hello []byte) string {
	t.Helper()
	resp, c, br := tp.connect(t, connectHead("a.test:443"))
	if resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	if _, err := c.Write(hello); err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(br)
	return string(got)
}

// TestTLSNameWithTrailingDotRefused sends a ClientHello naming the
// CONNECT host with a trailing dot ("a.test."), which the name check
// once took for "a.test": a front that routes by the name as sent gives
// it to its default route, another tenant. It is refused before anything
// reaches the front; the name itself, in any case, still reaches its own.
func TestTLSNameWithTrailingDotRefused(t *testing.T) {
	var defaultGot atomic.Int64
	tp := newTestProxy(t, proxyOpts{allow: []string{"a.test:443"}, upstream: sniRouter(&defaultGot)})
	tp.dns.set("a.test", 60, "93.184.216.34")
	send := func(hello []byte) string { return frontThrough(t, tp, hello) }
	// crypto/tls drops a trailing dot from the name it sends: one is put
	// in place of the last byte of a name as long.
	dotted := tlstest.ClientHello(t, "a.testx")
	i := bytes.Index(dotted, []byte("a.testx"))
	if i < 0 || bytes.Count(dotted, []byte("a.testx")) != 1 {
		t.Fatal("the server name is not in the ClientHello once")
	}
	dotted[i+len("a.test")] = '.'
	if got := send(dotted); got != string(tlsAccessDenied) {
		t.Fatalf("a trailing dot: the client got %q, want an access_denied alert", got)
	}
	if ev := tp.event(t); ev.Decision != record.DecisionDeny || ev.Reason != record.ReasonSNIMismatch || ev.SNI != "a.test." {
		t.Fatalf("event %+v, want sni_mismatch", ev)
	}
	if n := defaultGot.Load(); n != 0 {
		t.Fatalf("%d bytes of the ClientHello reached the front's default route", n)
	}
	for _, name := range []string{"a.test", "A.Test"} {
		if got := send(tlstest.ClientHello(t, name)); got != "tenant a" {
			t.Fatalf("%s: the client got %q, want its own tenant", name, got)
		}
		if ev := tp.event(t); ev.Decision != record.DecisionAllow {
			t.Fatalf("%s: event %+v, want allow", name, ev)
		}
	}
}

// TestTLSSplitHelloReachesTheFrontWhole sends the CONNECT host's own
// ClientHello split over records, which the name check reassembles: a
// front that reads the name from the first record alone found none there
// and took its default route, another tenant's, before the proxy sent
// the hello on in one record. Whatever the split, the front now reads it
// whole and routes it to its own tenant.
func TestTLSSplitHelloReachesTheFrontWhole(t *testing.T) {
	var defaultGot atomic.Int64
	tp := newTestProxy(t, proxyOpts{allow: []string{"a.test:443"}, tls: true, upstream: sniRouter(&defaultGot)})
	tp.dns.set("a.test", 60, "93.184.216.34")
	hello := tlstest.ClientHello(t, "a.test")
	for _, n := range []int{1, 40, 100, len(hello) - 6} {
		if got := frontThrough(t, tp, tlstest.ReRecord(hello, n)); got != "tenant a" {
			t.Errorf("records of %d bytes: the client got %q, want its own tenant's answer", n, got)
		}
		if ev := tp.event(t); ev.Decision != record.DecisionAllow || ev.SNI != "a.test" {
			t.Fatalf("records of %d bytes: event %+v", n, ev)
		}
	}
	if n := defaultGot.Load(); n != 0 {
		t.Fatalf("%d bytes reached the front's default route", n)
	}
}
