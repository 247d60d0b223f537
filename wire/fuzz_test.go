//go:build linux

package wire

import (
	"bufio"
	"bytes"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/internal/tlstest"
	"github.com/trialnet/trialnet/record"
)

// Seed corpora live in testdata/fuzz/<target>/; `make fuzz` runs each
// target for a bounded time.

func FuzzParseRequest(f *testing.F) {
	f.Add([]byte("CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := ReadRequest(bufio.NewReader(bytes.NewReader(data)))
		// What reaches a record as the method or target is ASCII,
		// refused or not (terminal controls stay out of it).
		if req != nil && !IsASCII(req.Method+req.Target+req.Version) {
			t.Fatalf("non-ASCII request line parsed: %+q", req.Method+" "+req.Target+" "+req.Version)
		}
		if err != nil {
			if record.ReasonOf(err) == "" {
				t.Fatalf("refusal without a reason: %v", err)
			}
			return
		}
		// Whatever passes is a clean, normalised name and port that
		// parses again to itself and is not an IP address.
		if req.Port == 0 || req.Host == "" || req.Host != strings.ToLower(req.Host) || strings.HasSuffix(req.Host, ".") {
			t.Fatalf("accepted %+v", req)
		}
		if isIPLiteral(req.Host) {
			t.Fatalf("accepted an IP literal %q", req.Host)
		}
		if _, err := netip.ParseAddr(req.Host); err == nil {
			t.Fatalf("accepted an address %q", req.Host)
		}
		h, p, err := parseTarget(req.HostPort())
		if err != nil || h != req.Host || p != req.Port {
			t.Fatalf("%q does not round-trip: %q %d %v", req.HostPort(), h, p, err)
		}
		for _, c := range []byte(req.Host) {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
				t.Fatalf("accepted byte %q in %q", c, req.Host)
			}
		}
	})
}

func FuzzClientHello(f *testing.F) {
	f.Add([]byte{0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x00, 0x00, 0x00})
	f.Add([]byte{0x15, 0x03, 0x01, 0x00, 0x02, 0x01, 0x5a, 0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x00, 0x00, 0x00})
	f.Add([]byte{0x80, 0x2e, 0x01, 0x00, 0x02})
	f.Fuzz(func(t *testing.T, data []byte) {
		kind := ClassifyStream(data)
		if len(data) > 0 && data[0] >= 0x14 && data[0] <= 0x17 && kind != streamTLS {
			t.Fatalf("first byte %#x is a TLS record type but the stream is not TLS", data[0])
		}
		msg, _, err := clientHelloRecords(data, false)
		if record.ReasonOf(err) == record.ReasonTLSRecordBeforeHello && kind != streamTLS {
			t.Fatalf("a record before the hello in a stream that is not TLS: %v", err)
		}
		if err != nil {
			return
		}
		// Only handshake records carry a ClientHello.
		if data[0] != RecordTypeHandshake {
			t.Fatalf("a ClientHello was assembled from a stream starting %#x", data[0])
		}
		info, err := parseClientHello(msg)
		if err != nil {
			return
		}
		if info.ServerName != "" {
			// Whatever name was parsed, only the exact CONNECT host passes
			// (in any case, with no trailing dot).
			if CheckSNI(info, "api.example.com") == nil && !info.ECH &&
				strings.ToLower(info.ServerName) != "api.example.com" {
				t.Fatalf("SNI %q passed as api.example.com", info.ServerName)
			}
		}
	})
}

func FuzzServerHello(f *testing.F) {
	f.Add(tlstest.ServerHelloRecord(false))
	f.Add(append(tlstest.ReRecord(tlstest.ServerHelloRecord(true), 7), 0x14, 0x03, 0x03, 0x00, 0x01, 0x01))
	f.Add(append([]byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x01, 0x70}, tlstest.ServerHelloRecord(false)...))
	f.Add([]byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x28})
	f.Fuzz(func(t *testing.T, data []byte) {
		n, retry, err := ServerHelloRecords(data)
		if err != nil {
			return
		}
		if n < recordHeaderLen || n > len(data) {
			t.Fatalf("%d bytes consumed of %d", n, len(data))
		}
		// The verdict rests on the records up to n alone: what follows
		// (the client's next flight has not even been sent) cannot change it.
		if m, r, err := ServerHelloRecords(data[:n]); err != nil || m != n || r != retry {
			t.Fatalf("on its own records: %d %v %v, want %d %v", m, r, err, n, retry)
		}
	})
}

// FuzzRetryClientHello: before the second ClientHello only dummy
// change_cipher_spec records are passed over.
func FuzzRetryClientHello(f *testing.F) {
	f.Add(append([]byte{0x14, 0x03, 0x03, 0x00, 0x01, 0x01}, tlstest.ClientHello(f, "api.example.com")...))
	f.Add(append([]byte{0x14, 0x03, 0x03, 0x00, 0x01, 0x02}, tlstest.ClientHello(f, "api.example.com")...))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, n, err := clientHelloRecords(data, true)
		if err != nil {
			return
		}
		b := data[:n]
		for b[0] != RecordTypeHandshake {
			if len(b) < 6 || !isDummyCCS(b[0], b[5:6]) || b[3] != 0 || b[4] != 1 {
				t.Fatalf("record %x passed over before a ClientHello", b[:min(6, len(b))])
			}
			b = b[6:]
		}
		if _, _, err := clientHelloRecords(b, false); err != nil {
			t.Fatalf("without the change_cipher_spec records the ClientHello fails: %v", err)
		}
	})
}

func FuzzHTTPHead(f *testing.F) {
	f.Add([]byte("GET http://api.example.com/x?y HTTP/1.1\r\nHost: api.example.com\r\n\r\n"))
	f.Add([]byte("POST http://api.example.com:8080/ HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"))
	f.Add([]byte("GET https://api.example.com/ HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		end := headEnd(data)
		if end == 0 {
			return
		}
		req, err := ParseHTTPHead(data[:end])
		if err != nil {
			if record.ReasonOf(err) == "" {
				t.Fatalf("refusal without a reason: %v", err)
			}
			return
		}
		// Whatever passes names a clean host and port, and net/http
		// frames it without complaint and with one body length.
		if req.Port == 0 || req.Host == "" || isIPLiteral(req.Host) || !forwardedMethods[req.Method] {
			t.Fatalf("accepted %+v", req)
		}
		in, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(data[:end])))
		if err != nil {
			t.Fatalf("accepted a head net/http refuses: %v", err)
		}
		if len(in.Header.Values("Content-Length")) > 0 && len(in.TransferEncoding) > 0 {
			t.Fatalf("accepted both Content-Length and Transfer-Encoding: %q", data[:end])
		}
	})
}

func FuzzGatewayHead(f *testing.F) {
	f.Add([]byte("POST /anthropic/v1/messages?beta=true HTTP/1.1\r\nHost: 127.0.0.1:3128\r\nX-Api-Key: k\r\nContent-Length: 2\r\n\r\n"))
	f.Add([]byte("GET /a/../b/%2e%2E/x HTTP/1.1\r\nHost: x\r\n\r\n"))
	f.Add([]byte("GET /a/b\\c#d HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		end := headEnd(data)
		if end == 0 {
			return
		}
		req, err := ParseGatewayHead(data[:end])
		if err != nil {
			if record.ReasonOf(err) == "" {
				t.Fatalf("refusal without a reason: %v", err)
			}
			return
		}
		// Whatever passes is a path with no segment that could climb out
		// of its route, and net/http frames it with one body length and
		// reads the same path.
		path, _, _ := strings.Cut(req.Target, "?")
		if !strings.HasPrefix(path, "/") || !forwardedMethods[req.Method] {
			t.Fatalf("accepted %+v", req)
		}
		for _, seg := range strings.Split(path, "/") {
			if seg == "." || seg == ".." {
				t.Fatalf("accepted a dot segment: %q", req.Target)
			}
		}
		in, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(data[:end])))
		if err != nil {
			t.Fatalf("accepted a head net/http refuses: %v", err)
		}
		if len(in.Header.Values("Content-Length")) > 0 && len(in.TransferEncoding) > 0 {
			t.Fatalf("accepted both Content-Length and Transfer-Encoding: %q", data[:end])
		}
		if in.URL.Path != "" && in.URL.Path != path && in.URL.RawPath == "" {
			if u, _ := url.PathUnescape(path); u != in.URL.Path {
				t.Fatalf("net/http reads path %q, the gateway matched %q", in.URL.Path, path)
			}
		}
		if strings.Contains(in.URL.Path, "/../") || strings.HasSuffix(in.URL.Path, "/..") {
			t.Fatalf("net/http decodes a dot segment from %q: %q", req.Target, in.URL.Path)
		}
	})
}

// The forwarder classifies a transparent connection's first bytes as they
// come, and acts on the first verdict that is not "more": a prefix judged
// not HTTP must leave the whole not HTTP, or a client that sends the
// prefix first has the rest (a request naming another Host) tunnelled
// unjudged. Told the bytes ended, the classifier never asks for more.
func FuzzClassifyHTTP(f *testing.F) {
	for _, s := range []string{"GET / HTTP/1.1\r\nHost: a\r\n\r\n", "SSH-2.0-x\r\n", "\r\n\r\n\x00\r\nQUIT\n", "PROXY TCP4 a b 1 2\r\n",
		"OPTIONS * RTSP/1.0\r\n", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "get foo\r\n", "\x16\x03\x01\x00", "GET x://o/\r\n", "SOURCE * ICE/1.0\r\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 2048 {
			return
		}
		whole, _ := ClassifyHTTP(b, false)
		ended, more := ClassifyHTTP(b, true)
		if more {
			t.Fatalf("%q, ended: asks for more", b)
		}
		for k := 0; k <= len(b); k++ {
			if is, more := ClassifyHTTP(b[:k], false); !is && !more && (whole || ended) {
				t.Fatalf("%q judged not HTTP, but the whole %q is HTTP (ended: %v)", b[:k], b, ended)
			}
		}
	})
}
