//go:build linux

package proxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

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
func (p *Proxy) tunnel(client, up net.Conn, br *bufio.Reader, ot *openTunnel, req *Request, ev *Event, fin cleanups) {
	ev.Decision, ev.Reason = DecisionAllow, ReasonAllowed
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
	var left atomic.Int32
	left.Store(2)
	end := func() { // the second pump to end closes and finishes
		if left.Add(-1) == 0 {
			abort("", nil)
			if why := ot.cutBecause.Load(); why != nil && ev.Decision == DecisionAllow {
				ev.Detail = "tunnel cut by a policy change: " + *why
			} else if m := first.Load(); m != nil && ev.Decision == DecisionAllow {
				ev.Detail = "tunnel cut: " + *m
			}
			fin.run()
		}
	}
	go func() {
		defer end()
		n, err := pumpDown(client, up, ev)
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
		if err := p.pumpUp(client, up, br, ot.entry, req, ev); err != nil {
			abort("client to upstream", err)
		}
	}()
}

// pumpDown copies upstream to client, timing the upstream's first byte.
// On a socket it waits for that byte without taking it (MSG_PEEK), so
// the whole stream is spliced and reaches the client in the segments it
// came in; otherwise the byte is read and written on its own.
func pumpDown(client, up net.Conn, ev *Event) (int64, error) {
	if ready, ok := waitReadable(up); ok {
		if ready {
			ev.FirstByte = time.Since(ev.Time)
		}
		return relay(client, up)
	}
	var b [1]byte
	n, err := up.Read(b[:])
	if n == 0 {
		if errors.Is(err, io.EOF) {
			return 0, nil
		}
		return 0, err
	}
	ev.FirstByte = time.Since(ev.Time)
	if _, err := client.Write(b[:n]); err != nil {
		return 0, err
	}
	m, err := relay(client, up)
	return m + 1, err
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
// br is the pooled reader that parsed the request head and may hold
// pipelined bytes; it goes back to the pool once the first bytes passed.
func (p *Proxy) pumpUp(client, up net.Conn, br *bufio.Reader, entry Entry, req *Request, ev *Event) error {
	first, err := p.checkFirstBytes(client, br, entry, req, ev)
	if err != nil {
		putReader(br)
		var d *Denial
		if errors.As(err, &d) {
			ev.Decision, ev.Reason, ev.Detail = DecisionDeny, d.Reason, d.Detail
			if d.Reason != ReasonTLSRequired {
				_ = client.SetWriteDeadline(time.Now().Add(time.Second))
				_, _ = client.Write(tlsAccessDenied)
			}
		}
		return err
	}
	if len(first) > 0 {
		n, err := up.Write(first)
		ev.BytesUp += int64(n)
		if err != nil {
			putReader(br)
			return err
		}
	}
	_, _ = br.Discard(br.Buffered()) // what was still buffered was part of first
	putReader(br)
	n, err := relay(up, client)
	ev.BytesUp += n
	if err != nil {
		return err
	}
	return closeWrite(up)
}

// checkFirstBytes returns the first bytes of the tunnel once they are
// acceptable. A stream whose first byte is a TLS record type (or an
// SSLv2-style hello) is TLS: it must open with a ClientHello naming the
// CONNECT host, carried only by handshake records. With require_tls the
// stream must be TLS. Waiting for them costs no buffer beyond br; only a
// ClientHello is copied out.
func (p *Proxy) checkFirstBytes(client net.Conn, br *bufio.Reader, entry Entry, req *Request, ev *Event) ([]byte, error) {
	first, err := p.peekFirst(client, br, entry)
	if err != nil || first == nil {
		return nil, err
	}
	switch classifyStream(first) {
	case streamSSLv2:
		return nil, deny(ReasonTLSSSLv2, "the first bytes are an SSLv2-style ClientHello, which carries no server name to check against %s", req.Host)
	case streamOther, streamUnknown: // unknown: the client ended within three bytes
		if entry.RequireTLS {
			return nil, deny(ReasonTLSRequired, "require_tls is set for %s and the first bytes are not a TLS ClientHello", entry)
		}
		return first, nil
	}
	hello := append([]byte(nil), first...)
	_, _ = br.Discard(len(first))
	_ = client.SetReadDeadline(time.Now().Add(p.cfg.TLSTimeout))
	hello, info, err := readClientHello(br, hello)
	_ = client.SetReadDeadline(time.Time{})
	if err != nil {
		var d *Denial
		if errors.As(err, &d) {
			return nil, d
		}
		return nil, &Denial{Reason: ReasonTLSMalformed, Detail: "the first bytes start a TLS record but are not a well-formed ClientHello: " + err.Error(), Err: err}
	}
	ev.SNI = info.ServerName
	return hello, checkSNI(info, req.Host)
}

// peekFirst waits for the client's first bytes and returns what is
// buffered, enough to classify it (an SSLv2-style header needs three
// bytes); nil, nil means the client half-closed without sending anything.
func (p *Proxy) peekFirst(client net.Conn, br *bufio.Reader, entry Entry) ([]byte, error) {
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
				return nil, deny(ReasonTLSRequired, "require_tls is set for %s and the client sent no ClientHello", entry)
			}
			if errors.Is(err, io.EOF) {
				return nil, nil // the client half-closed without data: forwarded by the relay
			}
			return nil, err
		}
	}
	first, _ := br.Peek(br.Buffered())
	if classifyStream(first) == streamUnknown {
		// A high first bit: wait for the rest of a possible SSLv2 header.
		_ = client.SetReadDeadline(time.Now().Add(p.cfg.TLSTimeout))
		_, err := br.Peek(sslv2HeaderLen)
		_ = client.SetReadDeadline(time.Time{})
		first, _ = br.Peek(br.Buffered())
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, &Denial{Reason: ReasonTLSMalformed, Detail: "the first bytes may start an SSLv2-style ClientHello, whose header did not complete in time", Err: err}
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
