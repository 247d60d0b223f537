//go:build linux

package handover

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"time"

	"github.com/trialnet/trialnet/internal/fdpass"
	"github.com/trialnet/trialnet/internal/lname"
	"golang.org/x/sys/unix"
)

// Giver is the old agent as its side of a hand-over needs it.
type Giver interface {
	// Hold admits a hand-over: calls that change Trials finish first, and
	// new ones wait until Release. It says why this agent may not hand
	// over now ("": it may; otherwise nothing is held).
	Hold() (why string)
	// Offer is what the offer carries: every listener and, if shares,
	// every counts page with this agent's slot in it, in which it counts
	// from now on; and from now on it sends each line a Trial's log gets
	// to forward. The caller closes the files.
	Offer(shares bool, forward func(trial string, line []byte)) (Goods, error)
	// Release ends Hold. stopped: the successor serves everything; this
	// agent stops accepting, and refuses the calls it held (their clients
	// retry them at the successor). Otherwise it serves on as before the
	// offer: it no longer shares its counts nor forwards its records.
	Release(stopped bool)
	// Open is what it serves, per Trial: open tunnels and requests.
	Open() map[string]int64
	// Drained waits until it serves nothing (true) or ctx ends (false).
	Drained(ctx context.Context) bool
	// CutAll ends everything it serves, saying why, and returns how many.
	CutAll(why string) int
	// SetAllow applies Trial's new allowlist to what it serves, cutting
	// the tunnels of the entries in cut; it returns how many it cut.
	SetAllow(trial string, allow json.RawMessage, cut []string) (int, error)
	// Remove ends what it serves of Trial, which writes its last records.
	Remove(trial string)
	// Finish ends every Trial's log with its last records (summaries).
	Finish()
}

// Goods are what the offer carries.
type Goods struct {
	Files []File
	// Offsets are each Trial's log size when the records began going to
	// forward: the successor replays its log up to there.
	Offsets map[string]int64
	// Open is what the old agent serves, per Trial, at the offer.
	Open map[string]int64
}

// File is one file an offer carries; a counts page's Slot is the old
// agent's in it.
type File struct {
	Name lname.Name
	File *os.File
	Slot int
}

// Successor is the new agent, as the old one sees it from its offer on.
type Successor struct {
	c       *net.UnixConn
	pid     int
	m       *machine
	log     *slog.Logger
	fw      *forwarder
	stopFwd chan struct{} // closed: the last records are to be sent
	sent    chan struct{} // closed once the forwarder has returned
}

// PID is the new agent's process id.
func (s *Successor) PID() int { return s.pid }

// State is where the hand-over is.
func (s *Successor) State() State { return s.m.state() }

func (s *Successor) send(m Message, files ...*os.File) error {
	_ = s.c.SetWriteDeadline(time.Now().Add(sendTimeout))
	return Send(s.c, m, files...)
}

// lost ends the hand-over from this side: the successor is gone, or
// cannot be reached (why says how, if it is worth a log line).
func (s *Successor) lost(why string, err error) {
	s.m.end()
	if why != "" {
		s.log.Error(why, "successor", s.pid, "error", err)
	}
}

// Give hands everything over to the new agent at c, a connection
// accepted on the hand-over socket from root of this PID namespace. On
// success the new agent serves every listener, this one has stopped
// accepting, and the Successor's Drain is next. On failure this agent
// serves on as if nothing happened: Give ended a new agent that may hold
// copies of its listeners, and released g.
func Give(c *net.UnixConn, g Giver, cfg Config) (*Successor, error) {
	pid := fdpass.PeerPID(c)
	// The successor's pidfd, taken at once: if the hand-over fails after
	// the offer, the successor is ended before this agent resumes, so that
	// no process accepts on these sockets but this one. Its hello must
	// name the same pid, the connection's, or it is not trusted.
	pidfd, how, err := fdpass.PeerPidfd(c)
	if err != nil {
		return nil, fmt.Errorf("pid %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	s := &Successor{c: c, pid: pid, m: newMachine(), log: cfg.log(), fw: newForwarder(),
		stopFwd: make(chan struct{}), sent: make(chan struct{})}
	hello, err := s.hello(cfg.Paths)
	if err != nil {
		return nil, err
	}
	s.log.Info("handing over to a new agent", "pid", pid, "pidfd", how)
	if why := g.Hold(); why != "" {
		return nil, s.refuse(why)
	}
	if err := s.give(g, hello.Shares); err != nil {
		offered := s.m.state() != StateHello
		s.m.end()
		// It may accept on copies of these sockets already.
		if offered && !endProcess(pidfd) {
			s.log.Error("the new agent has not exited though killed: what it still serves and records reaches none of this agent's counters, and its open tunnels are recorded only by the next agent to adopt its Trials", "successor", pid)
		}
		g.Release(false)
		return nil, fmt.Errorf("pid %d did not take over: %w", pid, err)
	}
	// Stopped first, then stop accepting, then say so: only then does the
	// successor take the socket paths and report itself ready.
	g.Release(true)
	if err := s.send(Stopped{Open: g.Open()}); err != nil {
		s.lost("the new agent did not hear that this one stopped accepting; this one cuts what it serves and exits", err)
	}
	return s, nil
}

// hello reads the successor's hello and refuses (telling it why) one this
// agent may not hand over to.
func (s *Successor) hello(paths map[string]string) (Hello, error) {
	_ = s.c.SetDeadline(time.Now().Add(StepTimeout))
	defer func() { _ = s.c.SetDeadline(time.Time{}) }()
	m, files, err := Recv(s.c)
	closeFiles(files)
	if err != nil {
		s.m.end()
		return Hello{}, fmt.Errorf("pid %d: hello: %w", s.pid, err)
	}
	h, ok := m.(Hello)
	switch {
	case !ok || h.Version != Version:
		return Hello{}, s.refuse(fmt.Sprintf("it speaks hand-over protocol %d, and the new agent asked for %q version %d: stop it first (its open tunnels are then cut), or start a build that speaks protocol %d", Version, m.Kind(), h.Version, Version))
	case h.PID != s.pid || fdpass.PeerPID(s.c) != s.pid:
		s.m.end()
		return Hello{}, fmt.Errorf("pid %d said hello as pid %d", s.pid, h.PID)
	case !maps.Equal(h.Paths, paths):
		// A successor with other paths would adopt none of these Trials
		// and leave their listeners unserved.
		return Hello{}, s.refuse(fmt.Sprintf("its paths are %v, the new agent's %v: an agent takes over only from one with the same paths (state, data, pins, namespaces, cgroup parent)", paths, h.Paths))
	}
	return h, nil
}

// refuse tells the successor why this agent does not hand over to it.
func (s *Successor) refuse(why string) error {
	_ = s.m.to(StateRefused)
	_ = s.send(Refused{Version: Version, PID: os.Getpid(), Error: why})
	return fmt.Errorf("pid %d asked to take over: refused: %s", s.pid, why)
}

// give offers everything, sends the records from then on, and waits
// until the successor serves; then the hand-over is Stopped.
func (s *Successor) give(g Giver, shares bool) error {
	goods, err := g.Offer(shares, s.fw.add)
	if err != nil {
		return err
	}
	defer func() {
		for _, f := range goods.Files {
			_ = f.File.Close()
		}
	}()
	if err := s.m.to(StateOffered); err != nil {
		return err
	}
	if err := s.offer(goods); err != nil {
		return fmt.Errorf("offer: %w", err)
	}
	// Its records go out while it starts: it counts them once it serves.
	go func() {
		defer close(s.sent)
		if err := s.fw.run(s, s.stopFwd); err != nil {
			s.lost("records no longer reach the new agent", err)
		}
	}()
	if err := s.awaitServing(); err != nil {
		close(s.stopFwd)
		return err
	}
	return s.m.to(StateStopped)
}

// offer sends the files, at most fdpass.MaxFiles a message; the first
// message carries each Trial's log size and open tunnel count, and this
// agent's slot in each counts page.
func (s *Successor) offer(g Goods) error {
	names := make([]string, len(g.Files))
	files := make([]*os.File, len(g.Files))
	var slots map[string]int
	for i, f := range g.Files {
		names[i], files[i] = f.Name.String(), f.File
		if f.Name.Kind == lname.Counts {
			if slots == nil {
				slots = make(map[string]int)
			}
			slots[names[i]] = f.Slot
		}
	}
	for i := 0; ; i += fdpass.MaxFiles {
		j := min(i+fdpass.MaxFiles, len(files))
		m := Offer{Version: Version, PID: os.Getpid(), Names: names[i:j], More: j < len(files)}
		if i == 0 {
			m.Offsets, m.Open, m.Slots = g.Offsets, g.Open, slots
		}
		if err := s.send(m, files[i:j]...); err != nil {
			return err
		}
		if j == len(files) {
			return nil
		}
	}
}

// awaitServing waits for the successor's Serving. It says it is still
// adopting every few seconds; that may take long (each Trial's log is
// replayed), but not for ever.
func (s *Successor) awaitServing() error {
	// The read deadline only: the forwarder sets write deadlines.
	defer func() { _ = s.c.SetReadDeadline(time.Time{}) }()
	for end := time.Now().Add(ServeTimeout); ; {
		step := time.Now().Add(StepTimeout)
		if step.After(end) {
			step = end
		}
		_ = s.c.SetReadDeadline(step)
		m, files, err := Recv(s.c)
		closeFiles(files)
		if err != nil {
			return err
		}
		switch m.(type) {
		case Serving:
			return s.m.to(StateServing)
		case Adopting:
		default:
			return fmt.Errorf("it said %q", m.Kind())
		}
	}
}

// Drain serves what this agent has open until it ends or timeout passes,
// then cuts the rest; meanwhile it applies the successor's Allow and
// Remove, and tells it what is open. It returns an error if the
// successor ended first: then nothing follows this agent's tunnels (their
// counts, policy changes, removals), so they are cut at once.
func (s *Successor) Drain(g Giver, timeout time.Duration) error {
	go s.follow(g)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	done := make(chan bool, 1)
	go func() { done <- g.Drained(ctx) }()
	err := s.drain(g, done, timeout)
	s.finish(g)
	return err
}

// drain waits for done, or the successor's end, sending what is open
// when it changes.
func (s *Successor) drain(g Giver, done <-chan bool, timeout time.Duration) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last map[string]int64
	for {
		st, changed := s.m.now()
		if st == StateLost {
			s.cut(g, fmt.Sprintf("the agent that took over from this one (pid %d) ended before this one had drained", s.pid))
			return fmt.Errorf("the agent that took over (pid %d) ended before this one had drained: no agent serves; the listeners wait in the keeper for the next", s.pid)
		}
		select {
		case ok := <-done:
			if !ok {
				s.cut(g, fmt.Sprintf("the agent handed over to pid %d, and its drain_timeout (%s) passed with this still open", s.pid, timeout))
			}
			return nil
		case <-changed:
		case <-tick.C:
			if open := g.Open(); !maps.Equal(open, last) {
				_ = s.send(Open{Open: open})
				last = open
			}
		}
	}
}

// cut ends what is still open, and waits (bounded) for its records.
func (s *Successor) cut(g Giver, why string) {
	n := g.CutAll(why)
	s.log.Warn("cutting what is still open", "tunnels", n, "why", why)
	wait, cancel := context.WithTimeout(context.Background(), cutWait)
	defer cancel()
	g.Drained(wait)
}

// finish writes and sends each Trial's last records, then tells the
// successor this agent is done.
func (s *Successor) finish(g Giver) {
	g.Finish()
	close(s.stopFwd)
	<-s.sent
	_ = s.send(Open{})
	// Drained before it is said: the successor closes its end once it
	// has read it, and follow, reading that, must find an end, not a
	// loss (which would close this agent's control socket early).
	_ = s.m.to(StateDrained)
	_ = s.send(Drained{})
	_ = s.c.Close()
	s.log.Info("drained; this agent exits", "successor", s.pid)
}

// follow applies the successor's requests during the drain, each
// answered with Done.
func (s *Successor) follow(g Giver) {
	for {
		m, files, err := Recv(s.c)
		closeFiles(files)
		if err != nil {
			s.lost("", err)
			return
		}
		var reply Done
		switch m := m.(type) {
		case Allow:
			reply.Seq = m.Seq
			reply.N, err = g.SetAllow(m.Trial, m.Allow, m.Cut)
		case Remove:
			reply.Seq = m.Seq
			g.Remove(m.Trial)
			// Its last records reach the successor before the answer: it
			// closes the Trial's log and counters on it.
			err = s.fw.flush(s)
		default:
			continue
		}
		if err != nil {
			reply.Error = err.Error()
		}
		_ = s.send(reply)
	}
}
