//go:build linux

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/counts"
	"github.com/trialnet/trialnet/internal/fdpass"
	"github.com/trialnet/trialnet/keeper"
	"github.com/trialnet/trialnet/record"
	trialspec "github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

// A hand-over moves a running agent's listeners to a new agent process
// without closing them: the old process (the predecessor) sends them over
// a root-only packet socket (SCM_RIGHTS), its successor serves them, and
// only then does the predecessor stop accepting. A connection arriving at
// any moment waits in the kernel's accept queue of a socket that stays
// open throughout, so none is refused. The predecessor then drains: it
// serves the tunnels and requests it has open until they end or its
// drain_timeout passes, and cuts the rest with a record saying why.
// Throughout, its records land in each Trial's log (both processes append
// whole lines), and it sends them to its successor, which counts them and
// shows them to watchers; from the offer on, the two map the counts
// behind each Trial's limits (internal/counts), so that together they
// keep to them as one process (with a successor of an earlier build, it
// sends its open tunnel counts instead); and it takes its successor's
// live policy changes and removals of Trials.

// handoverVersion is the hand-over protocol this agent speaks. An agent
// asked for another answers "refused", and the new one says so.
const handoverVersion = 1

// HandoverSocket is where the agent serving the control socket at sock
// offers its listeners to a successor.
func HandoverSocket(sock string) string {
	return strings.TrimSuffix(sock, ".sock") + ".handover"
}

// nameMetrics names the metrics listener among those a hand-over or the
// keeper moves; a Trial's are keeper.TrialListener's. The unix sockets
// (control, hand-over) are made anew by each agent (see listen).
const nameMetrics = "metrics"

// nameCounts names the proxy's counts page among the files a hand-over
// sends, countsName a Trial's (see proxy.Share).
const nameCounts = "counts"

func countsName(id string) string { return nameCounts + ":" + id }

func isCountsName(name string) bool {
	return name == nameCounts || strings.HasPrefix(name, nameCounts+":")
}

// hoKind is what a hand-over message is: its "type" on the wire. The
// strings are the protocol's; a new agent speaks them to an old one of an
// earlier build, so none may change. handover_test.go lists each kind
// with its sender.
type hoKind string

// The hand-over's message kinds, in the order a hand-over sends them. The
// new agent is the successor, the old one its predecessor.
const (
	// hoHello: new agent, first, with its protocol version and paths.
	hoHello hoKind = "hello"
	// hoRefused: old agent, instead of an offer, saying why it does not hand over.
	hoRefused hoKind = "refused"
	// hoOffer: old agent, after the hello, carrying listeners and counts pages.
	hoOffer hoKind = "offer"
	// hoAdopting: new agent, every few seconds while it adopts the Trials.
	hoAdopting hoKind = "adopting"
	// hoServing: new agent, once it serves every listener it was offered.
	hoServing hoKind = "serving"
	// hoStopped: old agent, once it has stopped accepting, with its open tunnels.
	hoStopped hoKind = "stopped"
	// hoRecords: old agent, from the offer until it has drained, with its records.
	hoRecords hoKind = "records"
	// hoOpen: old agent, while it drains, when its open tunnels change.
	hoOpen hoKind = "open"
	// hoAllow: new agent, while the old one drains, with a Trial's new allowlist.
	hoAllow hoKind = "allow"
	// hoRemove: new agent, while the old one drains, removing a Trial.
	hoRemove hoKind = "remove"
	// hoDone: old agent, answering an allow or remove (by its Seq).
	hoDone hoKind = "done"
	// hoDrained: old agent, last, once it has drained and is about to exit.
	hoDrained hoKind = "drained"
)

// hoMsg is one hand-over message; Type says which fields it uses.
type hoMsg struct {
	Type    hoKind `json:"type"`
	Version int    `json:"version,omitempty"`
	PID     int    `json:"pid,omitempty"`
	Error   string `json:"error,omitempty"`
	// hello: the new agent's paths, which must be the old one's, and
	// whether it shares the counts behind the limits (an agent of an
	// earlier build does not: its open counts go in messages).
	Paths  map[string]string `json:"paths,omitempty"`
	Shares bool              `json:"shares,omitempty"`
	// offer: the names of the files sent with it, in order, and whether
	// more offer messages follow; each Trial's log size when the
	// predecessor began sending its records; the predecessor's slot in
	// each counts page sent (by name), when the successor shares them.
	Names   []string         `json:"names,omitempty"`
	More    bool             `json:"more,omitempty"`
	Offsets map[string]int64 `json:"offsets,omitempty"`
	Slots   map[string]int   `json:"slots,omitempty"`
	// records, allow, remove, done
	Trial string                 `json:"trial,omitempty"`
	Lines []json.RawMessage      `json:"lines,omitempty"`
	Seq   uint64                 `json:"seq,omitempty"`
	Allow []trialspec.AllowEntry `json:"allow,omitempty"`
	Cut   []string               `json:"cut,omitempty"`
	N     int                    `json:"n,omitempty"`
	// open: each Trial's tunnels and requests the predecessor serves
	Open map[string]int64 `json:"open,omitempty"`
}

// Hand-over timeouts: the offer's messages, and the successor's start
// (it adopts every Trial, which takes well under a second each).
const (
	handoverStepTimeout  = 30 * time.Second
	handoverServeTimeout = 10 * time.Minute
)

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
	return a.hmu.RUnlock, nil
}

// forwarder queues the records a draining predecessor sends on.
type forwarder struct {
	mu      sync.Mutex
	q       map[string][]json.RawMessage
	n       int
	dropped int
	wake    chan struct{}
	// sendMu orders flushes: a flush returns once every record queued
	// before it is sent, whoever sends it.
	sendMu sync.Mutex
}

// fwdQueueMax bounds what waits for a slow successor; past it records are
// still written to the log, only not counted live by the successor.
const fwdQueueMax = 1 << 16

func newForwarder() *forwarder {
	return &forwarder{q: make(map[string][]json.RawMessage), wake: make(chan struct{}, 1)}
}

func (f *forwarder) add(id string, line []byte) {
	f.mu.Lock()
	if f.n >= fwdQueueMax {
		f.dropped++
	} else {
		f.q[id] = append(f.q[id], json.RawMessage(append([]byte(nil), line...)))
		f.n++
	}
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (f *forwarder) take() (map[string][]json.RawMessage, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	q, d := f.q, f.dropped
	f.q, f.n, f.dropped = make(map[string][]json.RawMessage), 0, 0
	return q, d
}

// send writes the queued records to c until stop is closed; it returns
// c's error, or nil after a last flush once stop is closed.
func (f *forwarder) send(c *net.UnixConn, stop <-chan struct{}, log func(string, ...any)) error {
	for {
		var last bool
		select {
		case <-f.wake:
		case <-stop:
			last = true
		}
		if err := f.flush(c, log); err != nil || last {
			return err
		}
	}
}

// flush sends every queued record, in messages well under fdpass's
// bound.
func (f *forwarder) flush(c *net.UnixConn, log func(string, ...any)) error {
	f.sendMu.Lock()
	defer f.sendMu.Unlock()
	q, dropped := f.take()
	if dropped > 0 {
		log("records not sent to the successor (it did not keep up); they are in the log, and its counters miss them until its next restart", "records", dropped)
	}
	for id, lines := range q {
		for len(lines) > 0 {
			n, size := 0, 0
			// Well under a packet socket's send buffer (~208 KiB).
			for n < len(lines) && size < 64<<10 {
				size += len(lines[n])
				n++
			}
			_ = c.SetWriteDeadline(time.Now().Add(sendTimeout))
			if err := fdpass.Send(c, hoMsg{Type: hoRecords, Trial: id, Lines: lines[:n]}); err != nil {
				return err
			}
			lines = lines[n:]
		}
	}
	return nil
}

// startForwarding makes every Trial's log send its records to fw from
// now on, and returns each log's size at that moment: what the successor
// replays, the rest it gets from fw. stopForwarding undoes it.
func (a *Agent) startForwarding(fw *forwarder) map[string]int64 {
	a.mu.Lock()
	lts := make([]*trial, 0, len(a.trials))
	for _, lt := range a.trials {
		lts = append(lts, lt)
	}
	a.mu.Unlock()
	out := make(map[string]int64, len(lts))
	for _, lt := range lts {
		id := lt.info.ID
		out[id] = lt.log.forward(func(line []byte) { fw.add(id, line) })
	}
	return out
}

func (a *Agent) stopForwarding() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, lt := range a.trials {
		lt.log.forward(nil)
	}
}

// listenerFiles are the descriptors of every listener this process
// serves, by name, for a hand-over or the keeper. The caller closes them.
func (d *daemon) listenerFiles() (names []string, files []*os.File, err error) {
	add := func(name string, ln net.Listener) {
		if ln == nil || err != nil {
			return
		}
		f, ferr := listenerFile(ln)
		if ferr != nil {
			err = fmt.Errorf("listener %s: %w", name, ferr)
			return
		}
		names, files = append(names, name), append(files, f)
	}
	add(nameMetrics, d.met)
	for id, lns := range d.a.trialListeners() {
		for i, ln := range lns {
			add(keeper.TrialListener(id, i), ln)
		}
	}
	if err != nil {
		closeFiles(files)
		return nil, nil, err
	}
	return names, files, nil
}

// countsFiles are descriptors of the proxy's counts page and every
// Trial's, by name, with this process's slot in each, for a successor
// that shares them. The caller closes them.
func (a *Agent) countsFiles() (names []string, files []*os.File, slots map[string]int, err error) {
	slots = make(map[string]int)
	add := func(name string, r *counts.Region, slot int) {
		if err != nil {
			return
		}
		f, derr := r.Dup()
		if derr != nil {
			err = fmt.Errorf("counts %s: %w", name, derr)
			return
		}
		names, files, slots[name] = append(names, name), append(files, f), slot
	}
	add(nameCounts, a.counts, a.countsSlot)
	a.mu.Lock()
	for id, lt := range a.trials {
		if lt.counts != nil {
			add(countsName(id), lt.counts, lt.slot)
		}
	}
	a.mu.Unlock()
	if err != nil {
		closeFiles(files)
		return nil, nil, nil, err
	}
	return names, files, slots, nil
}

// countsFor is the counts page named name (nameCounts, countsName) and
// this process's slot in it: the predecessor's page, in the slot it does
// not use, if it sent one; else a new page. A page sent that cannot be
// mapped fails the start: the two processes would each keep to the
// limits alone.
func (a *Agent) countsFor(name string) (*counts.Region, int, error) {
	if p := a.pred.Load(); p != nil {
		if f := p.takeCounts(name); f != nil {
			slot, ok := p.slots[name]
			if !ok || slot < 0 || slot >= counts.Slots {
				_ = f.Close()
				return nil, 0, fmt.Errorf("the running agent sent %s in slot %d (known: %v)", name, slot, ok)
			}
			r, err := counts.Open(f)
			if err != nil {
				return nil, 0, fmt.Errorf("the running agent's %s: %w", name, err)
			}
			return r, 1 - slot, nil
		}
	}
	r, err := counts.New(name)
	return r, 0, err
}

func listenerFile(ln net.Listener) (*os.File, error) {
	f, ok := ln.(interface{ File() (*os.File, error) })
	if !ok {
		return nil, fmt.Errorf("a %T cannot be handed over", ln)
	}
	return f.File()
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}

// trialListeners are the endpoint listeners of every live Trial.
func (a *Agent) trialListeners() map[string][]net.Listener {
	a.mu.Lock()
	lts := make([]*trial, 0, len(a.trials))
	for _, lt := range a.trials {
		if lt.state == stateLive {
			lts = append(lts, lt)
		}
	}
	a.mu.Unlock()
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
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		err = d.handOver(c)
		if err == nil {
			return // c stays open: the drain uses it
		}
		_ = c.Close()
		d.a.log.Error("hand-over to a new agent failed; this agent keeps serving everything", "error", err)
	}
}

// handOver offers everything to the successor at c. On success, this
// process no longer accepts anything and drains; on failure it serves on
// as if nothing happened (it never stopped accepting).
func (d *daemon) handOver(c *net.UnixConn) (err error) {
	a := d.a
	if err := fdpass.CheckPeer(c); err != nil {
		return err
	}
	pid := fdpass.PeerPID(c)
	// The successor's pidfd, taken at once: if the hand-over fails after
	// the offer, the successor is ended before this agent resumes, so that
	// no process accepts on these sockets but this one. Its hello must
	// name the same pid, the connection's, or it is not trusted.
	succ, how, perr := fdpass.PeerPidfd(c)
	if perr != nil {
		return fmt.Errorf("pid %d: %w", pid, perr)
	}
	defer unix.Close(succ)
	hello, err := d.hello(c, pid)
	if err != nil {
		return err
	}
	a.log.Info("handing over to a new agent", "pid", pid, "pidfd", how)
	// Calls that change Trials finish first; new ones wait for the end.
	a.hmu.Lock()
	if a.stopping {
		a.hmu.Unlock()
		_ = fdpass.Send(c, hoMsg{Type: hoRefused, Version: handoverVersion, PID: os.Getpid(), Error: "it is stopping: start this agent again once it has"})
		return fmt.Errorf("pid %d asked to take over while this agent stops", pid)
	}
	fw := newForwarder()
	offered := false
	defer func() {
		if err != nil {
			if offered {
				// It may accept on copies of these sockets already.
				endProcess(succ)
			}
			a.proxy.Unshare() // what it had open is no more
			a.stopForwarding()
			a.hmu.Unlock()
		}
	}()
	names, files, slots, err := d.offerFiles(hello.Shares)
	if err != nil {
		return err
	}
	defer func() { closeFiles(files) }()
	offsets := a.startForwarding(fw)
	offered = true
	if err := sendOffer(c, names, files, offsets, a.proxy.Open(), slots); err != nil {
		return fmt.Errorf("pid %d: offer: %w", pid, err)
	}
	// Its records go out while it starts: it counts them once it serves.
	stop, sent := make(chan struct{}), make(chan struct{})
	s := &successor{c: c, pid: pid, fw: fw, stopFwd: stop, sent: sent, gone: make(chan struct{}), ended: make(chan struct{})}
	go func() {
		defer close(sent)
		if err := fw.send(c, stop, a.log.Warn); err != nil {
			a.log.Error("records no longer reach the new agent", "successor", pid, "error", err)
			s.lost() // nothing follows this process's tunnels any more
		}
	}()
	if err := awaitServing(c); err != nil {
		close(stop)
		return fmt.Errorf("pid %d did not take over: %w", pid, err)
	}
	// Stop accepting first, then say so: only then does the successor
	// take the socket paths and report itself ready.
	a.handedOver = true
	d.srv.SetKeepAlivesEnabled(false)
	a.proxy.StopAccepting()
	a.hmu.Unlock()
	d.successor = s
	if err := s.send(hoMsg{Type: hoStopped, Open: a.proxy.Open()}); err != nil {
		a.log.Error("the new agent did not hear that this one stopped accepting; this one cuts what it serves and exits", "successor", pid, "error", err)
		s.lost()
	}
	a.log.Info("the new agent serves every listener; this one stopped accepting and drains", "successor", pid, "drain_timeout", d.drainTimeout())
	close(d.handedOff)
	return nil
}

// hello reads the successor's hello on c, from the process pid the
// connection names, and refuses (telling it why) one this agent may not
// hand over to.
func (d *daemon) hello(c *net.UnixConn, pid int) (hoMsg, error) {
	_ = c.SetDeadline(time.Now().Add(handoverStepTimeout))
	var hello hoMsg
	if _, err := fdpass.Recv(c, &hello); err != nil {
		return hoMsg{}, fmt.Errorf("pid %d: hello: %w", pid, err)
	}
	if hello.PID != pid || fdpass.PeerPID(c) != pid {
		return hoMsg{}, fmt.Errorf("pid %d said hello as pid %d", pid, hello.PID)
	}
	if why := d.refusal(hello); why != "" {
		_ = fdpass.Send(c, hoMsg{Type: hoRefused, Version: handoverVersion, PID: os.Getpid(), Error: why})
		return hoMsg{}, fmt.Errorf("pid %d asked to take over: refused: %s", pid, why)
	}
	return hello, nil
}

// offerFiles are what the offer carries: every listener and, to a
// successor that shares them, the pages of counts, with its slots. From
// then on this process counts in its own slots of those pages.
func (d *daemon) offerFiles(shares bool) (names []string, files []*os.File, slots map[string]int, err error) {
	names, files, err = d.listenerFiles()
	if err != nil || !shares {
		return names, files, nil, err
	}
	cn, cf, slots, err := d.a.countsFiles()
	if err != nil {
		closeFiles(files)
		return nil, nil, nil, err
	}
	d.a.proxy.Share(true)
	return append(names, cn...), append(files, cf...), slots, nil
}

// refusal says why a successor that said hello may not take over ("": it
// may).
func (d *daemon) refusal(hello hoMsg) string {
	if hello.Type != hoHello || hello.Version != handoverVersion {
		return fmt.Sprintf("it speaks hand-over protocol %d, and the new agent asked for %q version %d: stop it first (its open tunnels are then cut), or start a build that speaks protocol %d", handoverVersion, hello.Type, hello.Version, handoverVersion)
	}
	if p := d.a.pred.Load(); p != nil {
		if p.ended() {
			// It may still write to its slots of the counts, which this
			// hand-over would clear and give to the new agent.
			return fmt.Sprintf("the agent it took over from (pid %d) ended that hand-over before it drained and has not exited yet; until it has, its open connections still count against the Trials' limits: try again once pid %d has exited (end it if it hangs)", p.pid, p.pid)
		}
		return fmt.Sprintf("it took over from pid %d itself, which still drains; one hand-over at a time: try again once that ends (at most its drain_timeout)", p.pid)
	}
	// A successor with other paths would adopt none of these Trials and
	// leave their listeners unserved.
	if mine := d.paths(); !maps.Equal(hello.Paths, mine) {
		return fmt.Sprintf("its paths are %v, the new agent's %v: an agent takes over only from one with the same paths (state, data, pins, namespaces, cgroup parent)", mine, hello.Paths)
	}
	return ""
}

// sendOffer sends the listeners and counts pages, at most fdpass.MaxFiles
// a message; the first message carries each Trial's log size and open
// tunnel count, and this process's slot in each counts page.
func sendOffer(c *net.UnixConn, names []string, files []*os.File, offsets, open map[string]int64, slots map[string]int) error {
	for i := 0; ; i += fdpass.MaxFiles {
		j := min(i+fdpass.MaxFiles, len(files))
		m := hoMsg{Type: hoOffer, Version: handoverVersion, PID: os.Getpid(), Names: names[i:j], More: j < len(files)}
		if i == 0 {
			m.Offsets, m.Open, m.Slots = offsets, open, slots
		}
		if err := fdpass.Send(c, m, files[i:j]...); err != nil {
			return err
		}
		if j == len(files) {
			return nil
		}
	}
}

// awaitServing waits for the successor's "serving". It says it is still
// adopting every few seconds; that may take long (each Trial's log is
// replayed), but not for ever.
func awaitServing(c *net.UnixConn) error {
	// The read deadline only: the forwarder sets write deadlines of its own.
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	for end := time.Now().Add(handoverServeTimeout); ; {
		step := time.Now().Add(handoverStepTimeout)
		if step.After(end) {
			step = end
		}
		_ = c.SetReadDeadline(step)
		var m hoMsg
		if _, err := fdpass.Recv(c, &m); err != nil {
			return err
		}
		switch m.Type {
		case hoServing:
			return nil
		case hoAdopting:
		default:
			return fmt.Errorf("it said %q", m.Type)
		}
	}
}

// endProcess waits a moment for the process of pidfd to end (a successor
// that failed closes its copies of the listeners, says why and exits),
// then kills it, and waits (bounded) for its end.
func endProcess(pidfd int) {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	if n, _ := unix.Poll(fds, 2000); n > 0 {
		return
	}
	_ = unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
	_, _ = unix.Poll(fds, 5000)
}

// successor is the agent this one handed over to, as the drain sees it.
type successor struct {
	c       *net.UnixConn
	pid     int
	fw      *forwarder
	stopFwd chan struct{} // closed: the last records are sent
	sent    chan struct{} // closed once the forwarder has returned
	gone    chan struct{} // closed (lost) if it ended before the drain did
	ended   chan struct{} // closed by the drain as it closes the connection
	goneMu  sync.Once
}

// lost says that the successor is gone, or unreachable, before the drain
// ended.
func (s *successor) lost() { s.goneMu.Do(func() { close(s.gone) }) }

// sendTimeout bounds each message to the successor: one that stops
// reading must not hold the drain past its timeout.
const sendTimeout = 10 * time.Second

func (s *successor) send(m hoMsg) error {
	_ = s.c.SetWriteDeadline(time.Now().Add(sendTimeout))
	return fdpass.Send(s.c, m)
}

// drain runs after a hand-over: stop accepting everywhere, serve what is
// open until it ends or the drain time passes, then cut what is left.
// Meanwhile the successor's allowlist changes and removals are applied
// here too, and the open counts are sent to it. It returns an error if
// the successor ended first.
func (d *daemon) drain(ctx context.Context) (err error) {
	a, s := d.a, d.successor
	a.stopWatching()
	servers := d.stopServing()
	defer func() { <-servers }()
	go d.follow(s)
	drainCtx, stopDrain := context.WithTimeout(ctx, d.drainTimeout())
	defer stopDrain()
	done := make(chan bool, 1)
	go func() { done <- a.proxy.Drained(drainCtx) }()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last map[string]int64
	sendOpen := func() {
		open := a.proxy.Open()
		if !sameCounts(open, last) {
			_ = s.send(hoMsg{Type: hoOpen, Open: open})
			last = open
		}
	}
	cut := func(why string) {
		n := a.proxy.CutAll(why)
		a.log.Warn("cutting what is still open", "tunnels", n, "why", why)
		wait, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		a.proxy.Drained(wait)
		cancel()
	}
	for drained := false; !drained; {
		select {
		case ok := <-done:
			if !ok {
				cut(fmt.Sprintf("the agent handed over to pid %d, and its drain_timeout (%s) passed with this still open", s.pid, d.drainTimeout()))
			}
			drained = true
		case <-s.gone:
			// Nothing follows this process's tunnels any more: their
			// counts, policy changes and removals would go nowhere. The
			// next agent takes the listeners from the keeper, alone.
			cut(fmt.Sprintf("the agent that took over from this one (pid %d) ended before this one had drained", s.pid))
			err = fmt.Errorf("the agent that took over (pid %d) ended before this one had drained: no agent serves; the listeners wait in the keeper for the next", s.pid)
			drained = true
		case <-tick.C:
			sendOpen()
		}
	}
	d.finishDrain(s)
	return err
}

// stopServing closes the hand-over listener, ends the watchers and shuts
// the control and metrics servers down, in the background: the channel
// closes once they are. The socket paths are the successor's now (its
// own sockets, renamed over these: neither unlinks on close). A call
// that reached this control socket just before is still answered: it
// closes a moment later; a call that changes Trials gets CodeHandedOver,
// and its client retries it there. Watchers' clients follow the Trial to
// the new agent.
func (d *daemon) stopServing() <-chan struct{} {
	_ = d.hln.Close()
	d.a.endWatchers()
	servers := make(chan struct{})
	go func() {
		defer close(servers)
		shutdown, cancel := context.WithTimeout(context.Background(), 6*time.Second)
		defer cancel()
		if d.msrv != nil { // its socket is the successor's too: only one serves it
			_ = d.msrv.Shutdown(shutdown)
		}
		time.Sleep(time.Second)
		_ = d.srv.Shutdown(shutdown)
	}()
	return servers
}

// finishDrain writes and sends each Trial's last records (summaries),
// then tells the successor this process is done.
func (d *daemon) finishDrain(s *successor) {
	a := d.a
	for _, id := range a.ids() {
		a.proxy.RemoveTrial(id)
	}
	a.mu.Lock()
	for _, lt := range a.trials {
		lt.log.end()
		lt.log.close()
	}
	a.mu.Unlock()
	close(s.stopFwd)
	<-s.sent
	_ = s.send(hoMsg{Type: hoOpen, Open: map[string]int64{}})
	_ = s.send(hoMsg{Type: hoDrained})
	close(s.ended)
	_ = s.c.Close()
	a.log.Info("drained; this agent exits", "successor", s.pid)
}

func sameCounts(x, y map[string]int64) bool {
	if len(x) != len(y) {
		return false
	}
	for k, v := range x {
		if w, ok := y[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// follow applies the successor's requests during the drain: allowlist
// changes (with their cuts) and removals of Trials, each answered.
func (d *daemon) follow(s *successor) {
	a := d.a
	for {
		var m hoMsg
		if _, err := fdpass.Recv(s.c, &m); err != nil {
			select {
			case <-s.ended: // the drain ended and closed the connection
			default:
				s.lost()
			}
			return
		}
		reply := hoMsg{Type: hoDone, Seq: m.Seq}
		switch m.Type {
		case hoAllow:
			list, err := parseEntries(m.Allow, nil)
			if err == nil {
				var cut []trialspec.AllowEntry
				for _, c := range m.Cut {
					cut = append(cut, trialspec.AllowEntry{Entry: c})
				}
				cutEntries, _ := parseEntries(cut, nil)
				reply.N, err = a.proxy.SetAllow(m.Trial, allow.New(list...), cutEntries)
			}
			if err != nil {
				reply.Error = err.Error()
			}
		case hoRemove:
			a.proxy.RemoveTrial(m.Trial)
			// Its last records reach the successor before the answer:
			// it closes the Trial's log and counters on it.
			if err := s.fw.flush(s.c, a.log.Warn); err != nil {
				reply.Error = err.Error()
			}
		default:
			continue
		}
		_ = s.send(reply)
	}
}

// predecessor is the agent this one took over from, while it drains.
type predecessor struct {
	c       *net.UnixConn
	pid     int
	pidfd   int // to see it gone before reading its ledgers or giving up its slots; -1: gone already
	offsets map[string]int64
	open    map[string]int64 // its open tunnels when it offered
	// counts are the counts pages it sent, by name, until countsFor takes
	// them; slots its slot in each. With them, each process counts what
	// the other has open from the offer on, and open goes unused.
	counts map[string]*os.File
	slots  map[string]int

	mu      sync.Mutex
	seq     uint64
	waiting map[uint64]chan hoMsg
	stopped chan struct{} // closed when it has stopped accepting
	done    chan struct{} // closed when it has drained, or died

	// Its messages are read from the offer on, so that its records never
	// wait on this process's start; followPredecessor takes them in order.
	qmu   sync.Mutex
	qcond *sync.Cond
	q     []hoMsg
	qerr  error
}

// read queues the predecessor's messages until the connection ends.
func (p *predecessor) read() {
	for {
		var m hoMsg
		_, err := fdpass.Recv(p.c, &m)
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

// next is the predecessor's next message, or why there is none.
func (p *predecessor) next() (hoMsg, error) {
	p.qmu.Lock()
	defer p.qmu.Unlock()
	for len(p.q) == 0 && p.qerr == nil {
		p.qcond.Wait()
	}
	if len(p.q) == 0 {
		return hoMsg{}, p.qerr
	}
	m := p.q[0]
	p.q = p.q[1:]
	return m, nil
}

// send writes a message to the predecessor, bounded like its own.
func (p *predecessor) send(m hoMsg) error {
	_ = p.c.SetWriteDeadline(time.Now().Add(sendTimeout))
	return fdpass.Send(p.c, m)
}

// close gives back the connection and pidfd of a predecessor that was
// never followed (a start that failed).
func (p *predecessor) close() {
	_ = p.c.Close()
	p.closeCounts()
	if p.pidfd >= 0 {
		_ = unix.Close(p.pidfd)
	}
}

// ended reports whether its connection has ended (followPredecessor).
func (p *predecessor) ended() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// shares reports whether it sent its counts pages (offerFiles).
func (p *predecessor) shares() bool {
	_, ok := p.slots[nameCounts]
	return ok
}

// takeCounts takes the counts page it sent under name (nil: none).
func (p *predecessor) takeCounts(name string) *os.File {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.counts[name]
	delete(p.counts, name)
	return f
}

// closeCounts closes the counts pages no Trial took.
func (p *predecessor) closeCounts() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for name, f := range p.counts {
		_ = f.Close()
		delete(p.counts, name)
	}
}

// errNoPredecessor: no agent answers on the hand-over socket.
var errNoPredecessor = errors.New("no agent to take over from")

// takeOver asks the agent at the hand-over socket path for everything it
// serves. It returns errNoPredecessor when none answers, and an error
// that says what to do when one answers and cannot hand over.
func takeOver(path string, paths map[string]string) (*predecessor, map[string]*os.File, error) {
	c, err := fdpass.Dial(path)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
		return nil, nil, errNoPredecessor
	}
	if err != nil {
		return nil, nil, fmt.Errorf("take over from the running agent: %w", err)
	}
	files := make(map[string]*os.File)
	p := &predecessor{c: c, pid: fdpass.PeerPID(c), pidfd: -1, waiting: make(map[uint64]chan hoMsg),
		stopped: make(chan struct{}), done: make(chan struct{}), counts: make(map[string]*os.File)}
	fail := func(err error) (*predecessor, map[string]*os.File, error) {
		_ = c.Close()
		for _, f := range files {
			_ = f.Close()
		}
		p.closeCounts()
		return nil, nil, err
	}
	_ = c.SetDeadline(time.Now().Add(handoverStepTimeout))
	if err := fdpass.Send(c, hoMsg{Type: hoHello, Version: handoverVersion, PID: os.Getpid(), Paths: paths, Shares: true}); err != nil {
		return fail(fmt.Errorf("take over from the running agent: %w", err))
	}
	for more := true; more; {
		var m hoMsg
		got, err := fdpass.Recv(c, &m)
		if err != nil {
			return fail(fmt.Errorf("take over from the running agent: %w (it keeps serving; look at its log)", err))
		}
		if m.Type == hoRefused {
			closeFiles(got)
			return fail(fmt.Errorf("the running agent (pid %d) does not hand over to this one: %s. It keeps serving", m.PID, m.Error))
		}
		if m.Type != hoOffer || len(got) != len(m.Names) {
			closeFiles(got)
			return fail(fmt.Errorf("take over from the running agent: a %q message with %d files for %d names", m.Type, len(got), len(m.Names)))
		}
		for i, n := range m.Names {
			if isCountsName(n) {
				p.counts[n] = got[i]
			} else {
				files[n] = got[i]
			}
		}
		if p.offsets == nil {
			p.offsets, p.open, p.slots = m.Offsets, m.Open, m.Slots
			if p.offsets == nil {
				p.offsets = map[string]int64{} // it serves no Trial
			}
		}
		more = m.More
	}
	_ = c.SetDeadline(time.Time{})
	// Its pidfd shows when it has exited: its ledgers and its slots of
	// the counts are its own until then. ESRCH: it has already.
	fd, _, err := fdpass.PeerPidfd(c)
	if err != nil && !errors.Is(err, unix.ESRCH) {
		return fail(fmt.Errorf("take over from the running agent (pid %d): %w (it keeps serving; try again)", p.pid, err))
	}
	p.pidfd = fd
	p.qcond = sync.NewCond(&p.qmu)
	go p.read()
	return p, files, nil
}

// adopting tells the predecessor, every few seconds until stop is
// closed, that this process is still adopting its Trials.
func (p *predecessor) adopting(stop <-chan struct{}) {
	t := time.NewTicker(handoverStepTimeout / 6)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			_ = p.send(hoMsg{Type: hoAdopting})
		}
	}
}

// serving tells the predecessor that this process serves every listener,
// follows its drain, and waits until it has stopped accepting: only then
// may this process take the socket paths and call itself ready. An error
// means the hand-over did not happen; the predecessor serves on (or, if it
// stopped, cuts what it serves and exits, and the listeners are the
// keeper's for the next agent).
func (a *Agent) serving(p *predecessor) error {
	// Its tunnels count here from the start: in the counts it shares, or,
	// from an agent of an earlier build, as it says at the offer, as it
	// stops accepting, and whenever they change.
	if !p.shares() {
		for id, n := range p.open {
			a.proxy.SetElsewhere(id, n)
		}
	}
	go a.followPredecessor(p)
	if err := p.send(hoMsg{Type: hoServing, PID: os.Getpid()}); err != nil {
		_ = p.c.Close()
		return fmt.Errorf("tell the running agent (pid %d) that this one serves: %w", p.pid, err)
	}
	select {
	case <-p.stopped:
		return nil
	case <-p.done:
		select {
		case <-p.stopped: // it stopped, then drained or died: the listeners are this one's
			return nil
		default:
		}
		return fmt.Errorf("the running agent (pid %d) ended the hand-over before it stopped accepting", p.pid)
	case <-time.After(handoverStepTimeout):
		_ = p.c.Close()
		return fmt.Errorf("the running agent (pid %d) did not stop accepting within %s", p.pid, handoverStepTimeout)
	}
}

// followPredecessor counts the predecessor's records and open tunnels
// until it has drained. If it ends the hand-over first, once it has
// stopped accepting, the tunnels its ledgers kept are recorded as cut.
func (a *Agent) followPredecessor(p *predecessor) {
	lost := a.readPredecessor(p)
	p.mu.Lock()
	for seq, ch := range p.waiting {
		close(ch)
		delete(p.waiting, seq)
	}
	close(p.done) // under mu: no ask registers after it
	p.mu.Unlock()
	_ = p.c.Close()
	if lost != nil {
		// Until it has exited (a zombie has), it may still write to its
		// slots of the counts, which a new hand-over would clear and
		// give to the next agent (refusal waits for this), and to its
		// ledgers.
		a.log.Error("the agent this one took over from ended the hand-over before it drained; its open tunnels are cut, and recorded once it has exited", "pid", p.pid, "error", lost)
		awaitExit(p.pidfd)
		for _, id := range a.ids() {
			a.recordLost(id)
		}
	}
	if p.pidfd >= 0 {
		_ = unix.Close(p.pidfd)
	}
	// What it had open is not any more, or is not counted by it.
	a.proxy.Unshare()
	for _, id := range a.ids() {
		a.proxy.SetElsewhere(id, 0)
	}
	a.pred.CompareAndSwap(p, nil)
}

// readPredecessor follows the predecessor's messages until it has
// drained or its connection ends. If the connection ended after the
// predecessor stopped accepting and before it drained (the hand-over
// happened, and the predecessor did not finish it), it returns why.
func (a *Agent) readPredecessor(p *predecessor) (lost error) {
	for {
		m, err := p.next()
		if err != nil {
			select {
			case <-p.stopped:
				return err
			default:
				return nil // the hand-over did not happen: serving says so
			}
		}
		switch m.Type {
		case hoRecords:
			a.counted(m.Trial, m.Lines)
		case hoStopped:
			select {
			case <-p.stopped:
				// Said twice: a protocol error, not a second close.
				return fmt.Errorf("the agent this one took over from (pid %d) said twice that it stopped accepting", p.pid)
			default:
			}
			a.setElsewhere(p, m.Open)
			close(p.stopped)
		case hoOpen:
			a.setElsewhere(p, m.Open)
		case hoDone:
			p.mu.Lock()
			ch := p.waiting[m.Seq]
			delete(p.waiting, m.Seq)
			p.mu.Unlock()
			if ch != nil {
				ch <- m
			}
		case hoDrained:
			// It has removed every Trial, each once its handlers ended:
			// it writes to none of the counts any more.
			a.log.Info("the agent this one took over from has drained and exits", "pid", p.pid)
			return nil
		}
	}
}

// awaitExit waits until the process of pidfd has exited (-1: it had when
// its pidfd was asked for).
func awaitExit(pidfd int) {
	for pidfd >= 0 {
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}, -1)
		if n > 0 || (err != nil && err != unix.EINTR) {
			return
		}
	}
}

// setElsewhere counts the tunnels the predecessor says it has open, if
// it shares no counts (an agent of an earlier build).
func (a *Agent) setElsewhere(p *predecessor, open map[string]int64) {
	if p.shares() {
		return
	}
	for _, id := range a.ids() {
		a.proxy.SetElsewhere(id, open[id])
	}
}

// counted adds records the predecessor wrote to Trial id's counters, and
// shows them to its watchers.
func (a *Agent) counted(id string, lines []json.RawMessage) {
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

// ask sends a request to the predecessor and waits for its answer; a
// predecessor that has drained or died has nothing left to apply it to.
func (p *predecessor) ask(ctx context.Context, m hoMsg) (hoMsg, bool) {
	ch := make(chan hoMsg, 1)
	p.mu.Lock()
	select {
	case <-p.done:
		p.mu.Unlock()
		return hoMsg{}, false
	default:
	}
	p.seq++
	m.Seq = p.seq
	p.waiting[m.Seq] = ch
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.waiting, m.Seq)
		p.mu.Unlock()
	}()
	if err := p.send(m); err != nil {
		return hoMsg{}, false
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	select {
	case r, ok := <-ch:
		return r, ok && r.Error == ""
	case <-ctx.Done():
		return hoMsg{}, false
	}
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
