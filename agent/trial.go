//go:build linux

package agent

import (
	"cmp"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/dnsstub"
	"github.com/trialnet/trialnet/internal/counts"
	"github.com/trialnet/trialnet/internal/lname"
	"github.com/trialnet/trialnet/ledger"
	"github.com/trialnet/trialnet/proxy"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/sandbox"
	trialspec "github.com/trialnet/trialnet/trial"
)

// trial is one Trial as the agent owns it: its description, its sandbox
// Trial, its place in the proxy (it is the sandbox's Endpoint for it),
// its decision log and the watch on its owner. release is the one way
// all of that is given back: after a destroy, a create or an adoption
// that failed, and when the agent closes.
type trial struct {
	a *Agent
	// info is its description. Once it is live only its Allow and
	// Denied change (ChangeAllow, a reload --reprofile), under
	// Agent.mu, where they are read (Agent.info); the rest is read
	// without it.
	info  client.TrialInfo
	tr    *sandbox.Trial
	state trialState // guarded by Agent.mu
	// policy orders changes of the allowlist (ChangeAllow): each reads
	// the list the one before it left.
	policy sync.Mutex
	log    decisionLog
	mu     sync.Mutex // guards final
	final  record.TrialStats
	// ledger keeps its open tunnels where a successor finds them if this
	// process dies; nil without a state directory.
	ledger *ledger.Ledger
	// lns are the endpoint's listeners this process serves, which a
	// hand-over passes on; guarded by mu.
	lns []net.Listener
	// tp is its transparent mode (nil: off); guarded by mu. finalDNS are
	// its stub's counts when it stopped.
	tp       *transparent
	finalDNS *dnsstub.Stats
	// counts keep the counts behind the Trial's limits, this process's in
	// slot slot, where an agent handing over to this one, or taking over
	// from it, counts its own; a hand-over passes them on.
	counts *counts.Region
	slot   int
	// dataMade is one more than the Agent's dataSync ticket taken once
	// the Trial's data directory was in place (0: none taken): a sync of
	// DataDir begun after that ticket has made its name there durable.
	dataMade uint64
	// owner is a pidfd of an owned Trial's owner, which the agent watches
	// (watchOwner); guarded by Agent.mu, closed by dropOwner.
	owner *os.File
	// ownerGone: its owner had exited when this agent, taking over,
	// adopted it; watchOwner destroys it once the predecessor stopped.
	ownerGone bool
	// gw are its credential gateway routes with their secrets, and
	// gwRoots the trust store their upstreams are verified against.
	gw      []proxy.GatewayRoute
	gwRoots *x509.CertPool
	// containers counts the containers that joined it (AddContainer)
	// when there is no data directory to keep them; guarded by mu.
	containers int
	// opened are the transparent sockets opened before build starts its
	// transparent mode on them: its prepared shell's, or those its create
	// opened as its namespace was made (ListenInside); empty otherwise.
	opened transparentSockets
	// joined are pidfds of the inits of containers that joined it, which
	// the agent watches to move each to the ended ones (watchContainer);
	// guarded by mu, closed by dropJoined.
	joined []*os.File
}

// trialState: only live Trials are listed and served to API calls; the
// others hold their id. A Trial's decisions are logged in every state.
type trialState uint8

const (
	stateCreating   trialState = iota // being made, or re-adopted
	stateLive                         // ready
	stateDestroying                   // being torn down
)

// setTrial records what the sandbox made of the Trial.
func (lt *trial) setTrial(tr *sandbox.Trial) {
	lt.tr = tr
	lt.info.Netns, lt.info.Cgroup, lt.info.CgroupID = tr.Netns.Path, tr.Cgroup, tr.CgroupID
}

// ListenInside opens the Trial's transparent sockets on the thread that
// makes its network namespace, inside it, in the same trip as its proxy
// endpoint's listeners (sandbox.NetnsEndpoint): build starts its
// transparent mode on them.
func (lt *trial) ListenInside() error {
	if !lt.info.Transparent {
		return nil
	}
	s, err := listenTransparentHere()
	if err != nil {
		return fmt.Errorf("transparent mode: %w", err)
	}
	lt.opened = s
	return nil
}

// Serve serves the Trial's proxy endpoint: its listeners live in its
// namespace, the agent accepts on them (sandbox.Endpoint).
func (lt *trial) Serve(lns []net.Listener) error {
	lt.mu.Lock()
	lt.lns = lns
	lt.mu.Unlock()
	// The id, read here: a reload rewrites lt.info (writeInfo, under
	// a.mu) while these goroutines run.
	id := lt.info.ID
	lt.a.keep(id, lt.info.Created, lns)
	for _, ln := range lns {
		go func() {
			if err := lt.a.proxy.Serve(ln, id); err != nil {
				lt.a.log.Error("proxy serve", "trial", id, "error", err)
			}
		}()
	}
	return nil
}

// Stop removes the Trial from the proxy, closing its listeners and
// connections and waiting for its last decisions, and keeps its final
// proxy counters (sandbox.Endpoint; the teardown's first step).
func (lt *trial) Stop() { lt.stop(true) }

// stop is Stop; ending says the Trial ends, rather than being left to
// the next agent, whose stub answers the questions still queued.
func (lt *trial) stop(ending bool) {
	lt.mu.Lock()
	tp := lt.tp
	lt.mu.Unlock()
	if l, ok := lt.a.proxy.Allow(lt.info.ID); ok && tp != nil {
		tp.lastAllow.Store(l)
	}
	if st, ok := lt.a.proxy.RemoveTrial(lt.info.ID); ok {
		lt.mu.Lock()
		lt.final = st
		lt.mu.Unlock()
	}
	if tp == nil {
		return
	}
	// The stub stops before its counts are read, and at the Trial's end
	// what it sent the stub that the stub had not read yet is counted:
	// no question the Trial asked is missing from the receipt.
	st := tp.finish(ending)
	lt.mu.Lock()
	lt.tp = nil
	if st != nil {
		lt.finalDNS = st
	}
	lt.mu.Unlock()
	tp.close()
}

// dnsStats are the counts of the Trial's stub: live, or as it stopped
// (nil: none, or paused for a hand-over).
func (lt *trial) dnsStats() *client.DNSStats {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	if lt.tp != nil && lt.tp.stub != nil {
		st := client.DNSStats(lt.tp.stub.Stats())
		return &st
	}
	if lt.finalDNS == nil {
		return nil
	}
	st := client.DNSStats(*lt.finalDNS)
	return &st
}

// release gives back everything the agent holds of the Trial: its place
// in the proxy, its decision log, the watch on its owner and its id. The
// sandbox Trial itself is the caller's: torn down (Close) before, or
// left enforced for the next agent.
func (lt *trial) release() {
	lt.dropJoined()
	lt.stop(false) // when it was Stopped as it ended, there is nothing left to stop
	if lt.counts != nil {
		_ = lt.counts.Close() // the proxy no longer counts in it
	}
	if lt.ledger != nil {
		lt.ledger.Remove()
	}
	lt.log.end()
	lt.log.close()
	lt.a.dropOwner(lt)
	lt.a.unregister(lt.info.ID, lt)
}

// create makes a Trial for the caller at the other end of conn (nil: a
// caller in this process).
func (a *Agent) create(req trialspec.Request, conn *net.UnixConn) (_ client.TrialInfo, err error) {
	leave, err := a.enter()
	if err != nil {
		return client.TrialInfo{}, err
	}
	defer leave()
	lt, list, err := a.newTrial(req, conn)
	if err != nil {
		return client.TrialInfo{}, err
	}
	if err := a.build(lt, list, a.makeTrial(lt)); err != nil {
		return client.TrialInfo{}, err
	}
	if a.cfg.ReceiptKey != "" {
		warmSigner()
	}
	a.setState(lt, stateLive)
	a.watchOwner(lt)
	info := a.info(lt) // live: an allow/deny may change it now
	a.log.Info("trial created", "trial", info.ID, "allow", len(info.Allow), "strict", req.Strict, "learning", info.Learning, "owner_pid", ownerPID(info.Owner))
	return info, nil
}

// build makes the sandbox Trial of lt, a Trial newTrial took the id of,
// with makeIt (the host's Create, or an Adopt), and readies everything the
// agent serves of it; on error, all of it is given back (release).
func (a *Agent) build(lt *trial, list *allow.List, makeIt func(trialspec.Spec, sandbox.Endpoint) (*sandbox.Trial, error)) (err error) {
	defer func() {
		if err != nil {
			lt.release()
		}
	}()
	if err := a.keepOldData(lt.info.ID); err != nil {
		return errf(client.CodeInternal, "%v", err)
	}
	a.removeLedgers(lt.info.ID) // an earlier Trial's of this id, whose tunnels are not this one's
	files := a.shells.takeFiles()
	loaded := files.takeSteer()
	defer func() {
		if loaded != nil {
			_ = loaded.Close()
		}
	}()
	if err := a.prepare(lt, list, nil, files); err != nil {
		return errf(client.CodeInternal, "%v", err)
	}
	info := lt.info
	tr, err := makeIt(info.Spec, lt)
	if err != nil {
		// Opened before a later step of the make failed.
		lt.opened.close()
		lt.opened = transparentSockets{}
	}
	switch {
	case errors.Is(err, sandbox.ErrExists):
		return errf(client.CodeDuplicateID, "%v", err)
	case errors.Is(err, sandbox.ErrNestingUnavailable), errors.Is(err, sandbox.ErrNotAdoptable):
		return errf(client.CodeBadRequest, "%v", err)
	case err != nil:
		return errf(client.CodeInternal, "%v", err)
	}
	lt.setTrial(tr)
	inh := lt.opened
	lt.opened = transparentSockets{}
	inh.loaded, loaded = loaded, nil
	if err := a.startTransparent(lt, inh); err != nil {
		_, _ = tr.Close()
		a.dropTransparent(info.ID, tr.CgroupID)
		return errf(client.CodeInternal, "%v", err)
	}
	return nil
}

// newTrial checks a create request into a Trial's description and takes
// its id: the owner, the id, the allowlist and the limits it keeps.
func (a *Agent) newTrial(req trialspec.Request, conn *net.UnixConn) (_ *trial, _ *allow.List, err error) {
	lt := &trial{a: a}
	defer func() {
		if err != nil {
			a.dropOwner(lt)
		}
	}()
	var owner *trialspec.Owner
	switch {
	case a.cfg.Ephemeral, req.Owned && conn == nil:
		// This process's own: it ends with this process, which the next
		// agent sees in the record (an in-process caller is this process).
		owner = self()
	case req.Owned:
		if owner, lt.owner, err = callerOwner(conn); err != nil {
			return nil, nil, err
		}
	}
	if req.ID == "" {
		req.ID = NewID()
	}
	if err := sandbox.ValidID(req.ID); err != nil {
		return nil, nil, errf(client.CodeBadID, "%v", err)
	}
	if req.Nonce != "" {
		if err := ValidNonce(req.Nonce); err != nil {
			return nil, nil, errf(client.CodeBadRequest, "%v", err)
		}
	}
	if req.Report != "" && (!filepath.IsAbs(req.Report) || strings.ContainsFunc(req.Report, unicode.IsControl)) {
		return nil, nil, errf(client.CodeBadRequest, "invalid report path %q: give an absolute path without control characters", req.Report)
	}
	spec, list, err := a.file.Load().Spec(req, a.proxy.Guard().Allowed())
	switch {
	case errors.Is(err, config.ErrUnknownProfile):
		return nil, nil, errf(client.CodeUnknownProfile, "%v", err)
	case err != nil:
		return nil, nil, errf(client.CodeBadAllowlist, "%v", err)
	}
	if err := sandbox.CheckMaxProcs(spec.Limits.MaxProcesses); err != nil {
		return nil, nil, errf(client.CodeBadRequest, "max_processes: %v", err)
	}
	spec.Owner = owner
	lt.info = trialInfo(spec)
	// The secrets are read now, so that a create refuses an unreadable
	// or unsafe one with its reason.
	if lt.gw, lt.gwRoots, err = gatewayRoutes(spec.Gateway); err != nil {
		return nil, nil, errf(client.CodeBadConfig, "%v", err)
	}
	if err := a.register(req.ID, lt); err != nil {
		return nil, nil, err
	}
	return lt, list, nil
}

// keepOldData moves aside what a destroyed Trial with the same id left
// in the data directory, so that a new Trial's log starts empty and the
// old one stays on disk.
func (a *Agent) keepOldData(id string) error {
	if a.cfg.DataDir == "" {
		return nil
	}
	dir := filepath.Join(a.cfg.DataDir, id)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return os.Rename(dir, fmt.Sprintf("%s.%d", dir, time.Now().UnixNano()))
}

// prepare readies what serving a Trial needs before its endpoint
// listens: the decision log (its processes may connect at once, a
// re-adopted Trial's at the very moment it is served) and the proxy's
// policy for it. What it made, release gives back. A new Trial's
// decision log and ledger are the prepared files' (nil: none), where
// they can be taken (takeData, takeLedger); what is not taken of them is
// removed.
func (a *Agent) prepare(lt *trial, list *allow.List, stats *record.TrialStats, files *trialFiles) error {
	defer files.close()
	var written int64
	if a.cfg.DataDir != "" {
		var err error
		if f := files.takeData(a, lt.info.ID); f != nil {
			written, err = lt.log.openFile(f)
		} else if err = os.MkdirAll(filepath.Join(a.cfg.DataDir, lt.info.ID), 0o700); err == nil {
			written, err = lt.log.open(a.decisionLog(lt.info.ID))
		}
		if err != nil {
			return err
		}
		lt.dataMade = a.dataSync.ticket() + 1
	}
	var err error
	if lt.counts, lt.slot, err = a.countsFor(lname.CountsName(lt.info.ID)); err != nil {
		return err
	}
	if lt.gw == nil && len(lt.info.Gateway) > 0 { // re-adopted: the secrets are read again
		if lt.gw, lt.gwRoots, err = gatewayRoutes(lt.info.Gateway); err != nil {
			return err
		}
	}
	tp := proxy.TrialPolicy{Spec: lt.info.Spec, Allow: list, Stats: stats, LogWritten: written, Counts: lt.counts, Slot: lt.slot,
		Gateway: lt.gw, GatewayRoots: lt.gwRoots}
	// An ephemeral agent's Trials end with it, and the run that finds
	// one left by a run killed outright removes its ledgers unread (Sweep):
	// a ledger there would be made, written and removed for no reader.
	if dir := a.cfg.Host.StateDir; dir != "" && !a.cfg.Ephemeral {
		lim := a.proxy.DefaultLimits()
		if l := lt.info.Limits; l != nil {
			lim = l.ProxyLimits.WithDefaults()
		}
		if lt.ledger = files.takeLedger(a, lt.info.ID, lim.MaxTunnels); lt.ledger == nil {
			if lt.ledger, err = ledger.Create(dir, lt.info.ID, lim.MaxTunnels); err != nil {
				return fmt.Errorf("tunnel ledger: %w", err)
			}
		}
		tp.Ledger = lt.ledger
	}
	return a.proxy.AddTrial(tp)
}

// recordLost records, as cut, the tunnels of Trial id that a process
// which died left open (its ledgers).
func (a *Agent) recordLost(id string) { a.recordEvents(id, a.takeLost(id)) }

// takeLost reads and removes the ledgers of Trial id that processes
// which died left, and returns the tunnels in them as records of cuts,
// and the summaries they kept pending.
func (a *Agent) takeLost(id string) []record.Event {
	if a.cfg.Host.StateDir == "" {
		return nil
	}
	evs, err := ledger.Lost(a.cfg.Host.StateDir, id)
	if err != nil {
		a.log.Warn("a tunnel ledger is unreadable: the tunnels it kept are not recorded", "trial", id, "error", err)
	}
	return evs
}

// removeLedgers removes every ledger of Trial id: what it kept is no
// Trial's any more.
func (a *Agent) removeLedgers(id string) {
	if a.cfg.Host.StateDir == "" {
		return
	}
	ledger.RemoveAll(a.cfg.Host.StateDir, id)
}

// sweepLedgers removes the tunnel ledgers, the stub's names and its
// counts of Trials this agent did not adopt, as an agent killed in a
// create (before the Trial's record) or in a destroy (after its record
// was removed) leaves them: no record names them, and what they kept is
// no Trial's; a later Trial given the same id would start from another's
// names and counts. A live process's ledger is left (ledger.Lost), and
// the stub's files of a Trial still there (trialThere); prepared ones
// are sweepFiles'.
func (a *Agent) sweepLedgers() {
	dir := a.cfg.Host.StateDir
	if dir == "" {
		return
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		id, kind := leftoverOf(e)
		if kind == "" || strings.HasPrefix(id, sandbox.ShellPrefix) {
			continue
		}
		a.mu.Lock()
		_, adopted := a.trials[id]
		a.mu.Unlock()
		if adopted || kind != "tunnel ledgers" && a.trialThere(id) {
			continue
		}
		a.log.Warn("removing the "+kind+" of a Trial that has no record (an agent stopped in its create or destroy)", "trial", id)
		var err error
		if kind == "tunnel ledgers" {
			_, err = ledger.Lost(dir, id)
		} else if err = os.Remove(filepath.Join(dir, e.Name())); errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		if err != nil {
			a.log.Error("remove a leftover "+kind, "trial", id, "error", err)
		}
	}
}

// trialThere reports whether Trial id has a record or a namespace file:
// another process's (an ephemeral run beside this one), or one in its
// create, whose stub's files are in use.
func (a *Agent) trialThere(id string) bool {
	for _, p := range []string{filepath.Join(a.cfg.Host.StateDir, id+".json"), filepath.Join(a.cfg.Host.withDefaults().NetnsDir, id)} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			return true
		}
	}
	return false
}

// leftoverOf names what state directory entry e keeps for a Trial, and
// that Trial's id; kind is "" for anything else.
func leftoverOf(e os.DirEntry) (id, kind string) {
	if id, ok := strings.CutSuffix(e.Name(), ledgersSuffix); ok && e.IsDir() {
		return id, "tunnel ledgers"
	}
	if !e.Type().IsRegular() {
		return "", ""
	}
	if id, ok := strings.CutSuffix(e.Name(), namesSuffix); ok {
		return id, "DNS stub's names"
	}
	if id, ok := strings.CutSuffix(e.Name(), dnsCountsSuffix); ok {
		return id, "DNS stub's counts"
	}
	return "", ""
}

// ledgersSuffix ends the name of a Trial's ledgers' directory in the
// state directory.
const ledgersSuffix = ".ledgers"

// recordEvents records evs, made by no decision of this process, in
// Trial id's log and counters.
func (a *Agent) recordEvents(id string, evs []record.Event) {
	var tunnels, summaries int
	for i := range evs {
		if evs[i].Decision == record.DecisionSuppressed {
			summaries++
		} else {
			tunnels++
		}
		if err := a.proxy.Record(id, &evs[i]); err != nil {
			a.log.Error("record what an agent that died left", "trial", id, "error", err)
		}
	}
	if tunnels > 0 {
		a.log.Warn("tunnels lost with an agent that died are recorded as cut", "trial", id, "tunnels", tunnels)
	}
	if summaries > 0 {
		a.log.Warn("the summaries an agent that died had not written are written from its ledgers", "trial", id, "summaries", summaries)
	}
}

// readopt takes over the Trials a previous agent left: live ones get
// their proxy endpoint back (enforcement never lapsed: it is pinned);
// half-made or broken ones are removed. Taking over from an agent that
// runs, nothing is removed (it serves those Trials, and decides), and a
// Trial it serves that cannot be adopted fails the start: the hand-over
// does not happen.
func (a *Agent) readopt() error {
	for _, r := range a.smallestLogsFirst(a.host.Recorded()) {
		_, served := a.inherited[r.ID]
		var lt *trial
		var err error
		if !a.takingOver() && sandbox.Closing(r.Record.CgroupID) {
			// Its processes were killed: the destroy is finished here,
			// as it would have been (taking over, the running agent's).
			err = errors.New("its destroy was under way when the previous agent stopped")
		} else {
			lt, err = a.adopt(r)
		}
		switch {
		case err != nil && a.takingOver() && served:
			return fmt.Errorf("the running agent serves Trial %s, and this one cannot adopt it (%w); the running agent keeps serving", r.ID, err)
		case err != nil && a.takingOver():
			a.log.Warn("trial not adopted; the running agent, which does not serve it either, decides", "trial", r.ID, "reason", err)
			continue
		case err != nil:
			a.log.Warn("trial not re-adopted; removing what is left of it", "trial", r.ID, "reason", err)
			a.removeLedgers(r.ID)
			a.unkeep(r.ID)
			a.dropTransparent(r.ID, r.Record.CgroupID)
			if rerr := a.host.Remove(r.ID); rerr != nil {
				a.log.Error("remove leftover trial", "trial", r.ID, "error", rerr)
			}
			continue
		}
		a.setState(lt, stateLive)
		if !a.takingOver() {
			a.watchOwner(lt) // taking over: once the predecessor stopped (watchOwners)
		}
		a.log.Info("trial re-adopted", "trial", r.ID, "owner_pid", ownerPID(lt.info.Owner))
	}
	return nil
}

// smallestLogsFirst orders recorded Trials by the size of their decision
// logs, smallest first. Trials are adopted one after another, each
// replaying its log first, and a Trial's CONNECTs wait until it is
// adopted: a Trial that filled its log (64 MiB, 1.8 s to replay here)
// held back every Trial adopted after it, in the order of their ids.
func (a *Agent) smallestLogsFirst(recs []sandbox.Recorded) []sandbox.Recorded {
	if a.cfg.DataDir == "" {
		return recs
	}
	size := make(map[string]int64, len(recs))
	for _, r := range recs {
		if st, err := os.Stat(a.decisionLog(r.ID)); err == nil {
			size[r.ID] = st.Size()
		}
	}
	slices.SortStableFunc(recs, func(x, y sandbox.Recorded) int { return cmp.Compare(size[x.ID], size[y.ID]) })
	return recs
}

// watchOwners watches the owners of every live Trial: after a hand-over,
// once the predecessor no longer does.
func (a *Agent) watchOwners() {
	a.mu.Lock()
	var lts []*trial
	for _, lt := range a.trials {
		if lt.state == stateLive {
			lts = append(lts, lt)
		}
	}
	a.mu.Unlock()
	for _, lt := range lts {
		a.watchOwner(lt)
	}
}

// adopt readies a recorded Trial for serving, then opens it: its
// description, allowlist, decision log and proxy counters (rebuilt from
// the log) come back, and its endpoint is served again.
func (a *Agent) adopt(r sandbox.Recorded) (_ *trial, err error) {
	if r.Err != nil {
		return nil, r.Err
	}
	info := trialInfo(r.Record.Trial)
	entries, err := parseEntries(info.Allow, nil)
	if err != nil {
		return nil, err
	}
	lt := &trial{a: a, info: info}
	if info.Owner != nil {
		// The owner may have exited while no agent watched it.
		lt.owner, err = openOwner(*info.Owner)
		_, served := a.inherited[r.ID]
		switch {
		case errors.Is(err, errOwnerExited) && a.takingOver() && served:
			// It exited during the hand-over, and the running agent
			// holds the destroy that began: refusing the Trial would
			// fail the whole hand-over (an owner may exit at any time),
			// so it is served here and destroyed once this agent has
			// taken over.
			lt.ownerGone = true
		case errors.Is(err, errOwnerExited):
			return nil, fmt.Errorf("owner pid %d exited", info.Owner.PID)
		case err != nil:
			return nil, fmt.Errorf("its owner, pid %d, cannot be watched: %w", info.Owner.PID, err)
		}
	}
	if err := a.register(r.ID, lt); err != nil {
		a.dropOwner(lt)
		return nil, err
	}
	defer func() {
		if err != nil {
			lt.release()
		}
	}()
	// What dead processes' ledgers kept is read before this process's
	// own ledger is made: a pid of the dead can be this process's.
	lost := a.takeLost(r.ID)
	if err := a.prepare(lt, allow.New(entries...), a.replayStats(lt), nil); err != nil {
		return nil, err
	}
	a.recordEvents(r.ID, lost)
	inh := a.inheritedFor(r.ID)
	tr, err := a.host.Open(r.Record, lt, inh.lns)
	if err != nil {
		inh.tp.close()
		return nil, err
	}
	lt.setTrial(tr)
	if err := a.startTransparent(lt, inh.tp); err != nil {
		return nil, err
	}
	return lt, nil
}

// A create without a shell opens the Trial's transparent sockets in the
// trip into its namespace that makes it.
var _ sandbox.NetnsEndpoint = (*trial)(nil)
