//go:build linux

package proxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/wire"
)

// Names maps a transparent connection's local address (a pool address
// the Trial's DNS stub handed out) back to the name it was handed out
// for; false for an address it never handed out.
type Names func(netip.Addr) (string, bool)

// ServeTransparent accepts the transparent connections of Trial id on ln,
// until ln is closed, the Trial is removed or the proxy is closed: each
// was made to a pool address and port, which names maps back to the
// name:port it is then served as, exactly as a CONNECT to it would be
// (docs/transparent.md).
func (p *Proxy) ServeTransparent(ln net.Listener, id string, names Names) error {
	return p.serve(ln, id, func(c net.Conn, t *trial) { p.handleTransparent(c, t, names) })
}

// handleTransparent serves one transparent connection: admitted like any
// client connection, mapped to name:port, then judged, dialed and
// relayed like a CONNECT, or, when the client's first bytes are an HTTP
// request, forwarded with the host the address stands for. A refusal
// before the client is answered resets the connection: it asked no
// proxy, so an HTTP answer would be noise in its protocol.
func (p *Proxy) handleTransparent(c net.Conn, t *trial, names Names) {
	k := p.newClientConn(c, t)
	k.silent, k.ev.Transparent = true, true
	defer k.finish()
	if err := p.admit(t); err != nil {
		k.refusedAtAdmission = true
		k.deny(err)
		return
	}
	k.onDone(func() { p.conns.Add(-1); t.clients.Add(-1) })
	t.pending.Add(-1) // there is no head to wait for: it is judged now
	req, err := transparentTarget(c.LocalAddr(), names)
	if req != nil {
		k.ev.Target, k.ev.Host, k.ev.Port = req.Target, req.Host, req.Port
	}
	if err != nil {
		k.deny(err)
		return
	}
	p.serveTransparent(k, req)
}

// transparentTarget is the name:port a connection to local stands for.
func transparentTarget(local net.Addr, names Names) (*wire.Request, error) {
	ap, err := netip.ParseAddrPort(local.String())
	if err != nil {
		return nil, record.Deny(record.ReasonUnknownAddress, "the connection's local address %q is no address and port", local)
	}
	name, ok := names(ap.Addr().Unmap())
	if !ok {
		return &wire.Request{Target: ap.String(), Port: ap.Port()}, record.Deny(record.ReasonUnknownAddress, "%s was never handed out by this Trial's DNS stub: look the name up first", ap.Addr())
	}
	return &wire.Request{Host: name, Port: ap.Port(), Target: name + ":" + strconv.Itoa(int(ap.Port()))}, nil
}

// serveTransparent judges and dials a transparent connection as a
// CONNECT (the rate, the tunnel slot, the allowlist with its port, DNS
// at the agent, the address guard), then waits for whichever side speaks
// first. The dial comes first because a server may speak first (SMTP,
// MySQL, an ssh banner): waiting for the client would hang those. Which
// protocol it is, the client's first bytes say, and nothing of them
// reaches the upstream before they are judged: TLS gets its name checked
// in the tunnel like a CONNECT's, and HTTP is handed to the forwarder,
// which judges every request's Host (the dial made for it is closed
// unused).
func (p *Proxy) serveTransparent(k *clientConn, req *wire.Request) {
	c, t, ev := k.c, k.t, k.ev
	if err := t.takeConnect(); err != nil {
		k.deny(err)
		return
	}
	up, err := p.judgeAndDial(t, req, ev)
	if err != nil {
		t.tunnels.Add(-1)
		k.deny(err)
		return
	}
	k.br = getReader(c)
	if p.clientSpeaksHTTP(c, k.br, up) {
		t.untrack(up)
		_ = up.Close()
		t.tunnels.Add(-1)
		p.forwardTransparent(k, req)
		return
	}
	k.onDone(func() { t.tunnels.Add(-1) })
	k.onDone(func() { t.untrack(up) })
	k.onDone(k.releaseReader)
	p.openTunnel(k, req, up, "")
}

// clientSpeaksHTTP waits until the client or the upstream has something
// to say, or ends, and reports whether the client spoke first with what
// may be an HTTP request (wire.ClassifyHTTP; its first bytes stay in br).
// The wait is as long as the connection is silent, like an idle tunnel;
// telling HTTP from its first line, once some came, takes at most
// HeaderTimeout. Bytes still undecided then (a request line held back,
// or longer than br) go to the forwarder, which refuses what is no
// request: a tunnel would let a request's rest, sent later, pass unjudged.
func (p *Proxy) clientSpeaksHTTP(c net.Conn, br *bufio.Reader, up net.Conn) bool {
	upReady := make(chan struct{})
	go func() {
		defer close(upReady)
		waitReadable(up)
		_ = c.SetReadDeadline(aLongTimeAgo) // ends the client's wait
	}()
	_, _ = br.Peek(1)
	_ = up.SetReadDeadline(aLongTimeAgo) // ends the upstream's wait
	<-upReady
	_ = up.SetReadDeadline(time.Time{})
	_ = c.SetReadDeadline(time.Time{})
	if br.Buffered() == 0 {
		return false // the upstream spoke or ended first, or the client ended
	}
	_ = c.SetReadDeadline(time.Now().Add(p.cfg.HeaderTimeout))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	for {
		b, _ := br.Peek(br.Buffered())
		isHTTP, more := wire.ClassifyHTTP(b, false)
		if !more || len(b) == br.Size() {
			return isHTTP
		}
		if _, err := br.Peek(len(b) + 1); err != nil {
			isHTTP, _ = wire.ClassifyHTTP(b, errors.Is(err, io.EOF))
			return isHTTP
		}
	}
}

// aLongTimeAgo is a deadline that has passed: setting it ends a wait.
var aLongTimeAgo = time.Unix(1, 0)

// forwardTransparent serves plain HTTP sent to a transparent address
// through the forwarder, each request's Host judged against req, the
// name:port the address stands for. Its records are the requests'; the
// connection's own, which judged and dialed it, is dropped.
func (p *Proxy) forwardTransparent(k *clientConn, dest *wire.Request) {
	br := k.br // the forwarder keeps it, as it keeps a proxy client's
	k.br = nil
	k.silent = false // it speaks HTTP: refusals are answered in HTTP
	ev := p.newEvent(k.t, k.c)
	_ = k.c.SetReadDeadline(time.Now().Add(p.cfg.HeaderTimeout))
	k.ev = p.serveHTTP(k.c, k.t, br, ev, func() {}, dest)
}
