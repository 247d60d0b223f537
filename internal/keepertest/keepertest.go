//go:build linux

// Package keepertest runs a keeper in a test's own process, for the
// tests of package keeper and of the agent that uses it.
package keepertest

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/fdpass"
	"github.com/trialnet/trialnet/keeper"
)

// Start runs a keeper in this process at a socket of its own until t
// ends, and returns a client of it that starts no other; the keeper
// drops the listeners of Trials whose record in trials is gone (""; none).
func Start(t testing.TB, trials string) *keeper.Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.keeper")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- keeper.Run(ctx, sock, trials, slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c, err := fdpass.Dial(sock)
		if err == nil {
			_ = c.Close()
			return keeper.NewClient(sock, "", false, slog.New(slog.DiscardHandler))
		} else if time.Now().After(end) {
			t.Fatal(err)
		}
	}
}
