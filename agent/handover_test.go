//go:build linux

package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	trialspec "github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/handover"
	"github.com/trialnet/trialnet/internal/counts"
	"github.com/trialnet/trialnet/internal/fdpass"
	"github.com/trialnet/trialnet/proxy"
)

// An agent whose predecessor ended the hand-over after it stopped
// accepting and before it drained (its connection broke) hands over to no
// one while that process lives: it may still write to its slot of each
// counts page, which a new hand-over would clear and give to the next
// agent, so that the two would count in one slot. Until it has exited its
// open connections count here too; after, they do not, and a hand-over is
// taken again. The predecessor is this test binary again
// (lostPredecessorMain), a process of its own.
func TestHandoverWaitsForALostPredecessorToExit(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "old.handover")
	old := exec.Command(os.Args[0], "-test.run=^$")
	old.Env = append(os.Environ(), lostPredecessorEnv+"="+sock)
	old.Stderr = os.Stderr
	if err := old.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = old.Wait(); close(exited) }()
	t.Cleanup(func() { _ = old.Process.Kill(); <-exited })

	a := &Agent{log: slog.New(slog.DiscardHandler), trials: make(map[string]*trial)}
	var err error
	a.proxy, err = proxy.New(proxy.Config{ProxySettings: config.ProxySettings{Resolver: manyAddrs(1)}, HostAddrs: noHostAddrs{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.proxy.Close() })
	page, err := counts.New("t1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = page.Close() }) // after the proxy's Close
	if err := a.proxy.AddTrial(proxy.TrialPolicy{Spec: trialspec.Spec{ID: "t1"}, Counts: page, Slot: 0}); err != nil {
		t.Fatal(err)
	}
	page.Slot(1).Tunnels.Store(lostPredecessorOpen) // the predecessor's open tunnels
	a.proxy.Share(false)

	var c *net.UnixConn
	for deadline := time.Now().Add(10 * time.Second); c == nil; time.Sleep(10 * time.Millisecond) {
		c, err = net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
		if err != nil && time.Now().After(deadline) {
			t.Fatalf("the predecessor does not listen: %v", err)
		}
	}
	p, files, err := handover.Take(c, handover.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		_ = f.Close()
	}
	a.pred.Store(p)
	if err := p.Serve(taker{a}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !p.State().Ended(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the predecessor's connection ended, and the hand-over is %s", p.State())
		}
	}

	pid := strconv.Itoa(old.Process.Pid)
	a.hmu.Lock()
	why := a.holdRefusal()
	a.hmu.Unlock()
	if !strings.Contains(why, "pid "+pid+" has exited") {
		t.Errorf("a hand-over while the lost predecessor (pid %s) lives: refusal %q; want one that says to wait until it has exited", pid, why)
	}
	if st, _ := a.proxy.Stats("t1"); st.Active != lostPredecessorOpen {
		t.Errorf("while the lost predecessor lives, Active is %d; want its %d tunnels counted", st.Active, lostPredecessorOpen)
	}

	_ = old.Process.Kill()
	<-exited
	for deadline := time.Now().Add(10 * time.Second); a.pred.Load() != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %s exited 10s ago, and the agent still counts it as its predecessor", pid)
		}
	}
	a.hmu.Lock()
	why = a.holdRefusal()
	a.hmu.Unlock()
	if why != "" {
		t.Errorf("once the predecessor has exited, a hand-over is refused: %s", why)
	}
	if st, _ := a.proxy.Stats("t1"); st.Active != 0 {
		t.Errorf("once the predecessor has exited, Active is %d; want its tunnels no longer counted", st.Active)
	}
}

// lostPredecessorEnv names the hand-over socket at which the test binary,
// started again, is a predecessor that stops accepting with
// lostPredecessorOpen tunnels of Trial t1 open, then ends the hand-over
// and lives on until it is killed.
const (
	lostPredecessorEnv  = "TRIALNET_TEST_LOST_PREDECESSOR"
	lostPredecessorOpen = 3
)

func lostPredecessorMain(sock string) int {
	ln, err := fdpass.Listen(sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c, err := ln.AcceptUnix()
	if err != nil {
		return 1
	}
	if _, _, err := handover.Recv(c); err != nil { // its hello
		return 1
	}
	if err := handover.Send(c, handover.Offer{Version: handover.Version, PID: os.Getpid()}); err != nil {
		return 1
	}
	for {
		m, _, err := handover.Recv(c)
		if err != nil {
			return 1
		}
		if _, ok := m.(handover.Serving); ok {
			break
		}
	}
	if err := handover.Send(c, handover.Stopped{Open: map[string]int64{"t1": lostPredecessorOpen}}); err != nil {
		return 1
	}
	_ = c.Close()
	time.Sleep(time.Hour)
	return 0
}

// An allowlist change that reaches a predecessor only after it drained
// (the agent loaded it just before its end) is not confirmed by it, but
// it ended every tunnel of the Trial itself: the caller is not told that
// it "still drains" and may serve them by the old list.
func TestAllowOnADrainedPredecessorNeedsNoNote(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "old.handover")
	ln, err := fdpass.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	old := make(chan error, 1)
	go func() { old <- drainAtOnce(ln) }()

	a := &Agent{log: slog.New(slog.DiscardHandler), trials: make(map[string]*trial)}
	a.proxy, err = proxy.New(proxy.Config{ProxySettings: config.ProxySettings{Resolver: manyAddrs(1)}, HostAddrs: noHostAddrs{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.proxy.Close() })
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	p, files, err := handover.Take(c, handover.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		_ = f.Close()
	}
	a.pred.Store(p)
	if err := p.Serve(taker{a}); err != nil {
		t.Fatal(err)
	}
	if err := <-old; err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); a.pred.Load() != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the predecessor drained 10s ago and is still followed; the hand-over is %s", p.State())
		}
	}
	a.pred.Store(p) // as a change that loaded it just before its end has it
	list, err := allow.Parse([]string{"a.example.test:443"}, false)
	if err != nil {
		t.Fatal(err)
	}
	if n, note := a.allowOnPredecessor(context.Background(), "t1", list, list.Entries()); n != 0 || note != "" {
		t.Errorf("a change after the predecessor drained: %d cut there, note %q; want none and no note", n, note)
	}
}

// drainAtOnce is an old agent that hands over with nothing open and
// drains at once: it stops accepting, says it drained and closes.
func drainAtOnce(ln *net.UnixListener) error {
	c, err := ln.AcceptUnix()
	if err != nil {
		return err
	}
	defer c.Close()
	if _, _, err := handover.Recv(c); err != nil { // its hello
		return err
	}
	if err := handover.Send(c, handover.Offer{Version: handover.Version, PID: os.Getpid()}); err != nil {
		return err
	}
	for {
		m, _, err := handover.Recv(c)
		if err != nil {
			return err
		}
		if _, ok := m.(handover.Serving); ok {
			break
		}
	}
	if err := handover.Send(c, handover.Stopped{}); err != nil {
		return err
	}
	return handover.Send(c, handover.Drained{})
}

// A drain with nothing open ends at once (the hand-over is then
// "drained", an end), most often before the successor, which renames its
// control socket over the path only once it heard "stopped", has done so.
// That end is this agent's, not the successor's: the control socket must
// still listen until the rename (stopServing), else clients dialling the
// path are refused. Only a successor gone (the hand-over lost) stops the
// wait early.
func TestDrainedAtOnceIsNoSuccessorGone(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.handover")
	ln, err := fdpass.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	took := make(chan error, 1)
	go func() {
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
		if err != nil {
			took <- err
			return
		}
		p, files, err := handover.Take(c, handover.Config{})
		for _, f := range files {
			_ = f.Close()
		}
		if err == nil {
			err = p.Serve(idleTaker{})
		}
		took <- err
	}()
	c, err := ln.AcceptUnix()
	if err != nil {
		t.Fatal(err)
	}
	s, err := handover.Give(c, idleGiver{}, handover.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-took; err != nil {
		t.Fatal(err)
	}
	if err := s.Drain(idleGiver{}, time.Minute); err != nil {
		t.Fatal(err)
	}
	d := &daemon{successor: s}
	if d.successorGone() {
		t.Errorf("a successor that took over is taken as gone once this agent drained (the hand-over is %s): the control socket would close before the successor's replaced it", s.State())
	}
}

// idleGiver is an old agent with nothing open.
type idleGiver struct{}

func (idleGiver) Hold() string { return "" }
func (idleGiver) Offer(bool, func(string, []byte)) (handover.Goods, error) {
	return handover.Goods{}, nil
}
func (idleGiver) Release(bool)                                            {}
func (idleGiver) Open() map[string]int64                                  { return nil }
func (idleGiver) Drained(context.Context) bool                            { return true }
func (idleGiver) CutAll(string) int                                       { return 0 }
func (idleGiver) SetAllow(string, json.RawMessage, []string) (int, error) { return 0, nil }
func (idleGiver) Remove(string)                                           {}
func (idleGiver) Finish()                                                 {}

// idleTaker is a new agent that counts nothing.
type idleTaker struct{}

func (idleTaker) Counted(string, []json.RawMessage) {}
func (idleTaker) Elsewhere(map[string]int64)        {}
func (idleTaker) Lost()                             {}
func (idleTaker) Followed(*handover.Predecessor)    {}
