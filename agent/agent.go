//go:build linux

package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/handover"
	"github.com/trialnet/trialnet/internal/counts"
	"github.com/trialnet/trialnet/internal/lname"
	"github.com/trialnet/trialnet/internal/rootdir"
	"github.com/trialnet/trialnet/keeper"
	"github.com/trialnet/trialnet/ledger"
	"github.com/trialnet/trialnet/proxy"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/resolve"
	"github.com/trialnet/trialnet/sandbox"
	trialspec "github.com/trialnet/trialnet/trial"
)

// newProxy makes the agent's proxy from its config file, counting in its
// slot of the agent-wide counts page (one of its own, or the
// predecessor's, shared).
func (a *Agent) newProxy() error {
	set, err := a.proxySettings(a.cfg.File)
	if err != nil {
		return err
	}
	pcfg := proxy.Config{ProxySettings: set, Logger: a.log, LogDecisions: true, OnEvent: a.onEvent}
	if a.counts, a.countsSlot, err = a.countsFor(lname.CountsName("")); err != nil {
		return err
	}
	pcfg.Counts, pcfg.Slot = a.counts, a.countsSlot
	if a.proxy, err = proxy.New(pcfg); err != nil {
		_ = a.counts.Close()
		return err
	}
	return nil
}

// Default places of the daemon's state.
const (
	DefaultStateDir = "/run/trialnet/trials"     // live Trials, for re-adoption after a restart
	DefaultDataDir  = "/var/lib/trialnet/trials" // final stats and decision logs, kept after destroy
)

// AgentConfig configures an Agent. Zero values are defaults, except that
// an empty Host.StateDir means an embedded agent that persists nothing.
type AgentConfig struct {
	Host    Config
	DataDir string
	// ReceiptKey is the host's receipt signing key (made the first time);
	// Start makes "" DefaultReceiptKey. Each destroyed Trial's receipt is
	// signed with it.
	ReceiptKey string
	// Ephemeral: the agent's Trials are its own and end with it (trialnet
	// run without a daemon). With a Host.StateDir, each Trial's record
	// names its owner process, and an ephemeral agent starting removes the
	// Trials whose owner died without tearing them down, instead of
	// re-adopting anything.
	Ephemeral bool
	// SteerAhead: an Ephemeral agent about to make a transparent Trial
	// (trialnet run without --no-transparent) loads its steering while it
	// starts.
	SteerAhead bool
	// NoReceipt: the Trials' receipts are not signed, and ReceiptKey is
	// not used. For an ephemeral agent whose caller writes no report
	// (trialnet run without one): with no DataDir, the report is the one
	// place a receipt goes, and signing it cost the process ed25519's
	// tables (docs/performance.md, "Trial start").
	NoReceipt bool
	// File holds profiles, resolvers, allowed CIDRs and limits; nil: none.
	File *config.File
	// Resolvers override File's; AllowCIDRs add to File's.
	Resolvers  []string
	AllowCIDRs []netip.Prefix
	Logger     *slog.Logger
	// Resolver, if set, replaces the DNS resolver (tests point it at an
	// in-process server through Resolvers instead; this is for embedding).
	Resolver resolve.Resolver
	// ConfigPath is the file File was read from, which Reload reads
	// again; empty: Reload refuses.
	ConfigPath string
	// TrustConfig, if set, judges ConfigPath before each reload and
	// returns the path to read (the CLI's rootsConfig): a link on the way
	// may lead elsewhere since the start, and only root's word is read.
	TrustConfig func(path string) (string, error)
	// PendingFor bounds how long a prepared container's pending entry
	// waits for its hook (PrepareContainer); 0: DefaultPendingFor.
	PendingFor time.Duration
	// RetentionEvery is how often the retention rule is applied besides
	// at start and after each destroy; 0: one hour (defaultRetentionEvery).
	RetentionEvery time.Duration
}

// Agent owns the eBPF layer, the proxy and the registry of Trials, and
// serves the control API (Handler) that package client calls.
type Agent struct {
	cfg   AgentConfig
	host  *Host
	proxy *proxy.Proxy
	// counts hold the proxy's connections for its connection cap, this
	// process's in slot countsSlot, where an agent handing over to this
	// one, or taking over from it, counts its own (proxy.Share).
	counts     *counts.Region
	countsSlot int
	log        *slog.Logger
	file       atomic.Pointer[config.File] // the configuration in force; Reload swaps it
	obs        *observers
	ret        retainer
	dataSync   dirSync // of DataDir, for the receipts' directories

	mu     sync.Mutex
	trials map[string]*trial // every id in use, in any state
	closed atomic.Bool

	// hmu orders calls that change Trials (enter) against a hand-over,
	// which holds it while it offers everything to a successor.
	hmu        sync.RWMutex
	handedOver bool // under hmu: a successor serves; calls are refused
	stopping   bool // under hmu: the daemon stops; no hand-over starts
	// pred is the agent this one took over from, while it drains.
	pred atomic.Pointer[handover.Predecessor]
	// offsets are each Trial's log size when the predecessor began
	// sending its records, and inherited the listeners it (or the keeper)
	// passed on, until each Trial is adopted. Both are set before Start
	// adopts anything and read-only after.
	offsets   map[string]int64
	inherited map[string]*inherited
	keeper    *keeper.Client // nil: none

	reloadMu sync.Mutex // one Reload at a time
	gcSoon   quietTimer
	adopts   atomic.Bool    // a container came for a Trial: Trials' files made ahead hold a steer program
	owners   sync.WaitGroup // the goroutines watching owned Trials' owners
	pend     pendings       // prepared containers' cgroups, not yet adopted
	shells   *shells        // Trial shells kept ready for creates; set by start
	ahead    *steerAhead    // an embedded agent's steering loaded at its start; nil: none
	calls    atomic.Int32   // calls enter admitted, running
}

// An Agent serves the Trial API in process, as a client.Client does over
// the control socket.
var _ client.Trials = (*Agent)(nil)

// ProxyURL is what a Trial's processes get as HTTPS_PROXY.
var ProxyURL = "http://" + ProxyEndpoints[0].String()

// Start loads (or adopts) the eBPF layer, starts the proxy and re-adopts
// every Trial recorded in the state directory.
func Start(cfg AgentConfig) (*Agent, error) { return start(cfg, nil, nil, nil) }

// start is Start for a daemon that inherited Trials' listeners (by
// Trial id, in index order), from a predecessor (nil: none)
// whose logs it replays up to the offsets it gave, and that gives its
// listeners to a keeper.
func start(cfg AgentConfig, inherited map[string]*inherited, pred *handover.Predecessor, kc *keeper.Client) (*Agent, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.NoReceipt {
		cfg.ReceiptKey = "" // sign and warmSigner do nothing
	} else if cfg.ReceiptKey == "" {
		cfg.ReceiptKey = DefaultReceiptKey
	}
	a := &Agent{cfg: cfg, log: log, trials: make(map[string]*trial), obs: newObservers(),
		inherited: inherited, keeper: kc}
	if pred != nil {
		// Calls to its Trials go to the predecessor too from the start.
		a.offsets = pred.Offsets()
		a.pred.Store(pred)
	}
	// The proxy needs nothing of the host's: it starts (its settings, the
	// guard's dump of the host's addresses and routes, 2-4 ms) while the
	// host opens (the pins' adoption). Neither is used before both are
	// ready. It is the longer of the two: it starts first, before what
	// is needed only later takes a core.
	proxied := make(chan error, 1)
	go func() { proxied <- a.newProxy() }()
	// An embedded agent makes one Trial, at once: its steering loads
	// meanwhile, as a daemon's shells have theirs ahead.
	if cfg.Ephemeral && cfg.SteerAhead {
		a.ahead = loadSteerAhead()
	}
	warmEncoders()
	host, err := OpenHost(cfg.Host)
	if perr := <-proxied; err != nil || perr != nil {
		if perr == nil {
			a.closeProxy()
		} else if err == nil {
			_ = host.Close()
		}
		a.ahead.close()
		return nil, cmp.Or(err, perr)
	}
	a.host = host
	// Listeners of Trials that were not adopted close with their sockets,
	// their counts with them.
	defer func() {
		if pred != nil {
			pred.CloseCounts()
		}
		for name, inh := range a.inherited {
			inh.close()
			delete(a.inherited, name)
		}
	}()
	a.file.Store(cfg.File)
	if pred != nil && pred.Shares() {
		a.proxy.Share(false) // every Trial from the first adopted: the predecessor counts this one's already
	}
	for _, d := range []string{cfg.Host.StateDir, cfg.DataDir} {
		if d == "" {
			continue
		}
		if err := os.MkdirAll(d, 0o700); err != nil {
			a.Close(false)
			return nil, fmt.Errorf("agent: create %s: %w", d, err)
		}
	}
	host.Logger = log
	if d := cfg.Host.StateDir; d != "" {
		if err := ledger.MoveLegacy(d); err != nil {
			log.Warn("a tunnel ledger of an earlier agent could not be moved: the tunnels it kept may not be recorded as cut", "error", err)
		}
	}
	if cfg.Ephemeral {
		host.Sweep(ownerAlive, func(id string, cgroupID uint64) {
			a.dropTransparent(id, cgroupID)
			ledger.RemoveAll(cfg.Host.StateDir, id)
		})
	} else if err := a.readopt(); err != nil {
		a.Close(false)
		return nil, err
	} else {
		a.sweepPending()
		if !a.takingOver() { // else the running agent may be writing them
			a.host.SweepPartialRecords()
			a.sweepLedgers()
		}
	}
	if a.takingOver() {
		// A Trial the predecessor serves but this agent has no record of
		// would lose its endpoint: the hand-over does not happen.
		if len(a.inherited) > 0 {
			id := slices.Sorted(maps.Keys(a.inherited))[0]
			a.Close(false)
			return nil, fmt.Errorf("the running agent serves Trial %s, which has no record in %s: this agent cannot take it over; the running agent keeps serving", id, cfg.Host.StateDir)
		}
	}
	a.startShells()
	a.startRetention()
	return a, nil
}

// Close stops serving. With teardown it destroys every Trial; without,
// the Trials stay enforced (pinned eBPF, namespaces, cgroups) and a new
// agent re-adopts them (or removes those whose owner exited meanwhile);
// their proxy endpoint answers nothing meanwhile.
func (a *Agent) Close(teardown bool) {
	a.closed.Store(true)
	a.stopWatching()
	if a.shells != nil {
		a.shells.close()
	}
	if teardown {
		for _, info := range a.list() {
			if _, err := a.Destroy(context.Background(), info.ID); err != nil {
				a.log.Error("destroy on shutdown", "trial", info.ID, "error", err)
			}
		}
	}
	// The Trials left stay enforced (pinned) for the next agent; what
	// this one holds of them is given back.
	a.mu.Lock()
	lts := slices.Collect(maps.Values(a.trials))
	a.mu.Unlock()
	for _, lt := range lts {
		lt.release()
	}
	a.ahead.close()
	a.closeProxy()
	_ = a.host.Close()
}

// closeProxy stops the proxy, then its counts: it counts in them to the end.
func (a *Agent) closeProxy() {
	_ = a.proxy.Close()
	if a.counts != nil {
		_ = a.counts.Close()
	}
}

// stopWatching stops the retention rule and the watch on owners: an
// owner's exit after this is the next agent's to see.
func (a *Agent) stopWatching() {
	a.ret.stop()
	a.dropPendingAll("the agent stops or hands over")
	a.mu.Lock()
	lts := slices.Collect(maps.Values(a.trials))
	a.mu.Unlock()
	for _, lt := range lts {
		a.dropOwner(lt)
		lt.dropJoined()
	}
	a.owners.Wait()
}

// takingOver reports whether this agent is starting by a hand-over.
func (a *Agent) takingOver() bool { return a.offsets != nil }

// inherited are the sockets of one Trial an earlier process passed on:
// its endpoint's listeners, in index order, and its transparent sockets.
type inherited struct {
	lns []net.Listener
	tp  transparentSockets
}

func (i *inherited) close() {
	for _, l := range i.lns {
		_ = l.Close()
	}
	i.tp.close()
}

// inheritedFor takes the sockets inherited for Trial id (none: its
// endpoint listens anew, and its transparent sockets too).
func (a *Agent) inheritedFor(id string) inherited {
	inh := a.inherited[id]
	delete(a.inherited, id)
	if inh == nil {
		return inherited{}
	}
	return *inh
}

// Create makes a Trial: cgroup, namespaces, policy entry, and the proxy
// endpoint listening inside its namespace, served with the Trial's
// allowlist. It is all-or-nothing. An owned Trial is made through the
// control socket only (Handler), whose peer owns it.
func (a *Agent) Create(ctx context.Context, req trialspec.Request) (client.TrialInfo, error) {
	if err := ctx.Err(); err != nil {
		return client.TrialInfo{}, err
	}
	return a.create(req, callerConn(ctx))
}

// register takes id for lt, which starts in stateCreating.
func (a *Agent) register(id string, lt *trial) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.trials[id]; ok {
		return errf(client.CodeDuplicateID, "a Trial with id %q already exists; pick another id or destroy it first", id)
	}
	a.trials[id] = lt
	return nil
}

// unregister frees lt's id, unless lt was already forgotten and the id
// taken again.
func (a *Agent) unregister(id string, lt *trial) {
	a.mu.Lock()
	if a.trials[id] == lt {
		delete(a.trials, id)
	}
	a.mu.Unlock()
}

func (a *Agent) setState(lt *trial, s trialState) {
	a.mu.Lock()
	lt.state = s
	a.mu.Unlock()
}

func (a *Agent) onEvent(ev *record.Event, line []byte) {
	a.obs.observe(ev)
	a.record(ev, line)
}

// record appends a record, with its line if encoded already, to its
// Trial's decision log.
func (a *Agent) record(ev *record.Event, line []byte) {
	a.mu.Lock()
	lt := a.trials[ev.Trial]
	a.mu.Unlock()
	if lt == nil {
		return
	}
	if err := lt.log.add(ev, line); err != nil {
		a.log.Error("write decision log", "trial", ev.Trial, "error", err)
	}
}

// Watch calls fn with each decision of a live Trial as it is made, until
// ctx ends or the Trial is destroyed (after its last decision). A watcher
// that falls more than watchBacklog events behind loses the excess.
func (a *Agent) Watch(ctx context.Context, id string, fn func(record.Event)) error {
	lt, err := a.lookup(id)
	if err != nil {
		return err
	}
	return lt.log.watch(ctx, fn)
}

// releaseSoon runs two garbage collections a second after the last
// destroy: Go keeps the pipes its splice used in a pool that only a GC
// empties (through finalizers), so after a busy Trial ends an idle agent
// would otherwise hold thousands of pipe descriptors until the next GC.
// The second also gives the freed memory back to the system at once: the
// runtime's own scavenger does it at its pace, which on a loaded host
// left an agent idle after 100 busy Trials 17 MiB above its start 10 s
// later (test/load). Not while destroys keep coming: a forced collection
// marks the whole heap, which grows with the live Trials (~0.1 s of CPU
// for the pair at 1,000 here), and the runtime's own collections run
// meanwhile.
func (a *Agent) releaseSoon() {
	a.gcSoon.after(time.Second, func() {
		runtime.GC()
		debug.FreeOSMemory()
	})
}

// quietTimer runs a function once calls to after stop coming: d after
// the last one.
type quietTimer struct {
	mu sync.Mutex
	t  *time.Timer
}

// after runs fn d from now, instead of what an earlier call set to run,
// if that has not run yet.
func (q *quietTimer) after(d time.Duration, fn func()) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.t != nil {
		q.t.Stop()
	}
	q.t = time.AfterFunc(d, fn)
}

// Get returns a live Trial's description.
func (a *Agent) Get(_ context.Context, id string) (client.TrialInfo, error) {
	lt, err := a.lookup(id)
	if err != nil {
		return client.TrialInfo{}, err
	}
	return a.withDirs(a.info(lt)), nil
}

// withDirs is info with the agent's own directories, wherever its config
// puts them, for the OCI hook: it knows only their defaults, and the
// agent's answer is one no container can change, as it could a config
// file bound into it. It also says whether the BPF LSM layer is
// attached, which decides what the hook asks of a container's seccomp.
func (a *Agent) withDirs(info client.TrialInfo) client.TrialInfo {
	info.BPFLSM = a.host.BPF.LSM()
	h := a.cfg.Host.withDefaults()
	for _, d := range []string{h.StateDir, a.cfg.DataDir, filepath.Dir(a.cfg.ReceiptKey), h.NetnsDir, h.PinDir} {
		if filepath.IsAbs(d) && !slices.Contains(info.AgentDirs, d) {
			info.AgentDirs = append(info.AgentDirs, d)
		}
	}
	return info
}

// info is lt's description; ChangeAllow and a reload --reprofile replace
// its allowlist under mu.
func (a *Agent) info(lt *trial) client.TrialInfo {
	a.mu.Lock()
	defer a.mu.Unlock()
	return lt.info
}

func (a *Agent) lookup(id string) (*trial, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	lt := a.trials[id]
	if lt == nil || lt.state != stateLive {
		return nil, errf(client.CodeUnknownTrial, "no live Trial %q ('trialnet list' shows the live ones)", id)
	}
	return lt, nil
}

// List returns the live Trials, sorted by id.
func (a *Agent) List(context.Context) ([]client.TrialInfo, error) { return a.list(), nil }

func (a *Agent) list() []client.TrialInfo {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []client.TrialInfo
	for _, lt := range a.trials {
		if lt.state == stateLive {
			out = append(out, lt.info)
		}
	}
	slices.SortFunc(out, func(x, y client.TrialInfo) int { return strings.Compare(x.ID, y.ID) })
	return out
}

// Destroy kills everything in the Trial, closes its proxy endpoint and
// removes its namespace, cgroup and policy entry. The final stats, the
// signed receipt and the decision log stay in the data directory.
func (a *Agent) Destroy(ctx context.Context, id string) (client.Stats, error) {
	return a.DestroyExit(ctx, id, nil)
}

// DestroyExit is Destroy for a runner that knows how the Trial's command
// ended: exit goes into the receipt.
func (a *Agent) DestroyExit(ctx context.Context, id string, exit *int) (client.Stats, error) {
	leave, err := a.enter()
	if err != nil {
		return client.Stats{}, err
	}
	defer leave()
	lt, err := a.lookup(id)
	if err != nil {
		return client.Stats{}, err
	}
	a.mu.Lock()
	if lt.state != stateLive { // another destroy got here first
		a.mu.Unlock()
		return client.Stats{}, errf(client.CodeUnknownTrial, "no live Trial %q ('trialnet list' shows the live ones)", id)
	}
	lt.state = stateDestroying // the id stays taken until done
	a.mu.Unlock()
	a.dropOwner(lt)
	// A predecessor still draining ends its connections of the Trial
	// first, and writes their records. One that has drained meanwhile
	// ended them itself, and Remove returns once their records are
	// counted here.
	if p := a.pred.Load(); p != nil {
		if why, ok := p.Remove(ctx, id); !ok && p.State() != handover.StateDrained {
			a.log.Warn("the draining agent did not confirm that it ended the Trial's connections; records it writes later are not in the receipt", "trial", id, "pid", p.PID(), "error", why)
		}
	}
	// The one teardown: the endpoint stops first (its last decision events
	// still reach the log), then processes; the receipt is made while the
	// cgroup, policy and namespaces are removed.
	var st client.Stats
	_, err = lt.tr.CloseWith(func(k bpf.Counters, unsure error) error { return a.finish(lt, k, unsure, exit, &st) })
	lt.release()
	a.log.Info("trial destroyed", "trial", id, "direct_egress_packets", st.Egress)
	a.releaseSoon()
	a.ret.soon()
	if err != nil {
		return st, errf(client.CodeInternal, "destroy %s: %v", id, err)
	}
	return st, nil
}

// finish writes what a destroyed Trial leaves (its final stats, and its
// receipt signed over the counters k read after the kill and made
// durable) and gives back, at the same time, what the agent holds of it
// beside its sandbox (the keeper's copies of its listeners, its
// steering's pins). It runs while the sandbox removes the Trial's
// cgroups, namespace and entries (CloseWith); all of it is done before
// the destroy answers. unsure says why k may not hold all the Trial did:
// then the verdict says so, and never "ok".
func (a *Agent) finish(lt *trial, k bpf.Counters, unsure error, exit *int, st *client.Stats) error {
	id := lt.info.ID
	var dropped sync.WaitGroup
	defer dropped.Wait()
	dropped.Go(func() {
		a.unkeep(id)
		a.dropTransparent(id, lt.tr.CgroupID)
	})
	lt.mu.Lock()
	pst := lt.final
	lt.mu.Unlock()
	*st = a.makeStats(lt, k, pst, unsure)
	// Ended now, not at release: the receipt hashes the whole log.
	lt.log.end()
	lt.log.close()
	err := a.sign(lt, st, exit)
	if a.cfg.DataDir != "" {
		if b, jerr := json.MarshalIndent(*st, "", "  "); jerr == nil {
			// Whole or not at all, as a destroy killed mid-write leaves
			// it; not synced: only the receipt is promised durable.
			err = errors.Join(err, rootdir.ReplaceFile(filepath.Join(a.cfg.DataDir, id, "stats.json"), append(b, '\n'), 0o600))
		}
	}
	return err
}

// decisionLog is where a Trial's decision records are kept, one
// record.Event in JSON a line.
func (a *Agent) decisionLog(id string) string {
	return filepath.Join(a.cfg.DataDir, id, "decisions.jsonl")
}

// Audit returns a Trial's decision log (live or destroyed). A line that
// does not read as a record, one of a newer schema included, fails the
// audit with its line number: a record is never half-read.
func (a *Agent) Audit(_ context.Context, id string) ([]record.Event, error) {
	if err := sandbox.ValidID(id); err != nil {
		return nil, errf(client.CodeBadID, "%v", err)
	}
	if a.cfg.DataDir == "" {
		return nil, errf(client.CodeBadRequest, "this agent keeps no decision log (no data directory)")
	}
	recs, err := record.ReadFile(a.decisionLog(id))
	if errors.Is(err, os.ErrNotExist) {
		return nil, errf(client.CodeUnknownTrial, "no decision log for Trial %q", id)
	}
	if err != nil {
		return nil, errf(client.CodeInternal, "decision log of Trial %q: %v", id, err)
	}
	if err := a.endedLogSigned(id); err != nil {
		return nil, err
	}
	return recs, nil
}

// replayStats rebuilds a re-adopted Trial's proxy counters from its
// decision log, so that they continue across an agent restart as the
// kernel's do. Unreadable records are left out, and said so in the log.
func (a *Agent) replayStats(lt *trial) *record.TrialStats {
	if a.cfg.DataDir == "" {
		return nil
	}
	upTo := int64(-1)
	if off, ok := a.offsets[lt.info.ID]; ok {
		upTo = off // the predecessor sends what it writes after
	}
	st, err := replay(a.decisionLog(lt.info.ID), upTo)
	if err != nil {
		a.log.Warn("decision log partly unreadable: its proxy counters leave out those records", "trial", lt.info.ID, "error", err)
	}
	return st
}
