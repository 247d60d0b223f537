//go:build linux

// Package client talks to a trialnet agent over its control socket: it
// holds the control API's client, its wire types and errors, the Trials
// interface that the agent (in process) and Client (over the socket)
// both serve, and Run, one command in an ephemeral Trial. It links no
// eBPF, proxy, namespace or cgroup code, so a harness can import it
// (the agent's side, which serves the API, is package agent).
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/trialnet/trialnet/internal/fdpass"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/trial"
)

// DefaultSocket is the agent's control socket.
const DefaultSocket = "/run/trialnet/agent.sock"

// ErrNoAgent means no agent answers on the control socket.
var ErrNoAgent = errors.New("no trialnet agent is running")

// Client talks to an agent over its control socket.
type Client struct {
	Socket string
	hc     *http.Client
	// held is the connection Running checked, kept for the next call so
	// that a run dials the agent once: its peer was checked when it was
	// dialled, and a connected socket's peer never changes.
	held chan net.Conn
	// direct: each request on a connection of its own, written and read
	// on the caller's goroutine (NewDirectClient).
	direct bool
}

var _ Trials = (*Client)(nil)

// NewClient returns a client for the agent at socket ("" : DefaultSocket).
func NewClient(socket string) *Client {
	if socket == "" {
		socket = DefaultSocket
	}
	c := &Client{Socket: socket, held: make(chan net.Conn, 1)}
	c.hc = &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			select {
			case conn := <-c.held:
				return conn, nil
			default:
				return dialAgent(ctx, socket)
			}
		},
	}}
	return c
}

// NewDirectClient returns a client for a process that makes a call or
// two and exits, trialnet oci-hook, which a container's start waits on:
// each request goes on a connection of its own, dialled, written and
// read on the caller's goroutine, without the transport's pool and its
// goroutines (a container start waited about 3 ms from the hook's
// request to the agent's handler). Its peer is checked as NewClient's,
// and its errors are NewClient's.
func NewDirectClient(socket string) *Client {
	c := NewClient(socket)
	c.direct = true
	return c
}

// Running reports whether an agent answers on the socket. An error means
// something answers that is not trialnet's agent. The connection it
// checked serves the next call (Release drops it if none comes).
func (c *Client) Running(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second) // a listener answers a dial at once
	defer cancel()
	conn, err := dialAgent(ctx, c.Socket)
	var imp *impostorError
	if errors.As(err, &imp) {
		return false, err
	}
	if err != nil {
		return false, nil
	}
	c.Release()
	c.held <- conn
	return true, nil
}

// Release closes the connection Running kept, if no call took it.
func (c *Client) Release() {
	select {
	case conn := <-c.held:
		_ = conn.Close()
	default:
	}
}

// dialAgent connects to the control socket and checks who listens on it:
// root, in this PID namespace. The answers of whoever listens there say
// which namespace and cgroup a command runs in; a socket bound by a
// process inside a Trial (its own PID namespace) or by another user must
// never be taken for the agent.
func dialAgent(ctx context.Context, socket string) (net.Conn, error) {
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

// impostorError is a socket whose listener is not trialnet's agent.
type impostorError struct{ msg string }

func (e *impostorError) Error() string { return e.msg }

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
	return &impostorError{fmt.Sprintf("the process listening on %s is not trialnet's agent: it %s. Something took the agent's socket; see who (ss -xlp | grep %s), end it, and restart the agent (systemctl restart trialnet)",
		socket, why, filepath.Base(socket))}
}

// DefaultCallTimeout bounds a control API call whose context has no
// deadline of its own: an agent that accepts and never answers (stuck,
// or still starting) is reported, not waited for without end. A destroy
// kills the Trial's processes and waits for them, hence the room.
const DefaultCallTimeout = 2 * time.Minute

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
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
	for attempt := 1; ; attempt++ {
		err := c.once(ctx, method, path, b, out)
		var e *Error
		// An agent that handed over while the call waited did nothing of
		// it: its successor, on the same socket, serves it.
		if attempt < 5 && errors.As(err, &e) && e.Code == CodeHandedOver {
			c.hc.CloseIdleConnections()
			select {
			case <-ctx.Done():
				return err
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		return err
	}
}

func (c *Client) once(ctx context.Context, method, path string, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://trialnet"+path, rd)
	if err != nil {
		return err
	}
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(out)
}

// Create asks for a Trial.
func (c *Client) Create(ctx context.Context, req trial.Request) (TrialInfo, error) {
	var out TrialInfo
	err := c.do(ctx, http.MethodPost, "/v1/trials", req, &out)
	var e *Error
	if req.Owned && errors.As(err, &e) && e.Code == CodeBadRequest && strings.Contains(e.Message, `unknown field "owned"`) {
		return out, fmt.Errorf("the agent on %s is older than this trialnet: it cannot end a Trial when the process that asked for it dies, so nothing was created (a run killed outright would leave its Trial behind). Restart the agent on this trialnet (systemctl restart trialnet): %w", c.Socket, err)
	}
	return out, err
}

// List returns the live Trials.
func (c *Client) List(ctx context.Context) ([]TrialInfo, error) {
	var out []TrialInfo
	return out, c.do(ctx, http.MethodGet, "/v1/trials", nil, &out)
}

// Get describes one Trial.
func (c *Client) Get(ctx context.Context, id string) (TrialInfo, error) {
	var out TrialInfo
	return out, c.do(ctx, http.MethodGet, "/v1/trials/"+url.PathEscape(id), nil, &out)
}

// AddContainer records that a container joins Trial id: trialnet
// oci-hook calls it once the container passed its checks, before the
// runtime starts it.
func (c *Client) AddContainer(ctx context.Context, id string, ct Container) (TrialInfo, error) {
	var out TrialInfo
	return out, c.do(ctx, http.MethodPost, "/v1/trials/"+url.PathEscape(id)+"/containers", ct, &out)
}

// ContainerTrial makes a Trial around a container from a profile:
// trialnet oci-hook calls it at createRuntime for a container annotated
// trialnet.io/profile=NAME.
func (c *Client) ContainerTrial(ctx context.Context, req ContainerTrial) (TrialInfo, error) {
	var out TrialInfo
	return out, c.do(ctx, http.MethodPost, "/v1/containers", req, &out)
}

// PrepareContainer has the agent make a profile container's cgroup,
// with a pending entry, before its runtime creates it: trialnet
// oci-runtime calls it, then runs the runtime in its own place. The
// entry goes when the caller exits without the hook having adopted the
// container, or when it expires.
func (c *Client) PrepareContainer(ctx context.Context, req ContainerPrepare) (PreparedContainer, error) {
	var out PreparedContainer
	return out, c.do(ctx, http.MethodPost, "/v1/containers/prepare", req, &out)
}

// EndContainer tells the agent that container id ended: a Trial made
// around it is destroyed, a Trial it joined no longer lists it.
func (c *Client) EndContainer(ctx context.Context, id string) (ContainerEnd, error) {
	var out ContainerEnd
	return out, c.do(ctx, http.MethodDelete, "/v1/containers/"+url.PathEscape(id), nil, &out)
}

// send makes a request to the agent: a transport failure says whether an
// agent runs there at all, and an answer of 300 or more is the agent's
// *Error.
func (c *Client) send(req *http.Request) (*http.Response, error) {
	resp, err := c.roundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		var e struct {
			Error *Error `json:"error"`
		}
		if json.NewDecoder(resp.Body).Decode(&e) == nil && e.Error != nil {
			return nil, e.Error
		}
		return nil, &Error{Code: CodeInternal, Message: "agent answered " + resp.Status}
	}
	return resp, nil
}

// roundTrip makes a request to the agent; its error says what stands in
// the way when no answer comes: no socket, a socket left by an agent that
// is gone, no permission, or an agent that does not answer in time.
func (c *Client) roundTrip(req *http.Request) (*http.Response, error) {
	var resp *http.Response
	var err error
	if c.direct {
		resp, err = c.exchange(req)
	} else {
		resp, err = c.hc.Do(req)
	}
	var imp *impostorError
	switch {
	case err == nil:
		return resp, nil
	case errors.As(err, &imp):
		return nil, imp // says all there is; the URL would only blur it
	case errors.Is(err, syscall.ENOENT):
		return nil, fmt.Errorf("%w on %s: there is no socket (start one with 'sudo trialnet agent', or 'systemctl start trialnet')", ErrNoAgent, c.Socket)
	case errors.Is(err, syscall.ECONNREFUSED):
		// What a killed agent leaves: its socket file, with no listener.
		return nil, fmt.Errorf("%w on %s: the socket is left over from an agent that is gone (killed or crashed) and nothing listens on it (start one with 'sudo trialnet agent', or 'systemctl start trialnet'; it replaces the socket)", ErrNoAgent, c.Socket)
	case errors.Is(err, syscall.EACCES):
		return nil, fmt.Errorf("cannot reach the trialnet agent on %s: permission denied (the control socket is root only; try sudo)", c.Socket)
	case errors.Is(err, context.Canceled):
		return nil, fmt.Errorf("interrupted: the request to the trialnet agent on %s was abandoned before it answered (the agent may still carry it out: 'trialnet list' shows what it did)", c.Socket)
	case errors.Is(err, context.DeadlineExceeded):
		// The socket is taken before the eBPF layer is loaded and Trials
		// are re-adopted, and connections wait in its backlog meanwhile.
		return nil, fmt.Errorf("the trialnet agent on %s did not answer in time: it is still starting (loading eBPF, re-adopting Trials) or it is stuck; its log says which (journalctl -u trialnet, or kubectl logs)", c.Socket)
	}
	return nil, fmt.Errorf("trialnet agent on %s: %w", c.Socket, err)
}

// exchange makes req on a connection of its own, which the response's
// body closes. The request asks the agent to close it after its answer,
// so that nothing is left for a pool. A cancel or the deadline of req's
// context ends the exchange with the context's error.
func (c *Client) exchange(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	conn, err := dialAgent(ctx, c.Socket)
	if err != nil {
		return nil, err
	}
	// A past deadline wakes a blocked write or read once ctx is done (a
	// cancel, its deadline), whose error is then the exchange's.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	fail := func(err error) (*http.Response, error) {
		stop()
		_ = conn.Close()
		if cerr := ctx.Err(); cerr != nil {
			return nil, cerr
		}
		return nil, err
	}
	req.Close = true
	w := bufio.NewWriter(conn)
	if err := req.Write(w); err != nil {
		return fail(err)
	}
	if err := w.Flush(); err != nil {
		return fail(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return fail(err)
	}
	resp.Body = &connBody{ReadCloser: resp.Body, conn: conn, stop: stop}
	return resp, nil
}

// connBody is a response's body that closes its connection.
type connBody struct {
	io.ReadCloser
	conn net.Conn
	stop func() bool
}

func (b *connBody) Close() error {
	b.stop()
	err := b.ReadCloser.Close()
	if cerr := b.conn.Close(); err == nil {
		err = cerr
	}
	return err
}

// Health asks the agent whether it is healthy (GET /healthz). An agent
// that answers, healthy or not, gives its Health and no error. ctx bounds
// the wait: a starting or stuck agent accepts connections it does not
// answer.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://trialnet/healthz", nil)
	if err != nil {
		return h, err
	}
	resp, err := c.roundTrip(req)
	if err != nil {
		return h, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusServiceUnavailable {
		return h, fmt.Errorf("trialnet agent on %s answered /healthz with %s", c.Socket, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil {
		return h, fmt.Errorf("trialnet agent on %s: its /healthz answer: %w", c.Socket, err)
	}
	return h, nil
}

// Stats reads one Trial's counters.
func (c *Client) Stats(ctx context.Context, id string) (Stats, error) {
	var out Stats
	return out, c.do(ctx, http.MethodGet, "/v1/trials/"+url.PathEscape(id)+"/stats", nil, &out)
}

// Destroy tears a Trial down and returns its final stats.
func (c *Client) Destroy(ctx context.Context, id string) (Stats, error) {
	var out Stats
	return out, c.do(ctx, http.MethodDelete, "/v1/trials/"+url.PathEscape(id), nil, &out)
}

// DestroyExit is Destroy saying how the Trial's command ended, for the
// receipt.
func (c *Client) DestroyExit(ctx context.Context, id string, exit *int) (Stats, error) {
	if exit == nil {
		return c.Destroy(ctx, id)
	}
	var out Stats
	return out, c.do(ctx, http.MethodDelete, "/v1/trials/"+url.PathEscape(id)+"?exit_code="+strconv.Itoa(*exit), nil, &out)
}

// Watch calls fn with each decision of a live Trial as the agent makes
// it, until ctx ends or the Trial is destroyed.
//
// A stream ends when the Trial does, or when its agent hands over to a
// new one: then, the Trial still live, Watch follows it there (records
// made in between are in its log, not in the stream).
func (c *Client) Watch(ctx context.Context, id string, fn func(record.Event)) error {
	for quick := 0; ; {
		opened := time.Now()
		if err := c.watchOnce(ctx, id, fn); err != nil || ctx.Err() != nil {
			return err
		}
		var e *Error
		if _, err := c.Get(ctx, id); errors.As(err, &e) && e.Code == CodeUnknownTrial {
			return nil // the Trial ended
		}
		// Still live, or its agent not answering yet: try again, a few
		// times in quick succession at most.
		if time.Since(opened) < time.Second {
			if quick++; quick == 10 {
				return fmt.Errorf("decision stream of %s: it keeps ending while the Trial lives", id)
			}
		} else {
			quick = 0
		}
		c.hc.CloseIdleConnections()
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Duration(quick+1) * 100 * time.Millisecond):
		}
	}
}

func (c *Client) watchOnce(ctx context.Context, id string, fn func(record.Event)) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://trialnet/v1/trials/"+url.PathEscape(id)+"/decisions", nil)
	if err != nil {
		return err
	}
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var ev record.Event
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("decision stream of %s: %w", id, err)
		}
		fn(ev)
	}
}

// Audit returns a Trial's decision log.
func (c *Client) Audit(ctx context.Context, id string) ([]record.Event, error) {
	var out []record.Event
	return out, c.do(ctx, http.MethodGet, "/v1/trials/"+url.PathEscape(id)+"/audit", nil, &out)
}

// ChangeAllow changes a live Trial's allowlist.
func (c *Client) ChangeAllow(ctx context.Context, id string, ch AllowChange) (AllowChanged, error) {
	var out AllowChanged
	return out, c.do(ctx, http.MethodPatch, "/v1/trials/"+url.PathEscape(id)+"/allow", ch, &out)
}

// Reload asks the agent to read its config file again.
func (c *Client) Reload(ctx context.Context, req ReloadRequest) (ReloadResult, error) {
	var out ReloadResult
	return out, c.do(ctx, http.MethodPost, "/v1/reload", req, &out)
}
