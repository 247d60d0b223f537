//go:build linux

package agentwire

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/privtest"
)

// A direct client's call goes on a connection of its own, closed after
// the answer; it reads the agent's answers whole (with a Content-Length
// or chunked) and its errors, retries a call that an agent handing over
// did not carry out, and a call with no answer ends at its context's
// deadline, said as client.Client says it.
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
			case "/v1/trials/t1":
				_, _ = w.Write([]byte(`{"id":"t1"}`))
			case "/v1/trials/big":
				// Flushed in parts: the server chunks it.
				_, _ = w.Write([]byte(`{"id":"big","agent_dirs":[`))
				for i := range 500 {
					w.(http.Flusher).Flush()
					_, _ = fmt.Fprintf(w, "%q,", fmt.Sprintf("/var/lib/dir-%d", i))
				}
				_, _ = w.Write([]byte(`"/last"]}`))
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
	c := NewDirect(sock)
	ctx := context.Background()
	if info, err := c.Get(ctx, "t1"); err != nil || info.ID != "t1" {
		t.Fatalf("Get = %v, %v; want t1", info, err)
	}
	if info, err := c.Get(ctx, "big"); err != nil || info.ID != "big" || len(info.AgentDirs) != 501 || info.AgentDirs[500] != "/last" {
		t.Errorf("Get of a chunked answer = %d dirs, %v; want big with 501", len(info.AgentDirs), err)
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
	if o, cl := opened.Load(), closed.Load(); o != 6 || cl != o {
		t.Errorf("%d connections opened, %d closed; want 6, each closed", o, cl)
	}
}
