//go:build linux

package proxy

import (
	"strings"
	"testing"
)

func TestZZProbe(t *testing.T) {
	g := newGatewayWorld(t, withCA)
	ph := GatewayPlaceholder
	body := `{"model":"m"}`
	for _, raw := range []string{
		"POST /a/v1/messages HTTP/1.1\r\nHost: evil.test\r\nX-Api-Key: a\r\nx-api-key: b\r\nConnection: x-api-key\r\nContent-Length: 13\r\n\r\n" + body,
		"POST /a//evil.test/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 13\r\n\r\n" + body,
		"POST /a/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 13\r\nTransfer-Encoding: chunked\r\n\r\n" + body,
		"POST /a/v1/messages HTTP/1.1\r\nHost: x\r\nX-Foo: a\r\n b\r\nContent-Length: 13\r\n\r\n" + body,
		"POST /a/v1/messages HTTP/1.1\nHost: x\nContent-Length: 13\n\n" + body,
		"POST /a/v1/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nd;ext=" + ph + "\r\n" + body + "\r\n0\r\n\r\n",
		"POST /a/v1/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTrailer: X-Api-Key\r\n\r\nd\r\n" + body + "\r\n0\r\nX-Api-Key: zzz\r\n\r\n",
		"GET /a/v1/messages HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
		"GET /a/v1/messages HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n",
		"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"CONNECT api.gw.test:443 HTTP/1.1\r\nHost: api.gw.test:443\r\n\r\n",
		"GET http://api.gw.test:443/a/v1/messages HTTP/1.1\r\nHost: api.gw.test:443\r\n\r\n",
		"GET http://127.0.0.1:3128/a/v1/messages HTTP/1.1\r\nHost: 127.0.0.1:3128\r\n\r\n",
		"GET https://api.gw.test/v1/messages HTTP/1.1\r\nHost: api.gw.test\r\n\r\n",
		"GET /a/v1/messages%3f HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /a/v1/%00 HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /a/v1/messages?x=%0d%0aX-Injected:1 HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /a/%0d%0aX-Injected:%201 HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /a/v1/messages HTTP/1.0\r\n\r\n",
		"GET /a/v1/messages HTTP/1.1\r\nHost: x\r\nMax-Forwards: 0\r\nVia: 1.1 evil\r\nForwarded: for=evil\r\n\r\n",
		"GET /a/v1/messages HTTP/1.1\r\nHost: x\r\nX-Api-Key : zzz\r\n\r\n",
		"GET /a/v1/messages HTTP/1.1\r\nHost: x\r\nX-Api-Key\t: zzz\r\n\r\n",
		"GET /a/v1/messages HTTP/1.1\r\nHost: x\r\nX_Api_Key: zzz\r\n\r\n",
	} {
		n := len(g.up.Requests())
		resp, b := g.do(t, raw)
		line := ""
		if up := g.up.Requests(); len(up) > n {
			s := up[len(up)-1]
			line = s.Method + " " + s.Host + " " + s.URI + " " + strings.ReplaceAll(strings.ReplaceAll(strings.Join(hdrs(s.Header), "|"), gwSecret, "SECRET"), "\n", " ")
		}
		t.Logf("%q\n   -> %d %s %s | upstream: %s", raw[:min(len(raw), 90)], resp.StatusCode, resp.Header.Get("Trialnet-Reason"), strings.TrimSpace(b[:min(len(b), 120)]), line)
		g.lastLine(t)
	}
}

func hdrs(h map[string][]string) []string {
	var out []string
	for k, v := range h {
		out = append(out, k+"="+strings.Join(v, ","))
	}
	return out
}
