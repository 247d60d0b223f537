//go:build linux

package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http/httpproxy"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/record"
)

// seen is what the HTTP upstream received.
type seen struct {
	method, host, uri, remote string
	header                    http.Header
	body                      string
}

type httpUpstream struct {
	mu  sync.Mutex
	got []seen
}

func (u *httpUpstream) requests() []seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seen(nil), u.got...)
}

// newForwardProxy is a test proxy whose checked addresses all reach one
// loopback HTTP server; it allows api.example.com and other.example.com
// on port 80 and api.example.com on 8080.
func newForwardProxy(t *testing.T) (*testProxy, *httpUpstream) {
	t.Helper()
	return newForwardProxyWith(t, nil)
}

// newForwardProxyWith is newForwardProxy with its Config changed by
// configure (nil: none).
func newForwardProxyWith(t *testing.T, configure func(*Config)) (*testProxy, *httpUpstream) {
	t.Helper()
	u := &httpUpstream{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.got = append(u.got, seen{r.Method, r.Host, r.RequestURI, r.RemoteAddr, r.Header.Clone(), string(body)})
		u.mu.Unlock()
		w.Header().Set("Connection", "X-Hop")
		w.Header().Set("X-Hop", "must not reach the client")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("X-End", "ok")
		_, _ = io.WriteString(w, "hello from "+r.Host+" "+r.Method+" "+string(body))
	}))
	t.Cleanup(srv.Close)
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:80", "other.example.com:80", "api.example.com:8080"},
		upstreamAddr: srv.Listener.Addr().String(), configure: configure})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	tp.dns.set("other.example.com", 60, "93.184.216.35")
	tp.dns.set("denied.example.com", 60, "93.184.216.36")
	return tp, u
}

// drainEvents collects n events.
func (tp *testProxy) drainEvents(t *testing.T, n int) []record.Event {
	t.Helper()
	var evs []record.Event
	for range n {
		evs = append(evs, tp.event(t))
	}
	return evs
}

func TestForwardWithCurl(t *testing.T) {
	privtest.RequireTool(t, "curl")
	tp, u := newForwardProxy(t)
	curl := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "curl", append([]string{"-sS", "-i", "--max-time", "10"}, args...)...)
		// curl reads only the lower-case http_proxy for http:// URLs.
		cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "http_proxy=http://" + tp.addr, "NO_PROXY=", "no_proxy="}
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := curl("http://api.example.com/hello?x=1")
	if err != nil || !strings.HasPrefix(out, "HTTP/1.1 200") || !strings.HasSuffix(out, "hello from api.example.com GET ") {
		t.Fatalf("curl GET: %v\n%s", err, out)
	}
	if strings.Contains(out, "X-Hop") || strings.Contains(out, "Keep-Alive") || !strings.Contains(out, "X-End: ok") {
		t.Fatalf("hop-by-hop fields reached the client, or end-to-end ones did not:\n%s", out)
	}
	out, err = curl("-d", "payload", "http://api.example.com:8080/post")
	if err != nil || !strings.HasSuffix(out, "hello from api.example.com:8080 POST payload") {
		t.Fatalf("curl POST: %v\n%s", err, out)
	}
	out, _ = curl("http://denied.example.com/")
	if !strings.HasPrefix(out, "HTTP/1.1 403") || !strings.Contains(out, "Trialnet-Reason: policy_denied") ||
		!strings.Contains(out, "Proxy-Status: trialnet; error=http_request_denied") {
		t.Fatalf("curl to a refused name:\n%s", out)
	}
	got := u.requests()
	if len(got) != 2 || got[0].uri != "/hello?x=1" || got[0].host != "api.example.com" || got[1].body != "payload" {
		t.Fatalf("upstream saw %+v", got)
	}
	for _, name := range []string{"Proxy-Connection", "Proxy-Authorization"} {
		if v := got[0].header.Get(name); v != "" {
			t.Fatalf("upstream saw %s: %s", name, v)
		}
	}
	evs := tp.drainEvents(t, 3)
	if evs[0].Method != "GET" || evs[0].Reason != record.ReasonAllowed || evs[0].Dialed.String() != "93.184.216.34:80" ||
		evs[0].Rule != "api.example.com:80" || evs[0].FirstByte <= 0 || evs[1].Rule != "api.example.com:8080" || evs[0].ID == evs[1].ID ||
		evs[1].Method != "POST" || evs[1].BytesUp <= 7 || evs[2].Reason != record.ReasonPolicyDenied { // the head and the 7-byte body
		t.Fatalf("events %+v", evs)
	}
	if n := tp.dns.count("denied.example.com"); n != 0 {
		t.Fatalf("a refused name caused %d DNS queries", n)
	}
}

func TestForwardWithPythonURLLib(t *testing.T) {
	privtest.RequireTool(t, "python3")
	tp, u := newForwardProxy(t)
	script := `
import sys, urllib.request, urllib.error
for url in sys.argv[1:]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            print(r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        print(e.code, e.headers.get("Trialnet-Reason"))
`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "python3", "-c", script, "http://api.example.com/py", "http://denied.example.com/py", "http://api.example.com/py?again")
	// urllib reads HTTP_PROXY and http_proxy; the upper-case one here.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HTTP_PROXY=http://" + tp.addr}
	out, err := cmd.CombinedOutput()
	want := "200 hello from api.example.com GET \n403 policy_denied\n200 hello from api.example.com GET \n"
	if err != nil || string(out) != want {
		t.Fatalf("python: %v\n%s\nwant\n%s", err, out, want)
	}
	if got := u.requests(); len(got) != 2 || got[1].uri != "/py?again" {
		t.Fatalf("upstream saw %+v", got)
	}
	if n := tp.dns.count("denied.example.com"); n != 0 {
		t.Fatalf("a refused name caused %d DNS queries", n)
	}
}

func TestForwardWithGoClient(t *testing.T) {
	tp, u := newForwardProxy(t)
	// What http.ProxyFromEnvironment does with HTTP_PROXY set (it reads
	// the environment once per process, so the test builds the same
	// function from a Config).
	proxyFunc := (&httpproxy.Config{HTTPProxy: "http://" + tp.addr}).ProxyFunc()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		Proxy: func(r *http.Request) (*url.URL, error) { return proxyFunc(r.URL) },
	}}
	defer client.CloseIdleConnections()
	for i, c := range []struct {
		method, url, body string
		status            int
		reason            record.Reason
	}{
		{"GET", "http://api.example.com/go", "", 200, record.ReasonAllowed},
		{"PUT", "http://other.example.com/go", "abc", 200, record.ReasonAllowed},
		{"DELETE", "http://api.example.com:8080/go", "", 200, record.ReasonAllowed},
		{"GET", "http://denied.example.com/go", "", 403, record.ReasonPolicyDenied},
		{"GET", "http://api.example.com:81/go", "", 403, record.ReasonPolicyDenied},
	} {
		req, _ := http.NewRequest(c.method, c.url, strings.NewReader(c.body))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%d %s %s: %v", i, c.method, c.url, err)
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Fatalf("%s %s: %d %s", c.method, c.url, resp.StatusCode, b)
		}
		if ev := tp.event(t); ev.Reason != c.reason || ev.Method != c.method {
			t.Fatalf("%s %s: event %+v", c.method, c.url, ev)
		}
		if c.status == 200 && !strings.HasSuffix(string(b), c.method+" "+c.body) {
			t.Fatalf("%s %s: body %q", c.method, c.url, b)
		}
	}
	if got := u.requests(); len(got) != 3 || got[1].host != "other.example.com" || got[1].body != "abc" || got[2].host != "api.example.com:8080" {
		t.Fatalf("upstream saw %+v", got)
	}
	if n := tp.dns.count("denied.example.com"); n != 0 {
		t.Fatalf("a refused name caused %d DNS queries", n)
	}
}

// rawExchange writes raw requests on one connection and reads the
// responses, in order, until the proxy closes or n responses arrived.
func rawExchange(t *testing.T, addr, raw string, n int) []*http.Response {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	var out []*http.Response
	for range n {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			break
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(bytes.NewReader(b))
		out = append(out, resp)
	}
	return out
}

// A keep-alive client that switches hosts between requests is checked
// again each time: a refused host is refused, with no DNS, and an
// allowed other host gets its own upstream connection.
func TestForwardKeepAliveSwitchingHostsIsRechecked(t *testing.T) {
	tp, u := newForwardProxy(t)
	get := func(host string) string {
		return "GET http://" + host + "/ HTTP/1.1\r\nHost: " + host + "\r\n\r\n"
	}
	resps := rawExchange(t, tp.addr, get("api.example.com")+get("api.example.com")+get("other.example.com")+get("denied.example.com")+get("api.example.com"), 5)
	var codes []int
	for _, r := range resps {
		codes = append(codes, r.StatusCode)
	}
	if len(codes) != 4 || codes[0] != 200 || codes[1] != 200 || codes[2] != 200 || codes[3] != 403 ||
		resps[3].Header.Get("Trialnet-Reason") != string(record.ReasonPolicyDenied) {
		t.Fatalf("statuses %v, want 200 200 200 403 and then the connection closed", codes)
	}
	got := u.requests()
	if len(got) != 3 || got[2].host != "other.example.com" {
		t.Fatalf("upstream saw %+v", got)
	}
	if got[0].remote != got[1].remote {
		t.Fatalf("two requests to one host did not share an upstream connection: %s %s", got[0].remote, got[1].remote)
	}
	if got[2].remote == got[0].remote {
		t.Fatal("the request to another host reused the first host's upstream connection")
	}
	if d := tp.dialer.addrs(); len(d) != 2 || d[0].String() != "93.184.216.34:80" || d[1].String() != "93.184.216.35:80" {
		t.Fatalf("dialed %v", d)
	}
	if n := tp.dns.count("denied.example.com"); n != 0 {
		t.Fatalf("a refused name caused %d DNS queries", n)
	}
	evs := tp.drainEvents(t, 4)
	if evs[2].Host != "other.example.com" || evs[3].Reason != record.ReasonPolicyDenied || evs[3].Host != "denied.example.com" {
		t.Fatalf("events %+v", evs)
	}
}

// Shapes that smuggle a request past a proxy, and other heads that are
// not forwarded, are refused before any DNS and reach no upstream.
func TestForwardRefusals(t *testing.T) {
	tp, u := newForwardProxy(t)
	const api = "POST http://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n"
	for _, c := range []struct {
		name, raw string
		status    int
		reason    record.Reason
	}{
		{"Content-Length and Transfer-Encoding", api + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, record.ReasonBadRequest},
		{"Transfer-Encoding and Content-Length", api + "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n", 400, record.ReasonBadRequest},
		{"duplicate Content-Length", api + "Content-Length: 4\r\nContent-Length: 4\r\n\r\nabcd", 400, record.ReasonBadRequest},
		{"conflicting Content-Length", api + "Content-Length: 4\r\nContent-Length: 5\r\n\r\nabcde", 400, record.ReasonBadRequest},
		{"Content-Length list", api + "Content-Length: 4, 4\r\n\r\nabcd", 400, record.ReasonBadRequest},
		{"signed Content-Length", api + "Content-Length: +4\r\n\r\nabcd", 400, record.ReasonBadRequest},
		{"Transfer-Encoding not chunked", api + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 400, record.ReasonBadRequest},
		{"Transfer-Encoding twice", api + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, record.ReasonBadRequest},
		{"Transfer-Encoding on HTTP/1.0", "POST http://api.example.com/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400, record.ReasonBadRequest},
		{"obs-fold", api + "Content-Length: 4\r\nX-A: a\r\n b\r\n\r\nabcd", 400, record.ReasonBadRequest},
		{"space before colon", api + "Content-Length : 4\r\n\r\nabcd", 400, record.ReasonBadRequest},
		{"bare LF", "GET http://api.example.com/ HTTP/1.1\nHost: api.example.com\n\n", 400, record.ReasonBadRequest},
		{"https URL", "GET https://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n", 400, record.ReasonHTTPSNeedsConnect},
		{"origin-form", "GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n", 400, record.ReasonBadTarget},
		{"other scheme", "GET ftp://api.example.com/ HTTP/1.1\r\n\r\n", 400, record.ReasonBadTarget},
		{"TRACE", "TRACE http://api.example.com/ HTTP/1.1\r\n\r\n", 405, record.ReasonMethodNotAllowed},
		{"Host differs", "GET http://api.example.com/ HTTP/1.1\r\nHost: denied.example.com\r\n\r\n", 400, record.ReasonBadRequest},
		{"userinfo", "GET http://user:pw@api.example.com/ HTTP/1.1\r\n\r\n", 400, record.ReasonBadTarget},
		{"IP literal", "GET http://127.0.0.1/ HTTP/1.1\r\n\r\n", 403, record.ReasonIPLiteral},
		{"IPv6 literal", "GET http://[::1]/ HTTP/1.1\r\n\r\n", 403, record.ReasonIPLiteral},
		{"fragment", "GET http://api.example.com/#x HTTP/1.1\r\n\r\n", 400, record.ReasonBadTarget},
		{"path without slash", "GET http://api.example.com:80x HTTP/1.1\r\n\r\n", 400, record.ReasonBadPort},
		{"refused name", "GET http://denied.example.com/ HTTP/1.1\r\n\r\n", 403, record.ReasonPolicyDenied},
		{"unsupported Expect", api + "Content-Length: 4\r\nExpect: something\r\n\r\nabcd", 400, record.ReasonBadRequest},
	} {
		t.Run(c.name, func(t *testing.T) {
			resps := rawExchange(t, tp.addr, c.raw, 1)
			if len(resps) != 1 || resps[0].StatusCode != c.status || record.Reason(resps[0].Header.Get("Trialnet-Reason")) != c.reason {
				var got string
				if len(resps) == 1 {
					got = resps[0].Status + " " + resps[0].Header.Get("Trialnet-Reason") + " " + resps[0].Header.Get("Trialnet-Detail")
				}
				t.Fatalf("got %q, want %d %s", got, c.status, c.reason)
			}
			if ev := tp.event(t); ev.Decision != record.DecisionDeny || ev.Reason != c.reason {
				t.Fatalf("event %+v", ev)
			}
		})
	}
	// A CONNECT after a forwarded request on the same connection.
	resps := rawExchange(t, tp.addr, "GET http://api.example.com/ HTTP/1.1\r\n\r\n"+connectHead("api.example.com:80"), 2)
	if len(resps) != 2 || resps[0].StatusCode != 200 || resps[1].StatusCode != 400 {
		t.Fatalf("GET then CONNECT: %v", resps)
	}
	tp.drainEvents(t, 2)
	if got := u.requests(); len(got) != 1 {
		t.Fatalf("the upstream received %d requests, want only the GET before the CONNECT: %+v", len(got), got)
	}
	if n := tp.dns.count("denied.example.com"); n != 0 {
		t.Fatalf("refused requests caused %d DNS queries", n)
	}
}

// Hop-by-hop fields, those the Connection field names and the proxy's
// own credentials never reach the upstream; end-to-end ones do.
func TestForwardStripsHopByHop(t *testing.T) {
	tp, u := newForwardProxy(t)
	raw := "POST http://api.example.com/h HTTP/1.1\r\nHost: api.example.com\r\nConnection: keep-alive, X-Private\r\n" +
		"X-Private: secret\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\nProxy-Authorization: Basic dTpw\r\n" +
		"TE: trailers\r\nUpgrade: websocket\r\nX-End: kept\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"3\r\nabc\r\n0\r\n\r\n"
	resps := rawExchange(t, tp.addr, raw, 2)
	if len(resps) < 1 || resps[len(resps)-1].StatusCode != 200 {
		t.Fatalf("responses %v", resps)
	}
	got := u.requests()
	if len(got) != 1 || got[0].body != "abc" || got[0].header.Get("X-End") != "kept" {
		t.Fatalf("upstream saw %+v", got)
	}
	for _, name := range []string{"X-Private", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization", "Te", "Upgrade", "Expect", "Connection"} {
		if v, ok := got[0].header[http.CanonicalHeaderKey(name)]; ok {
			t.Errorf("upstream saw %s: %v", name, v)
		}
	}
	if len(resps) != 2 || resps[0].StatusCode != 100 {
		t.Fatalf("want 100 Continue, then 200: %v", resps)
	}
}

// An entry that requires TLS is never reached by plain HTTP, whatever the
// port: the forwarder refuses it before any DNS, as CONNECT refuses
// plaintext in a tunnel.
func TestForwardHonoursRequireTLS(t *testing.T) {
	reached := make(chan struct{}, 1)
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:443"}, tls: true, upstream: func(c *net.TCPConn) {
		reached <- struct{}{}
	}})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	resps := rawExchange(t, tp.addr, "POST http://api.example.com:443/exfil HTTP/1.1\r\nHost: api.example.com:443\r\nContent-Length: 6\r\n\r\nsecret", 1)
	if len(resps) != 1 || resps[0].StatusCode != 403 || record.Reason(resps[0].Header.Get("Trialnet-Reason")) != record.ReasonTLSRequired {
		t.Fatalf("plain HTTP to a require_tls entry: %v, want 403 %s", resps, record.ReasonTLSRequired)
	}
	if ev := tp.event(t); ev.Decision != record.DecisionDeny || ev.Reason != record.ReasonTLSRequired {
		t.Fatalf("event %+v", ev)
	}
	select {
	case <-reached:
		t.Fatal("the upstream was reached")
	case <-time.After(200 * time.Millisecond):
	}
	if n := tp.dns.count("api.example.com"); n != 0 {
		t.Fatalf("%d DNS queries for a refused request", n)
	}
}

// A forwarded request streams as long as a tunnel: deny --cut of its
// entry ends it too.
func TestCutEndsAForwardedStream(t *testing.T) {
	recv := make(chan int, 1000)
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:80"}, upstream: func(c *net.TCPConn) {
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		b := make([]byte, 1024)
		for {
			n, err := req.Body.Read(b)
			if n > 0 {
				recv <- n
			}
			if err != nil {
				return
			}
		}
	}})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	c, err := net.Dial("tcp", tp.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "POST http://api.example.com/up HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n")
	chunk := func() { _, _ = io.WriteString(c, fmt.Sprintf("%x\r\n%s\r\n", 5, "data!")) }
	chunk()
	select {
	case <-recv:
	case <-time.After(3 * time.Second):
		t.Fatal("first chunk did not arrive")
	}
	e, _ := allow.ParseEntry("api.example.com:80")
	n, err := tp.SetAllow("t1", allow.New(), []allow.Entry{e})
	if err != nil || n != 1 {
		t.Fatalf("SetAllow(remove api.example.com:80, cut): %d cut, %v; want the streaming request", n, err)
	}
	time.Sleep(200 * time.Millisecond)
	got := 0
	for range 10 {
		chunk()
		select {
		case <-recv:
			got++
		case <-time.After(100 * time.Millisecond):
		}
	}
	if got > 0 {
		t.Errorf("%d of 10 chunks reached the upstream after its entry was cut", got)
	}
}

// A forwarded response's head is bounded: one past MaxResponseHeaderBytes
// is refused as the upstream's fault and never held whole; one under it
// passes.
func TestForwardBoundsResponseHead(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := maxResponseHeaderBytes - 4<<10 // under the bound, with room for the rest of the head
		if r.URL.Path == "/big" {
			n = 4 << 20
		}
		w.Header().Set("X-Big", strings.Repeat("a", n))
		_, _ = io.WriteString(w, "body")
	}))
	t.Cleanup(srv.Close)
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:80"}, upstreamAddr: srv.Listener.Addr().String()})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	resps := rawExchange(t, tp.addr, "GET http://api.example.com/big HTTP/1.1\r\nHost: api.example.com\r\n\r\n", 1)
	if len(resps) != 1 || resps[0].StatusCode != http.StatusBadGateway || record.Reason(resps[0].Header.Get("Trialnet-Reason")) != record.ReasonUpstreamBadResponse ||
		!strings.Contains(resps[0].Header.Get("Trialnet-Detail"), "exceeded") {
		t.Fatalf("a 4 MiB response head: %+v", resps)
	}
	// The request reached the upstream: allowed, and the detail says how
	// it ended.
	if ev := tp.event(t); ev.Decision != record.DecisionAllow || !strings.Contains(ev.Detail, "then upstream_bad_response") || ev.BytesDown > maxResponseHeaderBytes+4<<10 {
		t.Fatalf("event %+v", ev)
	}
	resps = rawExchange(t, tp.addr, "GET http://api.example.com/ok HTTP/1.1\r\nHost: api.example.com\r\n\r\n", 1)
	if len(resps) != 1 || resps[0].StatusCode != http.StatusOK || len(resps[0].Header.Get("X-Big")) != maxResponseHeaderBytes-4<<10 {
		t.Fatalf("a response head under the bound: %+v", resps)
	}
}

// An upstream's unsolicited 101 (the proxy never forwards Upgrade) is
// relayed with Connection: close, and the client connection then closes:
// it is not kept for another request.
func TestForwardUnsolicitedSwitchingProtocolsCloses(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:80"}, upstream: func(c *net.TCPConn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\nraw bytes")
		time.Sleep(time.Second)
	}})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	c, err := net.Dial("tcp", tp.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "GET http://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols || !resp.Close {
		t.Fatalf("got %s, close %v", resp.Status, resp.Close)
	}
	if _, err := io.ReadAll(br); err != nil {
		t.Fatalf("the client connection was kept open after a 101 it was told was closing: %v", err)
	}
	tp.event(t)
}
