//go:build linux

package main

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/privtest"
)

// stuckAgent listens where an agent would, as root in this PID namespace
// (so the client takes it for the agent), accepts and never answers: an
// agent that is stuck. Each accepted connection is sent on the channel.
func stuckAgent(t *testing.T) (string, <-chan net.Conn) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		for len(accepted) > 0 {
			_ = (<-accepted).Close()
		}
	})
	return sock, accepted
}

// A call to an agent that never answers ends at its context's deadline,
// with what to do, rather than waiting without end.
func TestPrivilegedClientCallHasADeadline(t *testing.T) {
	privtest.Require(t)
	sock, _ := stuckAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := client.NewClient(sock).Destroy(ctx, "stuck-1")
	if err == nil || !strings.Contains(err.Error(), "did not answer in time") || time.Since(start) > 5*time.Second {
		t.Fatalf("destroy against a stuck agent: %v after %v", err, time.Since(start))
	}
}

// ^C ends any command that only asks the agent, at once and saying so,
// even while the agent does not answer.
func TestPrivilegedInterruptEndsAgentCalls(t *testing.T) {
	privtest.Require(t)
	sock, accepted := stuckAgent(t)
	for _, args := range [][]string{
		{"destroy", "stuck-1"},
		{"list"},
		{"stats", "--trial", "stuck-1"},
		{"audit", "--trial", "stuck-1"},
		{"deny", "--trial", "stuck-1", "a.example.com:443"},
		{"reload"},
	} {
		t.Run(args[0], func(t *testing.T) {
			cmd := trialnetProcess(t, append(args, "--socket", sock)...)
			var errOut bytes.Buffer
			cmd.Stderr = &errOut
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			select {
			case c := <-accepted: // the request is with the agent, which will not answer
				// Held: a connection the test drops would be closed by its
				// finalizer, a reset the client would report instead.
				t.Cleanup(func() { _ = c.Close() })
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
				t.Fatalf("trialnet %s never reached the agent: %s", args[0], errOut.String())
			}
			time.Sleep(50 * time.Millisecond)
			_ = cmd.Process.Signal(syscall.SIGINT)
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				_ = cmd.Process.Kill()
				<-done
				t.Fatalf("trialnet %s still waited for a stuck agent 5s after ^C", args[0])
			}
			if code := cmd.ProcessState.ExitCode(); code != exitFailure || !strings.Contains(errOut.String(), "interrupted") {
				t.Fatalf("trialnet %s after ^C: exit %d, %q", args[0], code, errOut.String())
			}
		})
	}
}
