//go:build linux

package handover

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/fdpass"
	"github.com/trialnet/trialnet/internal/lname"
)

// These tests run one agent in the test and the other in the test or in
// a child process (TestMain), over real packet sockets with real files;
// no root is needed. Both agents in this process: a hand-over that fails
// after the offer ends the new agent's process, which is then this one.

// An old agent asked by a new one speaking another protocol version (or
// saying anything but hello first) refuses, says why, and holds nothing:
// no call waits on it, no file is sent.
func TestRefusesAnotherVersion(t *testing.T) {
	for _, first := range []Message{Hello{Version: Version + 1, PID: os.Getpid(), Paths: testPaths}, Serving{PID: os.Getpid()}} {
		g := newTestGiver(t, 1)
		here, there := connectedPair(t)
		gave := make(chan error, 1)
		go func() { _, err := Give(there, g, Config{Paths: testPaths}); gave <- err }()
		if err := Send(here, first); err != nil {
			t.Fatal(err)
		}
		m, files, err := Recv(here)
		closeFiles(files)
		r, ok := m.(Refused)
		if err != nil || !ok || !strings.Contains(r.Error, "protocol 1") || len(files) != 0 {
			// Fatal at once: an old agent that offered kills this
			// process (its successor) once the hand-over fails.
			t.Fatalf("%T first: the old agent answered %#v with %d files (%v); want a refusal naming its protocol", first, m, len(files), err)
		}
		if err := <-gave; err == nil || !strings.Contains(err.Error(), "refused") {
			t.Errorf("%T first: Give returned %v, want a refusal", first, err)
		}
		if g.holds != 0 || len(g.released) != 0 {
			t.Errorf("%T first: the old agent held its calls %d times", first, g.holds)
		}
	}
}

// A new agent whose paths (state, pins, namespaces, ...) are not the old
// one's would adopt none of its Trials: it is refused before anything is
// held or offered, and says why.
func TestRefusesOtherPaths(t *testing.T) {
	g := newTestGiver(t, 1)
	here, there := connectedPair(t)
	gave := make(chan error, 1)
	go func() { _, err := Give(there, g, Config{Paths: testPaths}); gave <- err }()
	other := map[string]string{"socket": "/run/test.sock", "state_dir": "/elsewhere"}
	p, files, err := Take(here, Config{Paths: other})
	var refused *RefusedError
	if !errors.As(err, &refused) || !strings.Contains(refused.Why, "paths") || p != nil || files != nil {
		t.Fatalf("Take with other paths: %v, %v; want a refusal naming the paths", err, files)
	}
	if err := <-gave; err == nil {
		t.Error("Give handed over to an agent with other paths")
	}
	if g.holds != 0 {
		t.Errorf("the old agent held its calls for an agent it refused")
	}
}

// A new agent that takes the offer and dies before it serves: the old
// agent stops nothing, releases its calls, and serves on.
func TestSuccessorDiesAfterTheOffer(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "old.handover")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	startOtherAgent(t, "successor-dies", sock)
	c, err := ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	g := newTestGiver(t, 2)
	s, err := Give(c, g, Config{Paths: testPaths})
	if err == nil {
		t.Fatalf("Give to a successor that died returned %v, no error", s)
	}
	if g.holds != 1 || !slices.Equal(g.released, []bool{false}) {
		t.Errorf("held %d times, released %v; want held once and released to serve on (false)", g.holds, g.released)
	}
}

// An old agent that dies while it drains: once it has exited, the new
// agent records what it left open as cut, and follows no more. The
// listeners it took are the old agent's sockets themselves.
func TestPredecessorDiesMidDrain(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "old.handover")
	_, exited := startOtherAgent(t, "predecessor-dies", sock)
	p, files, err := Take(dialOtherAgent(t, sock), Config{Paths: testPaths})
	if err != nil {
		t.Fatal(err)
	}
	f := files[lname.EndpointName("t1", 0)]
	if len(files) != 1 || f == nil {
		t.Fatalf("took %v, want trial:t1:0", files)
	}
	ln, err := net.FileListener(f)
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	k := newTestTaker()
	if err := p.Serve(k); err != nil {
		t.Fatal(err)
	}
	<-exited
	<-k.followed
	if p.State() != StateLost || k.lost != 1 {
		t.Errorf("the old agent died mid-drain: the hand-over is %s, Lost called %d times; want lost, once", p.State(), k.lost)
	}
	// Its socket, served here now: a client of it is accepted here.
	cl, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if sc, err := ln.Accept(); err != nil {
		t.Errorf("the listener taken does not accept: %v", err)
	} else {
		_ = sc.Close()
	}
}

// An old agent that says twice it stopped accepting breaks the protocol:
// the hand-over is lost (not a panic, not a second stop), and what it
// left open is recorded as cut only once it has exited.
func TestStoppedTwiceIsLost(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "old.handover")
	cmd, exited := startOtherAgent(t, "stopped-twice", sock)
	p, _, err := Take(dialOtherAgent(t, sock), Config{Paths: testPaths})
	if err != nil {
		t.Fatal(err)
	}
	k := newTestTaker()
	k.alive = func() bool { return running(cmd.Process.Pid) }
	if err := p.Serve(k); err != nil {
		t.Fatal(err)
	}
	waitState(t, "new agent", p.State, StateLost)
	_ = cmd.Process.Kill()
	<-exited
	<-k.followed
	if k.lost != 1 || k.early != 0 {
		t.Errorf("Lost was called %d times, %d of them while the old agent still ran; want once, after it exited", k.lost, k.early)
	}
}

// While the old agent drains, the new one's allowlist changes and
// removals reach it and are answered; a removed Trial's last records are
// counted before the answer. Once it has drained, nothing is asked of it.
func TestPolicyChangeDuringDrain(t *testing.T) {
	g := newTestGiver(t, 2)
	k := newTestTaker()
	p, _, drained := handOver(t, g, k)
	ctx := context.Background()
	list := json.RawMessage(`[{"entry":"a.example:443"}]`)
	n, why, ok := p.Allow(ctx, "t1", list, []string{"b.example:443"})
	if !ok || n != 1 || why != "" {
		t.Errorf("Allow during the drain: %d cut, %q, %v; want 1 cut, confirmed", n, why, ok)
	}
	g.mu.Lock()
	allows := g.allows
	g.mu.Unlock()
	if want := []string{`t1 [{"entry":"a.example:443"}] [b.example:443]`}; !slices.Equal(allows, want) {
		t.Errorf("the old agent applied %q, want %q", allows, want)
	}
	if why, ok := p.Remove(ctx, "t1"); !ok {
		t.Errorf("Remove during the drain: not confirmed (%s)", why)
	}
	if got := k.counted("t1"); !slices.Contains(got, `{"last":true}`) {
		t.Errorf("once Remove is confirmed, the Trial's last records are counted; got %q", got)
	}
	close(g.drain)
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	<-k.followed
	if p.State() != StateDrained || k.lost != 0 {
		t.Errorf("after the drain the hand-over is %s, Lost called %d times", p.State(), k.lost)
	}
	if _, _, ok := p.Allow(ctx, "t1", list, nil); ok {
		t.Error("an old agent that has drained confirmed an allowlist change")
	}
}

// An old agent that drains and closes just as the new one removes a
// Trial: the removal no longer reaches it, and returns only once what it
// sent before its end is counted, for the new agent closes the Trial's
// counters next (its final stats, its receipt). Here the count of its
// last record is held until Remove returns, so Remove must wait until
// its context ends.
func TestRemoveAfterTheDrainWaitsForItsRecords(t *testing.T) {
	g := newTestGiver(t, 2)
	k := newTestTaker()
	held, release := k.holdOne("counted")
	p, _, drained := handOver(t, g, k)
	g.forward("t1", []byte(`{"n":1}`))
	<-held
	close(g.drain)
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	removeWaits(t, p, "a record the old agent sent before it closed was still being counted")
	close(release)
	<-k.followed
	if got := k.counted("t1"); !slices.Equal(got, []string{`{"n":1}`}) {
		t.Errorf("counted %q, want the old agent's record", got)
	}
	if p.State() != StateDrained {
		t.Errorf("the hand-over is %s, want drained", p.State())
	}
}

// An old agent that dies while it drains: a removal then returns only
// once the tunnels it left open are recorded (Lost), for the same reason.
func TestRemoveAfterALossWaitsForTheLostTunnels(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "old.handover")
	startOtherAgent(t, "predecessor-dies", sock)
	p, files, err := Take(dialOtherAgent(t, sock), Config{Paths: testPaths})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		_ = f.Close()
	}
	k := newTestTaker()
	held, release := k.holdOne("lost")
	if err := p.Serve(k); err != nil {
		t.Fatal(err)
	}
	<-held
	removeWaits(t, p, "the tunnels the dead old agent left were still being recorded")
	close(release)
	<-k.followed
	if p.State() != StateLost || k.lost != 1 {
		t.Errorf("the hand-over is %s, Lost called %d times; want lost, once", p.State(), k.lost)
	}
}

// removeWaits fails unless p.Remove, while what it must wait for is held,
// returns only as its context ends.
func removeWaits(t *testing.T, p *Predecessor, held string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	why, ok := p.Remove(ctx, "t1")
	if ctx.Err() == nil {
		t.Errorf("Remove returned (%v, %q) while %s", ok, why, held)
	}
}

// More files than one message carries (SCM_RIGHTS takes at most 253) go
// in several offers; each arrives under its name, and is the socket the
// old agent listens on. The counts page comes with the slot to count in.
func TestOfferMoreThanOneMessageCarries(t *testing.T) {
	g := newTestGiver(t, fdpass.MaxFiles+3)
	k := newTestTaker()
	p, files, drained := handOver(t, g, k)
	if len(files) != len(g.lns) {
		t.Errorf("took %d listeners, want %d", len(files), len(g.lns))
	}
	for i, want := range g.lns {
		f := files[g.name(i)]
		if f == nil {
			t.Errorf("%s was not taken", g.name(i))
			continue
		}
		ln, err := net.FileListener(f)
		if err != nil {
			t.Fatal(err)
		}
		if ln.Addr().String() != want.Addr().String() {
			t.Errorf("%s is a socket on %s, want %s", g.name(i), ln.Addr(), want.Addr())
		}
		_ = ln.Close()
	}
	page, slot, err := p.TakeCounts(lname.CountsName(""))
	if err != nil || page == nil || slot != 1 {
		t.Errorf("the counts page: %v in slot %d (%v); want it, in slot 1", page, slot, err)
	}
	if page != nil {
		_ = page.Close()
	}
	close(g.drain)
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	<-k.followed
}
