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
	"sync/atomic"
	"testing"
	"time"

	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/record"
)

// portDialer dials each checked address's port to its own upstream.
type portDialer map[uint16]string

func (d portDialer) Dial(ctx context.Context, a netip.AddrPort) (net.Conn, error) {
	var nd net.Dialer
	return nd.DialContext(ctx, "tcp", d[a.Port()])
}

// One request of a round trip's traffic, and how it is sent.
type roundTripRequest struct {
	kind   string // "tls": CONNECT and a TLS handshake; "http": a forwarded GET; "connect": CONNECT alone
	target string
}

// send makes the request through tp and returns its record.
func (r roundTripRequest) send(t *testing.T, tp *testProxy) record.Event {
	t.Helper()
	switch r.kind {
	case "tls":
		host, _, _ := net.SplitHostPort(r.target)
		if tc, err := tlsClientThrough(t, tp, r.target, host); err == nil {
			_, _ = tc.Write([]byte("x"))
			_, _ = io.ReadFull(tc, make([]byte, 1))
			_ = tc.Close()
		}
	case "http":
		c, err := net.Dial("tcp", tp.addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		host, _, _ := net.SplitHostPort(r.target)
		fmt.Fprintf(c, "GET http://%s/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", r.target, host)
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		_ = c.Close()
	default:
		resp, c, _ := tp.connect(t, connectHead(r.target))
		_ = resp.Body.Close()
		_ = c.Close()
	}
	return tp.event(t)
}

// Learn, then enforce, on the same traffic: a learning Trial's records
// are learned into a profile, and the profile, enforced, decides every
// request as the learning Trial did (would_deny gone), under the TLS
// requirement each was let through with. What a later check refused is
// refused again: for the same reason, or, for a name off the list that
// learning let on to that check, by the allowlist, which comes first.
func TestLearnProfileEnforceRoundTrip(t *testing.T) {
	var received atomic.Int64
	tlsUp := newUpstream(t, tlsUpstream(t, &received))
	httpUp := newUpstream(t, func(c *net.TCPConn) {
		if req, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
			_ = req.Body.Close()
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
		}
	})
	dialer := portDialer{443: tlsUp.ln.Addr().String(), 80: httpUp.ln.Addr().String()}
	traffic := []roundTripRequest{
		{"tls", "api.example.com:443"},      // on the list, under require_tls
		{"tls", "other.example.com:443"},    // off it: let through while learning
		{"http", "plain.example.org:80"},    // off it, plain HTTP
		{"connect", "meta.example.com:443"}, // resolves to the metadata address
		{"connect", "93.184.216.34:443"},    // an IP literal
		{"tls", "api.example.com:443"},      // again: the same decision each time
	}
	newProxy := func(learn bool) *testProxy {
		tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, tls: true, learn: learn,
			configure: func(c *Config) { c.Dialer = dialer }})
		tp.dns.set("api.example.com", 60, "93.184.216.34")
		tp.dns.set("other.example.com", 60, "93.184.216.35")
		tp.dns.set("plain.example.org", 60, "93.184.216.36")
		tp.dns.set("meta.example.com", 60, "169.254.169.254")
		return tp
	}

	learning := newProxy(true)
	var learned []record.Event
	for _, r := range traffic {
		learned = append(learned, r.send(t, learning))
	}
	yaml, err := config.Learn(learned, 0).Profile("learned")
	if err != nil {
		t.Fatal(err)
	}
	f, err := config.ParseFile(yaml)
	if err != nil {
		t.Fatalf("%v\n%s", err, yaml)
	}
	list, err := f.Allowlist(f.ProfileNames(), nil, false)
	if err != nil {
		t.Fatalf("%v\n%s", err, yaml)
	}

	enforcing := newProxy(false)
	if _, err := enforcing.SetAllow("t1", list, nil); err != nil {
		t.Fatal(err)
	}
	for i, r := range traffic {
		l, e := learned[i], r.send(t, enforcing)
		reason := l.Reason
		if l.Decision == record.DecisionDeny && l.WouldDeny != "" {
			reason = record.ReasonPolicyDenied
		}
		if e.Decision != l.Decision || e.Reason != reason || e.RequireTLS != l.RequireTLS || e.WouldDeny != "" {
			t.Errorf("%s %s: learning %s/%s (require_tls %v, would_deny %q), enforcing %s/%s (require_tls %v, would_deny %q)\n%s",
				r.kind, r.target, l.Decision, l.Reason, l.RequireTLS, l.WouldDeny, e.Decision, e.Reason, e.RequireTLS, e.WouldDeny, yaml)
		}
	}
	// The traffic exercised each kind of decision.
	if learned[0].Decision != record.DecisionAllow || learned[1].WouldDeny == "" || learned[2].WouldDeny == "" ||
		learned[3].Reason != record.ReasonAddressDenied || learned[4].Reason != record.ReasonIPLiteral {
		t.Fatalf("the learning Trial's records are not the mix this test needs: %+v", learned)
	}
}
