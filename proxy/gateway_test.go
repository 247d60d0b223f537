//go:build linux

package proxy

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/internal/gwtest"
	"github.com/trialnet/trialnet/record"
	trialspec "github.com/trialnet/trialnet/trial"
)

const (
	gwHost   = "api.gw.test"
	gwSecret = "sk-gwtest-SECRET-0123456789"
)

// gwWorld is a proxy with a gateway Trial "gw" whose routes /a/ (x-api-key)
// and /o/ (authorization) reach a TLS upstream under a CA of the test's.
type gwWorld struct {
	tp    *testProxy
	up    *gwtest.Upstream
	addr  string // the gateway Trial's proxy endpoint, which serves its routes
	upTLS string // the upstream's own address, for a direct request
	ca    []byte
	lines chan string
}

func newGatewayWorld(t testing.TB, roots func(ca []byte) *x509.CertPool) *gwWorld {
	return newGatewayWorldLimits(t, roots, nil)
}

// newGatewayWorldLimits is newGatewayWorld with the gateway Trial's proxy
// limits (nil: the defaults).
func newGatewayWorldLimits(t testing.TB, roots func(ca []byte) *x509.CertPool, lim *trialspec.ProxyLimits) *gwWorld {
	return newGatewayWorldServing(t, roots, lim, nil)
}

// newGatewayWorldServing is newGatewayWorldLimits with the upstream's
// answers written by serve, after the fake provider has recorded the
// request (nil: the fake provider answers).
func newGatewayWorldServing(t testing.TB, roots func(ca []byte) *x509.CertPool, lim *trialspec.ProxyLimits, serve http.HandlerFunc) *gwWorld {
	return newGatewayWorldRoutes(t, roots, lim, serve, []GatewayRoute{
		{Path: "/a/", Host: gwHost, Port: 443, Header: "x-api-key", Secret: []byte(gwSecret)},
		{Path: "/o/", Host: gwHost, Port: 443, Header: "authorization", Secret: []byte(gwSecret)},
	})
}

// newGatewayWorldRoutes is newGatewayWorldServing with the Trial's routes.
func newGatewayWorldRoutes(t testing.TB, roots func(ca []byte) *x509.CertPool, lim *trialspec.ProxyLimits, serve http.HandlerFunc, routes []GatewayRoute) *gwWorld {
	t.Helper()
	caPEM, cert := gwtest.NewCA(t, gwHost)
	up := &gwtest.Upstream{}
	var h http.Handler = up
	if serve != nil {
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			up.ServeHTTP(httptest.NewRecorder(), r.Clone(r.Context())) // recorded only
			serve(w, r)
		})
	}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	lines := make(chan string, 1024)
	tp := newTestProxy(t, proxyOpts{allow: []string{gwHost + ":443"}, upstreamAddr: srv.Listener.Addr().String(),
		configure: func(c *Config) {
			events := c.OnEvent
			c.OnEvent = func(e *record.Event, line []byte) { lines <- string(line); events(e, line) }
		}})
	tp.dns.set(gwHost, 60, "93.184.216.34")
	list, err := allow.Parse([]string{gwHost + ":443"}, true) // require_tls: the gateway speaks TLS, so it admits a route
	if err != nil {
		t.Fatal(err)
	}
	if err := tp.AddTrial(TrialPolicy{Spec: trialspec.Spec{ID: "gw", Limits: proxyHalf(lim)}, Allow: list, Gateway: routes, GatewayRoots: roots(caPEM)}); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = tp.Serve(ln, "gw") }()
	return &gwWorld{tp: tp, up: up, addr: ln.Addr().String(), upTLS: srv.Listener.Addr().String(), ca: caPEM, lines: lines}
}

func withCA(ca []byte) *x509.CertPool {
	p := x509.NewCertPool()
	p.AppendCertsFromPEM(ca)
	return p
}

// do sends one raw request to the gateway and reads the response.
func (g *gwWorld) do(t *testing.T, raw string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", g.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("response to %q: %v", raw, err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// lastLine is the record line of the request just made, checked to hold
// no secret.
func (g *gwWorld) lastLine(t *testing.T) string {
	t.Helper()
	select {
	case l := <-g.lines:
		if strings.Contains(l, gwSecret) {
			t.Fatalf("a decision record holds the secret: %s", l)
		}
		return l
	case <-time.After(10 * time.Second):
		t.Fatal("no decision record")
		return ""
	}
}

func messagesRequest(path, hdr string) string {
	body := `{"model":"m","stream":false,"messages":[]}`
	return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: 127.0.0.1:3130\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", path, hdr, len(body), body)
}

func TestGatewaySetsTheCredential(t *testing.T) {
	g := newGatewayWorld(t, withCA)
	for _, c := range []struct{ path, header, want string }{
		{"/a/v1/messages", "X-Api-Key", gwSecret},
		{"/o/v1/chat/completions", "Authorization", "Bearer " + gwSecret},
	} {
		t.Run(c.path, func(t *testing.T) {
			n := len(g.up.Requests())
			resp, body := g.do(t, messagesRequest(c.path, c.header+": "+GatewayPlaceholder+"\r\n"))
			if resp.StatusCode != 200 || !strings.Contains(body, gwtest.Answer) {
				t.Fatalf("status %d body %q", resp.StatusCode, body)
			}
			got := g.up.Requests()[n]
			if v := got.Header.Values(c.header); len(v) != 1 || v[0] != c.want {
				t.Errorf("upstream got %s %q, want only the secret", c.header, v)
			}
			if wantURI := "/" + strings.SplitN(c.path, "/", 3)[2]; got.URI != wantURI || got.Host != gwHost {
				t.Errorf("upstream got %s %s, want %s %s", got.Host, got.URI, gwHost, wantURI)
			}
			if strings.Contains(body, gwSecret) {
				t.Error("the response holds the secret")
			}
			l := g.lastLine(t)
			for _, want := range []string{`"route":"` + c.path[:3] + `"`, `"status":200`, `"method":"POST"`, `"target":"` + c.path + `"`, `"decision":"allow"`} {
				if !strings.Contains(l, want) {
					t.Errorf("record lacks %s: %s", want, l)
				}
			}
		})
	}
}

// TestGatewayDropsTheTrialsVariantsOfTheField: a field whose name is
// the route's with '_' for '-' is the same field to an upstream that reads
// fields as CGI variables (HTTP_X_API_KEY): the Trial's value there would
// stand beside the secret, or in its place. It is not sent on.
func TestGatewayDropsTheTrialsVariantsOfTheField(t *testing.T) {
	g := newGatewayWorld(t, withCA)
	for _, c := range []struct{ path, variant string }{
		{"/a/v1/messages", "X_Api_Key"},
		{"/a/v1/messages", "x_API-key"},
		{"/o/v1/chat/completions", "AUTHORIZATION"},
	} {
		n := len(g.up.Requests())
		resp, body := g.do(t, messagesRequest(c.path, c.variant+": sk-the-trials-own\r\n"))
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d body %q", c.variant, resp.StatusCode, body)
		}
		g.lastLine(t)
		for name, vs := range g.up.Requests()[n].Header {
			for _, v := range vs {
				if strings.Contains(v, "sk-the-trials-own") {
					t.Errorf("%s: the upstream got the Trial's value in %s: %q", c.variant, name, v)
				}
			}
		}
	}
}

// TestGatewayStreamsUnbuffered: the first event of a streamed answer
// reaches the client while the upstream still holds the rest back.
func TestGatewayStreamsUnbuffered(t *testing.T) {
	g := newGatewayWorld(t, withCA)
	g.up.Hold = make(chan struct{})
	defer close(g.up.Hold)
	c, err := net.Dial("tcp", g.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := `{"model":"m","stream":true}`
	fmt.Fprintf(c, "POST /a/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second)) // a failure's bound, not a timing assertion
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || ev != "event: message_start\n" {
		t.Fatalf("first line %q, %v: the stream was held back", ev, err)
	}
}

func TestGatewayRefusals(t *testing.T) {
	g := newGatewayWorld(t, withCA)
	ph := GatewayPlaceholder
	for _, c := range []struct {
		name, raw string
		reason    record.Reason
	}{
		{"no route", messagesRequest("/z/v1/messages", ""), record.ReasonGatewayNoRoute},
		{"placeholder in another field", messagesRequest("/a/v1/messages", "Authorization: Bearer "+ph+"\r\n"), record.ReasonPlaceholderMisused},
		{"placeholder in another route's field", messagesRequest("/o/v1/messages", "X-Api-Key: "+ph+"\r\n"), record.ReasonPlaceholderMisused},
		{"placeholder in the query", messagesRequest("/a/v1/messages?key="+ph, ""), record.ReasonPlaceholderMisused},
		{"placeholder encoded in the path", messagesRequest("/a/v1/%74rialnet-gateway-placeholder", ""), record.ReasonPlaceholderMisused},
		{"dot segment", messagesRequest("/a/../o/v1/messages", ""), record.ReasonBadTarget},
		{"encoded slash", messagesRequest("/a/..%2fo/v1", ""), record.ReasonBadTarget},
		{"a network-path reference upstream", messagesRequest("/a//evil.test/v1/messages", ""), record.ReasonBadTarget},
		{"body over the bound", fmt.Sprintf("POST /a/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", maxGatewayBody+1), record.ReasonBodyTooLarge},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := len(g.up.Requests())
			resp, _ := g.do(t, c.raw)
			if got := record.Reason(resp.Header.Get("Trialnet-Reason")); got != c.reason || resp.StatusCode != c.reason.Status() {
				t.Fatalf("got %d %q, want %d %q", resp.StatusCode, got, c.reason.Status(), c.reason)
			}
			if len(g.up.Requests()) != n {
				t.Error("the refused request reached the upstream")
			}
			if l := g.lastLine(t); !strings.Contains(l, `"reason":"`+string(c.reason)+`"`) {
				t.Errorf("record: %s", l)
			}
		})
	}
}

// TestGatewayRouteOffTheAllowlist: a route whose upstream the Trial's
// allowlist no longer admits is refused when the request comes.
func TestGatewayRouteOffTheAllowlist(t *testing.T) {
	g := newGatewayWorld(t, withCA)
	if _, err := g.tp.SetAllow("gw", allow.New(), nil); err != nil {
		t.Fatal(err)
	}
	resp, _ := g.do(t, messagesRequest("/a/v1/messages", ""))
	if r := resp.Header.Get("Trialnet-Reason"); r != string(record.ReasonPolicyDenied) {
		t.Fatalf("got %d %q, want policy_denied", resp.StatusCode, r)
	}
	if len(g.up.Requests()) != 0 {
		t.Error("the upstream was reached")
	}
	g.lastLine(t)
}

// TestGatewayVerifiesTheUpstream: an upstream whose certificate the
// Trial's trust store does not hold is refused, and never sent the
// secret.
func TestGatewayVerifiesTheUpstream(t *testing.T) {
	g := newGatewayWorld(t, func([]byte) *x509.CertPool { return x509.NewCertPool() })
	resp, body := g.do(t, messagesRequest("/a/v1/messages", ""))
	if r := resp.Header.Get("Trialnet-Reason"); r != string(record.ReasonUpstreamTLS) {
		t.Fatalf("got %d %q %q, want upstream_tls_failed", resp.StatusCode, r, body)
	}
	if len(g.up.Requests()) != 0 {
		t.Error("the upstream got a request")
	}
	g.lastLine(t)
}

// TestPlaceholderRefusedOutsideTheGateway: the placeholder in a
// forwarded request or a CONNECT head is refused and recorded.
func TestPlaceholderRefusedOutsideTheGateway(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:80", "api.example.com:443"}})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	for _, head := range []string{
		"GET http://api.example.com/v1?k=" + GatewayPlaceholder + " HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
		"GET http://api.example.com/v1 HTTP/1.1\r\nHost: api.example.com\r\nX-Api-Key: " + GatewayPlaceholder + "\r\n\r\n",
		"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\nProxy-Authorization: Bearer " + strings.ToUpper(GatewayPlaceholder) + "\r\n\r\n",
	} {
		resp, _, _ := tp.connect(t, head)
		if r := resp.Header.Get("Trialnet-Reason"); r != string(record.ReasonPlaceholderMisused) {
			t.Errorf("%q: got %d %q, want placeholder_misused", head, resp.StatusCode, r)
		}
		if ev := tp.event(t); ev.Reason != record.ReasonPlaceholderMisused {
			t.Errorf("record reason %q", ev.Reason)
		}
	}
	if n := len(tp.dialer.addrs()); n != 0 {
		t.Errorf("%d dials for refused requests", n)
	}
}

// TestGatewayBoundsAChunkedBody: a body without a length is cut at the
// bound, and the request refused.
func TestGatewayBoundsAChunkedBody(t *testing.T) {
	g := newGatewayWorld(t, withCA)
	c, err := net.Dial("tcp", g.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	go func() {
		_, _ = io.WriteString(c, "POST /a/v1/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
		chunk := fmt.Sprintf("%x\r\n%s\r\n", 1<<20, strings.Repeat("x", 1<<20))
		for range maxGatewayBody>>20 + 2 {
			if _, err := io.WriteString(c, chunk); err != nil {
				return // refused: the gateway stopped reading
			}
		}
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Header.Get("Trialnet-Reason"); r != string(record.ReasonBodyTooLarge) {
		t.Fatalf("got %d %q, want request_body_too_large", resp.StatusCode, r)
	}
	g.lastLine(t)
}

// TestGatewayBoundsTheResponseHead: an upstream's response head past the
// bound is refused, not held whole.
func TestGatewayBoundsTheResponseHead(t *testing.T) {
	g := newGatewayWorld(t, withCA)
	g.up.Header = http.Header{"X-Big": {strings.Repeat("b", maxResponseHeaderBytes)}}
	resp, _ := g.do(t, messagesRequest("/a/v1/messages", ""))
	if r := resp.Header.Get("Trialnet-Reason"); r != string(record.ReasonUpstreamBadResponse) {
		t.Fatalf("got %d %q, want upstream_bad_response", resp.StatusCode, r)
	}
	g.lastLine(t)
}

// A route printed, logged or encoded by mistake does not show its secret.
func TestGatewaySecretDoesNotPrint(t *testing.T) {
	r := GatewayRoute{Path: "/a/", Host: gwHost, Port: 443, Header: "x-api-key", Secret: Secret(gwSecret)}
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("route", "route", r, "secret", r.Secret)
	j, _ := json.Marshal(r)
	for _, s := range []string{fmt.Sprint(r), fmt.Sprintf("%+v %#v %s %x %q", r, r, r.Secret, r.Secret, r.Secret), logged.String(), string(j)} {
		if strings.Contains(s, gwSecret) || strings.Contains(s, fmt.Sprintf("%x", gwSecret)) || strings.Contains(s, fmt.Sprint([]byte(gwSecret))) {
			t.Errorf("the secret shows: %s", s)
		}
	}
}

// TestPlaceholderEncodedIsFound: the placeholder base64'd (Basic
// credentials, a token that wraps it, URL-safe or padded or not) or
// percent-encoded twice is refused wherever the proxy sees it outside its
// route's header: another route, a forwarded request, a CONNECT head.
func TestPlaceholderEncodedIsFound(t *testing.T) {
	b64 := func(s string) []string {
		return []string{base64.StdEncoding.EncodeToString([]byte(s)), base64.RawURLEncoding.EncodeToString([]byte(s))}
	}
	var forms []string
	for _, s := range []string{"user:" + GatewayPlaceholder, GatewayPlaceholder, `{"k":"` + strings.ToUpper(GatewayPlaceholder) + `"}`, "ab" + GatewayPlaceholder} {
		forms = append(forms, b64(s)...)
	}
	fields := []string{}
	for _, f := range forms {
		fields = append(fields, "Authorization: Basic "+f, "Proxy-Authorization: Basic "+f, "Cookie: s="+f+"; a=b")
	}
	twice := "%2574rialnet-gateway-placeholder" // 't' percent-encoded twice
	for _, field := range fields {
		if !misplaced([]byte("GET /a/ HTTP/1.1\r\n"+field+"\r\n\r\n"), "x-api-key") {
			t.Errorf("not found in %q", field)
		}
	}
	if !lineMisplaces("GET /v1?k=" + twice + " HTTP/1.1") {
		t.Errorf("not found percent-encoded twice: %q", twice)
	}
	// The route's own header keeps its placeholder; nothing near it is found.
	for _, line := range []string{"X-Api-Key: " + GatewayPlaceholder, "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("user:trialnet-gateway")), "Cookie: " + strings.Repeat("QUJD", 40)} {
		if misplaced([]byte(line+"\r\n"), "x-api-key") {
			t.Errorf("found in %q", line)
		}
	}

	g := newGatewayWorld(t, withCA)
	basic := "Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("u:"+GatewayPlaceholder)) + "\r\n"
	resp, _ := g.do(t, messagesRequest("/a/v1/messages", basic))
	if r := resp.Header.Get("Trialnet-Reason"); r != string(record.ReasonPlaceholderMisused) {
		t.Errorf("Basic credentials on another route's field: %d %q", resp.StatusCode, r)
	}
	g.lastLine(t)
	tp := newTestProxy(t, proxyOpts{allow: []string{"api.example.com:80", "api.example.com:443"}})
	tp.dns.set("api.example.com", 60, "93.184.216.34")
	for _, head := range []string{
		"GET http://api.example.com/v1 HTTP/1.1\r\nHost: api.example.com\r\n" + basic + "\r\n",
		"GET http://api.example.com/v1?k=" + twice + " HTTP/1.1\r\nHost: api.example.com\r\n\r\n",
		"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\nProxy-" + basic + "\r\n",
	} {
		resp, _, _ := tp.connect(t, head)
		if r := resp.Header.Get("Trialnet-Reason"); r != string(record.ReasonPlaceholderMisused) {
			t.Errorf("%q: got %d %q, want placeholder_misused", head, resp.StatusCode, r)
		}
		tp.event(t)
	}
}
