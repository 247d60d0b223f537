package proxy

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/trialnet/trialnet/record"
)

// An agent that hands its listeners to a successor drains: it stops
// accepting (its successor accepts on the same sockets), serves the
// tunnels and requests it has open until they end, and cuts what is
// left when its drain time is up. From the offer on, both processes
// count each other's connections, rates and log bytes against each
// Trial's limits (Share); the successor counts the drained process's
// records in each Trial's counters (Count).

// StopAccepting stops accepting on every Trial's listeners, closing this
// process's descriptors of them (another process may hold the same
// sockets), and ends each forwarding connection after its current
// request, or, waiting for its next, now: as a server closes an idle
// kept-alive connection, so that the client sends its next request on a
// new one, which the successor decides. Open tunnels and requests go on.
func (p *Proxy) StopAccepting() {
	p.draining.Store(true)
	p.mu.Lock()
	trials := make([]*trial, 0, len(p.trials))
	for _, t := range p.trials {
		trials = append(trials, t)
	}
	p.mu.Unlock()
	for _, t := range trials {
		t.mu.Lock()
		for ln := range t.listeners {
			_ = ln.Close()
		}
		for c := range t.idle {
			_ = c.SetReadDeadline(time.Now()) // its wait for a head ends: serveOne closes it
		}
		t.mu.Unlock()
	}
}

// waitNext marks c, a kept-alive forwarding connection, as waiting for
// its next request, unless the process drains: then it reports false,
// and c is to close unserved. Either this sees the drain, or
// StopAccepting (which sets it before it takes t.mu) sees c.
func (t *trial) waitNext(p *Proxy, c net.Conn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p.draining.Load() {
		return false
	}
	t.idle[c] = struct{}{}
	return true
}

// gotNext ends waitNext: c's wait for its next head is over.
func (t *trial) gotNext(c net.Conn) {
	t.mu.Lock()
	delete(t.idle, c)
	t.mu.Unlock()
}

// Drained waits until every connection of every Trial has ended, or ctx
// ends; it reports whether they all ended. Call it after StopAccepting.
func (p *Proxy) Drained(ctx context.Context) bool {
	done := make(chan struct{})
	go func() {
		p.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// Open is how many connections (tunnels, requests and connections whose
// request is still being read) each Trial has open.
func (p *Proxy) Open() map[string]int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int64, len(p.trials))
	for id, t := range p.trials {
		out[id] = t.tunnels.Load()
	}
	return out
}

// CutAll ends every Trial's open tunnels and requests, each recorded as
// cut with ReasonShutdown and why, and every other connection; it returns
// how many tunnels and requests were cut. The Trials stay registered:
// RemoveTrial waits for their records.
func (p *Proxy) CutAll(why string) int {
	p.mu.Lock()
	trials := make([]*trial, 0, len(p.trials))
	for _, t := range p.trials {
		trials = append(trials, t)
	}
	p.mu.Unlock()
	n := 0
	for _, t := range trials {
		t.mu.Lock()
		for ot := range t.open {
			if ot.cut(record.ReasonShutdown, why) {
				n++
			}
		}
		conns := make([]net.Conn, 0, len(t.conns))
		for c := range t.conns {
			conns = append(conns, c)
		}
		t.mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	}
	return n
}

// Share makes every Trial's limits count what the other slot of its
// counts.Region holds too, and the proxy's connection cap its Region's:
// another process that maps them (the agent handing over to this one, or
// taking over from it) serves the same Trials, and the two keep to each
// limit together. Each process adds to its own slot, then checks the sum
// (sequentially consistent atomics): of two racing for the last place,
// at least one sees the other's, so the sum never passes the limit. The
// rates and log bytes are one word of each Region, whoever takes from
// them. fresh zeroes the other slots first: a successor is yet to use
// them, and what a process before it left there is not open any more.
func (p *Proxy) Share(fresh bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if fresh {
		p.cfg.Counts.Clear(1 - p.cfg.Slot)
		for _, t := range p.trials {
			t.counts.Clear(1 - t.slot)
		}
	}
	p.sharing.Store(true)
	for _, t := range p.trials {
		t.peer.Store(t.counts.Slot(1 - t.slot))
	}
}

// Unshare ends Share: the other process has ended, or never served.
func (p *Proxy) Unshare() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sharing.Store(false)
	for _, t := range p.trials {
		t.peer.Store(nil)
	}
}

// otherConns are the client connections the process sharing the proxy's
// counts has open (Share), of every Trial.
func (p *Proxy) otherConns() int64 {
	if !p.sharing.Load() {
		return 0
	}
	return p.cfg.Counts.Slot(1 - p.cfg.Slot).Clients.Load()
}

// otherTunnels, otherClients and otherPending are what another process
// has open of the Trial: the one sharing its counts (Share), and what an
// agent of an earlier build said (SetElsewhere).
func (t *trial) otherTunnels() int64 {
	n := t.elsewhere.Load()
	if s := t.peer.Load(); s != nil {
		n += s.Tunnels.Load()
	}
	return n
}

func (t *trial) otherClients() int64 {
	if s := t.peer.Load(); s != nil {
		return s.Clients.Load()
	}
	return 0
}

func (t *trial) otherPending() int64 {
	if s := t.peer.Load(); s != nil {
		return s.Pending.Load()
	}
	return 0
}

// SetElsewhere says how many of Trial id's tunnels and requests another
// process serves now: they count against its max_tunnels and in its
// Active count.
func (p *Proxy) SetElsewhere(id string, n int64) {
	p.mu.Lock()
	t := p.trials[id]
	p.mu.Unlock()
	if t != nil {
		t.elsewhere.Store(n)
	}
}

// Count adds a record that another process wrote to Trial id's log to its
// counters, as a replay of the log would.
func (p *Proxy) Count(id string, ev *record.Event) error {
	p.mu.Lock()
	t := p.trials[id]
	p.mu.Unlock()
	if t == nil {
		return fmt.Errorf("proxy: Trial %q is not registered", id)
	}
	t.mu.Lock()
	t.stats.Add(ev)
	t.stats.CountWritten(ev)
	t.mu.Unlock()
	return nil
}

// Record counts and records, as its own, a decision this process did not
// make: a tunnel that a process which died left open, or the summary it
// kept pending (see Ledger).
func (p *Proxy) Record(id string, ev *record.Event) error {
	p.mu.Lock()
	t := p.trials[id]
	p.mu.Unlock()
	if t == nil {
		return fmt.Errorf("proxy: Trial %q is not registered", id)
	}
	if ev.Decision == record.DecisionSuppressed { // a summary a process that ended kept pending
		t.mu.Lock()
		t.stats.Add(ev)
		t.mu.Unlock()
		t.records.Restore(ev)
		return nil
	}
	p.emit(t, ev)
	return nil
}
