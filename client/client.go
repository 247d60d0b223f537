//go:build linux

// Package client talks to a trialnet agent over its control socket: it
// holds the control API's client, its wire types and errors, the Trials
// interface that the agent (in process) and Client (over the socket)
// both serve, and Run, one command in an ephemeral Trial. It links no
// eBPF, proxy, namespace or cgroup code, so a harness can import it
// (the agent's side, which serves the API, is package agent).
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/trialnet/trialnet/internal/agentwire"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/trial"
)

// Client talks to an agent over its control socket.
type Client struct {
	Socket string
	hc     *http.Client
	// held is the connection Running checked, kept for the next call so
	// that a run dials the agent once: its peer was checked when it was
	// dialled, and a connected socket's peer never changes.
	held chan net.Conn
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
				return agentwire.Dial(ctx, socket)
			}
		},
	}}
	return c
}

// Running reports whether an agent answers on the socket. An error means
// something answers that is not trialnet's agent. The connection it
// checked serves the next call (Release drops it if none comes).
func (c *Client) Running(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second) // a listener answers a dial at once
	defer cancel()
	conn, err := agentwire.Dial(ctx, c.Socket)
	var imp *agentwire.ImpostorError
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

// DefaultCallTimeout bounds a control API call whose context has no
// deadline of its own (agentwire.DefaultCallTimeout).
const DefaultCallTimeout = agentwire.DefaultCallTimeout

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	return agentwire.Call(ctx, body, func(ctx context.Context, b []byte) error { return c.once(ctx, method, path, b, out) }, c.hc.CloseIdleConnections)
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
// the way when no answer comes (agentwire.Unreached).
func (c *Client) roundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, agentwire.Unreached(c.Socket, err)
	}
	return resp, nil
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
	err := c.do(ctx, http.MethodDelete, "/v1/trials/"+url.PathEscape(id), nil, &out)
	return failedStats(out, err)
}

// DestroyExit is Destroy saying how the Trial's command ended, for the
// receipt.
func (c *Client) DestroyExit(ctx context.Context, id string, exit *int) (Stats, error) {
	if exit == nil {
		return c.Destroy(ctx, id)
	}
	var out Stats
	err := c.do(ctx, http.MethodDelete, "/v1/trials/"+url.PathEscape(id)+"?exit_code="+strconv.Itoa(*exit), nil, &out)
	return failedStats(out, err)
}

// failedStats is a destroy's answer: out, or, when it failed, the final
// stats the agent made all the same and sent with its error (Error.Stats).
func failedStats(out Stats, err error) (Stats, error) {
	var e *Error
	if errors.As(err, &e) && len(e.Stats) > 0 {
		_ = json.Unmarshal(e.Stats, &out)
	}
	return out, err
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
