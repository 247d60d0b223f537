//go:build linux

package keeper_test

import (
	"context"
	"errors"
	"github.com/trialnet/trialnet/internal/lname"
	"golang.org/x/sys/unix"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
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

// A put (an agent's create) does not wait for the keeper's pass over
// every Trial's record: with 1,000 Trials that pass reads 1,000 records,
// and it reads them without holding what a put, a del or a fetch takes.
// One Trial's record here is a FIFO, whose read blocks the pass until it
// is written.
func TestPrivilegedKeeperServesDuringPrune(t *testing.T) {
	privtest.Require(t)
	trials := t.TempDir()
	fifo := filepath.Join(trials, "slow.json")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(trials, "quick.json"), []byte(`{"phase":"live","trial":{"id":"quick"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	kc := keepertest.Start(t, trials)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	kc.Put([]string{lname.EndpointName("slow", 0).String()}, nil, []net.Listener{ln})
	// The pass (every 2 s) opens slow's record: a writer can open the
	// FIFO once it does.
	var w *os.File
	for end := time.Now().Add(30 * time.Second); w == nil; time.Sleep(20 * time.Millisecond) {
		if w, err = os.OpenFile(fifo, os.O_WRONLY|unix.O_NONBLOCK, 0); err != nil && !errors.Is(err, unix.ENXIO) {
			t.Fatal(err)
		} else if time.Now().After(end) {
			t.Fatal("the keeper's pass never read slow's record")
		}
	}
	// Unblocked, the pass reads the record, and later passes a file in
	// its place.
	unblock := sync.OnceFunc(func() {
		rec := `{"phase":"live","trial":{"id":"slow"}}`
		if err := os.WriteFile(fifo+".new", []byte(rec), 0o600); err != nil {
			t.Error(err)
		} else if err := os.Rename(fifo+".new", fifo); err != nil {
			t.Error(err)
		}
		_, _ = w.WriteString(rec)
		_ = w.Close()
	})
	t.Cleanup(unblock)
	done := make(chan map[string]*os.File)
	go func() {
		kc.Put([]string{lname.EndpointName("quick", 0).String()}, nil, []net.Listener{ln})
		got, _, _ := kc.Fetch()
		done <- got
	}()
	select {
	case got := <-done:
		for _, f := range got {
			_ = f.Close()
		}
		if got[lname.EndpointName("quick", 0).String()] == nil {
			t.Errorf("quick's listener is not held: %v", got)
		}
	case <-time.After(20 * time.Second): // a hang, not a speed: the pass is blocked for good
		unblock()
		<-done
		t.Fatal("a put and a fetch waited for the keeper's pass over the Trials' records")
	}
}
