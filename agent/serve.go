//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/handover"
	"github.com/trialnet/trialnet/internal/fdpass"
	"github.com/trialnet/trialnet/internal/lname"
	"github.com/trialnet/trialnet/internal/rootdir"
	"github.com/trialnet/trialnet/keeper"
	"github.com/trialnet/trialnet/sandbox"
)

// ServeConfig is the daemon: an agent, where its control API listens,
// where its metrics are served and what happens to Trials when it stops.
type ServeConfig struct {
	AgentConfig
	Socket      string // control socket; empty: DefaultSocket
	MetricsAddr string // Prometheus metrics on this address; empty: none
	// TeardownOnExit destroys every Trial when ctx ends; otherwise they
	// stay enforced (pinned) for the next agent to re-adopt.
	TeardownOnExit bool
	// Reload: each value received reloads the config file (SIGHUP); a
	// refused reload is logged and changes nothing. nil: none.
	Reload <-chan os.Signal
	// Upgrade: each value received starts this agent's executable again
	// (the file at its path now: an upgraded build), with the same
	// arguments, to take over by hand-over (SIGUSR2). nil: none.
	Upgrade <-chan os.Signal
	// Keeper is the keeper's socket (keeper.DefaultSocket); empty: no
	// keeper, and listeners die with this process. SpawnKeeper starts
	// one when none answers there.
	Keeper      string
	SpawnKeeper bool
	// PIDFile, if set, gets this process's pid once it serves.
	PIDFile string
	// Serving, if set, is called once the agent serves (as PIDFile is
	// written): what should not slow its start begins there.
	Serving func()
	// DrainTimeout bounds how long this agent, once it has handed over,
	// serves its open tunnels before it cuts them; 0: DefaultDrainTimeout.
	DrainTimeout time.Duration
}

// DefaultDrainTimeout is long enough for a streaming model call.
const DefaultDrainTimeout = 15 * time.Minute

// AgentOOMScoreAdj is the OOM score adjustment the agent takes: far
// below a Trial's 1000, above the -1000 that would exempt it outright.
const AgentOOMScoreAdj = -900

// daemon is one agent process serving: its listeners, its servers, and,
// once it has handed over, its successor.
type daemon struct {
	a         *Agent
	cfg       ServeConfig
	sock      string
	ctl, met  net.Listener
	hln       *net.UnixListener
	srv, msrv *http.Server
	handedOff chan struct{} // closed once a successor serves everything
	successor *handover.Successor
	// ctlFile and hlnFile are the sockets this process put at the paths.
	ctlFile, hlnFile os.FileInfo
	tending          atomic.Bool // a keeper check runs
}

func (d *daemon) drainTimeout() time.Duration {
	if d.cfg.DrainTimeout > 0 {
		return d.cfg.DrainTimeout
	}
	return DefaultDrainTimeout
}

// Serve runs the daemon until ctx ends, or until it has handed over to a
// successor and drained. At start it takes over from an agent that runs
// already (a hand-over: nothing is refused or cut), else takes back what
// the keeper held for an agent that died, else listens anew. Nothing is
// served until every listener is bound and the agent has started.
func Serve(ctx context.Context, cfg ServeConfig) error {
	// Every Trial's proxy lives here: when memory runs out, the OOM
	// killer should end a Trial's processes (1000, set at launch), never
	// the agent. Lowering a score needs CAP_SYS_RESOURCE, which the
	// systemd unit does not give: it sets OOMScoreAdjust instead.
	oomErr := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(AgentOOMScoreAdj)), 0)
	d := &daemon{cfg: cfg, sock: cfg.Socket, handedOff: make(chan struct{})}
	if d.sock == "" {
		d.sock = client.DefaultSocket
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var kc *keeper.Client
	if cfg.Keeper != "" {
		kc = keeper.NewClient(cfg.Keeper, cfg.Host.StateDir, cfg.SpawnKeeper, log)
	}
	pred, inh, err := d.inherit(kc, log)
	if err != nil {
		return err
	}
	closeRest := func() {
		for _, i := range inh {
			i.close()
		}
	}
	// A predecessor keeps its socket paths until this agent has started:
	// if it fails, the predecessor serves on as if nothing happened.
	if pred == nil {
		err = d.bindPaths(false)
	}
	if err == nil {
		err = d.listen()
	}
	if err == nil && kc != nil {
		kc.Ensure()
	}
	if err != nil {
		closeRest()
		d.closeListeners(pred == nil)
		if pred != nil {
			pred.Close() // it keeps serving
		}
		return err
	}
	a, err := d.startTakingOver(inh, pred, kc)
	if err != nil {
		d.closeListeners(pred == nil)
		return err
	}
	d.a = a
	if oomErr != nil {
		a.log.Warn("could not lower the agent's OOM score: the OOM killer may choose it before a Trial (set OOMScoreAdjust in the unit, or give it CAP_SYS_RESOURCE)",
			"oom_score_adj", AgentOOMScoreAdj, "error", oomErr)
	}
	// Loaded now rather than at the first container adopted, which
	// would wait the 25-85 ms a load takes (docs/measured.md).
	go func() {
		if err := sandbox.NetnsScanError(); err != nil {
			a.log.Warn("adoptions walk /proc for the processes in a container's network namespace, 3 ms and more on a busy host, rather than read a task iterator", "error", err)
		}
	}()
	d.srv = a.Server()
	go a.serveHTTP(d.srv, d.ctl, "control socket")
	if d.met != nil {
		d.msrv = &http.Server{Handler: a.MetricsHandler(), ReadHeaderTimeout: 10 * time.Second}
		go a.serveHTTP(d.msrv, d.met, "metrics")
	}
	if pred != nil {
		a.log.Info("took over every listener from the running agent, which now drains", "predecessor", pred.PID())
	}
	go d.serveHandovers(d.hln)
	if kc != nil && d.met != nil {
		kc.Put([]string{lname.MetricsName().String()}, nil, []net.Listener{d.met}) // each Trial's went when it was served
	}
	if cfg.PIDFile != "" {
		if err := writePIDFile(cfg.PIDFile); err != nil {
			a.log.Warn("pid file not written: health --pid-file will not find this agent ready", "path", cfg.PIDFile, "error", err)
		}
	}
	if cfg.Serving != nil {
		cfg.Serving()
	}
	sdNotify(fmt.Sprintf("READY=1\nMAINPID=%d", os.Getpid()))
	a.log.Info("trialnet agent ready", "socket", d.sock, "trials", len(a.list()), "metrics", cfg.MetricsAddr, "pid", os.Getpid())
	return d.run(ctx)
}

// startTakingOver starts the agent. Taking over, it tells the
// predecessor it is still adopting while it starts, then that it serves;
// once the predecessor has stopped accepting, it takes the socket paths
// and watches the Trials' owners. Any failure before that leaves the
// predecessor serving (this process's copies of its listeners closed
// first, then the connection).
func (d *daemon) startTakingOver(inh map[string]*inherited, pred *handover.Predecessor, kc *keeper.Client) (*Agent, error) {
	var beat chan struct{}
	if pred != nil {
		beat = make(chan struct{})
		go pred.Adopting(beat)
	}
	a, err := start(d.cfg.AgentConfig, inh, pred, kc)
	if beat != nil {
		close(beat)
	}
	if pred == nil || err != nil {
		if pred != nil {
			pred.Close()
		}
		return a, err
	}
	// The sockets are made before "serving": after "stopped" only the
	// renames are left to fail.
	paths, err := d.prepPaths()
	if err == nil {
		if err = pred.Serve(taker{a}); err == nil {
			err = paths.take(d)
		} else {
			paths.discard()
		}
	}
	if err != nil {
		a.Close(false)
		pred.Close()
		return nil, err
	}
	a.watchOwners()
	return a, nil
}

// inherit finds what this process takes over: from a running agent (a
// hand-over), else from the keeper (an agent that died). It returns the
// Trials' listeners by id, in index order, and puts the metrics listener
// in d.met.
func (d *daemon) inherit(kc *keeper.Client, log *slog.Logger) (*handover.Predecessor, map[string]*inherited, error) {
	pred, files, err := takeOver(HandoverSocket(d.sock), handover.Config{Paths: d.paths(), Log: log})
	switch {
	case errors.Is(err, errNoPredecessor):
		pred, files = nil, d.fromKeeper(kc, log)
	case err != nil:
		return nil, nil, err
	}
	inh := make(map[string]*inherited)
	of := func(id string) *inherited {
		if inh[id] == nil {
			inh[id] = &inherited{}
		}
		return inh[id]
	}
	names := slices.SortedFunc(maps.Keys(files), func(x, y lname.Name) int { return cmpBool(lname.Less(x, y), lname.Less(y, x)) })
	for _, n := range names {
		f := files[n]
		if n.OfTrial() && n.Kind != lname.Endpoint {
			if err := of(n.Trial).tp.take(n, f); err != nil {
				log.Warn("a transparent socket handed over is not one; dropped", "name", n, "error", err)
			}
			continue
		}
		ln, lerr := net.FileListener(f)
		_ = f.Close()
		switch {
		case lerr != nil:
			log.Warn("a listener handed over is not one; dropped", "name", n, "error", lerr)
		case n.Kind == lname.Metrics && d.met == nil:
			d.met = ln
		case n.Kind == lname.Endpoint:
			of(n.Trial).lns = append(of(n.Trial).lns, ln)
		default:
			_ = ln.Close() // not one this build serves
		}
	}
	return pred, inh, nil
}

// cmpBool orders by a less-than test both ways, as slices.SortFunc wants.
func cmpBool(less, greater bool) int {
	switch {
	case less:
		return -1
	case greater:
		return 1
	}
	return 0
}

// fromKeeper takes back what the keeper held for an agent that died (nil
// without a keeper); a name this build does not know is closed.
func (d *daemon) fromKeeper(kc *keeper.Client, log *slog.Logger) map[lname.Name]*os.File {
	if kc == nil {
		return nil
	}
	files, created, err := kc.Fetch()
	if err != nil {
		log.Warn("the keeper's listeners could not be taken back: listening anew", "keeper", kc.Path(), "error", err)
		return nil
	}
	if len(files) > 0 {
		log.Info("taking back the listeners the keeper held for an agent that ended", "listeners", len(files))
	}
	d.dropEarlierTrials(files, created, log)
	out := make(map[lname.Name]*os.File, len(files))
	for s, f := range files {
		if n, err := lname.Parse(s); err == nil {
			out[n] = f
		} else {
			_ = f.Close()
		}
	}
	return out
}

// dropEarlierTrials closes and forgets the listeners a keeper held for a
// Trial that is gone, whose id a later Trial took (the keeper missed the
// word of it): served as the later Trial's, they would fail its adoption,
// and it would be removed. That Trial's endpoint listens anew instead.
func (d *daemon) dropEarlierTrials(files map[string]*os.File, created map[string]string, log *slog.Logger) {
	for n, f := range files {
		name, err := lname.Parse(n)
		if err != nil || !name.OfTrial() {
			continue
		}
		id := name.Trial
		if now, _ := keeper.RecordedCreated(d.cfg.Host.StateDir, id); keeper.OtherTrial(created[n], now) {
			log.Warn("the keeper held a listener of an earlier Trial with this id; not served", "name", n, "created", created[n], "trial_created", now)
			_ = f.Close()
			delete(files, n)
		}
	}
}

// bindPaths makes the control and hand-over sockets: anew, as a unix
// socket's peer credentials (which clients check) are those of the
// process that made it. Taking over, it replaces the predecessor's at
// their paths, in one rename each; otherwise it fails if an agent answers
// on the control socket.
func (d *daemon) bindPaths(takingOver bool) error {
	var err error
	if d.ctl, err = ListenSocket(d.sock); err != nil {
		return err
	}
	if d.hln, err = fdpass.Listen(HandoverSocket(d.sock)); err != nil {
		return fmt.Errorf("agent: hand-over socket: %w", err)
	}
	d.noteBound()
	return nil
}

// boundPaths are a successor's control and hand-over sockets, made at
// temporary paths until the predecessor has stopped accepting.
type boundPaths struct {
	ctl, hln       *net.UnixListener
	ctlTmp, hlnTmp string
}

func (d *daemon) prepPaths() (*boundPaths, error) {
	ctl, ctlTmp, err := fdpass.ListenTemp("unix", d.sock)
	if err != nil {
		return nil, err
	}
	hln, hlnTmp, err := fdpass.ListenTemp("unixpacket", HandoverSocket(d.sock))
	if err != nil {
		_ = ctl.Close()
		_ = os.Remove(ctlTmp)
		return nil, fmt.Errorf("agent: hand-over socket: %w", err)
	}
	return &boundPaths{ctl, hln, ctlTmp, hlnTmp}, nil
}

func (b *boundPaths) discard() {
	_, _ = b.ctl.Close(), b.hln.Close()
	_, _ = os.Remove(b.ctlTmp), os.Remove(b.hlnTmp)
}

// take renames the sockets over the socket paths: two renames in one
// directory, the hand-over socket's last.
func (b *boundPaths) take(d *daemon) error {
	err := os.Rename(b.ctlTmp, d.sock)
	if err == nil {
		err = os.Rename(b.hlnTmp, HandoverSocket(d.sock))
	}
	if err != nil {
		b.discard()
		return fmt.Errorf("agent: take the socket paths: %w", err)
	}
	d.ctl, d.hln = b.ctl, b.hln
	d.noteBound()
	return nil
}

// noteBound remembers which files at the socket paths are this
// process's: a stop removes them only if they still are.
func (d *daemon) noteBound() {
	d.ctlFile, _ = os.Stat(d.sock)
	d.hlnFile, _ = os.Stat(HandoverSocket(d.sock))
}

// isOwn reports whether the file at path is still own.
func isOwn(path string, own os.FileInfo) bool {
	now, err := os.Stat(path)
	return err == nil && own != nil && os.SameFile(now, own)
}

// removeOwn removes path if the file there is still own.
func removeOwn(path string, own os.FileInfo) {
	if isOwn(path, own) {
		_ = os.Remove(path)
	}
}

// awaitTaken waits, at most bound, until the file at path is no longer
// own or ended says the one taking it gave up.
func awaitTaken(path string, own os.FileInfo, ended func() bool, bound time.Duration) {
	for end := time.Now().Add(bound); isOwn(path, own) && !ended() && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
}

// listen keeps the inherited metrics listener if it is on the address
// configured, or binds the metrics port.
func (d *daemon) listen() error {
	var err error
	if d.met != nil && !sameAddr(d.met.Addr(), d.cfg.MetricsAddr) {
		_ = d.met.Close() // this agent serves its metrics elsewhere, or not at all
		d.met = nil
	}
	if d.met == nil && d.cfg.MetricsAddr != "" {
		if d.met, err = net.Listen("tcp", d.cfg.MetricsAddr); err != nil {
			return fmt.Errorf("agent: metrics on %s: %w (is something else serving that port? Pick another --metrics-addr, or leave it out)", d.cfg.MetricsAddr, err)
		}
	}
	return nil
}

// closeListeners closes what a start that failed made; its socket paths
// go too when they are its own (ours), not a predecessor's.
func (d *daemon) closeListeners(ours bool) {
	if d.met != nil {
		_ = d.met.Close()
	}
	if d.ctl != nil {
		_ = d.ctl.Close()
		if ours {
			removeOwn(d.sock, d.ctlFile)
		}
	}
	if d.hln != nil {
		_ = d.hln.Close()
		if ours {
			removeOwn(HandoverSocket(d.sock), d.hlnFile)
		}
	}
}

// sameAddr reports whether a listener's address is the one configured.
func sameAddr(have net.Addr, want string) bool {
	if want == "" {
		return false
	}
	w, err := net.ResolveTCPAddr("tcp", want)
	h, ok := have.(*net.TCPAddr)
	return err == nil && ok && h.Port == w.Port && (h.IP.Equal(w.IP) || (len(w.IP) == 0 && h.IP.IsUnspecified()))
}

// run serves until ctx ends (a stop) or a successor has taken over and
// this process has drained.
func (d *daemon) run(ctx context.Context) error {
	a := d.a
	tend := time.NewTicker(keeperTend)
	defer tend.Stop()
	for {
		select {
		case <-tend.C:
			if !d.tending.Swap(true) { // off the loop: a keeper may be slow
				go func() {
					defer d.tending.Store(false)
					d.tendKeeper()
				}()
			}
		case <-ctx.Done():
			return d.stop()
		case sig := <-d.cfg.Reload:
			if _, err := a.Reload(context.Background(), client.ReloadRequest{}); err != nil {
				a.log.Error("reload", "signal", sig.String(), "error", err)
			}
		case <-d.cfg.Upgrade:
			d.spawnSuccessor()
		case <-d.handedOff:
			return d.drainAndExit()
		}
	}
}

// drainAndExit drains after a hand-over and ends the agent. A signal now
// (Kubernetes ending the old pod) does not cut the drain short: the drain
// timeout bounds it. A successor that ended first makes it an error, so
// that a supervisor restarts the agent.
func (d *daemon) drainAndExit() error {
	err := d.drain()
	d.a.Close(false)
	return err
}

// keeperTend is how often the agent checks that the keeper holds every
// listener it serves.
const keeperTend = 10 * time.Second

// tendKeeper gives the keeper every listener again when it holds fewer
// than this agent serves: a keeper that restarted, started late (a
// Kubernetes container), or missed a put. The listeners are counted
// first, and copied only for a keeper that holds fewer: copying every
// Trial's transparent sockets each time, to be closed unsent, cost
// 50-300 ms of the agent's CPU every 10 s at 1,000 live Trials.
func (d *daemon) tendKeeper() {
	kc := d.a.keeper
	if kc == nil {
		return
	}
	served := d.a.keptCount()
	if d.met != nil {
		served++
	}
	if served == 0 {
		return // nothing to keep: no keeper is started for it
	}
	n, err := kc.Held()
	if err == nil && n >= served {
		return
	}
	var names, created []string
	var lns []net.Listener
	if d.met != nil {
		names, created, lns = append(names, lname.MetricsName().String()), append(created, ""), append(lns, d.met)
	}
	for id, tl := range d.a.trialListeners() {
		at := keeper.TrialCreated(d.a.createdAt(id))
		for i, ln := range tl {
			names, created, lns = append(names, lname.EndpointName(id, i).String()), append(created, at), append(lns, ln)
		}
	}
	var tnames, tcreated []string
	var tfiles []*os.File
	defer func() { closeAll(tfiles) }()
	for _, lt := range d.a.liveTrials() {
		ns, fs, err := d.a.transparentFiles(lt)
		if err != nil {
			continue
		}
		for i := range ns {
			tnames, tcreated, tfiles = append(tnames, ns[i].String()), append(tcreated, keeper.TrialCreated(lt.info.Created)), append(tfiles, fs[i])
		}
	}
	d.a.log.Info("the keeper holds fewer listeners than this agent serves: giving it every one again", "held", n, "served", len(names)+len(tnames))
	kc.Put(names, created, lns)
	kc.PutFiles(tnames, tcreated, tfiles)
}

// stop ends serving without a successor: Trials stay enforced (or are
// destroyed with TeardownOnExit); their listeners stay with the keeper,
// so that connections wait for the next agent.
func (d *daemon) stop() error {
	a := d.a
	// No hand-over starts from now, and one under way ends first: if it
	// succeeded, this process drains as after any hand-over.
	_ = d.hln.Close()
	a.hmu.Lock()
	a.stopping = true
	handedOver := a.handedOver
	a.hmu.Unlock()
	if handedOver {
		<-d.handedOff
		return d.drainAndExit()
	}
	a.log.Info("trialnet agent stopping", "teardown", d.cfg.TeardownOnExit)
	sdNotify("STOPPING=1")
	removeOwn(HandoverSocket(d.sock), d.hlnFile)
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := d.srv.Shutdown(shutdown)
	if d.msrv != nil {
		err = errors.Join(err, d.msrv.Shutdown(shutdown))
	}
	a.Close(d.cfg.TeardownOnExit)
	if a.keeper != nil {
		if d.cfg.TeardownOnExit {
			if kerr := keeper.Stop(a.keeper.Path()); kerr != nil {
				a.log.Warn("keeper: not stopped", "error", kerr)
			}
		} else {
			// Scrapers should hear that no agent runs, not wait for one.
			a.keeper.Del("", lname.MetricsName().String())
		}
	}
	removeOwn(d.sock, d.ctlFile)
	if errors.Is(err, context.DeadlineExceeded) {
		// Clients still connected after 5 s: not a failure of the agent.
		err = nil
	}
	return err
}

// spawnSuccessor starts this agent's executable again, as it is on disk
// now, with the same arguments: it takes over by hand-over, and this
// process drains. If it fails, this one serves on.
func (d *daemon) spawnSuccessor() {
	exe, err := os.Executable()
	if err != nil {
		d.a.log.Error("upgrade: cannot find this agent's executable", "error", err)
		return
	}
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		d.a.log.Error("upgrade: the new agent did not start; this one serves on", "executable", exe, "error", err)
		return
	}
	d.a.log.Info("upgrade: started a new agent to take over", "executable", exe, "pid", cmd.Process.Pid)
	go func() {
		if err := cmd.Wait(); err != nil {
			d.a.log.Error("upgrade: the new agent exited", "pid", cmd.Process.Pid, "error", err)
		}
	}()
}

// writePIDFile puts this process's pid in path by way of a new file
// renamed over it: a symlink or hard link someone planted at the name (a
// --pid-file in a directory others can write, such as /tmp) is replaced,
// never written through, so the agent, which is root, overwrites no file
// of its choosing.
func writePIDFile(path string) error {
	return rootdir.WriteFileAtomic(path, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644)
}

// sdNotify tells systemd (Type=notify) the agent's state, when it runs
// under it; a successor's MAINPID makes it the unit's main process
// (NotifyAccess=all).
func sdNotify(state string) {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return
	}
	if strings.HasPrefix(path, "@") {
		path = "\x00" + path[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return
	}
	defer c.Close()
	_, _ = c.Write([]byte(state))
}

// serveHTTP serves srv on ln until it is shut down. Any other end leaves
// the agent running without that listener, so it is logged.
func (a *Agent) serveHTTP(srv *http.Server, ln net.Listener, what string) {
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
		a.log.Error("stopped serving the "+what, "addr", ln.Addr().String(), "error", err)
	}
}
