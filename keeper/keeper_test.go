//go:build linux

package keeper_test

import (
	"context"
	"github.com/trialnet/trialnet/internal/lname"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/keepertest"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/keeper"
)

// The keeper holds what it is given, gives copies back (the same sockets:
// a connection made to the original is accepted from the copy), drops a
// Trial's by prefix, and refuses a second keeper on its socket.
func TestPrivilegedKeeperHoldsAndGivesBack(t *testing.T) {
	privtest.Require(t) // the peer check wants root
	kc := keepertest.Start(t, "")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	kc.Put([]string{lname.EndpointName("k1", 0).String(), "metrics"}, nil, []net.Listener{ln, ln})
	_ = ln.Close() // the keeper's copy keeps the socket open
	got, _, err := kc.Fetch()
	if err != nil || len(got) != 2 || got[lname.EndpointName("k1", 0).String()] == nil {
		t.Fatalf("fetch: %v %v", got, err)
	}
	back, err := net.FileListener(got[lname.EndpointName("k1", 0).String()])
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
	kc.Del("trial:k1:")
	if got, _, _ := kc.Fetch(); len(got) != 1 || got["metrics"] == nil {
		t.Errorf("after dropping Trial k1's: %v", got)
	}
	if err := keeper.Run(context.Background(), kc.Path(), "", slog.New(slog.DiscardHandler)); err == nil {
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
		kc := keepertest.Start(b, "")
		l1, err1 := net.Listen("tcp", "127.0.0.1:0")
		l2, err2 := net.Listen("tcp", "[::1]:0")
		if err1 != nil || err2 != nil {
			b.Fatal(err1, err2)
		}
		defer l1.Close()
		defer l2.Close()
		b.ResetTimer()
		for range b.N {
			kc.Put([]string{lname.EndpointName("b", 0).String(), lname.EndpointName("b", 1).String()}, nil, []net.Listener{l1, l2})
			kc.Del("trial:b:")
		}
	})
}

// The keeper finds a Trial's creation time in its record as this build
// writes it (under "trial") and as builds before trial.Spec did (under
// "meta"), so that it drops the listeners of a Trial whose id was reused.
func TestRecordedCreated(t *testing.T) {
	dir := t.TempDir()
	at := time.Date(2026, 12, 5, 2, 39, 50, 960600661, time.UTC)
	for id, rec := range map[string]string{
		"now":    `{"phase":"live","trial":{"id":"now","created":"2026-12-05T02:39:50.960600661Z","schema":1}}`,
		"before": `{"phase":"live","id":"before","meta":{"id":"before","created":"2026-12-05T02:39:50.960600661Z"}}`,
	} {
		if err := os.WriteFile(filepath.Join(dir, id+".json"), []byte(rec), 0o600); err != nil {
			t.Fatal(err)
		}
		if got, ok := keeper.RecordedCreated(dir, id); !ok || got != keeper.TrialCreated(at) {
			t.Errorf("%s: %q %v, want %q", id, got, ok, keeper.TrialCreated(at))
		}
	}
	if _, ok := keeper.RecordedCreated(dir, "gone"); ok {
		t.Error("a Trial with no record has one")
	}
}
