//go:build linux

package agent

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	trialspec "github.com/trialnet/trialnet/trial"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/counts"
	"github.com/trialnet/trialnet/internal/fdpass"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/proxy"
)

// An agent whose predecessor ended the hand-over after it stopped
// accepting and before it drained (its connection broke) hands over to no
// one while that process lives: it may still write to its slot of each
// counts page, which a new hand-over would clear and give to the next
// agent, so that the two would count in one slot. Until it has exited its
// open connections count here too; after, they do not, and a hand-over is
// taken again.
func TestHandoverWaitsForALostPredecessorToExit(t *testing.T) {
	old := exec.Command("sleep", "600") // the predecessor's process
	if err := old.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = old.Wait(); close(exited) }()
	t.Cleanup(func() { _ = old.Process.Kill(); <-exited })
	pidfd, err := unix.PidfdOpen(old.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}

	a := &Agent{log: slog.New(slog.DiscardHandler), trials: make(map[string]*trial)}
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
	const theirs = 3
	page.Slot(1).Tunnels.Store(theirs) // the predecessor's open tunnels
	a.proxy.Share(false)

	here, there := testkit.SeqpacketPair(t)
	p := &predecessor{c: here, pid: old.Process.Pid, pidfd: pidfd, waiting: make(map[uint64]chan hoMsg),
		stopped: make(chan struct{}), done: make(chan struct{}), counts: make(map[string]*os.File)}
	p.qcond = sync.NewCond(&p.qmu)
	go p.read()
	a.pred.Store(p)
	followed := make(chan struct{})
	go func() { a.followPredecessor(p); close(followed) }()
	t.Cleanup(func() { <-followed })
	if err := fdpass.Send(there, hoMsg{Type: hoStopped, Open: map[string]int64{"t1": theirs}}); err != nil {
		t.Fatal(err)
	}
	_ = there.Close()
	<-p.done // the break is seen

	d := &daemon{a: a, sock: filepath.Join(t.TempDir(), "agent.sock")}
	hello := hoMsg{Type: hoHello, Version: handoverVersion, Paths: d.paths()}
	pid := strconv.Itoa(old.Process.Pid)
	if why := d.refusal(hello); !strings.Contains(why, "pid "+pid+" has exited") {
		t.Errorf("a hand-over while the lost predecessor (pid %s) lives: refusal %q; want one that says to wait until it has exited", pid, why)
	}
	if st, _ := a.proxy.Stats("t1"); st.Active != theirs {
		t.Errorf("while the lost predecessor lives, Active is %d; want its %d tunnels counted", st.Active, theirs)
	}

	_ = old.Process.Kill()
	<-exited
	for deadline := time.Now().Add(10 * time.Second); a.pred.Load() != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %s exited 10s ago, and the agent still counts it as its predecessor", pid)
		}
	}
	if why := d.refusal(hello); why != "" {
		t.Errorf("once the predecessor has exited, a hand-over is refused: %s", why)
	}
	if st, _ := a.proxy.Stats("t1"); st.Active != 0 {
		t.Errorf("once the predecessor has exited, Active is %d; want its tunnels no longer counted", st.Active)
	}
}

// A predecessor that says twice that it stopped accepting breaks the
// protocol: the follower returns why, rather than closing its channel a
// second time (a panic that would end the new agent).
func TestHandoverStoppedTwiceIsAnError(t *testing.T) {
	a := &Agent{log: slog.New(slog.DiscardHandler), trials: make(map[string]*trial)}
	here, there := testkit.SeqpacketPair(t)
	p := &predecessor{c: here, pid: 1, waiting: make(map[uint64]chan hoMsg),
		stopped: make(chan struct{}), done: make(chan struct{}), counts: make(map[string]*os.File)}
	p.qcond = sync.NewCond(&p.qmu)
	go p.read()
	for range 2 {
		if err := fdpass.Send(there, hoMsg{Type: hoStopped}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.readPredecessor(p); err == nil || !strings.Contains(err.Error(), "said twice") {
		t.Fatalf("a second stopped: %v, want a protocol error", err)
	}
}
