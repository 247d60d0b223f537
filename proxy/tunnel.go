//go:build linux

package proxy

import (
	"errors"
	"io"
	"net"
	"time"
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
// either direction aborts both. Copies between two TCP sockets use
// splice(2) through io.Copy. There is no idle timeout: keepalives find
// dead peers, a silent model call lives as long as it needs.
func (p *Proxy) tunnel(client, up net.Conn, prefix []byte, entry Entry, req *Request, ev *Event) {
	ev.Decision, ev.Reason = DecisionAllow, ReasonAllowed
	down := make(chan struct{})
	go func() {
		defer close(down)
		n, err := io.Copy(client, up)
		ev.BytesDown = n
		if err == nil {
			err = closeWrite(client)
		}
		if err != nil { // abort: unblocks the other direction too
			_ = client.Close()
			_ = up.Close()
		}
	}()
	if err := p.pumpUp(client, up, prefix, entry, req, ev); err != nil {
		_ = client.Close()
		_ = up.Close()
	}
	<-down
	_ = client.Close()
	_ = up.Close()
}

// pumpUp checks the client's first bytes (TLS name check), then copies
// client to upstream and half-closes the upstream at the client's EOF.
func (p *Proxy) pumpUp(client, up net.Conn, first []byte, entry Entry, req *Request, ev *Event) error {
	var err error
	if first, err = p.checkFirstBytes(client, first, entry, req, ev); err != nil {
		var d *Denial
		if errors.As(err, &d) {
			ev.Decision, ev.Reason, ev.Detail = DecisionDeny, d.Reason, d.Detail
			if d.Reason != ReasonTLSRequired && d.Reason != ReasonShutdown {
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
			return err
		}
	}
	n, err := io.Copy(up, client)
	ev.BytesUp += n
	if err != nil {
		return err
	}
	return closeWrite(up)
}

// checkFirstBytes returns the bytes read so far once the first bytes of
// the tunnel are acceptable. A ClientHello must name the CONNECT host;
// with require_tls, the first bytes must be a ClientHello.
func (p *Proxy) checkFirstBytes(client net.Conn, first []byte, entry Entry, req *Request, ev *Event) ([]byte, error) {
	if len(first) == 0 {
		if entry.RequireTLS {
			// A TLS client speaks first; one that does not within the
			// timeout is not a TLS client.
			_ = client.SetReadDeadline(time.Now().Add(p.cfg.TLSTimeout))
		}
		buf := make([]byte, 1024)
		n, err := client.Read(buf)
		_ = client.SetReadDeadline(time.Time{})
		first = buf[:n]
		if n == 0 {
			if entry.RequireTLS {
				return nil, deny(ReasonTLSRequired, "require_tls is set for %s and the client sent no ClientHello", entry)
			}
			if errors.Is(err, io.EOF) {
				return nil, nil // the client half-closed without data: forwarded by the copy
			}
			return nil, err
		}
	}
	if !looksLikeTLS(first) {
		if entry.RequireTLS {
			return nil, deny(ReasonTLSRequired, "require_tls is set for %s and the first bytes are not a TLS ClientHello", entry)
		}
		return first, nil
	}
	_ = client.SetReadDeadline(time.Now().Add(p.cfg.TLSTimeout))
	first, info, err := readClientHello(client, first)
	_ = client.SetReadDeadline(time.Time{})
	if err != nil {
		return nil, &Denial{Reason: ReasonTLSMalformed, Detail: "the first bytes start a TLS record but are not a well-formed ClientHello: " + err.Error(), Err: err}
	}
	ev.SNI = info.ServerName
	return first, checkSNI(info, req.Host)
}

func closeWrite(c net.Conn) error {
	if cw, ok := c.(closeWriter); ok {
		if err := cw.CloseWrite(); err != nil && !errors.Is(err, net.ErrClosed) {
			return err
		}
	}
	return nil
}
