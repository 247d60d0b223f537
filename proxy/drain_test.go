package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// A kept-alive plain-HTTP connection that waits for its next request
// when this process stops accepting (it handed over) is served no
// further request: the successor decides what comes next, on a new
// connection. A draining process deciding anew would follow policy it
// no longer shares with the successor once a change fails to reach it.
func TestDrainServesNoNewRequestOnAKeptAliveConnection(t *testing.T) {
	tp, u := newForwardProxy(t)
	c, err := net.Dial("tcp", tp.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	br := bufio.NewReader(c)
	get := func(host string) string {
		return "GET http://" + host + "/ HTTP/1.1\r\nHost: " + host + "\r\n\r\n"
	}
	requestDone(t, tp, c, br, get("api.example.com"))
	tp.StopAccepting()
	if _, err := io.WriteString(c, get("other.example.com")); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.ReadResponse(br, nil); err == nil {
		_ = resp.Body.Close()
		t.Fatalf("a request sent after the drain began was answered %s", resp.Status)
	}
	if got := u.requests(); len(got) != 1 {
		t.Fatalf("the upstream saw %d requests, want 1 (none after the drain began): %+v", len(got), got)
	}
}

// A kept-alive connection idle when the process stops accepting is
// closed then, not when its next request comes: a client sees the close
// before it sends, and sends on a new connection, where a request sent
// on one closed as it comes fails at a client that retries no request
// that is not idempotent (a POST: Go's and Python's clients).
//
// Its header timeout is an hour: only the drain ends the wait (the
// client's deadline only bounds the test).
func TestDrainClosesAnIdleKeptAliveConnection(t *testing.T) {
	tp, u := newForwardProxyWith(t, func(c *Config) { c.HeaderTimeout = time.Hour })
	c, err := net.Dial("tcp", tp.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	br := bufio.NewReader(c)
	requestDone(t, tp, c, br, "POST http://api.example.com/ HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 2\r\n\r\nhi")
	tp.StopAccepting()
	if b, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("an idle kept-alive connection was not closed when the drain began: read %q, %v", b, err)
	}
	if got := u.requests(); len(got) != 1 {
		t.Fatalf("the upstream saw %d requests, want 1: %+v", len(got), got)
	}
}

// requestDone sends req on c and reads its answer whole; its record,
// emitted once the request is done, says the connection now waits for
// its next head.
func requestDone(t *testing.T, tp *testProxy, c net.Conn, br *bufio.Reader, req string) {
	t.Helper()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	_ = tp.event(t)
}
