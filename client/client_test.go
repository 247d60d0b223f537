//go:build linux

package client

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/privtest"
)

// serveCounting serves an agent-like API (an empty list of Trials) on a
// unix socket of root's in this PID namespace, which passes the client's
// peer check, and counts the connections it accepts.
func serveCounting(t *testing.T) (sock string, conns *atomic.Int64) {
	t.Helper()
	sock = filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	conns = new(atomic.Int64)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("[]")) }),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		},
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return sock, conns
}

// A run dials the agent once: the connection Running checked carries the
// next call, and a call after Release dials (and checks) afresh.
func TestPrivilegedRunningConnectionServesNextCall(t *testing.T) {
	privtest.Require(t) // the peer check passes root's listeners only
	sock, conns := serveCounting(t)
	c := NewClient(sock)
	ctx := context.Background()
	if running, err := c.Running(ctx); err != nil || !running {
		t.Fatalf("Running = %v, %v; want true", running, err)
	}
	if _, err := c.List(ctx); err != nil {
		t.Fatal(err)
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("Running then List made %d connections; want 1 (Running's carries the call)", n)
	}

	c2 := NewClient(sock)
	if running, err := c2.Running(ctx); err != nil || !running {
		t.Fatalf("Running = %v, %v; want true", running, err)
	}
	c2.Release()
	c2.Release() // nothing left to drop: no block, no panic
	if _, err := c2.List(ctx); err != nil {
		t.Fatalf("List after Release: %v; want a fresh connection", err)
	}
	if n := conns.Load(); n != 3 {
		t.Errorf("%d connections in all; want 3 (after Release, List dials its own)", n)
	}
}

// A direct client's call goes on a connection of its own, closed after
// the answer; it reads the agent's errors, retries a call that an agent
// handing over did not carry out, and a call with no answer ends at its
// context's deadline, said as NewClient says it.
func TestPrivilegedDirectClient(t *testing.T) {
	privtest.Require(t) // the peer check passes root's listeners only
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var opened, closed, handedOver atomic.Int64
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch r.URL.Path {
			case "/v1/trials":
				_, _ = w.Write([]byte(`[{"id":"t1"}]`))
			case "/v1/trials/handover":
				if handedOver.Add(1) == 1 {
					w.WriteHeader(http.StatusServiceUnavailable)
					_, _ = w.Write([]byte(`{"error":{"code":"handed_over","message":"handed over"}}`))
					return
				}
				_, _ = w.Write([]byte(`{"id":"handover"}`))
			case "/v1/trials/stuck":
				<-r.Context().Done()
			default:
				w.WriteHeader(http.StatusNotFound)
				_, _ = w.Write([]byte(`{"error":{"code":"unknown_trial","message":"no Trial x"}}`))
			}
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			switch s {
			case http.StateNew:
				opened.Add(1)
			case http.StateClosed:
				closed.Add(1)
			}
		},
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	c := NewDirectClient(sock)
	ctx := context.Background()
	list, err := c.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != "t1" {
		t.Fatalf("List = %v, %v; want [t1]", list, err)
	}
	_, err = c.Get(ctx, "x")
	var e *Error
	if !errors.As(err, &e) || e.Code != CodeUnknownTrial {
		t.Errorf("Get of an unknown Trial: %v; want the agent's %s", err, CodeUnknownTrial)
	}
	if info, err := c.Get(ctx, "handover"); err != nil || info.ID != "handover" {
		t.Errorf("Get across a handover = %v, %v; want it retried", info, err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := c.Get(short, "stuck"); err == nil || !strings.Contains(err.Error(), "did not answer in time") {
		t.Errorf("Get with no answer: %v; want the deadline's error", err)
	}
	// The server sees each close as it reads the next request: bounded wait.
	for end := time.Now().Add(5 * time.Second); closed.Load() < opened.Load() && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	if o, cl := opened.Load(), closed.Load(); o != 5 || cl != o {
		t.Errorf("%d connections opened, %d closed; want 5, each closed", o, cl)
	}
}
