//go:build linux

package client

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

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

// A destroy that failed sends the final stats it made all the same with
// its error (an UNKNOWN or ALARM verdict, signed): DestroyExit returns
// them beside the error, where they were lost.
func TestPrivilegedFailedDestroyKeepsItsStats(t *testing.T) {
	privtest.Require(t) // the peer check passes root's listeners only
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	const body = `{"error":{"code":"internal","message":"destroy t1: close Trial t1: cgroup still has processes","stats":{"trial":"t1","direct_egress_packets":3,"verdict":"ALARM: 3 direct egress packets dropped"}}}`
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(body))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	exit := 0
	st, err := NewClient(sock).DestroyExit(context.Background(), "t1", &exit)
	if err == nil || st.Egress != 3 || !strings.HasPrefix(st.Verdict, "ALARM") {
		t.Errorf("DestroyExit = %+v, %v; want the ALARM stats beside the error", st, err)
	}
}
