//go:build linux

package proxy

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"
)

// echoed is what an upstream that reflects the request's credential
// makes of it: every header value it was sent, one after another.
func echoed(r *http.Request) string {
	return r.Header.Get("X-Api-Key") + r.Header.Get("Authorization")
}

// readAllOf sends raw to the gateway and returns every byte the client
// got, as sent and with the body de-chunked and decompressed where it
// can be: a secret split across chunks shows only in the second form.
func (g *gwWorld) readAllOf(t *testing.T, raw string) (wireBytes, decoded string) {
	t.Helper()
	c, err := net.Dial("tcp", g.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second)) // a failure's bound
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	var all bytes.Buffer
	resp, err := http.ReadResponse(bufio.NewReader(io.TeeReader(c, &all)), nil)
	if err != nil {
		return all.String(), ""
	}
	body, _ := io.ReadAll(resp.Body) // a cut answer is read up to the cut
	if zr, err := gzip.NewReader(bytes.NewReader(body)); err == nil {
		if plain, err := io.ReadAll(zr); len(plain) > 0 || err == nil {
			body = plain
		}
	}
	var hdr strings.Builder
	_ = resp.Header.Write(&hdr)
	_ = resp.Trailer.Write(&hdr)
	return all.String(), resp.Status + "\n" + hdr.String() + string(body)
}

// TestGatewayUpstreamEchoNeverReachesTheTrial: an upstream that reflects
// the request's credential — in a header, a redirect's Location, a
// trailer, a 401's body, a streamed body that splits it across chunks, a
// compressed body, a malformed head that net/http quotes in its error —
// hands the Trial nothing of it, nor the records; the Trial gets a
// refusal or an answer cut before the secret.
func TestGatewayUpstreamEchoNeverReachesTheTrial(t *testing.T) {
	for _, c := range []struct {
		name  string
		hdr   string // the Trial's own extra fields
		serve http.HandlerFunc
	}{
		{"response header", "", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Echo", echoed(r))
		}},
		{"redirect location", "", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "https://elsewhere.test/?k="+echoed(r), http.StatusTemporaryRedirect)
		}},
		{"trailer", "", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", "X-Echo")
			_, _ = io.WriteString(w, "body")
			w.Header().Set("X-Echo", echoed(r))
		}},
		{"trailer name", "", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", r.Header.Get("X-Api-Key"))
			_, _ = io.WriteString(w, "body")
			w.Header().Set(r.Header.Get("X-Api-Key"), "v")
		}},
		{"401 body", "", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"error":"invalid key `+echoed(r)+`"}`)
		}},
		{"split across chunks", "", func(w http.ResponseWriter, r *http.Request) {
			e := echoed(r)
			for i := range len(e) {
				_, _ = io.WriteString(w, e[i:i+1])
				w.(http.Flusher).Flush()
			}
		}},
		{"compressed at the Trial's asking", "Accept-Encoding: gzip\r\n", func(w http.ResponseWriter, r *http.Request) {
			// Compressed unless identity alone is asked for: no field at
			// all leaves any coding acceptable.
			if r.Header.Get("Accept-Encoding") == "identity" {
				_, _ = io.WriteString(w, "plain")
				return
			}
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			_, _ = io.WriteString(zw, echoed(r))
			_ = zw.Close()
		}},
		{"compressed unasked", "", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			_, _ = io.WriteString(zw, echoed(r))
			_ = zw.Close()
		}},
		{"compressed, its coding named hop-by-hop", "", func(w http.ResponseWriter, r *http.Request) {
			// Connection: content-encoding would have the field dropped as
			// hop-by-hop, and the coded body pass as plain.
			w.Header().Set("Connection", "content-encoding")
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			_, _ = io.WriteString(zw, echoed(r))
			_ = zw.Close()
		}},
		{"a range of it", "Range: bytes=3-12\r\n", func(w http.ResponseWriter, r *http.Request) {
			http.ServeContent(w, r, "", time.Time{}, strings.NewReader(echoed(r)))
		}},
		{"a range of it, asked as Request-Range", "Request-Range: bytes=3-12\r\n", func(w http.ResponseWriter, r *http.Request) {
			// Apache httpd reads Request-Range (Netscape's draft) where
			// Range is absent.
			if rr := r.Header.Get("Request-Range"); rr != "" && r.Header.Get("Range") == "" {
				r.Header.Set("Range", rr)
			}
			http.ServeContent(w, r, "", time.Time{}, strings.NewReader(echoed(r)))
		}},
		{"quoted in net/http's error", "", func(w http.ResponseWriter, r *http.Request) {
			c, brw, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			_, _ = brw.WriteString("HTTP/1.1 200 OK\r\nBad line " + echoed(r) + "\r\n\r\n")
			_ = brw.Flush()
		}},
		{"quoted in net/http's error, a control byte after each", "", func(w http.ResponseWriter, r *http.Request) {
			c, brw, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			defer c.Close()
			// %q spells each \x01 as four characters: the secret's own
			// forms are nowhere in the quote, but between its escapes.
			var spread strings.Builder
			for _, b := range []byte(echoed(r)) {
				spread.WriteByte(b)
				spread.WriteByte(1)
			}
			_, _ = brw.WriteString("HTTP/1.1 200 OK\r\nX-Echo: " + spread.String() + "\r\n\r\n")
			_ = brw.Flush()
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := newGatewayWorldServing(t, withCA, nil, c.serve)
			for _, route := range []string{"/a/", "/o/"} {
				wireBytes, decoded := g.readAllOf(t, messagesRequest(route+"v1/messages", c.hdr))
				if len(g.up.Requests()) == 0 {
					t.Fatal("the request never reached the upstream")
				}
				// A range of it: any ten bytes of the secret, in any case
				// (a field's name is canonicalised), are a leak.
				line := g.lastLine(t) // fails on a record holding the secret
				unescaped := strings.NewReplacer(`\x01`, "", `\\x01`, "")
				for _, s := range []string{gwSecret, gwSecret[3:13]} {
					s = strings.ToLower(s)
					if containsFold(wireBytes, s) || containsFold(decoded, s) || containsFold(unescaped.Replace(wireBytes), s) {
						t.Errorf("%s: the Trial got the secret (%q):\n%s\n--- decoded:\n%s", route, s, wireBytes, decoded)
					}
					if containsFold(unescaped.Replace(line), s) {
						t.Errorf("%s: the record holds the secret (%q), escaped: %s", route, s, line)
					}
				}
				t.Logf("%s", line)
			}
		})
	}
}

// TestSecretFilterPassesNearMisses: a body that holds pieces of the
// secret but never the whole passes whole, however it is read; one that
// holds it ends before its first byte.
func TestSecretFilterPassesNearMisses(t *testing.T) {
	s := Secret(gwSecret)
	near := "a" + gwSecret[:10] + "b" + gwSecret[:len(gwSecret)-1] + "\n" + gwSecret[1:] + gwSecret[:5]
	for _, c := range []struct {
		body    string
		want    string
		echoing bool
	}{
		{near, near, false},
		{"data: x\n\n" + gwSecret[:4] + gwSecret + "tail", "data: x\n\n" + gwSecret[:4], true},
	} {
		f := &secretFilter{body: io.NopCloser(iotest.OneByteReader(strings.NewReader(c.body))), resp: &http.Response{}, forms: secretForms(s)}
		got, err := io.ReadAll(iotest.OneByteReader(f))
		if string(got) != c.want || (err != nil) != c.echoing {
			t.Errorf("%q: passed %q, %v; want %q", c.body, got, err, c.want)
		}
	}
}

// TestGatewayTransformedEchoNeverReachesTheTrial: an upstream that echoes
// the credential re-coded — another case, base64 at each alignment
// (standard or URL-safe), hex — in a body or a field hands the Trial
// none of those forms either.
func TestGatewayTransformedEchoNeverReachesTheTrial(t *testing.T) {
	forms := map[string]func(string) string{
		"upper case":       strings.ToUpper,
		"base64":           func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) },
		"base64 after one": func(s string) string { return base64.StdEncoding.EncodeToString([]byte("{" + s))[4:] },
		"url-safe after two": func(s string) string {
			return base64.RawURLEncoding.EncodeToString([]byte("{\"" + s))[4:]
		},
		"hex":       func(s string) string { return hex.EncodeToString([]byte(s)) },
		"upper hex": func(s string) string { return strings.ToUpper(hex.EncodeToString([]byte(s))) },
		"utf-16le":  func(s string) string { return wideOf(s, 2, false) },
		"utf-16be":  func(s string) string { return wideOf(s, 2, true) },
		"utf-32le":  func(s string) string { return wideOf(s, 4, false) },
		"utf-32be":  func(s string) string { return wideOf(s, 4, true) },
	}
	for name, form := range forms {
		for _, inHead := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, in the head %v", name, inHead), func(t *testing.T) {
				g := newGatewayWorldServing(t, withCA, nil, func(w http.ResponseWriter, r *http.Request) {
					if inHead {
						w.Header().Set("X-Echo", form(r.Header.Get("X-Api-Key")))
					}
					_, _ = io.WriteString(w, "data: "+form(r.Header.Get("X-Api-Key"))+"\n\n")
				})
				wireBytes, decoded := g.readAllOf(t, messagesRequest("/a/v1/messages", ""))
				if len(g.up.Requests()) == 0 {
					t.Fatal("the request never reached the upstream")
				}
				if f := form(gwSecret); strings.Contains(wireBytes, f) || strings.Contains(decoded, f) {
					t.Errorf("the Trial got the secret as %q:\n%s", f, wireBytes)
				}
				t.Logf("%s", g.lastLine(t))
			})
		}
	}
}

// TestSecretFormsOfAnAwkwardSecret: a secret with characters that
// quoting changes is found as JSON (with and without "\/"), %q,
// percent-encoding and HTML (Go's and Python's) spell it, and never let
// through.
func TestSecretFormsOfAnAwkwardSecret(t *testing.T) {
	secret := `ab/c+d"e\f=gh-0123456789`
	j, _ := json.Marshal(secret)
	q := strconv.Quote(secret)
	py := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;", "'", "&#x27;") // Python's html.escape
	for _, form := range []string{string(j[1 : len(j)-1]), strings.ReplaceAll(string(j[1:len(j)-1]), "/", `\/`), q[1 : len(q)-1], url.QueryEscape(secret), url.PathEscape(secret),
		html.EscapeString(secret), py.Replace(secret)} {
		body := `{"echo":"` + form + `"}`
		f := &secretFilter{body: io.NopCloser(strings.NewReader(body)), resp: &http.Response{}, forms: secretForms(Secret(secret))}
		got, err := io.ReadAll(f)
		if err == nil || strings.Contains(string(got), form[:10]) {
			t.Errorf("%s: passed %q, %v", form, got, err)
		}
	}
}

// TestGatewayAsksForNoCoding: the gateway asks for identity whatever the
// Trial asked, so that an upstream that may code its answer (no field
// leaves any coding acceptable) answers one the check can read, and the
// Trial gets it rather than a refusal; nor does it pass on a charset the
// Trial asks for (UTF-32 spells the secret in none of the forms looked
// for), in either field's name or its '_' spelling, which an upstream
// that reads fields as CGI variables takes for it, or as a parameter of
// Accept.
func TestGatewayAsksForNoCoding(t *testing.T) {
	g := newGatewayWorldServing(t, withCA, nil, func(w http.ResponseWriter, r *http.Request) {
		if cs := cgiField(r, "Accept-Charset"); len(cs) > 0 {
			_, _ = io.WriteString(w, "in "+strings.Join(cs, ", "))
			return
		}
		if a := strings.Join(r.Header.Values("Accept"), ","); strings.Contains(strings.ToLower(a), "charset") {
			_, _ = io.WriteString(w, "in "+a)
			return
		}
		if ae := cgiField(r, "Accept-Encoding"); len(ae) != 1 || ae[0] != "identity" {
			w.Header().Set("Content-Encoding", "gzip")
			zw := gzip.NewWriter(w)
			_, _ = io.WriteString(zw, "coded")
			_ = zw.Close()
			return
		}
		_, _ = io.WriteString(w, "plain")
	})
	for _, asked := range []string{"", "Accept-Encoding: gzip, br\r\n", "Accept-Charset: utf-32\r\n",
		"Accept_Charset: utf-32\r\n", "accept_encoding: gzip\r\n", "Accept: text/plain; charset=utf-7\r\n",
		"Accept: application/json, text/plain;q=0.5;CHARSET*=cp500\r\n", "Accept: text/plain;charset=\"utf-7\"\r\n"} {
		resp, body := g.do(t, messagesRequest("/a/v1/messages", asked))
		if resp.StatusCode != 200 || body != "plain" {
			t.Errorf("asking %q: %d %q %s", asked, resp.StatusCode, body, resp.Header.Get("Trialnet-Detail"))
		}
		g.lastLine(t)
	}
	// The media ranges asked for stay.
	reqs := g.up.Requests()
	if got := reqs[len(reqs)-1].Header.Values("Accept"); len(got) != 1 || got[0] != "text/plain" {
		t.Errorf("the upstream was sent Accept %q, want text/plain", got)
	}
}

// cgiField is every value of the fields of r an upstream that reads
// fields as CGI variables (HTTP_ACCEPT_CHARSET) takes for name: any case,
// '_' for '-'.
func cgiField(r *http.Request, name string) []string {
	var vs []string
	for n, v := range r.Header {
		if strings.EqualFold(strings.ReplaceAll(n, "_", "-"), name) {
			vs = append(vs, v...)
		}
	}
	return vs
}

// BenchmarkSecretFilter is the echo check's cost on one 4 KiB answer,
// with the Trial's forms made (once, when it is added): of one route,
// and of two with their own secrets (every answer is searched for
// both); and the making of one route's forms ("forms").
func BenchmarkSecretFilter(b *testing.B) {
	body := strings.Repeat(`data: {"type":"content_block_delta","delta":{"text":"hello"}}`+"\n\n", 80)[:4096]
	one := []GatewayRoute{{Secret: Secret(gwSecret)}}
	two := append(one, GatewayRoute{Secret: Secret("sk-proj-other-route-SECRET-9876543210")})
	for name, routes := range map[string][]GatewayRoute{"answer": one, "answer-two-routes": two} {
		b.Run(name, func(b *testing.B) {
			forms := routesForms(routes)
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				f := &secretFilter{body: io.NopCloser(strings.NewReader(body)), resp: &http.Response{}, forms: forms}
				if _, err := io.Copy(io.Discard, f); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("forms", func(b *testing.B) {
		for b.Loop() {
			routesForms(one)
		}
	})
}

// wideOf is ASCII s in UTF-16 (width 2) or UTF-32 (width 4), little- or
// big-endian: what an upstream that answers in the charset asked for
// makes of it.
func wideOf(s string, width int, bigEndian bool) string {
	var b strings.Builder
	pad := strings.Repeat("\x00", width-1)
	for i := range len(s) {
		if bigEndian {
			b.WriteString(pad + s[i:i+1])
		} else {
			b.WriteString(s[i:i+1] + pad)
		}
	}
	return b.String()
}

// TestGatewayUnsolicitedEchoNotLogged: an upstream that sends the
// credential after the end of its answer has net/http's Transport quote
// it in the standard log, as bytes on an idle connection; the output
// AddTrial gives the log for a Trial with routes (quietStdLog), in any
// process that serves one, says so without them.
func TestGatewayUnsolicitedEchoNotLogged(t *testing.T) {
	logged := make(chan string, 4)
	prev := log.Writer()
	log.SetOutput(lineWriter(logged)) // the process's own, not yet quiet
	t.Cleanup(func() { log.SetOutput(prev) })
	g := newGatewayWorldServing(t, withCA, nil, func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = brw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + "after the end " + echoed(r))
		_ = brw.Flush()
		_, _ = io.Copy(io.Discard, c) // until the Transport drops the connection it logged
	})
	c, err := net.Dial("tcp", g.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second)) // a failure's bound
	if _, err := io.WriteString(c, "GET /a/v1/models HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(resp.Body); string(b) != "ok" {
		t.Fatalf("answer %q", b)
	}
	select {
	case line := <-logged:
		if !strings.Contains(line, "Unsolicited response") || strings.Contains(strings.ToLower(line), strings.ToLower(gwSecret)) {
			t.Errorf("the standard log got %q", line)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("net/http logged nothing of the unsolicited bytes")
	}
}

// lineWriter sends each write to lines.
type lineWriter chan string

func (l lineWriter) Write(p []byte) (int, error) {
	select {
	case l <- string(p):
	default:
	}
	return len(p), nil
}

// TestGatewayOtherRoutesSecretNeverReachesTheTrial: two routes of one
// Trial with two secrets and one upstream, which answers one route's
// request with what the other's carried (a cache keyed by path alone, or
// a connection the two share out of step): the answer is searched for
// every secret of the Trial's routes, not only its own route's.
func TestGatewayOtherRoutesSecretNeverReachesTheTrial(t *testing.T) {
	const other = "sk-other-route-SECRET-9876543210"
	var mu sync.Mutex
	var last string // the credential of the upstream's previous request
	g := newGatewayWorldRoutes(t, withCA, nil, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		prev := last
		last = echoed(r)
		mu.Unlock()
		_, _ = io.WriteString(w, "cached: "+prev+"\n")
	}, []GatewayRoute{
		{Path: "/a/", Host: gwHost, Port: 443, Header: "x-api-key", Secret: []byte(gwSecret)},
		{Path: "/o/", Host: gwHost, Port: 443, Header: "authorization", Secret: []byte(other)},
	})
	for _, route := range []string{"/a/", "/o/", "/a/"} {
		wireBytes, decoded := g.readAllOf(t, messagesRequest(route+"v1/messages", ""))
		for _, s := range []string{gwSecret, other} {
			if containsFold(wireBytes, strings.ToLower(s)) || containsFold(decoded, strings.ToLower(s)) {
				t.Errorf("%s: the Trial got a route's secret (%q):\n%s", route, s, wireBytes)
			}
		}
		if line := g.lastLine(t); strings.Contains(line, other) {
			t.Errorf("a decision record holds the other route's secret: %s", line)
		}
	}
	if n := len(g.up.Requests()); n != 3 {
		t.Fatalf("the upstream saw %d requests, want 3", n)
	}
}
