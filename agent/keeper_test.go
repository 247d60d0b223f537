//go:build linux

package agent

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/fdpass"
	"github.com/trialnet/trialnet/internal/privtest"
)

// startKeeper runs a keeper in this process at a socket of its own.
func startKeeper(t testing.TB) *keeperClient {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.keeper")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- RunKeeper(ctx, sock, "", slog.New(slog.DiscardHandler)) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	kc := &keeperClient{path: sock, log: slog.New(slog.DiscardHandler)}
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c, err := fdpass.Dial(sock)
		if err == nil {
			_ = c.Close()
			return kc
		} else if time.Now().After(end) {
			t.Fatal(err)
		}
	}
}

// The keeper holds what it is given, gives copies back (the same sockets:
// a connection made to the original is accepted from the copy), drops a
// Trial's by prefix, and refuses a second keeper on its socket.
func TestKeeperHoldsAndGivesBack(t *testing.T) {
	privtest.Require(t) // the peer check wants root
	kc := startKeeper(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	kc.put([]string{trialListenerName("k1", 0), nameMetrics}, []net.Listener{ln, ln})
	_ = ln.Close() // the keeper's copy keeps the socket open
	got, err := kc.fetch()
	if err != nil || len(got) != 2 || got[trialListenerName("k1", 0)] == nil {
		t.Fatalf("fetch: %v %v", got, err)
	}
	back, err := net.FileListener(got[trialListenerName("k1", 0)])
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	for _, f := range got {
		_ = f.Close()
	}
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatalf("the socket closed with this process's listener, though the keeper holds it: %v", err)
	}
	defer c.Close()
	_ = back.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
	if s, err := back.Accept(); err != nil {
		t.Fatalf("the copy given back does not accept the connection: %v", err)
	} else {
		_ = s.Close()
	}
	kc.del("trial:k1:")
	if got, _ := kc.fetch(); len(got) != 1 || got[nameMetrics] == nil {
		t.Errorf("after dropping Trial k1's: %v", got)
	}
	if err := RunKeeper(context.Background(), kc.path, "", slog.New(slog.DiscardHandler)); err == nil {
		t.Error("a second keeper started on the same socket")
	}
}

// BenchmarkKeeper is what the keeper costs a Trial: keeping its two
// endpoint listeners when it is made and dropping them when it ends
// (keep), beside making and closing those two listeners (listen, the
// reference).
func BenchmarkKeeper(b *testing.B) {
	privtest.Require(b)
	b.Run("listen", func(b *testing.B) {
		for range b.N {
			l1, err1 := net.Listen("tcp", "127.0.0.1:0")
			l2, err2 := net.Listen("tcp", "[::1]:0")
			if err1 != nil || err2 != nil {
				b.Fatal(err1, err2)
			}
			_ = l1.Close()
			_ = l2.Close()
		}
	})
	b.Run("keep", func(b *testing.B) {
		kc := startKeeper(b)
		l1, err1 := net.Listen("tcp", "127.0.0.1:0")
		l2, err2 := net.Listen("tcp", "[::1]:0")
		if err1 != nil || err2 != nil {
			b.Fatal(err1, err2)
		}
		defer l1.Close()
		defer l2.Close()
		b.ResetTimer()
		for range b.N {
			kc.put([]string{trialListenerName("b", 0), trialListenerName("b", 1)}, []net.Listener{l1, l2})
			kc.del("trial:b:")
		}
	})
}
