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
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/tlstest"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/wire"
)

// tlsUpstream is a TLS echo server with a certificate for every name,
// counting the bytes it received before or without a handshake.
func tlsUpstream(t *testing.T, received *atomic.Int64) func(*net.TCPConn) {
	t.Helper()
	cfg := testServerConfig(t)
	return func(c *net.TCPConn) {
		cc := &countConn{Conn: c, n: received}
		s := tls.Server(cc, cfg)
		if s.Handshake() != nil {
			return
		}
		_, _ = io.Copy(s, s)
	}
}

// testServerConfig is a TLS server's with a certificate for every name
// the tests ask for.
func testServerConfig(t *testing.T) *tls.Config {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		DNSNames: []string{"api.example.com", "other.example.com"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
}

type countConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.n.Add(int64(n))
	return n, err
}

func tlsClientThrough(t *testing.T, tp *testProxy, target, sni string) (*tls.Conn, error) {
	t.Helper()
	resp, c, _ := tp.connect(t, connectHead(target))
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT %s: %s", target, resp.Status)
	}
	tc := tls.Client(c, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return tc, tc.Handshake()
}

func TestTLSNameCheck(t *testing.T) {
	var received atomic.Int64
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, upstream: tlsUpstream(t, &received)})
	tp.dns.set("api.example.com", 60, "93.184.216.34")

	t.Run("matching SNI", func(t *testing.T) {
		tc, err := tlsClientThrough(t, tp, "api.example.com:443", "API.example.com")
		if err != nil {
			t.Fatal(err)
		}
		pingEcho(t, tc)
		_ = tc.Close()
		if ev := tp.event(t); ev.Reason != record.ReasonAllowed || ev.SNI != "API.example.com" {
			t.Fatalf("event %+v", ev)
		}
	})
	t.Run("other SNI", func(t *testing.T) {
		before := received.Load()
		_, err := tlsClientThrough(t, tp, "api.example.com:443", "other.example.com")
		if err == nil || !strings.Contains(err.Error(), "access denied") {
			t.Fatalf("handshake: %v, want access denied", err)
		}
		if ev := tp.event(t); ev.Decision != record.DecisionDeny || ev.Reason != record.ReasonSNIMismatch || ev.SNI != "other.example.com" {
			t.Fatalf("event %+v", ev)
		}
		if received.Load() != before {
			t.Fatal("the refused ClientHello reached the upstream")
		}
	})
	t.Run("no SNI", func(t *testing.T) {
		// crypto/tls sends no SNI for an IP-address ServerName.
		_, err := tlsClientThrough(t, tp, "api.example.com:443", "93.184.216.34")
		if err == nil {
			t.Fatal("handshake without SNI succeeded")
		}
		if ev := tp.event(t); ev.Reason != record.ReasonSNIMissing {
			t.Fatalf("event %+v", ev)
		}
	})
}

// sendInPieces opens a tunnel and writes data in pieces with pauses, so
// the proxy sees several TCP segments; it returns what the client read
// back before the tunnel closed.
func sendInPieces(t *testing.T, tp *testProxy, data []byte, pieces int) []byte {
	t.Helper()
	return sendInPiecesTo(t, tp, "api.example.com:443", data, pieces)
}

func TestTLSSplitClientHello(t *testing.T) {
	var received atomic.Int64
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, upstream: tlsUpstream(t, &received)})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	other := tlstest.ClientHello(t, "other.example.com")
	for name, data := range map[string][]byte{
		"segments":             other,
		"records and segments": tlstest.ReRecord(other, 100),
	} {
		t.Run(name, func(t *testing.T) {
			got := sendInPieces(t, tp, data, 7)
			if string(got) != string(tlsAccessDenied) {
				t.Fatalf("client got %x, want an access_denied alert", got)
			}
			if ev := tp.event(t); ev.Reason != record.ReasonSNIMismatch {
				t.Fatalf("event %+v", ev)
			}
		})
	}
	if received.Load() != 0 {
		t.Fatal("a refused ClientHello reached the upstream")
	}
	// The matching name, split the same way, passes whole.
	got := sendInPieces(t, tp, tlstest.ReRecord(tlstest.ClientHello(t, "api.example.com"), 64), 9)
	if len(got) < 5 || got[0] != 0x16 {
		t.Fatalf("a split matching ClientHello got %x, want a ServerHello", got)
	}
}

func TestTLSMalformedAndRequired(t *testing.T) {
	var received atomic.Int64
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, upstream: tlsUpstream(t, &received), tls: true,
		configure: func(c *Config) { c.TLSTimeout = 500 * time.Millisecond }})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	hello := tlstest.ClientHello(t, "api.example.com")
	// The same hello with a handshake length one byte longer than its record.
	long := append([]byte(nil), hello...)
	long[8]++
	truncated := hello[:len(hello)-10]
	// A server name holding a C1 control (CSI, UTF-8 encoded), same length.
	c1 := []byte(strings.Replace(string(hello), "api.example.com", "api\u009bxample.com", 1))
	for _, c := range []struct {
		name string
		data []byte
		want record.Reason
	}{
		{"garbage with require_tls", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), record.ReasonTLSRequired},
		{"record header only", []byte{0x16, 0x03, 0x01, 0x00, 0x05}, record.ReasonTLSMalformed},
		{"not a ClientHello", []byte{0x16, 0x03, 0x01, 0x00, 0x04, 0x02, 0x00, 0x00, 0x00}, record.ReasonTLSMalformed},
		{"wrong record version", []byte{0x16, 0x09, 0x01, 0x00, 0x04, 0x01, 0x00, 0x00, 0x00}, record.ReasonTLSMalformed},
		{"truncated ClientHello then silence", truncated, record.ReasonTLSMalformed},
		{"handshake longer than its records", long, record.ReasonTLSMalformed},
		{"server name not ASCII", c1, record.ReasonTLSMalformed},
	} {
		t.Run(c.name, func(t *testing.T) {
			sendInPieces(t, tp, c.data, 1)
			if ev := tp.event(t); ev.Reason != c.want || ev.SNI != "" || !wire.IsASCII(ev.Detail) {
				t.Fatalf("event %+v, want %s with no SNI and an ASCII detail", ev, c.want)
			}
		})
	}
	t.Run("silence with require_tls", func(t *testing.T) {
		resp, _, _ := tp.connect(t, connectHead("api.example.com:443"))
		if resp.StatusCode != 200 {
			t.Fatal(resp.Status)
		}
		if ev := tp.event(t); ev.Reason != record.ReasonTLSRequired {
			t.Fatalf("event %+v", ev)
		}
	})
	if received.Load() != 0 {
		t.Fatal("refused bytes reached the upstream")
	}
}

// Without require_tls, a client that does not speak TLS is tunnelled.
func TestTunnelNonTLSWithoutRequireTLS(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	if got := sendInPieces(t, tp, []byte("plain"), 1); string(got) != "plain" {
		t.Fatalf("got %q", got)
	}
}

// sslRequest is PostgreSQL's SSLRequest: its length (8) and code
// 80877103; gssRequest its GSSENCRequest (80877104), which libpq sends
// first where it has Kerberos credentials.
var (
	sslRequest = []byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f}
	gssRequest = []byte{0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x30}
)

// pgFront stands in for a PostgreSQL front that routes by SNI (Neon's,
// Supabase's): it answers an SSLRequest with 'S' (TLS follows) or, with
// plain, 'N' (then echoes the plaintext); it sends the SNI of each
// ClientHello it reads on snis, then serves an echo over TLS.
func pgFront(t *testing.T, plain bool, snis chan<- string) func(*net.TCPConn) {
	cfg := testServerConfig(t)
	cfg.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		snis <- h.ServerName
		return nil, nil
	}
	return func(c *net.TCPConn) {
		b := make([]byte, len(sslRequest))
		_, err := io.ReadFull(c, b)
		if err == nil && bytes.Equal(b, gssRequest) {
			_, _ = c.Write([]byte("N")) // no GSSAPI here: the client goes on
			_, err = io.ReadFull(c, b)
		}
		if err != nil || !bytes.Equal(b, sslRequest) {
			return
		}
		if plain {
			_, _ = c.Write([]byte("N"))
			echo(c)
			return
		}
		_, _ = c.Write([]byte("S"))
		s := tls.Server(c, cfg)
		if s.Handshake() != nil {
			return
		}
		_, _ = io.Copy(s, s)
	}
}

// A TLS stream after a PostgreSQL SSLRequest is a TLS stream like any
// other: its ClientHello must name the tunnel's host, since a front that
// routes by SNI would otherwise take the Trial to another tenant's
// database behind the same name. A server that declines TLS ('N') gets
// the plaintext, as before.
func TestTLSAfterPostgresSSLRequest(t *testing.T) {
	for _, c := range []struct {
		name, sni      string
		pipelined, gss bool
		want           record.Reason
	}{
		{"matching SNI", "db.example.com", false, false, record.ReasonAllowed},
		{"other SNI", "other.example.com", false, false, record.ReasonSNIMismatch},
		{"other SNI sent with the SSLRequest", "other.example.com", true, false, record.ReasonSNIMismatch},
		{"no SNI", "93.184.216.34", false, false, record.ReasonSNIMissing},
		{"matching SNI after a GSSENCRequest declined", "db.example.com", false, true, record.ReasonAllowed},
		{"other SNI after a GSSENCRequest declined", "other.example.com", false, true, record.ReasonSNIMismatch},
		{"other SNI sent with a GSSENCRequest and the SSLRequest", "other.example.com", true, true, record.ReasonSNIMismatch},
	} {
		t.Run(c.name, func(t *testing.T) {
			snis := make(chan string, 4)
			tp := newTestProxy(t, proxyOpts{allow: []string{"db.example.com:5432"}, upstream: pgFront(t, false, snis)})
			tp.dns.set("db.example.com", 60, "93.184.216.34")
			resp, conn, br := tp.connect(t, connectHead("db.example.com:5432"))
			if resp.StatusCode != 200 {
				t.Fatalf("CONNECT: %s", resp.Status)
			}
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
			tc := tls.Client(&bufConn{Conn: conn, r: br}, &tls.Config{ServerName: c.sni, InsecureSkipVerify: true})
			var prelude []byte
			if c.gss {
				prelude = gssRequest
			}
			if c.pipelined {
				hello := tlstest.ClientHello(t, c.sni)
				if _, err := conn.Write(slices.Concat(prelude, sslRequest, hello)); err != nil {
					t.Fatal(err)
				}
				_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
				_, _ = io.ReadAll(br) // the refusal's alert, or nothing
			} else {
				if c.gss {
					if _, err := conn.Write(gssRequest); err != nil {
						t.Fatal(err)
					}
					if b, err := br.ReadByte(); err != nil || b != 'N' {
						t.Fatalf("the front's answer to the GSSENCRequest: %q %v", b, err)
					}
				}
				if _, err := conn.Write(sslRequest); err != nil {
					t.Fatal(err)
				}
				if b, err := br.ReadByte(); err != nil || b != 'S' {
					t.Fatalf("the front's answer: %q %v", b, err)
				}
				err := tc.Handshake()
				if (err == nil) != (c.want == record.ReasonAllowed) {
					t.Fatalf("handshake: %v", err)
				}
			}
			_ = conn.Close() // a tunnel's record is written as it ends
			if ev := tp.event(t); ev.Reason != c.want {
				t.Fatalf("event %+v, want %s", ev, c.want)
			}
			if c.want != record.ReasonAllowed && len(snis) > 0 {
				t.Fatal("the refused ClientHello reached the front")
			}
		})
	}
	t.Run("declined", func(t *testing.T) {
		tp := newTestProxy(t, proxyOpts{allow: []string{"db.example.com:5432"}, upstream: pgFront(t, true, make(chan string, 1))})
		tp.dns.set("db.example.com", 60, "93.184.216.34")
		resp, conn, br := tp.connect(t, connectHead("db.example.com:5432"))
		if resp.StatusCode != 200 {
			t.Fatalf("CONNECT: %s", resp.Status)
		}
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := conn.Write(append(append([]byte(nil), sslRequest...), "startup"...)); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len("Nstartup"))
		if _, err := io.ReadFull(br, got); err != nil || string(got) != "Nstartup" {
			t.Fatalf("got %q %v", got, err)
		}
	})
}
