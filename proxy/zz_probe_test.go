//go:build linux

package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestZZProbe(t *testing.T) {
	g := newGatewayWorldServing(t, withCA, nil, func(w http.ResponseWriter, r *http.Request) {
		var b strings.Builder
		fmt.Fprintf(&b, "UP %s host=%q uri=%q hdr=", r.Method, r.Host, r.RequestURI)
		for k, v := range r.Header {
			fmt.Fprintf(&b, "%s=%q;", k, v)
		}
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(&b, " body=%q trailer=%v", body, r.Trailer)
		w.Header().Set("X-Seen", strings.ReplaceAll(strings.ReplaceAll(b.String(), gwSecret, "<<SECRET>>"), "\n", " "))
		w.WriteHeader(200)
	})
	for _, raw := range []string{
		"GET /a/x HTTP/1.1\r\nHost: evil.example\r\nX-Api-Key: mine\r\n\r\n",
		"GET /a/x HTTP/1.1\r\nHost: x\r\nConnection: x-api-key\r\nX-Api-Key: mine\r\n\r\n",
		"GET /a/x HTTP/1.1\r\nHost: x\r\nx_api_key: mine\r\n\r\n",
		"GET /a/;@evil.example/x HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /a/http://evil.example/ HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /a/%252e%252e/x HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /a HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /a/?x HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /a/x?/../../ HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /a/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTrailer: X-Api-Key\r\n\r\n3\r\nabc\r\n0\r\nX-Api-Key: trailer\r\nAuthorization: t2\r\n\r\n",
		"GET /a/x HTTP/1.1\r\nHost: x\r\nX-Api-Key: a\r\nX-API-KEY: b\r\n\r\n",
		"GET /a/x HTTP/1.1\r\nHost: x\r\nTE: trailers\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
		"GET /a/x HTTP/1.1\r\nHost: x\r\nAccept-Charset: utf-16\r\nMax-Forwards: 0\r\nX-HTTP-Method-Override: TRACE\r\n\r\n",
		"GET /a/x HTTP/1.0\r\n\r\n",
		"GET /o/x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer mine\r\nauthorization: Basic x\r\n\r\n",
	} {
		c, err := net.Dial("tcp", g.addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.WriteString(c, raw)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Logf("%q -> err %v", raw, err)
			c.Close()
			continue
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		t.Logf("%q\n  -> %s %s\n  %s", raw, resp.Status, resp.Header.Get("X-Seen"), b)
		c.Close()
	}
}
