//go:build linux

// Package agentwire holds the control API's wire types and Direct, the
// client of a process that makes a call or two and exits: trialnet-oci,
// which a container's start waits on. It links no net/http (nor
// crypto/tls, crypto/x509), which cost the hook about 2 ms of each start
// in initialisation alone, nor record and crypto/ed25519: the stats and
// receipts, which the hook never reads, are client's types. Package
// client names the rest of its types and serves every other caller.
package agentwire

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/textproto"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/trialnet/trialnet/internal/fdpass"
)

// DefaultSocket is the agent's control socket.
const DefaultSocket = "/run/trialnet/agent.sock"

// ErrNoAgent means no agent answers on the control socket.
var ErrNoAgent = errors.New("no trialnet agent is running")

// DefaultCallTimeout bounds a control API call whose context has no
// deadline of its own: an agent that accepts and never answers (stuck,
// or still starting) is reported, not waited for without end. A destroy
// kills the Trial's processes and waits for them, hence the room.
const DefaultCallTimeout = 2 * time.Minute

// Dial connects to the control socket and checks who listens on it:
// root, in this PID namespace. The answers of whoever listens there say
// which namespace and cgroup a command runs in; a socket bound by a
// process inside a Trial (its own PID namespace) or by another user must
// never be taken for the agent.
func Dial(ctx context.Context, socket string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return nil, err
	}
	if err := checkAgentPeer(c.(*net.UnixConn), socket); err != nil {
		_ = c.Close()
		return nil, err
	}
	return c, nil
}

// ImpostorError is a socket whose listener is not trialnet's agent.
type ImpostorError struct{ msg string }

func (e *ImpostorError) Error() string { return e.msg }

func checkAgentPeer(c *net.UnixConn, socket string) error {
	why, err := fdpass.RootPeer(c)
	if err != nil {
		return fmt.Errorf("who listens on %s: %w", socket, err)
	}
	if why == "" {
		return nil
	}
	if strings.Contains(why, "cannot see") {
		why += " (run trialnet in the agent's PID namespace: on Kubernetes, a pod with hostPID)"
	}
	return &ImpostorError{fmt.Sprintf("the process listening on %s is not trialnet's agent: it %s. Something took the agent's socket; see who (ss -xlp | grep %s), end it, and restart the agent (systemctl restart trialnet)",
		socket, why, filepath.Base(socket))}
}

// Unreached says what stands in the way when a request to the agent on
// socket got no answer (err): no socket, a socket left by an agent that
// is gone, no permission, or an agent that does not answer in time.
func Unreached(socket string, err error) error {
	var imp *ImpostorError
	switch {
	case errors.As(err, &imp):
		return imp // says all there is; the URL would only blur it
	case errors.Is(err, syscall.ENOENT):
		return fmt.Errorf("%w on %s: there is no socket (start one with 'sudo trialnet agent', or 'systemctl start trialnet')", ErrNoAgent, socket)
	case errors.Is(err, syscall.ECONNREFUSED):
		// What a killed agent leaves: its socket file, with no listener.
		return fmt.Errorf("%w on %s: the socket is left over from an agent that is gone (killed or crashed) and nothing listens on it (start one with 'sudo trialnet agent', or 'systemctl start trialnet'; it replaces the socket)", ErrNoAgent, socket)
	case errors.Is(err, syscall.EACCES):
		return fmt.Errorf("cannot reach the trialnet agent on %s: permission denied (the control socket is root only; try sudo)", socket)
	case errors.Is(err, context.Canceled):
		return fmt.Errorf("interrupted: the request to the trialnet agent on %s was abandoned before it answered (the agent may still carry it out: 'trialnet list' shows what it did)", socket)
	case errors.Is(err, context.DeadlineExceeded):
		// The socket is taken before the eBPF layer is loaded and Trials
		// are re-adopted, and connections wait in its backlog meanwhile.
		return fmt.Errorf("the trialnet agent on %s did not answer in time: it is still starting (loading eBPF, re-adopting Trials) or it is stuck; its log says which (journalctl -u trialnet, or kubectl logs)", socket)
	}
	return fmt.Errorf("trialnet agent on %s: %w", socket, err)
}

// Direct is the client of trialnet-oci: each request goes on a
// connection of its own, dialled, written and read on the caller's
// goroutine, without a transport's pool and its goroutines (a container
// start waited about 3 ms from the hook's request to the agent's
// handler). Its peer is checked and its errors said as client.Client's.
type Direct struct {
	Socket string
}

// NewDirect returns a direct client for the agent at socket ("" :
// DefaultSocket).
func NewDirect(socket string) *Direct {
	if socket == "" {
		socket = DefaultSocket
	}
	return &Direct{Socket: socket}
}

// Get describes one Trial.
func (c *Direct) Get(ctx context.Context, id string) (TrialInfo, error) {
	var out TrialInfo
	return out, c.do(ctx, "GET", "/v1/trials/"+url.PathEscape(id), nil, &out)
}

// AddContainer records that a container joins Trial id.
func (c *Direct) AddContainer(ctx context.Context, id string, ct Container) (TrialInfo, error) {
	var out TrialInfo
	return out, c.do(ctx, "POST", "/v1/trials/"+url.PathEscape(id)+"/containers", ct, &out)
}

// ContainerTrial makes a Trial around a container from a profile.
func (c *Direct) ContainerTrial(ctx context.Context, req ContainerTrial) (TrialInfo, error) {
	var out TrialInfo
	return out, c.do(ctx, "POST", "/v1/containers", req, &out)
}

// PrepareContainer has the agent make a profile container's cgroup
// before its runtime creates it (client.Client.PrepareContainer).
func (c *Direct) PrepareContainer(ctx context.Context, req ContainerPrepare) (PreparedContainer, error) {
	var out PreparedContainer
	return out, c.do(ctx, "POST", "/v1/containers/prepare", req, &out)
}

// EndContainer tells the agent that container id ended.
func (c *Direct) EndContainer(ctx context.Context, id string) (ContainerEnd, error) {
	var out ContainerEnd
	return out, c.do(ctx, "DELETE", "/v1/containers/"+url.PathEscape(id), nil, &out)
}

// Destroy tears a Trial down. Its final stats, in the answer, are not
// read: their types (client.Stats) would link record's into trialnet-oci.
func (c *Direct) Destroy(ctx context.Context, id string) error {
	return c.do(ctx, "DELETE", "/v1/trials/"+url.PathEscape(id), nil, nil)
}

func (c *Direct) do(ctx context.Context, method, path string, body, out any) error {
	return Call(ctx, body, func(ctx context.Context, b []byte) error { return c.once(ctx, method, path, b, out) }, nil)
}

// Call is one control API call as both clients make it: body as JSON,
// ctx bounded by DefaultCallTimeout where it has no deadline, and tried
// again (after handedOver, if any) while the agent answers that it
// handed over: it did nothing of the call, and its successor serves it
// once its socket replaces the old one's at the path, which may take
// seconds on a loaded host (the old agent answers until then, then
// closes: bounded). ctx bounds the tries; a call it ends while the
// answer is still handed_over says that no successor answered.
func Call(ctx context.Context, body any, once func(ctx context.Context, body []byte) error, handedOver func()) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultCallTimeout)
		defer cancel()
	}
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return err
		}
	}
	for {
		err := once(ctx, b)
		var e *Error
		if errors.As(err, &e) && e.Code == CodeHandedOver {
			if handedOver != nil {
				handedOver()
			}
			select {
			case <-ctx.Done():
				// The old agent's "the new agent serves a retry" is
				// what every retry disproved.
				return fmt.Errorf("%w; tried again until the call ended (%w), but no new agent answered at the socket: it is still starting (loading eBPF, re-adopting Trials) or it failed; its log says which (journalctl -u trialnet, or kubectl logs)", err, ctx.Err())
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		return err
	}
}

// once makes one request: an answer of 300 or more is the agent's *Error.
func (c *Direct) once(ctx context.Context, method, path string, body []byte, out any) error {
	status, line, rd, err := c.exchange(ctx, method, path, body)
	if err != nil {
		return Unreached(c.Socket, err)
	}
	defer rd.Close()
	if status >= 300 {
		var e struct {
			Error *Error `json:"error"`
		}
		if json.NewDecoder(rd).Decode(&e) == nil && e.Error != nil {
			return e.Error
		}
		return &Error{Code: CodeInternal, Message: "agent answered " + line}
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(rd).Decode(out); err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return Unreached(c.Socket, cerr)
		}
		return err
	}
	return nil
}

// exchange writes an HTTP/1.1 request on a connection of its own, asking
// the agent to close it after its answer, and reads the answer's status
// (code, and the status line's text after the version) and body, which
// closes the connection. A cancel or the deadline of ctx ends the
// exchange with the context's error.
func (c *Direct) exchange(ctx context.Context, method, path string, body []byte) (int, string, io.ReadCloser, error) {
	conn, err := Dial(ctx, c.Socket)
	if err != nil {
		return 0, "", nil, err
	}
	// A past deadline wakes a blocked write or read once ctx is done (a
	// cancel, its deadline), whose error is then the exchange's.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	fail := func(err error) (int, string, io.ReadCloser, error) {
		stop()
		_ = conn.Close()
		if cerr := ctx.Err(); cerr != nil {
			return 0, "", nil, cerr
		}
		return 0, "", nil, err
	}
	var req bytes.Buffer
	fmt.Fprintf(&req, "%s %s HTTP/1.1\r\nHost: trialnet\r\nUser-Agent: trialnet-oci\r\nConnection: close\r\n", method, path)
	if body != nil {
		fmt.Fprintf(&req, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	req.WriteString("\r\n")
	req.Write(body)
	if _, err := conn.Write(req.Bytes()); err != nil {
		return fail(err)
	}
	tp := textproto.NewReader(bufio.NewReader(conn))
	line, err := tp.ReadLine()
	if err != nil {
		return fail(err)
	}
	proto, text, ok := strings.Cut(line, " ")
	code, _, _ := strings.Cut(text, " ")
	status, cerr := strconv.Atoi(code)
	if !ok || !strings.HasPrefix(proto, "HTTP/1.") || cerr != nil || len(code) != 3 {
		return fail(fmt.Errorf("malformed HTTP status line %q", line))
	}
	hdr, err := tp.ReadMIMEHeader()
	if err != nil {
		return fail(err)
	}
	var rd io.Reader = tp.R
	switch te := strings.ToLower(hdr.Get("Transfer-Encoding")); {
	case te == "chunked":
		rd = &chunked{r: tp.R}
	case te != "":
		return fail(fmt.Errorf("unsupported transfer encoding %q", te))
	case hdr.Get("Content-Length") != "":
		n, err := strconv.ParseInt(hdr.Get("Content-Length"), 10, 64)
		if err != nil || n < 0 {
			return fail(fmt.Errorf("bad Content-Length %q", hdr.Get("Content-Length")))
		}
		rd = io.LimitReader(tp.R, n)
	}
	return status, text, &connBody{Reader: rd, conn: conn, stop: stop}, nil
}

// chunked reads a chunked body (RFC 9112, 7.1): the agent's server
// chunks an answer it has not measured; trailers are not read, as the
// connection closes after the body.
type chunked struct {
	r    *bufio.Reader
	left int64
	done bool
}

func (c *chunked) Read(p []byte) (int, error) {
	for c.left == 0 {
		if c.done {
			return 0, io.EOF
		}
		line, err := c.r.ReadString('\n')
		if err != nil {
			return 0, io.ErrUnexpectedEOF
		}
		size, _, _ := strings.Cut(strings.TrimRight(line, "\r\n"), ";")
		n, err := strconv.ParseInt(strings.TrimSpace(size), 16, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("malformed chunk size %q", line)
		}
		if n == 0 {
			c.done = true
			return 0, io.EOF
		}
		c.left = n
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if c.left == 0 && err == nil {
		// Each chunk's data ends in CRLF.
		if _, err := c.r.Discard(2); err != nil {
			return n, io.ErrUnexpectedEOF
		}
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// connBody is a response's body that closes its connection.
type connBody struct {
	io.Reader
	conn net.Conn
	stop func() bool
}

func (b *connBody) Close() error {
	b.stop()
	return b.conn.Close()
}
