//go:build linux

package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/wire"
	"golang.org/x/sys/unix"
)

// tlsAccessDenied is a fatal TLS alert (access_denied), sent to a client
// whose ClientHello was refused so that its TLS stack reports a clear
// "access denied" rather than a bare EOF.
var tlsAccessDenied = []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31}

// closeWriter is a connection that can half-close (TCP, Unix).
type closeWriter interface {
	CloseWrite() error
}

// tunnel relays between client and upstream until both directions have
// ended. Each direction half-closes its destination when its source
// ends, so EOF travels like it does on one TCP connection; an error in
// either direction aborts both. Copies between two TCP sockets splice(2)
// (see relay). There is no idle timeout: keepalives find dead peers, a
// silent model call lives as long as it needs.
func (p *Proxy) tunnel(k *clientConn, up net.Conn, ot *openTunnel, req *wire.Request) {
	client, ev := k.c, k.ev
	ev.Decision, ev.Reason = record.DecisionAllow, record.ReasonAllowed
	var aborted atomic.Bool
	var first atomic.Pointer[string]       // why the tunnel was cut, if it was
	abort := func(why string, err error) { // unblocks the other direction
		if err != nil && !aborted.Swap(true) {
			msg := why + ": " + err.Error()
			first.Store(&msg)
		}
		_ = client.Close()
		_ = up.Close()
	}
	w := new(helloWatch)
	var left atomic.Int32
	left.Store(2)
	end := func() { // the second pump to end closes and finishes
		if left.Add(-1) == 0 {
			abort("", nil)
			if c := ot.cutBecause.Load(); c != nil && ev.Decision == record.DecisionAllow {
				ev.Detail = c.detail()
			} else if m := first.Load(); m != nil && ev.Decision == record.DecisionAllow {
				ev.Detail = "tunnel cut: " + *m
			}
			k.done()
		}
	}
	go func() {
		defer end()
		n, err := pumpDown(client, up, ev, w)
		ev.BytesDown = n
		if err == nil {
			err = closeWrite(client)
		}
		if err != nil {
			abort("upstream to client", err)
		}
	}()
	go func() {
		defer end()
		if err := p.pumpUp(k, up, ot.entry, req, w); err != nil {
			abort("client to upstream", err)
		}
	}()
}

// helloWatch holds a TLS tunnel's client bytes after each ClientHello
// until the upstream's answer to it is known. In TLS 1.3 a server may
// answer with a HelloRetryRequest, and the client then sends a second
// ClientHello in the clear, which a front that routes by name may read:
// it is checked like the first. Only once the server has sent a
// ServerHello that is not a HelloRetryRequest does the tunnel relay
// unchecked.
type helloWatch struct {
	state atomic.Int32 // which side spoke first (watch* below)
	// preludes counts the client's PostgreSQL SSLRequests and
	// GSSENCRequests sent upstream whose one-byte answers the upstream
	// side has yet to pass on.
	preludes atomic.Int32
	// answers carries, per ClientHello sent upstream, whether the
	// server answered it with a HelloRetryRequest. It is closed when the
	// upstream side stops watching (no ServerHello came, or the answer
	// was refused); its two slots mean the upstream side never blocks.
	answers chan bool
}

const (
	watchUndecided   int32 = iota
	watchTLS               // a ClientHello went upstream first: its answer is read
	watchServerSpoke       // the upstream sent bytes before any ClientHello
	watchServerEnded       // the upstream ended before any ClientHello
)

// clientHelloFirst is called before a checked ClientHello goes upstream.
// It reports whether the server's answer will be watched; a server that
// spoke first cannot be a TLS server answering a ClientHello, and its
// answer to one could not be told apart from what it sent before.
func (w *helloWatch) clientHelloFirst() (bool, error) {
	w.answers = make(chan bool, 2) // published by the swap below
	if w.state.CompareAndSwap(watchUndecided, watchTLS) {
		return true, nil
	}
	if w.state.Load() == watchServerEnded {
		return false, nil
	}
	return false, errors.New("the upstream spoke before the ClientHello, so a HelloRetryRequest could not be told from what it sent")
}

// upstreamFirst is called when the upstream has a byte to read (spoke)
// or has ended. It reports whether a ClientHello went upstream first,
// whose answer must then be watched.
func (w *helloWatch) upstreamFirst(spoke bool) bool {
	st := watchServerEnded
	if spoke {
		st = watchServerSpoke
	}
	return !w.state.CompareAndSwap(watchUndecided, st)
}

// pumpDown copies upstream to client, timing the upstream's first byte.
// On a socket it waits for that byte without taking it (MSG_PEEK), so
// the whole stream is spliced and reaches the client in the segments it
// came in; otherwise the byte is read and written on its own. In a TLS
// tunnel the server's ServerHello (and, after a HelloRetryRequest, the
// next one) is read and judged first.
func pumpDown(client, up net.Conn, ev *record.Event, w *helloWatch) (int64, error) {
	var n int64
	var b [1]byte
	var ready bool
	var pre []byte
	for {
		var isSocket bool
		ready, isSocket = waitReadable(up)
		pre = nil
		if !isSocket {
			m, err := up.Read(b[:])
			if m == 0 && err != nil && !errors.Is(err, io.EOF) {
				if w.upstreamFirst(false) {
					close(w.answers)
				}
				return n, err
			}
			ready, pre = m > 0, b[:m]
		}
		if ready && n == 0 {
			ev.FirstByte = time.Since(ev.Time)
		}
		if !ready || w.preludes.Load() == 0 {
			break
		}
		// The upstream's answer to a prelude, one byte: passed on,
		// and what it sends next is watched as a first answer is.
		if len(pre) == 0 {
			if _, err := io.ReadFull(up, b[:]); err != nil {
				return n, err
			}
		}
		w.preludes.Add(-1)
		m, err := client.Write(b[:])
		n += int64(m)
		if err != nil {
			return n, err
		}
	}
	if w.upstreamFirst(ready) {
		m, err := watchServerHello(client, up, pre, w.answers)
		close(w.answers)
		n += m
		if err != nil {
			return n, err
		}
	} else if len(pre) > 0 {
		m, err := client.Write(pre)
		n += int64(m)
		if err != nil {
			return n, err
		}
	}
	m, err := relay(client, up)
	return n + m, err
}

// watchServerHello reads the server's answer to the ClientHello, after
// the bytes in buf, and forwards it to the client. A ServerHello ends
// the watch; a HelloRetryRequest is told to the client side, which
// checks the second ClientHello, and the next answer must then be a
// ServerHello: TLS allows one HelloRetryRequest, and a third ClientHello
// would pass unchecked. Anything else cuts the tunnel once what was read
// is forwarded (a fatal alert reaches the client); an upstream that ends
// first ends the watch.
func watchServerHello(client, up net.Conn, buf []byte, answers chan<- bool) (int64, error) {
	var sent int64
	retried := false
	for {
		n, retry, err := wire.ServerHelloRecords(buf)
		if errors.Is(err, wire.ErrNeedMore) {
			var m int
			var rerr error
			if buf, m, rerr = wire.ReadMore(up, buf); errors.Is(rerr, wire.ErrHelloBuffer) {
				err = errors.New("ServerHello too large")
			} else {
				if m > 0 || rerr == nil {
					continue
				}
				if !errors.Is(rerr, io.EOF) {
					return sent, rerr
				}
				m, werr := client.Write(buf)
				return sent + int64(m), werr // the upstream ended: so does the watch
			}
		}
		if err == nil && retry && retried {
			return sent, errors.New("a second HelloRetryRequest from the upstream (RFC 8446 allows one)")
		}
		if err != nil || !retry {
			m, werr := client.Write(buf)
			sent += int64(m)
			if err != nil {
				return sent, fmt.Errorf("the upstream did not answer the ClientHello with a ServerHello: %w", err)
			}
			answers <- false
			return sent, werr
		}
		m, werr := client.Write(buf[:n])
		sent += int64(m)
		if werr != nil {
			return sent, werr
		}
		retried = true
		answers <- true
		buf = buf[n:]
	}
}

// waitReadable waits, like a read, until c has a byte to read, its EOF
// or an error, and takes nothing. ready reports a byte; ok is false for a
// connection that is not a socket, which it leaves untouched.
func waitReadable(c net.Conn) (ready, ok bool) {
	sc, isSocket := c.(syscall.Conn)
	if !isSocket {
		return false, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false, false
	}
	var b [1]byte
	_ = rc.Read(func(fd uintptr) bool {
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		ready = n > 0
		return err != unix.EAGAIN && err != unix.EINTR
	})
	return ready, true // an error shows again in the relay's first read
}

// pumpUp checks the client's first bytes (TLS name check), then copies
// client to upstream and half-closes the upstream at the client's EOF.
// The connection's pooled reader, which parsed the request head and may
// hold pipelined bytes, goes back to the pool once the first bytes
// passed, or when pumpUp returns. In a TLS tunnel the client's bytes
// after its ClientHello wait for the server's answer (see helloWatch).
func (p *Proxy) pumpUp(k *clientConn, up net.Conn, entry allow.Entry, req *wire.Request, w *helloWatch) error {
	defer k.releaseReader()
	client, br, ev := k.c, k.br, k.ev
	for {
		isReq, err := p.postgresPrelude(client, br, entry)
		if err != nil {
			return refuseTLS(client, ev, err)
		}
		if !isReq {
			break
		}
		prelude, _ := br.Peek(pgPreludeLen)
		prelude = append([]byte(nil), prelude...)
		_, _ = br.Discard(pgPreludeLen)
		w.preludes.Add(1) // before it goes: the answer may come at once
		if err := writeUp(up, prelude, ev); err != nil {
			return err
		}
	}
	first, rest, isTLS, err := p.checkFirstBytes(client, br, entry, req, ev)
	if err != nil {
		return refuseTLS(client, ev, err)
	}
	watch := false
	if isTLS {
		if watch, err = w.clientHelloFirst(); err != nil {
			return err
		}
	}
	if err := writeUp(up, first, ev); err != nil {
		return err
	}
	for watch {
		// The client is not read while the answer is awaited, so its end
		// goes unseen: an upstream that never answers must not hold the
		// tunnel (and a slot of the Trial's) for good.
		var retry, ok bool
		select {
		case retry, ok = <-w.answers:
		case <-time.After(p.cfg.TLSTimeout):
			return fmt.Errorf("the upstream did not answer the ClientHello within %s", p.cfg.TLSTimeout)
		}
		if !ok { // the upstream side ended without a ServerHello, or cut the tunnel and says why
			return nil
		}
		if !retry {
			break
		}
		var hello []byte
		hello, rest, err = p.checkRetryHello(client, br, rest, req, ev)
		if errors.Is(err, io.EOF) { // the client gave up after the HelloRetryRequest
			return closeWrite(up)
		}
		if err != nil {
			return refuseTLS(client, ev, err)
		}
		if err := writeUp(up, hello, ev); err != nil {
			return err
		}
	}
	if n := br.Buffered(); n > 0 { // read ahead of a ClientHello: it follows rest
		b, _ := br.Peek(n)
		rest = append(rest, b...)
	}
	k.releaseReader() // before the relay: an idle tunnel holds no buffer
	if err := writeUp(up, rest, ev); err != nil {
		return err
	}
	n, err := relay(up, client)
	ev.BytesUp += n
	if err != nil {
		return err
	}
	return closeWrite(up)
}

// writeUp writes b upstream, counting it.
func writeUp(up net.Conn, b []byte, ev *record.Event) error {
	if len(b) == 0 {
		return nil
	}
	n, err := up.Write(b)
	ev.BytesUp += int64(n)
	return err
}

// refuseTLS records a refusal of the client's first bytes and answers
// it with an access_denied alert (not for require_tls: that client may
// not speak TLS at all).
func refuseTLS(client net.Conn, ev *record.Event, err error) error {
	var d *record.Denial
	if errors.As(err, &d) {
		ev.Decision, ev.Reason, ev.Detail = record.DecisionDeny, d.Reason, d.Detail
		if d.Reason != record.ReasonTLSRequired {
			_ = client.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = client.Write(tlsAccessDenied)
		}
	}
	return err
}

// pgPrelude is what PostgreSQL's SSLRequest and GSSENCRequest start
// with: their length (8) and the first half of their codes; the last
// byte tells them apart (0x2f, 80877103; 0x30, 80877104). A server
// answers each with one byte: after 'N' the client may send the other
// (libpq asks for GSSAPI first where it has Kerberos credentials), and
// after an SSLRequest's 'S' its next bytes are a ClientHello, which a
// front that routes by name (Neon's, Supabase's) reads as it reads a
// TLS-first one.
var pgPrelude = []byte{0, 0, 0, 8, 0x04, 0xd2, 0x16}

const pgPreludeLen = 8

// postgresPrelude reports whether the client's next bytes are an SSLRequest
// or a GSSENCRequest, after which the tunnel's first bytes are judged
// again: TLS there is held to the tunnel's name like TLS at the start.
// Only bytes that begin one are waited for past the first, and for at
// most the TLS timeout. Under require_tls it is none: the first bytes
// must be a ClientHello.
func (p *Proxy) postgresPrelude(client net.Conn, br *bufio.Reader, entry allow.Entry) (bool, error) {
	if entry.RequireTLS {
		return false, nil
	}
	first, err := p.peekFirst(client, br, entry)
	if err != nil || len(first) == 0 || !bytes.HasPrefix(pgPrelude, first[:min(len(first), len(pgPrelude))]) {
		return false, err
	}
	if len(first) < pgPreludeLen {
		_ = client.SetReadDeadline(time.Now().Add(p.cfg.TLSTimeout))
		first, _ = br.Peek(pgPreludeLen)
		_ = client.SetReadDeadline(time.Time{})
	}
	return len(first) >= pgPreludeLen && bytes.HasPrefix(first, pgPrelude) && (first[7] == 0x2f || first[7] == 0x30), nil
}

// checkFirstBytes returns the first bytes of the tunnel once they are
// acceptable. A stream whose first byte is a TLS record type (or an
// SSLv2-style hello) is TLS: it must open with a ClientHello naming the
// CONNECT host, carried only by handshake records; first is then the
// ClientHello's records and rest what the client sent after them. With
// require_tls the stream must be TLS. Waiting for them costs no buffer
// beyond br; only a ClientHello is copied out, in one record
// (wire.JoinHello) however the client split it.
func (p *Proxy) checkFirstBytes(client net.Conn, br *bufio.Reader, entry allow.Entry, req *wire.Request, ev *record.Event) (first, rest []byte, isTLS bool, err error) {
	first, err = p.peekFirst(client, br, entry)
	if err != nil || first == nil {
		return nil, nil, false, err
	}
	switch wire.ClassifyStream(first) {
	case wire.StreamSSLv2:
		return nil, nil, false, record.Deny(record.ReasonTLSSSLv2, "the first bytes are an SSLv2-style ClientHello, which carries no server name to check against %s", req.Host)
	case wire.StreamOther, wire.StreamUnknown: // unknown: the client ended within three bytes
		if entry.RequireTLS {
			return nil, nil, false, record.Deny(record.ReasonTLSRequired, "require_tls is set for %s and the first bytes are not a TLS ClientHello", entry)
		}
		_, _ = br.Discard(len(first))
		return first, nil, false, nil
	}
	hello := append([]byte(nil), first...)
	_, _ = br.Discard(len(first))
	_ = client.SetReadDeadline(time.Now().Add(p.cfg.TLSTimeout))
	hello, n, info, err := wire.ReadClientHello(br, hello, false)
	_ = client.SetReadDeadline(time.Time{})
	if err != nil {
		return nil, nil, false, tlsRefusal(err, "the first bytes start a TLS record but are not a well-formed ClientHello: ")
	}
	ev.SNI = info.ServerName
	if err := wire.CheckSNI(info, req.Host); err != nil {
		return nil, nil, true, err
	}
	joined, err := wire.JoinHello(hello[:n])
	if err != nil {
		return nil, nil, true, tlsRefusal(err, "")
	}
	return joined, hello[n:], true, nil
}

// checkRetryHello reads the second ClientHello, which the client sends
// after a HelloRetryRequest (after the bytes in buf, which it may have
// sent before the request arrived), and checks it like the first. It
// returns its records and what the client sent after them; io.EOF means
// the client ended without sending anything more.
func (p *Proxy) checkRetryHello(client net.Conn, br *bufio.Reader, buf []byte, req *wire.Request, ev *record.Event) (hello, rest []byte, err error) {
	_ = client.SetReadDeadline(time.Now().Add(p.cfg.TLSTimeout))
	buf, n, info, err := wire.ReadClientHello(br, buf, true)
	_ = client.SetReadDeadline(time.Time{})
	if err != nil {
		if len(buf) == 0 && errors.Is(err, io.EOF) {
			return nil, nil, io.EOF
		}
		return nil, nil, tlsRefusal(err, "after a HelloRetryRequest the client's next handshake message is not a well-formed ClientHello: ")
	}
	ev.SNI = info.ServerName
	if err := wire.CheckSNI(info, req.Host); err != nil {
		var d *record.Denial
		if errors.As(err, &d) {
			d.Detail = "after a HelloRetryRequest, the second ClientHello: " + d.Detail
		}
		return nil, nil, err
	}
	joined, err := wire.JoinHello(buf[:n])
	if err != nil {
		return nil, nil, tlsRefusal(err, "after a HelloRetryRequest, the second ClientHello: ")
	}
	return joined, buf[n:], nil
}

// tlsRefusal makes a ClientHello read error a refusal: a *Denial as it
// is, anything else a malformation.
func tlsRefusal(err error, what string) error {
	var d *record.Denial
	if errors.As(err, &d) {
		return d
	}
	return &record.Denial{Reason: record.ReasonTLSMalformed, Detail: what + err.Error(), Err: err}
}

// peekFirst waits for the client's first bytes and returns what is
// buffered, enough to classify it (an SSLv2-style header needs three
// bytes); nil, nil means the client half-closed without sending anything.
func (p *Proxy) peekFirst(client net.Conn, br *bufio.Reader, entry allow.Entry) ([]byte, error) {
	if br.Buffered() == 0 {
		if entry.RequireTLS {
			// A TLS client speaks first; one that does not within the
			// timeout is not a TLS client.
			_ = client.SetReadDeadline(time.Now().Add(p.cfg.TLSTimeout))
		}
		_, err := br.Peek(1)
		_ = client.SetReadDeadline(time.Time{})
		if err != nil {
			if entry.RequireTLS {
				return nil, record.Deny(record.ReasonTLSRequired, "require_tls is set for %s and the client sent no ClientHello", entry)
			}
			if errors.Is(err, io.EOF) {
				return nil, nil // the client half-closed without data: forwarded by the relay
			}
			return nil, err
		}
	}
	first, _ := br.Peek(br.Buffered())
	if wire.ClassifyStream(first) == wire.StreamUnknown {
		// A high first bit: wait for the rest of a possible SSLv2 header.
		_ = client.SetReadDeadline(time.Now().Add(p.cfg.TLSTimeout))
		_, err := br.Peek(wire.SSLv2HeaderLen)
		_ = client.SetReadDeadline(time.Time{})
		first, _ = br.Peek(br.Buffered())
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, &record.Denial{Reason: record.ReasonTLSMalformed, Detail: "the first bytes may start an SSLv2-style ClientHello, whose header did not complete in time", Err: err}
		}
	}
	return first, nil
}

var readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 1024) }}

// getReader returns a pooled reader for a request head; lines are at
// most MaxRequestLine, and ReadRequest joins longer fragments.
func getReader(c net.Conn) *bufio.Reader {
	br := readerPool.Get().(*bufio.Reader)
	br.Reset(c)
	return br
}

func putReader(br *bufio.Reader) {
	br.Reset(nil)
	readerPool.Put(br)
}

// relay copies src to dst until EOF. Between two TCP sockets it calls
// ReadFrom directly, which splices; io.Copy would first try src.WriteTo,
// whose extra frames double an idle tunnel's goroutine stack.
func relay(dst, src net.Conn) (int64, error) {
	if rf, ok := dst.(io.ReaderFrom); ok {
		return rf.ReadFrom(src)
	}
	return io.Copy(dst, src)
}

func closeWrite(c net.Conn) error {
	if cw, ok := c.(closeWriter); ok {
		if err := cw.CloseWrite(); err != nil && !errors.Is(err, net.ErrClosed) {
			return err
		}
	}
	return nil
}
