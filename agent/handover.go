//go:build linux

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/handover"
	"github.com/trialnet/trialnet/internal/counts"
	"github.com/trialnet/trialnet/internal/fdpass"
	"github.com/trialnet/trialnet/internal/lname"
	"github.com/trialnet/trialnet/record"
	trialspec "github.com/trialnet/trialnet/trial"
)

// The hand-over's protocol, both sides, is package handover; this file is
// what the agent gives it: the old agent's side (giver, the daemon) and
// the new agent's (taker). Throughout a hand-over the old agent's records
// land in each Trial's log (both processes append whole lines), and from
// the offer on the two map the counts behind each Trial's limits
// (internal/counts), so that together they keep to them as one process.

// HandoverSocket is where the agent serving the control socket at sock
// offers its listeners to a successor.
func HandoverSocket(sock string) string {
	return strings.TrimSuffix(sock, ".sock") + ".handover"
}

// errHandedOver answers a call that waited on a hand-over: this process
// no longer serves, and did nothing of it. Clients retry it.
func errHandedOver() *client.Error {
	return errf(client.CodeHandedOver, "this agent handed over to a new agent process while the call waited; it did nothing, and the new agent serves a retry")
}

// enter admits a call that changes Trials (create, destroy, allowlist,
// reload); a hand-over waits for those admitted and holds the others
// until it is done, after which they are refused with errHandedOver.
func (a *Agent) enter() (leave func(), err error) {
	a.hmu.RLock()
	if a.handedOver {
		a.hmu.RUnlock()
		return nil, errHandedOver()
	}
	a.calls.Add(1)
	return func() {
		a.calls.Add(-1)
		a.hmu.RUnlock()
		a.shells.kick() // the refill waits for no such call to run
	}, nil
}

// paths are what an agent holds by path; a successor must have the same.
func (d *daemon) paths() map[string]string { return agentPaths(d.cfg.AgentConfig, d.sock) }

func agentPaths(c AgentConfig, sock string) map[string]string {
	h := c.Host.withDefaults()
	return map[string]string{"socket": sock, "state_dir": h.StateDir, "data_dir": c.DataDir, "pin_dir": h.PinDir,
		"netns_dir": h.NetnsDir, "cgroup_parent": h.Parent}
}

// serveHandovers answers successors on ln, one at a time, until one takes
// over (it closes d.handedOff) or ln is closed.
func (d *daemon) serveHandovers(ln *net.UnixListener) {
	cfg := handover.Config{Paths: d.paths(), Log: d.a.log}
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		err = fdpass.CheckPeer(c)
		if err == nil {
			if d.successor, err = handover.Give(c, giver{d}, cfg); err == nil {
				// c stays open: the drain uses it.
				d.a.log.Info("the new agent serves every listener; this one stopped accepting and drains", "successor", d.successor.PID(), "drain_timeout", d.drainTimeout())
				close(d.handedOff)
				return
			}
		}
		_ = c.Close()
		d.a.log.Error("hand-over to a new agent failed; this agent keeps serving everything", "error", err)
	}
}

// drain runs after a hand-over: the control and metrics servers stop,
// and what is open is served until it ends or the drain time passes (see
// handover.Successor.Drain). It returns an error if the successor ended
// first.
func (d *daemon) drain() error {
	d.a.stopWatching()
	servers := d.stopServing()
	defer func() { <-servers }()
	return d.successor.Drain(giver{d}, d.drainTimeout())
}

// pathTakenBound is how long a drain waits for the successor's control
// socket to replace this agent's at the path.
const pathTakenBound = 30 * time.Second

// stopServing closes the hand-over listener, ends the watchers and shuts
// the control and metrics servers down, in the background: the channel
// closes once they are. The socket paths become the successor's (its
// own sockets, renamed over these once it hears that this agent stopped:
// neither unlinks on close). Until that rename a client dialling the path
// reaches this control socket, which must still listen (closed, it would
// refuse the client); after it, a call that reached this socket just
// before is still answered for a second. A call that changes Trials gets
// CodeHandedOver, and its client retries it there. Watchers' clients
// follow the Trial to the new agent.
func (d *daemon) stopServing() <-chan struct{} {
	_ = d.hln.Close()
	d.a.endWatchers()
	servers := make(chan struct{})
	go func() {
		defer close(servers)
		if d.msrv != nil { // its socket is the successor's too: only one serves it
			shutdown, cancel := context.WithTimeout(context.Background(), 6*time.Second)
			_ = d.msrv.Shutdown(shutdown)
			cancel()
		}
		awaitTaken(d.sock, d.ctlFile, d.successorGone, pathTakenBound)
		time.Sleep(time.Second)
		shutdown, cancel := context.WithTimeout(context.Background(), 6*time.Second)
		defer cancel()
		_ = d.srv.Shutdown(shutdown)
	}()
	return servers
}

// successorGone reports whether the successor is known to have ended (a
// failed rename ends it): the hand-over was lost. A drained one is not:
// that end is this agent's, at once when nothing was open, and says
// nothing of the rename. A successor that ends after this agent drained
// is not seen (the connection is closed): the wait's bound ends it.
func (d *daemon) successorGone() bool { return d.successor.State() == handover.StateLost }

// giver is the daemon as the old agent's side of a hand-over needs it.
type giver struct{ d *daemon }

func (g giver) Hold() string {
	a := g.d.a
	a.hmu.Lock()
	why := a.holdRefusal()
	if why != "" {
		a.hmu.Unlock()
	}
	return why
}

// holdRefusal says why this agent may not hand over now (under hmu).
func (a *Agent) holdRefusal() string {
	if a.stopping {
		return "it is stopping: start this agent again once it has"
	}
	if p := a.pred.Load(); p != nil {
		if p.State().Ended() {
			// It may still write to its slots of the counts, which this
			// hand-over would clear and give to the new agent.
			return fmt.Sprintf("the agent it took over from (pid %d) ended that hand-over before it drained and has not exited yet; until it has, its open connections still count against the Trials' limits: try again once pid %d has exited (end it if it hangs)", p.PID(), p.PID())
		}
		return fmt.Sprintf("it took over from pid %d itself, which still drains; one hand-over at a time: try again once that ends (at most its drain_timeout)", p.PID())
	}
	return ""
}

func (g giver) Offer(shares bool, forward func(string, []byte)) (handover.Goods, error) {
	files, err := g.d.listenerFiles()
	if err != nil {
		return handover.Goods{}, err
	}
	if shares {
		cf, err := g.d.a.countsFiles()
		if err != nil {
			closeFiles(files)
			return handover.Goods{}, err
		}
		g.d.a.proxy.Share(true)
		files = append(files, cf...)
	}
	if err := g.d.a.pauseStubs(); err != nil {
		closeFiles(files)
		return handover.Goods{}, err
	}
	offsets := g.d.a.startForwarding(forward)
	return handover.Goods{Files: files, Offsets: offsets, Open: g.d.a.proxy.Open()}, nil
}

func (g giver) Release(stopped bool) {
	a := g.d.a
	if stopped {
		a.handedOver = true
		g.d.srv.SetKeepAlivesEnabled(false)
		a.proxy.StopAccepting()
		a.forEachLog((*decisionLog).handedOver)
		a.releaseStubs()
		a.shells.close() // creates go to the successor now
	} else {
		a.proxy.Unshare() // what it had open is no more
		// The successor, ended by now, served the Trials it had adopted
		// on copies of their listeners: its records are in their logs,
		// not in these counters, and the tunnels it had open died with
		// it, kept in its ledgers, which no later adoption may read (a
		// Trial destroyed first has its ledgers swept unread).
		a.countStrangers()
		a.stopForwarding()
		a.resumeStubs()
		for _, id := range a.ids() {
			a.recordLost(id)
		}
	}
	a.hmu.Unlock()
}

func (g giver) Open() map[string]int64           { return g.d.a.proxy.Open() }
func (g giver) Drained(ctx context.Context) bool { return g.d.a.proxy.Drained(ctx) }
func (g giver) CutAll(why string) int            { return g.d.a.proxy.CutAll(why) }
func (g giver) Remove(trial string)              { g.d.a.proxy.RemoveTrial(trial) }
func (g giver) SetAllow(trial string, raw json.RawMessage, cut []string) (int, error) {
	var entries []trialspec.AllowEntry
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &entries); err != nil {
			return 0, fmt.Errorf("the allowlist: %w", err)
		}
	}
	list, err := parseEntries(entries, nil)
	if err != nil {
		return 0, err
	}
	var cutList []trialspec.AllowEntry
	for _, c := range cut {
		cutList = append(cutList, trialspec.AllowEntry{Entry: c})
	}
	cutEntries, _ := parseEntries(cutList, nil)
	return g.d.a.proxy.SetAllow(trial, allow.New(list...), cutEntries)
}

// Finish removes every Trial from the proxy and ends each one's log with
// its last records.
func (g giver) Finish() {
	a := g.d.a
	for _, id := range a.ids() {
		a.proxy.RemoveTrial(id)
	}
	a.mu.Lock()
	for _, lt := range a.trials {
		lt.log.end()
		lt.log.close()
	}
	a.mu.Unlock()
}

// startForwarding makes every Trial's log send its records to fw from
// now on, and returns each log's size at that moment: what the successor
// replays, the rest it gets from fw. stopForwarding undoes it.
func (a *Agent) startForwarding(fw func(id string, line []byte)) map[string]int64 {
	lts := a.allTrials()
	out := make(map[string]int64, len(lts))
	for _, lt := range lts {
		id := lt.info.ID
		out[id] = lt.log.forward(func(line []byte) { fw(id, line) })
	}
	return out
}

// countStrangers counts, in each Trial's counters, the records its log
// got from a successor whose hand-over failed.
func (a *Agent) countStrangers() {
	lts := a.allTrials()
	for _, lt := range lts {
		evs, err := lt.log.strangers()
		if err != nil {
			a.log.Warn("the records a failed successor wrote are partly unreadable (torn by its end, or of a newer schema): the Trial's counters and receipt leave those out; trialnet audit lists the log's readable records", "trial", lt.info.ID, "error", err)
		}
		for i := range evs {
			_ = a.proxy.Count(lt.info.ID, &evs[i])
			lt.log.observe(&evs[i])
		}
	}
}

// forEachLog calls fn with every Trial's log.
func (a *Agent) forEachLog(fn func(*decisionLog)) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, lt := range a.trials {
		fn(&lt.log)
	}
}

func (a *Agent) stopForwarding() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, lt := range a.trials {
		lt.log.forward(nil)
	}
}

// listenerFiles are the descriptors of every listener this process
// serves, by name, for a hand-over. The caller closes them.
func (d *daemon) listenerFiles() (files []handover.File, err error) {
	add := func(name lname.Name, ln net.Listener) {
		if ln == nil || err != nil {
			return
		}
		f, ferr := listenerFile(ln)
		if ferr != nil {
			err = fmt.Errorf("listener %s: %w", name, ferr)
			return
		}
		files = append(files, handover.File{Name: name, File: f})
	}
	add(lname.MetricsName(), d.met)
	for id, lns := range d.a.trialListeners() {
		for i, ln := range lns {
			add(lname.EndpointName(id, i), ln)
		}
	}
	for _, lt := range d.a.liveTrials() {
		if err != nil {
			break
		}
		names, tfiles, terr := d.a.transparentFiles(lt)
		if terr != nil {
			err = terr
			break
		}
		for i, n := range names {
			files = append(files, handover.File{Name: n, File: tfiles[i]})
		}
	}
	if err != nil {
		closeFiles(files)
		return nil, err
	}
	return files, nil
}

// countsFiles are descriptors of the proxy's counts page and every
// Trial's, by name, with this process's slot in each, for a successor
// that shares them. The caller closes them.
func (a *Agent) countsFiles() (files []handover.File, err error) {
	add := func(name lname.Name, r *counts.Region, slot int) {
		if err != nil {
			return
		}
		f, derr := r.Dup()
		if derr != nil {
			err = fmt.Errorf("counts %s: %w", name, derr)
			return
		}
		files = append(files, handover.File{Name: name, File: f, Slot: slot})
	}
	add(lname.CountsName(""), a.counts, a.countsSlot)
	a.mu.Lock()
	for id, lt := range a.trials {
		if lt.counts != nil {
			add(lname.CountsName(id), lt.counts, lt.slot)
		}
	}
	a.mu.Unlock()
	if err != nil {
		closeFiles(files)
		return nil, err
	}
	return files, nil
}

func listenerFile(ln net.Listener) (*os.File, error) {
	f, ok := ln.(interface{ File() (*os.File, error) })
	if !ok {
		return nil, fmt.Errorf("a %T cannot be handed over", ln)
	}
	return f.File()
}

func closeFiles(files []handover.File) {
	for _, f := range files {
		_ = f.File.Close()
	}
}

// trialListeners are the endpoint listeners of every live Trial.
func (a *Agent) trialListeners() map[string][]net.Listener {
	lts := a.liveTrials()
	out := make(map[string][]net.Listener, len(lts))
	for _, lt := range lts {
		lt.mu.Lock()
		if len(lt.lns) > 0 {
			out[lt.info.ID] = lt.lns
		}
		lt.mu.Unlock()
	}
	return out
}

// errNoPredecessor: no agent answers on the hand-over socket.
var errNoPredecessor = errors.New("no agent to take over from")

// takeOver asks the agent at the hand-over socket path for everything it
// serves. It returns errNoPredecessor when none answers, and an error
// that says what to do when one answers and cannot hand over.
func takeOver(path string, cfg handover.Config) (*handover.Predecessor, map[lname.Name]*os.File, error) {
	c, err := fdpass.Dial(path)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
		return nil, nil, errNoPredecessor
	}
	if err != nil {
		return nil, nil, fmt.Errorf("take over from the running agent: %w", err)
	}
	return handover.Take(c, cfg)
}

// countsFor is the counts page named name and this process's slot in it:
// the predecessor's page, in the slot it does not use, if it sent one;
// else a new page. A page sent that cannot be mapped fails the start: the
// two processes would each keep to the limits alone.
func (a *Agent) countsFor(name lname.Name) (*counts.Region, int, error) {
	if p := a.pred.Load(); p != nil {
		f, slot, err := p.TakeCounts(name)
		if err != nil {
			return nil, 0, err
		}
		if f != nil {
			r, err := counts.Open(f)
			if err != nil {
				return nil, 0, fmt.Errorf("the running agent's %s: %w", name, err)
			}
			return r, slot, nil
		}
	}
	r, err := counts.New(name.String())
	return r, 0, err
}

// taker is the agent as the new agent's side of a hand-over needs it.
type taker struct{ a *Agent }

// Counted adds records the predecessor wrote to Trial id's counters, and
// shows them to its watchers.
func (t taker) Counted(id string, lines []json.RawMessage) {
	a := t.a
	a.mu.Lock()
	lt := a.trials[id]
	a.mu.Unlock()
	if lt == nil {
		return
	}
	for _, line := range lines {
		var ev record.Event
		if err := ev.UnmarshalJSON(line); err != nil {
			continue
		}
		_ = a.proxy.Count(id, &ev)
		lt.log.observe(&ev)
	}
}

func (t taker) Elsewhere(open map[string]int64) {
	for _, id := range t.a.ids() {
		t.a.proxy.SetElsewhere(id, open[id])
	}
}

func (t taker) Lost() {
	for _, id := range t.a.ids() {
		t.a.recordLost(id)
	}
}

// Followed: what the predecessor had open is not any more, or is not
// counted by it.
func (t taker) Followed(p *handover.Predecessor) {
	t.a.proxy.Unshare()
	t.Elsewhere(nil)
	t.a.pred.CompareAndSwap(p, nil)
}

// ids are the ids of every Trial this agent holds.
func (a *Agent) ids() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]string, 0, len(a.trials))
	for id := range a.trials {
		out = append(out, id)
	}
	return out
}
