//go:build linux

package proxy

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/wire"
)

func TestRefusedRequests(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443", "*.wild.example.com:443"}})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	long := strings.Repeat("a", 63)
	cases := []struct {
		name, head string
		status     int
		reason     record.Reason
	}{
		{"GET absolute-form, port 80 not allowed", "GET http://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n", 403, record.ReasonPolicyDenied},
		{"POST origin-form", "POST / HTTP/1.1\r\nHost: api.example.com\r\n\r\n", 400, record.ReasonBadTarget},
		{"PROPFIND absolute-form", "PROPFIND http://api.example.com/ HTTP/1.1\r\n\r\n", 405, record.ReasonMethodNotAllowed},
		{"lower-case method", "connect api.example.com:443 HTTP/1.1\r\n\r\n", 405, record.ReasonMethodNotAllowed},
		{"CONNECT absolute-URI", connectHeadNoHost("http://api.example.com:443"), 400, record.ReasonBadTarget},
		{"CONNECT origin-form", connectHeadNoHost("/api.example.com:443"), 400, record.ReasonBadTarget},
		{"CONNECT asterisk", connectHeadNoHost("*"), 400, record.ReasonBadTarget},
		{"userinfo", connectHeadNoHost("user:pw@api.example.com:443"), 400, record.ReasonBadTarget},
		{"path", connectHeadNoHost("api.example.com:443/v1"), 400, record.ReasonBadTarget},
		{"query", connectHeadNoHost("api.example.com:443?x=1"), 400, record.ReasonBadTarget},
		{"fragment", connectHeadNoHost("api.example.com:443#x"), 400, record.ReasonBadTarget},
		{"percent-encoding", connectHeadNoHost("api%2eexample.com:443"), 400, record.ReasonBadTarget},
		{"backslash", connectHeadNoHost("api.example.com\\:443"), 400, record.ReasonBadTarget},
		{"dotted IPv4", connectHeadNoHost("127.0.0.1:443"), 403, record.ReasonIPLiteral},
		{"dotted IPv4 trailing dot", connectHeadNoHost("127.0.0.1.:443"), 403, record.ReasonIPLiteral},
		{"decimal IPv4", connectHeadNoHost("2130706433:443"), 403, record.ReasonIPLiteral},
		{"hex IPv4", connectHeadNoHost("0x7f000001:443"), 403, record.ReasonIPLiteral},
		{"octal IPv4", connectHeadNoHost("0177.0.0.1:443"), 403, record.ReasonIPLiteral},
		{"short IPv4", connectHeadNoHost("127.1:443"), 403, record.ReasonIPLiteral},
		{"mixed hex IPv4", connectHeadNoHost("0x7f.0.0.1:443"), 403, record.ReasonIPLiteral},
		{"hex last label", connectHeadNoHost("foo.0x1f:443"), 403, record.ReasonIPLiteral},
		{"zero", connectHeadNoHost("0:443"), 403, record.ReasonIPLiteral},
		{"metadata IPv4", connectHeadNoHost("169.254.169.254:80"), 403, record.ReasonIPLiteral},
		{"bracketed IPv6", connectHeadNoHost("[::1]:443"), 403, record.ReasonIPLiteral},
		{"bracketed mapped", connectHeadNoHost("[::ffff:127.0.0.1]:443"), 403, record.ReasonIPLiteral},
		{"bracketed zone", connectHeadNoHost("[fe80::1%25eth0]:443"), 403, record.ReasonIPLiteral},
		{"bare IPv6", connectHeadNoHost("::1:443"), 403, record.ReasonIPLiteral},
		{"bare IPv6 with zone", connectHeadNoHost("fe80::1%eth0:443"), 403, record.ReasonIPLiteral},
		{"port zero", connectHeadNoHost("api.example.com:0"), 400, record.ReasonBadPort},
		{"port too big", connectHeadNoHost("api.example.com:65536"), 400, record.ReasonBadPort},
		{"port negative", connectHeadNoHost("api.example.com:-1"), 400, record.ReasonBadPort},
		{"port leading zero", connectHeadNoHost("api.example.com:0443"), 400, record.ReasonBadPort},
		{"port not numeric", connectHeadNoHost("api.example.com:https"), 400, record.ReasonBadPort},
		{"port empty", connectHeadNoHost("api.example.com:"), 400, record.ReasonBadPort},
		{"no port", connectHeadNoHost("api.example.com"), 400, record.ReasonBadPort},
		{"port not allowlisted", connectHeadNoHost("api.example.com:80"), 403, record.ReasonPolicyDenied},
		{"name not allowlisted", connectHeadNoHost("evil.example.net:443"), 403, record.ReasonPolicyDenied},
		{"suffix of allowed name", connectHeadNoHost("example.com:443"), 403, record.ReasonPolicyDenied},
		{"allowed name as prefix", connectHeadNoHost("api.example.com.evil.net:443"), 403, record.ReasonPolicyDenied},
		{"wildcard bare suffix", connectHeadNoHost("wild.example.com:443"), 403, record.ReasonPolicyDenied},
		{"empty name", connectHeadNoHost(":443"), 400, record.ReasonBadTarget},
		{"only a dot", connectHeadNoHost(".:443"), 400, record.ReasonBadTarget},
		{"two trailing dots", connectHeadNoHost("api.example.com..:443"), 400, record.ReasonBadTarget},
		{"empty label", connectHeadNoHost("api..example.com:443"), 400, record.ReasonBadTarget},
		{"leading hyphen", connectHeadNoHost("-api.example.com:443"), 400, record.ReasonBadTarget},
		{"underscore", connectHeadNoHost("api_x.example.com:443"), 400, record.ReasonBadTarget},
		{"label too long", connectHeadNoHost(long + "b.example.com:443"), 400, record.ReasonBadTarget},
		{"name too long", connectHeadNoHost(strings.Repeat(long+".", 4) + "com:443"), 400, record.ReasonBadTarget},
		{"bad punycode", connectHeadNoHost("xn--a.example.com:443"), 400, record.ReasonBadTarget},
		{"non-ASCII name", connectHeadNoHost("bücher.example.com:443"), 400, record.ReasonBadTarget},
		{"C1 CSI in target", connectHeadNoHost("a\u009b31m.example.com:443"), 400, record.ReasonBadTarget},
		{"bidi override in target", connectHeadNoHost("a\u202emoc.example.com:443"), 400, record.ReasonBadTarget},
		{"C1 OSC in absolute-form", "GET http://a\u009d.example.com/ HTTP/1.1\r\n\r\n", 400, record.ReasonBadTarget},
		{"non-ASCII method", "CONNECT\u0085 api.example.com:443 HTTP/1.1\r\n\r\n", 400, record.ReasonBadRequest},
		{"non-ASCII version", "CONNECT api.example.com:443 HTTP/1.1\u009b\r\n\r\n", 400, record.ReasonBadRequest},
		{"tab in target", "CONNECT api.example.com:443\t HTTP/1.1\r\n\r\n", 400, record.ReasonBadTarget},
		{"NUL in request line", "CONNECT api.example.com:443\x00 HTTP/1.1\r\n\r\n", 400, record.ReasonBadRequest},
		{"control char in header", "CONNECT api.example.com:443 HTTP/1.1\r\nX: a\x01b\r\n\r\n", 400, record.ReasonBadRequest},
		{"bare LF", "CONNECT api.example.com:443 HTTP/1.1\nHost: api.example.com:443\n\n", 400, record.ReasonBadRequest},
		{"obs-fold", "CONNECT api.example.com:443 HTTP/1.1\r\nX: a\r\n b\r\n\r\n", 400, record.ReasonBadRequest},
		{"bad header name", "CONNECT api.example.com:443 HTTP/1.1\r\nX Y: a\r\n\r\n", 400, record.ReasonBadRequest},
		{"two spaces", "CONNECT  api.example.com:443 HTTP/1.1\r\n\r\n", 400, record.ReasonBadRequest},
		{"missing version", "CONNECT api.example.com:443\r\n\r\n", 400, record.ReasonBadRequest},
		{"HTTP/2.0", "CONNECT api.example.com:443 HTTP/2.0\r\n\r\n", 505, record.ReasonBadVersion},
		{"Host header differs", "CONNECT api.example.com:443 HTTP/1.1\r\nHost: evil.example.net:443\r\n\r\n", 400, record.ReasonBadRequest},
		{"two Host headers", "CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com\r\nHost: api.example.com\r\n\r\n", 400, record.ReasonBadRequest},
		{"Content-Length body", "CONNECT api.example.com:443 HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 400, record.ReasonBadRequest},
		{"Transfer-Encoding", "CONNECT api.example.com:443 HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 400, record.ReasonBadRequest},
		{"request line too long", connectHeadNoHost("a" + strings.Repeat(".a", wire.MaxRequestLine) + ":443"), 431, record.ReasonRequestTooLarge},
		{"header too long", "CONNECT api.example.com:443 HTTP/1.1\r\nX: " + strings.Repeat("a", wire.MaxRequestLine) + "\r\n\r\n", 431, record.ReasonRequestTooLarge},
		{"head too large", "CONNECT api.example.com:443 HTTP/1.1\r\n" + strings.Repeat("X: "+strings.Repeat("a", 900)+"\r\n", 10) + "\r\n", 431, record.ReasonRequestTooLarge},
		{"too many headers", "CONNECT api.example.com:443 HTTP/1.1\r\n" + strings.Repeat("X: a\r\n", wire.MaxHeaders+1) + "\r\n", 431, record.ReasonTooManyHeaders},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, _, _ := tp.connect(t, tc.head)
			if resp.StatusCode != tc.status || record.Reason(resp.Header.Get("Trialnet-Reason")) != tc.reason {
				t.Fatalf("got %d %q (%s), want %d %q", resp.StatusCode, resp.Header.Get("Trialnet-Reason"), resp.Header.Get("Trialnet-Detail"), tc.status, tc.reason)
			}
			if ps, want := resp.Header.Get("Proxy-Status"), "trialnet; error="+tc.reason.ProxyError()+"; details="; !strings.HasPrefix(ps, want) {
				t.Fatalf("Proxy-Status %q, want %s...", ps, want)
			}
			if ev := tp.event(t); ev.Decision != record.DecisionDeny || ev.Reason != tc.reason || ev.Trial != "t1" {
				t.Fatalf("event %+v", ev)
			}
		})
	}
	if n := tp.dns.totalQueries(); n != 0 {
		t.Fatalf("refused requests caused %d DNS queries; names must be checked before DNS", n)
	}
}

// A request line with a byte outside ASCII is refused whole: its record
// and its answer carry the line only escaped, so no terminal control
// (C1, bidi) a Trial sends reaches an operator through them.
func TestNonASCIIRequestLineNotRecorded(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}})
	for _, head := range []string{
		connectHeadNoHost("\u009b2J\u009d0;pwned\u009c.example.com:443"),
		"GET http://\u202eevil.example.com/ HTTP/1.1\r\n\r\n",
		"\u009b31mCONNECT api.example.com:443 HTTP/1.1\r\n\r\n",
		connectHeadNoHost("\xff\xfe.example.com:443"),
	} {
		resp, _, _ := tp.connect(t, head)
		ev := tp.event(t)
		for _, s := range []string{ev.Method, ev.Target, ev.Host, ev.Detail, resp.Header.Get("Trialnet-Detail")} {
			if !wire.IsASCII(s) {
				t.Errorf("%q: %q reached the record or the answer", head, s)
			}
		}
		if ev.Decision != record.DecisionDeny || ev.Target != "" || !strings.Contains(ev.Detail, "non-ASCII") {
			t.Errorf("%q: record %+v", head, ev)
		}
	}
}

func connectHeadNoHost(target string) string {
	return "CONNECT " + target + " HTTP/1.1\r\n\r\n"
}

// Normalised spellings of an allowed name are allowed, and a wildcard
// matches a deeper name.
func TestAllowedSpellings(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443", "*.wild.example.com:443"}})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	tp.dns.set("a.b.wild.example.com", 60, "93.184.216.35")
	for _, target := range []string{"api.example.com:443", "API.Example.COM:443", "api.example.com.:443", "a.b.wild.example.com:443"} {
		resp, c, _ := tp.connect(t, connectHead(target))
		if resp.StatusCode != 200 {
			t.Fatalf("%s: got %d %s", target, resp.StatusCode, resp.Header.Get("Trialnet-Detail"))
		}
		_ = c.Close()
		tp.event(t)
	}
}

// A client that drips its head slower than the header deadline is cut
// off with 408 header_timeout.
func TestSlowloris(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, configure: func(c *Config) { c.HeaderTimeout = 300 * time.Millisecond }})
	c, err := net.Dial("tcp", tp.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	head := connectHead("api.example.com:443")
	start := time.Now()
	for i := 0; i < len(head)-2; i++ {
		if _, err := c.Write([]byte{head[i]}); err != nil {
			break // the proxy gave up on us: expected
		}
		time.Sleep(20 * time.Millisecond)
		if time.Since(start) > 5*time.Second {
			break
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, _ := io.ReadAll(c)
	if !strings.HasPrefix(string(got), "HTTP/1.1 408 ") || !strings.Contains(string(got), "Trialnet-Reason: header_timeout") {
		t.Fatalf("got %q", got)
	}
	if ev := tp.event(t); ev.Reason != record.ReasonHeaderTimeout {
		t.Fatalf("event %+v", ev)
	}
}
