//go:build linux

package proxy

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/wire"
)

// maxResponseHeaderBytes bounds a forwarded response's head, which the
// proxy holds whole before it writes a byte of it: net/http's default
// (10 MiB) let one Trial's upstream grow the shared proxy by that much a
// request.
const maxResponseHeaderBytes = 64 << 10

// hopByHop are the fields that describe one connection, never forwarded
// either way (RFC 9110 7.6.1), with Proxy-Authorization and
// Proxy-Authenticate, which are meant for this proxy.
var hopByHop = []string{
	"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization", "Proxy-Authenticate",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// removeHopByHop deletes the hop-by-hop fields and every field the
// Connection field names.
func removeHopByHop(h http.Header) {
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopByHop {
		h.Del(name)
	}
}

// httpConn forwards the requests of one client connection. Each request
// goes through the same steps as a CONNECT — strict head, allowlist
// before DNS, rate and tunnel limits, every address guarded, only checked
// addresses dialed — and is recorded as its own decision. A keep-alive
// client that switches hosts between requests is checked again each
// time; upstream connections are pooled by the Transport per host:port,
// and the Transport belongs to this client connection (so to one Trial),
// so a connection is never reused for another host or Trial.
type httpConn struct {
	p   *Proxy
	t   *trial
	c   net.Conn
	r   *bufio.Reader // holds a whole head: MaxHeaderBytes
	ctx context.Context
	tr  *http.Transport
	// dest is the name:port a transparent connection stands for, which
	// every request on it must name; nil on a proxy client's connection.
	dest *wire.Request
	// route is the credential gateway route of the request being
	// served; nil for a forwarded one.
	route *GatewayRoute
	// reached: bytes of the last request reached the upstream, over a
	// connection no check refused, so its record is allow.
	reached bool
	wrote   bool // response bytes reached the client: no refusal can follow

	// wmu orders a 100 Continue, written from the Transport's goroutine
	// when it first reads the body, before the response: once the
	// response is being written, no 100 Continue is.
	wmu        sync.Mutex
	responding bool
}

// errDrainedBetween ends a kept-alive connection that waited for its
// next request when StopAccepting ran: it closes idle, or, its next
// request come meanwhile, with that left unread, unrecorded, as if the
// connection had closed before it was sent.
var errDrainedBetween = errors.New("the agent handed over while the connection waited for its next request")

// serveHTTP serves forwarded requests on c until the client or a refusal
// ends the connection. headDone is called once the first head is in.
// dest is the name:port of a transparent connection (nil: a proxy
// client's). It returns the last request's event, not yet emitted, or nil.
func (p *Proxy) serveHTTP(c net.Conn, t *trial, br *bufio.Reader, ev *record.Event, headDone func(), dest *wire.Request) *record.Event {
	return p.serveConn(&httpConn{p: p, t: t, c: c, r: bufio.NewReaderSize(br, wire.MaxHeaderBytes), dest: dest}, ev, headDone)
}

// serveConn serves h's requests, as serveHTTP says.
func (p *Proxy) serveConn(h *httpConn, ev *record.Event, headDone func()) *record.Event {
	c, t, dest := h.c, h.t, h.dest
	ctx, cancel := context.WithCancel(t.ctx)
	defer cancel()
	h.ctx = ctx
	h.tr = &http.Transport{
		Proxy:               nil, // never the environment's proxy
		DialContext:         h.dial,
		DialTLSContext:      h.dialTLS, // a gateway route's upstream only (https)
		DisableCompression:  true,      // bytes pass as they are
		MaxIdleConnsPerHost: 1,         // requests on one client connection are sequential
		// and only the last host's connection is worth keeping: idle
		// upstream sockets count against no limit of the Trial's.
		MaxIdleConns:           1,
		IdleConnTimeout:        p.cfg.HeaderTimeout,
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
	}
	defer h.tr.CloseIdleConnections()
	for first := true; ; first = false {
		if !first {
			// A kept-alive connection gets HeaderTimeout for its next head.
			_ = c.SetReadDeadline(time.Now().Add(p.cfg.HeaderTimeout))
			ev = p.newEvent(t, c)
		}
		if dest != nil {
			// A request that fails before its head is read is still
			// recorded against the name the address stands for.
			ev.Transparent, ev.Host, ev.Port, ev.Target = true, dest.Host, dest.Port, dest.Target
		}
		keep, err := h.serveOne(ev, headDone, first)
		if errors.Is(err, wire.ErrClientDone) || errors.Is(err, errDrainedBetween) {
			return nil
		}
		if err != nil {
			if h.wrote {
				ev.Decision, ev.Reason = record.DecisionAllow, record.ReasonAllowed
				ev.Detail = "response cut: " + err.Error()
				_ = c.Close()
				return ev
			}
			h.wmu.Lock()
			h.responding = true // no 100 Continue after the refusal
			p.refuse(c, ev, err)
			h.wmu.Unlock()
			if h.reached {
				// What reached the upstream was allowed: the record says
				// so, whatever ended the exchange, and says what did.
				ev.Detail = fmt.Sprintf("the request reached the upstream, then %s: %s", ev.Reason, ev.Detail)
				ev.Decision, ev.Reason = record.DecisionAllow, record.ReasonAllowed
			}
			return ev
		}
		if !keep || p.draining.Load() {
			// Draining after a hand-over: the client's next request goes
			// to a new connection, which the new agent accepts.
			_ = c.Close()
			return ev
		}
		ev.Duration = time.Since(ev.Time)
		p.emit(t, ev)
	}
}

// serveOne serves one request; keep says the connection may carry
// another.
func (h *httpConn) serveOne(ev *record.Event, headDone func(), first bool) (keep bool, err error) {
	defer func() {
		if h.route != nil {
			err = redactSecret(err, h.t.gwForms)
		}
	}()
	h.wrote, h.reached = false, false
	h.wmu.Lock()
	h.responding = false
	h.wmu.Unlock()
	if !first && !h.t.waitNext(h.p, h.c) {
		return false, errDrainedBetween
	}
	raw, err := wire.PeekHead(h.r)
	if first {
		headDone()
	} else {
		h.t.gotNext(h.c)
		if h.p.draining.Load() {
			// The process handed over while this connection waited
			// (StopAccepting ended the wait), or as its next head came:
			// the successor decides that request, on a new connection.
			return false, errDrainedBetween
		}
	}
	if err != nil {
		return false, err
	}
	var req *wire.Request
	h.route = nil
	switch {
	case h.dest != nil:
		req, err = wire.ParseTransparentHead(raw, h.dest.Host, h.dest.Port)
	case len(h.t.gateway) > 0 && originForm(raw):
		req, h.route, err = h.t.gatewayRequest(raw)
	default:
		req, err = wire.ParseHTTPHead(raw)
	}
	if req != nil {
		ev.Method, ev.Target, ev.Host, ev.Port = req.Method, req.Target, req.Host, req.Port
	}
	own := ""
	if h.route != nil {
		ev.Route, own = h.route.Path, h.route.Header
	}
	if err == nil && misplaced(raw, own) {
		err = placeholderDenial("outside its route's header")
	}
	if err != nil {
		return false, h.t.chargeRefusal(err)
	}
	in, err := http.ReadRequest(h.r) // consumes exactly the head judged above
	if err != nil {
		return false, &record.Denial{Reason: record.ReasonBadRequest, Detail: "malformed request: " + err.Error(), Err: err}
	}
	_ = h.c.SetReadDeadline(time.Time{})
	if err := h.p.admitRequest(h.t, req, ev); err != nil {
		return false, err
	}
	defer h.t.tunnels.Add(-1)
	// Known to the Trial like a tunnel while it runs (a request or a
	// response may stream for as long as a tunnel), so that a deny --cut
	// of its entry ends it: in its DNS, dial or upload too (rctx).
	rctx, stop := context.WithCancel(h.ctx)
	defer stop()
	ot, err := h.t.register(req, ev, h.c, nil, stop)
	if err != nil {
		return false, err
	}
	defer h.t.unregister(ot)
	out, body, err := h.outgoing(in, req, ev)
	if err != nil {
		return false, err
	}
	f := &fwdReq{req: req, ev: ev, ot: ot, rctx: rctx}
	defer func() { h.reached = f.account() }()
	ctx := context.WithValue(httptrace.WithClientTrace(rctx, &httptrace.ClientTrace{GotConn: f.gotConn}), fwdKey{}, f)
	resp, err := h.tr.RoundTrip(out.WithContext(ctx))
	f.end()
	if err != nil {
		return false, h.roundTripError(err, body, ot)
	}
	ev.FirstByte = time.Since(ev.Time)
	ev.Status = resp.StatusCode
	defer resp.Body.Close()
	ev.Decision, ev.Reason = record.DecisionAllow, record.ReasonAllowed
	keep, err = h.respond(in, resp, ev)
	// A body the upstream did not read leaves the next head unfindable.
	return keep && body.done(), err
}

// fwdKey is the request context key of the *fwdReq the dialer serves.
type fwdKey struct{}

// fwdReq is one forwarded request as its dials and its record see it.
// Its dials may outlive it (net/http does not wait for a dial whose
// request was cancelled): they write its record only under mu, before end.
type fwdReq struct {
	req  *wire.Request
	ev   *record.Event
	ot   *openTunnel
	rctx context.Context // cancelled by a cut

	mu      sync.Mutex
	done    bool // the request ended: its record is no dial's to write
	refused bool // a dial of it was refused by a check (guard, policy, TLS)

	// On the RoundTrip goroutine only: the upstream connection it has,
	// that connection's counts when it got it, and the bytes of the
	// connections it had before (a retry after a reused one failed).
	up                   *trackedConn
	w0, r0               int64
	upBefore, downBefore int64
}

// end marks the request over for its dials.
func (f *fwdReq) end() {
	f.mu.Lock()
	f.done = true
	f.mu.Unlock()
}

// dialed copies what a dial learned into the record, unless the request
// ended first; a refusal of the dial is remembered.
func (f *fwdReq) dialed(dev *record.Event, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err != nil {
		f.refused = true
	}
	if f.done {
		return
	}
	f.ev.DNS, f.ev.Dial, f.ev.Dialed = dev.DNS, dev.Dial, dev.Dialed
	f.ev.ResolvedFrom(dev)
	if err == nil {
		f.ev.Rule, f.ev.Profile, f.ev.WouldDeny, f.ev.RequireTLS = dev.Rule, dev.Profile, dev.WouldDeny, dev.RequireTLS
	}
}

// gotConn ties the upstream connection the Transport chose (dialed now,
// or kept from the client's previous request) to the request: a cut
// closes it from then on, and its byte counts are the record's.
func (f *fwdReq) gotConn(info httptrace.GotConnInfo) {
	tc, ok := info.Conn.(*trackedConn)
	if !ok {
		_ = info.Conn.Close() // not one the dialer made: never used
		return
	}
	if f.up != nil {
		f.upBefore += f.up.wrote.Load() - f.w0
		f.downBefore += f.up.read.Load() - f.r0
	}
	f.up, f.w0, f.r0 = tc, tc.wrote.Load(), tc.read.Load()
	// The bare connection: a cut closes it under the Trial's lock, which
	// the tracked one's Close takes (the Transport closes that after).
	if err := f.ot.attach(tc.bare()); err != nil {
		_ = tc.Close() // cut while being opened: nothing may be written
	}
}

// account sets the record's bytes from what crossed the upstream
// connections during the request, heads included, however it ended, and
// says whether the record is allow because the request reached the
// upstream: never when a dial of it was refused, which is the record's.
func (f *fwdReq) account() (reached bool) {
	up, down := f.upBefore, f.downBefore
	if f.up != nil {
		f.up.settled()
		up += f.up.wrote.Load() - f.w0
		down += f.up.read.Load() - f.r0
	}
	f.ev.BytesUp, f.ev.BytesDown = up, down
	f.mu.Lock()
	defer f.mu.Unlock()
	return up > 0 && !f.refused
}

// roundTripError says whose doing a failed exchange was: a policy
// change's, the client's (its body), or the upstream's.
func (h *httpConn) roundTripError(err error, body *countBody, ot *openTunnel) error {
	if c := ot.cutBecause.Load(); c != nil {
		return record.Deny(c.reason, "%s while the request was being forwarded", c.why)
	}
	if berr := body.readErr(); berr != nil {
		var d *record.Denial
		if errors.As(berr, &d) {
			return d // the gateway's body bound
		}
		return &record.Denial{Reason: record.ReasonBadRequest, Detail: "the client's request body: " + berr.Error(), Err: berr}
	}
	return upstreamError(h.t.ctx, err)
}

// admitRequest charges one forwarded request like one CONNECT: the rate,
// a tunnel slot for its life (the caller gives it back) and the
// allowlist (recorded on ev), all before any DNS.
func (p *Proxy) admitRequest(t *trial, req *wire.Request, ev *record.Event) error {
	if err := t.takeConnect(); err != nil {
		return err
	}
	if n := t.tunnels.Add(1) + t.otherTunnels(); n > int64(t.limits.MaxTunnels) {
		t.tunnels.Add(-1)
		return record.Deny(record.ReasonTunnelLimit, "this Trial already has %d tunnels and requests open, its limit", t.limits.MaxTunnels)
	}
	_, err := t.judge(req, ev, true)
	if err != nil {
		t.tunnels.Add(-1)
		return err
	}
	return nil
}

// outgoing builds the upstream request: the checked name and port, the
// path and query as sent, the client's fields without hop-by-hop ones.
func (h *httpConn) outgoing(in *http.Request, req *wire.Request, ev *record.Event) (*http.Request, *countBody, error) {
	hdr := in.Header.Clone()
	removeHopByHop(hdr)
	if _, ok := hdr["User-Agent"]; !ok {
		hdr["User-Agent"] = []string{""} // net/http would add its own
	}
	body := &countBody{r: in.Body}
	if h.route != nil {
		if in.ContentLength > maxGatewayBody {
			return nil, nil, record.Deny(record.ReasonBodyTooLarge, "a gateway request body of %d bytes, over its bound of %d", in.ContentLength, maxGatewayBody)
		}
		body.r = &boundedBody{r: in.Body, n: maxGatewayBody}
	}
	if exp := hdr.Get("Expect"); exp != "" {
		if !strings.EqualFold(exp, "100-continue") || len(hdr.Values("Expect")) > 1 {
			return nil, nil, record.Deny(record.ReasonBadRequest, "Expect %q: only 100-continue is supported", wire.Truncate(exp))
		}
		hdr.Del("Expect")
		// The client waits for 100 Continue before its body; it gets one
		// when the upstream request first reads the body.
		body.onFirstRead = func() {
			h.wmu.Lock()
			defer h.wmu.Unlock()
			if !h.responding {
				_, _ = io.WriteString(h.c, "HTTP/1.1 100 Continue\r\n\r\n")
			}
		}
	}
	hostField := req.Host
	if req.Port != 80 {
		hostField = req.HostPort()
	}
	out := &http.Request{
		Method: in.Method,
		URL: &url.URL{Scheme: "http", Host: req.HostPort(), Path: in.URL.Path, RawPath: in.URL.RawPath,
			RawQuery: in.URL.RawQuery, ForceQuery: in.URL.ForceQuery},
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: hdr, Host: hostField, ContentLength: in.ContentLength,
	}
	if h.route != nil {
		h.gatewayOutgoing(out, in.URL)
	}
	if in.Body != nil && in.Body != http.NoBody {
		out.Body = body
	} else {
		body.eof.Store(true)
	}
	return out, body, nil
}

// respond writes the upstream's response to the client, without
// hop-by-hop fields, and says whether the connection may be kept.
func (h *httpConn) respond(in *http.Request, resp *http.Response, ev *record.Event) (bool, error) {
	h.wmu.Lock()
	h.responding = true
	h.wmu.Unlock()
	if h.route != nil {
		// The head as received: a Content-Encoding the Connection field
		// names would be dropped below, and the coded body pass as plain.
		forms := h.t.gwForms
		if err := checkGatewayHead(resp, forms); err != nil {
			return false, err
		}
		resp.Body = &secretFilter{body: resp.Body, resp: resp, forms: forms}
	}
	removeHopByHop(resp.Header)
	resp.ProtoMajor, resp.ProtoMinor, resp.Proto = 1, 1, "HTTP/1.1"
	// An unsolicited 101 (Upgrade is never forwarded) switches nothing
	// here: it is relayed, and the connection ends with it.
	keep := !in.Close && !(in.ProtoMajor == 1 && in.ProtoMinor == 0) && resp.StatusCode != http.StatusSwitchingProtocols
	resp.Close = !keep
	resp.TransferEncoding = nil
	if resp.ContentLength < 0 && in.Method != http.MethodHead && bodyAllowed(resp.StatusCode) {
		if in.ProtoMinor == 0 {
			keep, resp.Close = false, true // HTTP/1.0: the end of the body is the close
		} else {
			resp.TransferEncoding = []string{"chunked"}
		}
	}
	w := &countWriter{w: h.c, wrote: &h.wrote}
	err := resp.Write(w)
	ev.BytesDown = w.n
	return keep && !resp.Close, err
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

// dial is the Transport's only way to the network: the checked
// resolution and dial of the request being served, for exactly its
// host:port.
func (h *httpConn) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	f, _ := ctx.Value(fwdKey{}).(*fwdReq)
	if f == nil || addr != f.req.HostPort() {
		return nil, record.Deny(record.ReasonPolicyDenied, "the forwarder asked to dial %q outside a checked request", wire.Truncate(addr))
	}
	// net/http does not cancel a dial with its request: a cut must.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(f.rctx, cancel)()
	dev := &record.Event{} // the request may end while this dial runs: f.dialed copies
	up, err := h.p.connect(ctx, h.t, f.req, dev)
	if err == nil {
		boundBuffers(up, upstreamBuffer)
	}
	if c := f.ot.cutBecause.Load(); c != nil && err == nil {
		_ = up.Close()
		err = record.Deny(c.reason, "%s while the request was being opened", c.why)
	}
	if err == nil {
		// The allowlist may have changed during the DNS and the dial:
		// decide again, as a CONNECT does when it registers.
		if err = h.t.redecide(f.req, dev, f.ot); err != nil {
			_ = up.Close()
		}
	}
	f.dialed(dev, err)
	if err != nil {
		if c := f.ot.cutBecause.Load(); c != nil {
			return nil, record.Deny(c.reason, "%s while the request was being opened", c.why)
		}
		return nil, err
	}
	if !h.t.track(up) {
		_ = up.Close()
		return nil, record.Deny(record.ReasonShutdown, "the Trial is being removed")
	}
	return &trackedConn{Conn: up, t: h.t}, nil
}

// upstreamError turns a RoundTrip error into a denial: the dialer's own,
// or a failed exchange with the upstream.
func upstreamError(trialCtx context.Context, err error) error {
	var d *record.Denial
	if errors.As(err, &d) {
		return d
	}
	if trialCtx.Err() != nil {
		return &record.Denial{Reason: record.ReasonShutdown, Detail: "the Trial is being removed", Err: err}
	}
	return &record.Denial{Reason: record.ReasonUpstreamBadResponse, Detail: "the upstream did not answer the request: " + err.Error(), Err: err}
}

// trackedConn is an upstream connection tracked by its Trial, so that
// removing the Trial closes it, with the bytes that crossed it each way.
type trackedConn struct {
	net.Conn
	// raw is the TCP connection under a gateway's TLS one (Conn); nil
	// when Conn is that connection itself.
	raw         net.Conn
	t           *trial
	wrote, read atomic.Int64
	// writing counts Writes under way: their bytes may have reached the
	// upstream (and been answered) before wrote counts them.
	writing atomic.Int32
}

func (c *trackedConn) Write(p []byte) (int, error) {
	c.writing.Add(1)
	defer c.writing.Add(-1)
	n, err := c.Conn.Write(p)
	c.wrote.Add(int64(n))
	return n, err
}

// settled waits for the Writes under way, so that wrote is final for
// what came before: a Write still blocked once its request is over (the
// upstream stopped reading a body it answered early) is ended by closing
// the connection, which is then no use to another request anyway.
func (c *trackedConn) settled() {
	for i := 0; c.writing.Load() > 0; i++ {
		if i == 100 {
			_ = c.Close()
		}
		time.Sleep(100 * time.Microsecond)
	}
}

func (c *trackedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

func (c *trackedConn) Close() error {
	c.t.untrack(c.bare())
	return c.Conn.Close()
}

// bare is the TCP connection: the one the Trial tracks, and a cut closes.
func (c *trackedConn) bare() net.Conn {
	if c.raw != nil {
		return c.raw
	}
	return c.Conn
}

// countBody is the client's request body as the upstream request reads
// it: counted, with a hook for 100-continue, and not drained or closed by
// the Transport (the client connection's reader is not its to drain).
type countBody struct {
	r           io.Reader
	eof         atomic.Bool
	err         atomic.Pointer[error] // the first read error but EOF: the client's
	onFirstRead func()
}

func (b *countBody) Read(p []byte) (int, error) {
	if f := b.onFirstRead; f != nil {
		b.onFirstRead = nil
		f()
	}
	n, err := b.r.Read(p)
	switch {
	case errors.Is(err, io.EOF):
		b.eof.Store(true)
	case err != nil:
		b.err.CompareAndSwap(nil, &err)
	}
	return n, err
}

// readErr is the error reading the client's body met, if any.
func (b *countBody) readErr() error {
	if p := b.err.Load(); p != nil {
		return *p
	}
	return nil
}

func (b *countBody) Close() error { return nil }

func (b *countBody) done() bool { return b.eof.Load() }

type countWriter struct {
	w     io.Writer
	n     int64
	wrote *bool
}

func (w *countWriter) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	w.n += int64(n)
	if n > 0 {
		*w.wrote = true
	}
	return n, err
}

// newEvent starts the decision record of one request on c.
func (p *Proxy) newEvent(t *trial, c net.Conn) *record.Event {
	return &record.Event{Schema: record.EventSchema, ID: rand.Text(), Time: time.Now(), Trial: t.id, Client: c.RemoteAddr().String(), Learning: t.learn}
}
