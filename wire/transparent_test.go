package wire

import (
	"strings"
	"testing"

	"github.com/trialnet/trialnet/record"
)

func TestParseTransparentHead(t *testing.T) {
	const host, port = "api.example.com", 8080
	for _, c := range []struct {
		head string
		want record.Reason // "" accepted
	}{
		{"GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n", ""},
		{"GET /a?b HTTP/1.1\r\nHost: API.example.com.:8080\r\n\r\n", ""},
		{"GET / HTTP/1.0\r\n\r\n", ""},
		{"GET http://api.example.com:8080/x HTTP/1.1\r\nHost: api.example.com\r\n\r\n", ""},
		{"GET / HTTP/1.1\r\n\r\n", record.ReasonBadRequest},
		{"GET / HTTP/1.1\r\nHost: other.example.com\r\n\r\n", record.ReasonHostMismatch},
		{"GET / HTTP/1.1\r\nHost: api.example.com:9090\r\n\r\n", record.ReasonHostMismatch},
		{"GET / HTTP/1.1\r\nHost: 127.100.0.1\r\n\r\n", record.ReasonHostMismatch},
		{"GET http://other.example.com:8080/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n", record.ReasonHostMismatch},
		{"GET http://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\n\r\n", record.ReasonHostMismatch}, // port 80, not 8080
		{"GET * HTTP/1.1\r\nHost: api.example.com\r\n\r\n", record.ReasonBadTarget},
		{"GET /#f HTTP/1.1\r\nHost: api.example.com\r\n\r\n", record.ReasonBadTarget},
		{"CONNECT api.example.com:8080 HTTP/1.1\r\nHost: api.example.com\r\n\r\n", record.ReasonMethodNotAllowed},
		{"GET / HTTP/2.0\r\nHost: api.example.com\r\n\r\n", record.ReasonBadVersion},
		{"POST / HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", record.ReasonBadRequest},
		{"GET / HTTP/1.1\r\nHost: api.example.com\r\nHost: other.example.com\r\n\r\n", record.ReasonBadRequest},
	} {
		req, err := ParseTransparentHead([]byte(c.head), host, port)
		if got := record.ReasonOf(err); got != c.want || (err != nil && c.want == "") {
			t.Errorf("%q: reason %q (%v), want %q", c.head, got, err, c.want)
			continue
		}
		if err == nil && (req.Host != host || req.Port != port) {
			t.Errorf("%q: request for %s, want %s:%d", c.head, req.HostPort(), host, port)
		}
	}
}

func TestClassifyHTTP(t *testing.T) {
	for _, c := range []struct {
		in           string
		ended        bool
		isHTTP, more bool
	}{
		{"GET / HTTP/1.1\r\n", false, true, false},
		{"GET / HTTP/1.1", false, true, true}, // the line may go on
		{"GET / HTTP/1.1", true, true, false},
		{"G", false, true, true},
		{"G", true, false, false}, // a bare token is no request
		{"", false, true, true},
		{"\r\n\r\nGET / HTTP/1.1\r\n", false, true, false},
		{"\r\n", true, false, false},
		{"PROPFIND /x HTTP/1.1\r\n", false, true, false},
		{"get / http/1.0\n", false, true, false},
		{"GET\t/ HTTP/1.1\r\n", false, true, false},
		{"CONNECT other.example.com:443 HTTP/1.1\r\n", false, true, false},
		{"GET /" + strings.Repeat("a", 2000), false, true, true},
		{"\x16\x03\x01", false, false, false},
		{"\x00\x00\x00\x08", false, false, false},     // PostgreSQL's startup
		{"*1\r\n$4\r\nPING\r\n", false, false, false}, // RESP
		{"SSH-2.0-OpenSSH_9.6\r\n", false, false, false},
		{"SSH-2.0-OpenSSH_9.6p1 Debian-5\r\n", false, false, false},
		{"SSH-2.0-OpenSSH_9.6p1 Debian-5", false, true, true},
		{"get foo\r\n", false, false, false}, // memcached
		// Node's parser (llhttp) takes RTSP's version as HTTP's, with
		// any target, and routes by Host.
		{"OPTIONS rtsp://cam/ RTSP/1.0\r\n", false, true, false},
		{"GET * RTSP/1.0\r\n", false, true, false},
		{"DESCRIBE x://a/ rtsp/2.0\n", false, true, false},
		{"INVITE sip:bob@example.com SIP/2.0\r\n", false, false, false},
		// and Icecast's ICE/ with SOURCE, routed by Host too.
		{"SOURCE * ICE/1.0\r\n", false, true, false},
		{"source x://a/ ICE/1.0\r\n", false, true, false},
		{"GET service/x\r\n", false, false, false}, // ICE/ with no SOURCE: no request
		// PROXY protocol: a front that takes it from its client reads the
		// request after it.
		{"PROXY TCP4 10.0.0.1 10.0.0.2 1 80\r\nGET / HTTP/1.1\r\n", false, true, false},
		{"PROXY UNKNOWN\r\n", false, true, false},
		{"\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c", false, true, false},
		{"\r\n\r\n\x00\r\nQU", false, true, true},
		{"\r\n\r\n\x00\r\nQU", true, true, false},
		{"\r\n\r\n\x00\x00\x00\x08", false, false, false},         // blank lines, then not a request
		{"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", false, false, false}, // h2c: tunnelled
		{"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04", false, false, false},
		{"PRI * HTTP/2.0\r\n\r\nS", false, true, true},
		{"PRI * HTTP/2.0\r\n", true, false, false}, // ended: no request can follow
		// Go's net/http takes the preface's line with fields after it as
		// a request, its handler seeing their Host.
		{"PRI * HTTP/2.0\r\nHost: other.example.com\r\n\r\n", false, true, false},
		{"PRI * HTTP/2.0\n\nSM\n\n", false, true, false},
		{"GETX:", false, false, false},
		// HTTP/0.9 (no version): a lenient front takes it as a request,
		// routed by an absolute target.
		{"GET http://other.example.com/\r\n", false, true, false},
		{"GET HTTPS://other.example.com/\n", false, true, false},
		{"GET  //other.example.com/x\r\n", false, true, false},
		{"GET /x\r\n", false, true, false},
		{"GET http://other.example.com/\rHost: a\r\n", false, true, false},
		// nginx takes any scheme in an HTTP/0.9 target and routes by its host.
		{"GET x://other.example.com/\r\n", false, true, false},
		{"GET X-y.z+1://other.example.com/\xa0\r\n", false, true, false},
		{"GET x://other.example.com/\rHost: a\r\n", false, true, false},
		{"GET x://other.example.com/ SIP/2.0", true, false, false}, // a version no HTTP server takes
		{"GET 1x://other.example.com/\r\n", false, false, false},
		// Node's parser takes a target starting with '*' after a method it
		// knows as HTTP/0.9, reads the fields after it and routes by Host.
		{"GET *\r\n", false, true, false},
		{"OPTIONS *x\n", false, true, false},
		{"M-SEARCH */a\r\n", false, true, false},
		{"KEYS *\r\n", false, false, false}, // Redis inline, which Node's parser refuses
		{"get *\r\n", false, false, false},  // memcached; Node's methods are uppercase
		{"GET /x", true, true, false},
		{"get /key\r\n", false, true, false}, // a memcached key like a path: the forwarder's
		// Whitespace Python's str.split knows (http.server splits on it).
		{"\x0bGET / HTTP/1.1\r\n", false, true, false},
		{"\x1c\x1d\x1e\x1fGET / HTTP/1.1\r\n", false, true, false},
		{"\xa0GET / HTTP/1.1\r\n", false, true, false},
		{"\x85GET / HTTP/1.1\r\n", false, true, false},
		{"GET\x0c/\x0cHTTP/1.1\r\n", false, true, false},
		{"GET\x0bhttp://other.example.com/\r\n", false, true, false},
		{"\x0c", false, true, true},
		{"\x0c\x00\x00\x00", false, false, false},     // a length prefix
		{"GET\r/x\rHTTP/1.1\r\n", false, true, false}, // a bare CR: whitespace to str.split
		{"GET\r", false, true, true},                  // a line end, or a space
		{"GET\r", true, false, false},
		{"*1\r", false, true, true},
	} {
		if h, m := ClassifyHTTP([]byte(c.in), c.ended); h != c.isHTTP || m != c.more {
			t.Errorf("ClassifyHTTP(%q, %v) = %v, %v; want %v, %v", c.in, c.ended, h, m, c.isHTTP, c.more)
		}
	}
}
