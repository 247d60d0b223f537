//go:build linux

package handover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/trialnet/trialnet/internal/counts"
	"github.com/trialnet/trialnet/internal/fdpass"
	"github.com/trialnet/trialnet/internal/lname"
	"golang.org/x/sys/unix"
)

// Taker is the new agent as its side of a hand-over needs it, from the
// moment it serves what it was offered until the old agent has drained.
type Taker interface {
	// Counted counts lines the old agent wrote to Trial's log, and shows
	// them to the Trial's watchers.
	Counted(trial string, lines []json.RawMessage)
	// Elsewhere counts, against each Trial's limits, the tunnels the old
	// agent has open there (absent: none). Only an old agent that shares
	// no counts pages (an earlier build) says so.
	Elsewhere(open map[string]int64)
	// Lost records as cut the tunnels the old agent left open: it ended
	// the hand-over after it stopped accepting and before it drained, and
	// has exited since.
	Lost()
	// Followed says the old agent counts nothing any more: it has drained,
	// or is gone. What it had open is not, or is not counted by it.
	Followed(p *Predecessor)
}

// Predecessor is the old agent, as the new one sees it from its offer on.
type Predecessor struct {
	c     *net.UnixConn
	pid   int
	pidfd int // to see it gone before its ledgers or slots are read; -1: gone already
	m     *machine
	log   *slog.Logger
	first Offer // its first offer: offsets, open tunnels, slots

	mu      sync.Mutex
	counts  map[lname.Name]*os.File // the counts pages it sent, until taken
	seq     uint64
	waiting map[uint64]chan Done
	closed  bool // no ask waits any more: it has drained, or is gone
	// followed is closed once follow has ended: every record the old
	// agent sent is counted, the tunnels it lost are recorded.
	followed chan struct{}

	// Its messages are read from the offer on, so that its records never
	// wait on this agent's start; follow takes them in order.
	qmu   sync.Mutex
	qcond *sync.Cond
	q     []Message
	qerr  error
}

// PID is the old agent's process id.
func (p *Predecessor) PID() int { return p.pid }

// State is where the hand-over is.
func (p *Predecessor) State() State { return p.m.state() }

// Offsets are each Trial's log size when the old agent began sending its
// records: this agent replays each log up to there, and counts the rest
// as Records.
func (p *Predecessor) Offsets() map[string]int64 { return p.first.Offsets }

// Shares reports whether it sent its counts pages, which both agents
// count in from the offer on.
func (p *Predecessor) Shares() bool {
	_, ok := p.first.Slots[lname.CountsName("").String()]
	return ok
}

// RefusedError says why the old agent does not hand over to this one; it
// serves on.
type RefusedError struct {
	PID int
	Why string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("the running agent (pid %d) does not hand over to this one: %s. It keeps serving", e.PID, e.Why)
}

// Take says hello to the old agent at c (a connection to its hand-over
// socket, from root of this PID namespace) and takes its offer: its
// listeners by name, and its counts pages, which TakeCounts gives out.
// An error says what to do; the old agent serves on.
func Take(c *net.UnixConn, cfg Config) (*Predecessor, map[lname.Name]*os.File, error) {
	p := &Predecessor{c: c, pid: fdpass.PeerPID(c), pidfd: -1, m: newMachine(), log: cfg.log(),
		counts: make(map[lname.Name]*os.File), waiting: make(map[uint64]chan Done), followed: make(chan struct{})}
	p.qcond = sync.NewCond(&p.qmu)
	files := make(map[lname.Name]*os.File)
	fail := func(err error) (*Predecessor, map[lname.Name]*os.File, error) {
		p.m.end()
		_ = c.Close()
		for _, f := range files {
			_ = f.Close()
		}
		p.CloseCounts()
		return nil, nil, err
	}
	_ = c.SetDeadline(time.Now().Add(StepTimeout))
	if err := Send(c, Hello{Version: Version, PID: os.Getpid(), Paths: cfg.Paths, Shares: true}); err != nil {
		return fail(fmt.Errorf("take over from the running agent: %w", err))
	}
	if err := p.takeOffer(files); err != nil {
		return fail(err)
	}
	_ = c.SetDeadline(time.Time{})
	// Its pidfd shows when it has exited: its ledgers and its slots of
	// the counts are its own until then. ESRCH: it has already.
	fd, _, err := fdpass.PeerPidfd(c)
	if err != nil && !errors.Is(err, unix.ESRCH) {
		return fail(fmt.Errorf("take over from the running agent (pid %d): %w (it keeps serving; try again)", p.pid, err))
	}
	p.pidfd = fd
	go p.read()
	return p, files, nil
}

// takeOffer reads the offer's messages into files (listeners) and
// p.counts (counts pages); a file under a name this build does not know
// is closed.
func (p *Predecessor) takeOffer(files map[lname.Name]*os.File) error {
	for first, more := true, true; more; first = false {
		m, got, err := Recv(p.c)
		if err != nil {
			return fmt.Errorf("take over from the running agent: %w (it keeps serving; look at its log)", err)
		}
		if r, ok := m.(Refused); ok {
			closeFiles(got)
			_ = p.m.to(StateRefused)
			return &RefusedError{PID: r.PID, Why: r.Error}
		}
		o, ok := m.(Offer)
		if !ok || len(got) != len(o.Names) {
			closeFiles(got)
			return fmt.Errorf("take over from the running agent: a %q message with %d files for %d names", m.Kind(), len(got), len(o.Names))
		}
		if first {
			if err := p.m.to(StateOffered); err != nil {
				closeFiles(got)
				return err
			}
			p.first = o
			if p.first.Offsets == nil {
				p.first.Offsets = map[string]int64{} // it serves no Trial
			}
		}
		for i, s := range o.Names {
			n, err := lname.Parse(s)
			switch {
			case err != nil:
				_ = got[i].Close()
			case n.Kind == lname.Counts:
				p.counts[n] = got[i]
			default:
				files[n] = got[i]
			}
		}
		more = o.More
	}
	return nil
}

// TakeCounts takes the counts page the old agent sent under name (nil:
// none), with the slot this agent counts in: the one it does not use.
func (p *Predecessor) TakeCounts(name lname.Name) (*os.File, int, error) {
	p.mu.Lock()
	f := p.counts[name]
	delete(p.counts, name)
	p.mu.Unlock()
	if f == nil {
		return nil, 0, nil
	}
	slot, ok := p.first.Slots[name.String()]
	if !ok || slot < 0 || slot >= counts.Slots {
		_ = f.Close()
		return nil, 0, fmt.Errorf("the running agent sent %s in slot %d (known: %v)", name, slot, ok)
	}
	return f, 1 - slot, nil
}

// CloseCounts closes the counts pages no Trial took.
func (p *Predecessor) CloseCounts() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, f := range p.counts {
		_ = f.Close()
		delete(p.counts, name)
	}
}

// Close gives back the connection and pidfd of an old agent that was
// never followed (a start that failed): it serves on.
func (p *Predecessor) Close() {
	p.m.fail()
	_ = p.c.Close()
	p.CloseCounts()
	if p.pidfd >= 0 {
		_ = unix.Close(p.pidfd)
		p.pidfd = -1
	}
}

// read queues the old agent's messages until the connection ends.
func (p *Predecessor) read() {
	for {
		m, files, err := Recv(p.c)
		closeFiles(files)
		p.qmu.Lock()
		if err != nil {
			p.qerr = err
		} else {
			p.q = append(p.q, m)
		}
		p.qcond.Broadcast()
		p.qmu.Unlock()
		if err != nil {
			return
		}
	}
}

// next is the old agent's next message, or why there is none.
func (p *Predecessor) next() (Message, error) {
	p.qmu.Lock()
	defer p.qmu.Unlock()
	for len(p.q) == 0 && p.qerr == nil {
		p.qcond.Wait()
	}
	if len(p.q) == 0 {
		return nil, p.qerr
	}
	m := p.q[0]
	p.q = p.q[1:]
	return m, nil
}

func (p *Predecessor) send(m Message) error {
	_ = p.c.SetWriteDeadline(time.Now().Add(sendTimeout))
	return Send(p.c, m)
}

// Adopting tells the old agent, every few seconds until stop is closed,
// that this one is still adopting its Trials.
func (p *Predecessor) Adopting(stop <-chan struct{}) {
	t := time.NewTicker(StepTimeout / 6)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			_ = p.send(Adopting{})
		}
	}
}

// Serve tells the old agent that this one serves every listener, follows
// its drain with t, and waits until it has stopped accepting: only then
// may this agent take the socket paths and call itself ready. An error
// means the hand-over did not happen: the old agent serves on (or, if it
// stopped, cuts what it serves and exits, and the listeners are the
// keeper's for the next agent).
func (p *Predecessor) Serve(t Taker) error {
	// Its tunnels count here from the start: in the counts it shares, or,
	// from an agent of an earlier build, as it says at the offer, as it
	// stops accepting, and whenever they change.
	if !p.Shares() {
		t.Elsewhere(p.first.Open)
	}
	if err := p.m.to(StateServing); err != nil {
		return fmt.Errorf("the running agent (pid %d) ended the hand-over before this one served: %w", p.pid, err)
	}
	go p.follow(t)
	if err := p.send(Serving{PID: os.Getpid()}); err != nil {
		p.m.fail()
		_ = p.c.Close()
		return fmt.Errorf("tell the running agent (pid %d) that this one serves: %w", p.pid, err)
	}
	timeout := time.After(StepTimeout)
	for {
		st, changed := p.m.now()
		switch {
		case st == StateFailed:
			return fmt.Errorf("the running agent (pid %d) ended the hand-over before it stopped accepting", p.pid)
		case st != StateServing: // it stopped, and may have drained or died since: the listeners are this one's
			return nil
		}
		select {
		case <-changed:
		case <-timeout:
			if p.m.fail() == StateFailed {
				_ = p.c.Close()
				return fmt.Errorf("the running agent (pid %d) did not stop accepting within %s", p.pid, StepTimeout)
			}
		}
	}
}

// follow counts the old agent's records and open tunnels until it has
// drained. If it ends the hand-over first, once it has stopped accepting,
// the tunnels it left are recorded as cut once it has exited.
func (p *Predecessor) follow(t Taker) {
	lost := p.readAll(t)
	p.mu.Lock()
	for seq, ch := range p.waiting {
		close(ch)
		delete(p.waiting, seq)
	}
	p.closed = true // under mu: no ask registers after it
	p.mu.Unlock()
	_ = p.c.Close()
	if lost != nil {
		// Until it has exited (a zombie has), it may still write to its
		// slots of the counts, which a new hand-over would clear and
		// give to the next agent, and to its ledgers.
		p.log.Error("the agent this one took over from ended the hand-over before it drained; its open tunnels are cut, and recorded once it has exited", "pid", p.pid, "error", lost)
		awaitExit(p.pidfd)
		t.Lost()
	}
	if p.pidfd >= 0 {
		_ = unix.Close(p.pidfd)
	}
	t.Followed(p)
	close(p.followed)
}

// readAll takes the old agent's messages until it has drained or the
// hand-over ends. If it ended after the old agent stopped accepting and
// before it drained (the hand-over happened, and the old agent did not
// finish it), it returns why.
func (p *Predecessor) readAll(t Taker) error {
	for {
		m, err := p.next()
		if err != nil {
			return p.broke(err)
		}
		switch m := m.(type) {
		case Records:
			t.Counted(m.Trial, m.Lines)
		case Stopped:
			if err := p.m.to(StateStopped); err != nil {
				// Out of turn (a second one): a protocol error.
				return p.broke(fmt.Errorf("the agent this one took over from (pid %d) said it stopped accepting: %w", p.pid, err))
			}
			p.elsewhere(t, m.Open)
		case Open:
			p.elsewhere(t, m.Open)
		case Done:
			p.answer(m)
		case Drained:
			if err := p.m.to(StateDrained); err != nil {
				return p.broke(fmt.Errorf("the agent this one took over from (pid %d) said it drained: %w", p.pid, err))
			}
			p.log.Info("the agent this one took over from has drained and exits", "pid", p.pid)
			return nil
		}
	}
}

// broke ends the hand-over for why; it returns why if the old agent had
// stopped accepting (StateLost), nil if not: Serve says so then.
func (p *Predecessor) broke(why error) error {
	if p.m.end() == StateLost {
		return why
	}
	return nil
}

func (p *Predecessor) elsewhere(t Taker, open map[string]int64) {
	if !p.Shares() {
		t.Elsewhere(open)
	}
}

// answer gives a Done to the ask waiting for it.
func (p *Predecessor) answer(d Done) {
	p.mu.Lock()
	ch := p.waiting[d.Seq]
	delete(p.waiting, d.Seq)
	p.mu.Unlock()
	if ch != nil {
		ch <- d
	}
}

// Allow asks the old agent, while it drains, to apply Trial's new
// allowlist (as the control API encodes it) and cut the tunnels of the
// entries in cut. ok: it did, and cut that many; otherwise it has
// drained, is gone, refused (why) or did not answer in time.
func (p *Predecessor) Allow(ctx context.Context, trial string, allow json.RawMessage, cut []string) (n int, why string, ok bool) {
	d, ok := p.ask(ctx, func(seq uint64) Message { return Allow{Trial: trial, Seq: seq, Allow: allow, Cut: cut} })
	return d.N, d.Error, ok
}

// Remove asks the old agent, while it drains, to end what it serves of
// Trial; once ok, its last records of the Trial have been counted here.
func (p *Predecessor) Remove(ctx context.Context, trial string) (why string, ok bool) {
	d, ok := p.ask(ctx, func(seq uint64) Message { return Remove{Trial: trial, Seq: seq} })
	return d.Error, ok
}

// ask sends the request numbered seq and waits for its Done. An old
// agent that ends first (it drained, or died) answers nothing, but what
// it sent before its end may still wait in the queue: ask returns only
// once follow has taken all of it, so that a caller that goes on to
// close the Trial's counters (a removal) has every record it wrote.
func (p *Predecessor) ask(ctx context.Context, request func(seq uint64) Message) (Done, bool) {
	ctx, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	ended := func(d Done) (Done, bool) {
		select {
		case <-p.followed:
		case <-ctx.Done():
		}
		return d, false
	}
	ch := make(chan Done, 1)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ended(Done{})
	}
	p.seq++
	seq := p.seq
	p.waiting[seq] = ch
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.waiting, seq)
		p.mu.Unlock()
	}()
	if err := p.send(request(seq)); err != nil {
		// It may have closed the connection, drained or dead, just now.
		return ended(Done{Error: err.Error()})
	}
	select {
	case d, ok := <-ch:
		if !ok {
			return ended(d)
		}
		return d, d.Error == ""
	case <-ctx.Done():
		return Done{}, false
	}
}
