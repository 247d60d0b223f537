//go:build linux

package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/fdpass"
	"github.com/trialnet/trialnet/internal/privtest"
)

// startKeeper runs a keeper in this process at a socket of its own; it
// drops the listeners of Trials whose record in trials is gone (""; none).
func startKeeper(t testing.TB, trials string) *keeperClient {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.keeper")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- RunKeeper(ctx, sock, trials, slog.New(slog.DiscardHandler)) }()
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
	kc := startKeeper(t, "")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	kc.put([]string{trialListenerName("k1", 0), nameMetrics}, nil, []net.Listener{ln, ln})
	_ = ln.Close() // the keeper's copy keeps the socket open
	got, _, err := kc.fetch()
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
	if got, _, _ := kc.fetch(); len(got) != 1 || got[nameMetrics] == nil {
		t.Errorf("after dropping Trial k1's: %v", got)
	}
	if err := RunKeeper(context.Background(), kc.path, "", slog.New(slog.DiscardHandler)); err == nil {
		t.Error("a second keeper started on the same socket")
	}
}

// A keeper that missed a Trial's end and the reuse of its id still holds
// the earlier Trial's listeners under that id. The next agent serves the
// later Trial, its endpoint listening anew, and never removes it; and the
// keeper drops the earlier Trial's listeners, as their Trial is not the
// one its record names.
func TestPrivilegedKeeperReusedID(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 242, "kr.test")
	cfg := w.config(t)
	log := slog.New(slog.DiscardHandler)
	ctx := context.Background()
	kc := startKeeper(t, "") // it holds what it is given: it hears nothing of what follows
	d := &daemon{cfg: ServeConfig{AgentConfig: cfg}, sock: filepath.Join(t.TempDir(), "agent.sock")}
	req := CreateRequest{ID: "kr", Allow: []string{fmt.Sprintf("kr.test:%d", upstreamPort)}}
	a1, err := start(cfg, nil, nil, kc)
	if err != nil {
		t.Fatal(err)
	}
	first, err := a1.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	a1.Close(false) // as if killed: the Trial stays, its listeners with the keeper
	// An agent the keeper does not hear from ends the Trial, and makes
	// another with the same id.
	_, inh, err := d.inherit(kc, log)
	if err != nil {
		t.Fatal(err)
	}
	a2, err := start(cfg, inh, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a2.Destroy(ctx, "kr"); err != nil {
		t.Fatal(err)
	}
	second, err := a2.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	a2.Close(false)
	if _, created, _ := kc.fetch(); created[trialListenerName("kr", 0)] != trialCreated(first.Created) {
		t.Fatalf("the keeper holds %v; the test wants it to hold the first Trial's (created %s)", created, trialCreated(first.Created))
	}
	// The next agent, with that keeper.
	_, inh, err = d.inherit(kc, log)
	if err != nil {
		t.Fatal(err)
	}
	a3, err := start(cfg, inh, nil, kc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a3.Close(true) })
	got, err := a3.Get(ctx, "kr")
	if err != nil || !got.Created.Equal(second.Created) {
		t.Fatalf("the Trial that reused the id, after a restart with a keeper holding the earlier one's listeners: %+v, %v", got, err)
	}
	if code, out := through(t, a3, "kr", fmt.Sprintf("http://kr.test:%d/", upstreamPort)); code != 0 {
		t.Errorf("its endpoint does not serve: curl exit %d: %s", code, out)
	}
	// Its listeners replaced the earlier Trial's in the keeper, every one.
	files, created, err := kc.fetch()
	if err != nil {
		t.Fatal(err)
	}
	for n, f := range files {
		_ = f.Close()
		if id, _ := trialOfName(n); id == "kr" && created[n] != trialCreated(second.Created) {
			t.Errorf("the keeper holds %s of the Trial created %s; the live one was created %s", n, created[n], trialCreated(second.Created))
		}
	}

	// A keeper that reads the state directory drops a listener whose
	// Trial is not the one the record names.
	pruning := startKeeper(t, cfg.Host.StateDir)
	stale, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stale.Close()
	pruning.put([]string{trialListenerName("kr", 7)}, []string{trialCreated(first.Created)}, []net.Listener{stale})
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		files, _, err := pruning.fetch()
		for _, f := range files {
			_ = f.Close()
		}
		if err == nil && len(files) == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the keeper reading the state directory holds %v (%v); want none: their Trial is not the live one", files, err)
		}
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
		kc := startKeeper(b, "")
		l1, err1 := net.Listen("tcp", "127.0.0.1:0")
		l2, err2 := net.Listen("tcp", "[::1]:0")
		if err1 != nil || err2 != nil {
			b.Fatal(err1, err2)
		}
		defer l1.Close()
		defer l2.Close()
		b.ResetTimer()
		for range b.N {
			kc.put([]string{trialListenerName("b", 0), trialListenerName("b", 1)}, nil, []net.Listener{l1, l2})
			kc.del("trial:b:")
		}
	})
}
