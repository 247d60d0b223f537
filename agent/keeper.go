//go:build linux

package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/trialnet/trialnet/internal/fdpass"
)

// The keeper holds copies of the agent's listening sockets (the control
// socket, the metrics port, every Trial's proxy endpoint) in a process of
// its own, so that they outlive the agent: when the agent is killed
// outright, connections to them wait in the kernel's accept queue instead
// of being refused, and the next agent takes the sockets back and serves
// them. It never accepts, reads or writes on them; it only holds them,
// and gives them to root of this PID namespace.
//
// Under systemd it is the agent's child in the unit's cgroup, which
// KillMode=process leaves alive when the agent dies; on Kubernetes it is
// a container of its own in the agent's pod, which outlives the agent
// container's restarts. Without either, the agent starts it (setsid) the
// first time it needs it.

// DefaultKeeperSocket is the keeper's socket beside the control socket.
func DefaultKeeperSocket(sock string) string {
	return strings.TrimSuffix(sock, ".sock") + ".keeper"
}

// keeperMsg is one request to the keeper, or its answer.
type keeperMsg struct {
	Op     string   `json:"op"` // put, del, get, quit; the answer: ok, error
	Names  []string `json:"names,omitempty"`
	Prefix string   `json:"prefix,omitempty"` // del: every name starting with it
	More   bool     `json:"more,omitempty"`   // get's answer: more messages follow
	PID    int      `json:"pid,omitempty"`
	N      int      `json:"n,omitempty"` // ping's answer: how many it holds
	Error  string   `json:"error,omitempty"`
	// Created is, for each of Names that is a Trial's listener, when its
	// Trial was created (trialCreated): with its id, it names one Trial,
	// where an id alone may be a later Trial's that reused it. "": not
	// known (an agent or keeper of an earlier build).
	Created []string `json:"created,omitempty"`
}

// trialCreated is a Trial's identity beside its id, as the keeper and
// the agent compare it: its creation time, which its record keeps.
func trialCreated(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// recordedCreated is the creation time that Trial id's record in the
// state directory trials names (ok false: no record), "" if it names
// none or cannot be read.
func recordedCreated(trials, id string) (created string, ok bool) {
	b, err := os.ReadFile(filepath.Join(trials, id+".json"))
	if errors.Is(err, os.ErrNotExist) {
		return "", false
	}
	var rec struct {
		Meta struct {
			Created time.Time `json:"created"`
		} `json:"meta"`
	}
	if err != nil || json.Unmarshal(b, &rec) != nil {
		return "", true
	}
	return trialCreated(rec.Meta.Created), true
}

// otherTrial reports whether a listener kept for the Trial created at
// kept belongs to another Trial than the one created at now, under the
// same id; an unknown time ("") matches any.
func otherTrial(kept, now string) bool { return kept != "" && now != "" && kept != now }

// RunKeeper holds listeners for agents at the socket path until ctx ends,
// an agent asks it to quit (a teardown), or it holds nothing. A Trial's
// listeners are dropped once its record is gone from trials (the agent's
// state directory; empty: never): a Trial removed by other means than an
// agent's destroy must not have its namespace kept alive by a socket.
func RunKeeper(ctx context.Context, path, trials string, log *slog.Logger) error {
	if c, err := fdpass.Dial(path); err == nil {
		_ = c.Close()
		return fmt.Errorf("keeper: another keeper serves %s already", path)
	}
	ln, err := fdpass.Listen(path)
	if err != nil {
		return fmt.Errorf("keeper: %w", err)
	}
	// The path goes with this keeper, unless another took it meanwhile.
	if mine, err := os.Stat(path); err == nil {
		defer func() {
			if now, err := os.Stat(path); err == nil && os.SameFile(mine, now) {
				_ = os.Remove(path)
			}
		}()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	k := &keeper{files: make(map[string]*os.File), created: make(map[string]string), trials: trials}
	defer k.closeAll()
	go k.prune(ctx, cancel, log)
	log.Info("trialnet keeper ready", "socket", path, "pid", os.Getpid())
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		quit := k.serve(c, log)
		_ = c.Close()
		if quit {
			log.Info("trialnet keeper quits: the agent tore every Trial down")
			return nil
		}
	}
}

type keeper struct {
	mu      sync.Mutex
	files   map[string]*os.File
	created map[string]string // of a Trial's listener: its Trial's creation time, if known
	trials  string
}

// keeperIdle is how long a keeper holding nothing waits for an agent.
const keeperIdle = time.Minute

// prune drops the listeners of Trials whose record is gone or names
// another Trial under the same id (it was destroyed and its id reused,
// and this keeper missed the agent's word of it), and ends the keeper
// (cancel) once it has held nothing for keeperIdle.
func (k *keeper) prune(ctx context.Context, cancel context.CancelFunc, log *slog.Logger) {
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	empty := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		k.mu.Lock()
		for n := range k.files {
			if id, ok := trialOfName(n); ok && k.trials != "" {
				if created, ok := recordedCreated(k.trials, id); !ok || otherTrial(k.created[n], created) {
					k.drop(n)
					log.Info("keeper: dropped the listener of a Trial that is gone", "name", n, "created", k.created[n])
				}
			}
		}
		n := len(k.files)
		k.mu.Unlock()
		switch {
		case n > 0:
			empty = time.Now()
		case time.Since(empty) > keeperIdle:
			log.Info("trialnet keeper quits: it has held nothing for a while")
			cancel()
			return
		}
	}
}

// drop closes and forgets the listener named n; k.mu is held.
func (k *keeper) drop(n string) {
	if f := k.files[n]; f != nil {
		_ = f.Close()
	}
	delete(k.files, n)
	delete(k.created, n)
}

// keep holds f as the listener named n of the Trial created at created
// (""; unknown, or not a Trial's), in place of what it held under that
// name, and of every listener it held for another Trial of the same id;
// k.mu is held.
func (k *keeper) keep(n string, f *os.File, created string) {
	if id, ok := trialOfName(n); ok && created != "" {
		for m := range k.files {
			if mid, _ := trialOfName(m); mid == id && otherTrial(k.created[m], created) {
				k.drop(m)
			}
		}
	}
	k.drop(n)
	k.files[n] = f
	if created != "" {
		k.created[n] = created
	}
}

func (k *keeper) closeAll() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for n := range k.files {
		k.drop(n)
	}
}

// serve answers one connection's requests; it reports a quit.
func (k *keeper) serve(c *net.UnixConn, log *slog.Logger) (quit bool) {
	if err := fdpass.CheckPeer(c); err != nil {
		log.Warn("keeper: refused a peer", "error", err)
		return false
	}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	for {
		var m keeperMsg
		files, err := fdpass.Recv(c, &m)
		if err != nil {
			return false
		}
		reply := keeperMsg{Op: "ok", PID: os.Getpid()}
		switch m.Op {
		case "put":
			if len(files) != len(m.Names) {
				closeFiles(files)
				reply = keeperMsg{Op: "error", Error: fmt.Sprintf("%d files for %d names", len(files), len(m.Names))}
				break
			}
			k.mu.Lock()
			for i, n := range m.Names {
				k.keep(n, files[i], at(m.Created, i))
			}
			k.mu.Unlock()
		case "del":
			closeFiles(files)
			k.mu.Lock()
			for n := range k.files {
				if (m.Prefix != "" && strings.HasPrefix(n, m.Prefix)) || contains(m.Names, n) {
					k.drop(n)
				}
			}
			k.mu.Unlock()
		case "get":
			closeFiles(files)
			if err := k.sendAll(c); err != nil {
				return false
			}
			continue
		case "ping":
			closeFiles(files)
			k.mu.Lock()
			reply.N = len(k.files)
			k.mu.Unlock()
		case "quit":
			closeFiles(files)
			_ = fdpass.Send(c, reply)
			return true
		default:
			closeFiles(files)
			reply = keeperMsg{Op: "error", Error: fmt.Sprintf("unknown op %q", m.Op)}
		}
		if err := fdpass.Send(c, reply); err != nil {
			return false
		}
	}
}

// at is s[i], or "" past its end.
func at(s []string, i int) string {
	if i < len(s) {
		return s[i]
	}
	return ""
}

func contains(names []string, n string) bool {
	for _, x := range names {
		if x == n {
			return true
		}
	}
	return false
}

func (k *keeper) sendAll(c *net.UnixConn) error {
	k.mu.Lock()
	names := make([]string, 0, len(k.files))
	for n := range k.files {
		names = append(names, n)
	}
	sort.Strings(names)
	files := make([]*os.File, len(names))
	created := make([]string, len(names))
	for i, n := range names {
		files[i], created[i] = k.files[n], k.created[n]
	}
	k.mu.Unlock()
	for i := 0; ; i += fdpass.MaxFiles {
		j := min(i+fdpass.MaxFiles, len(names))
		m := keeperMsg{Op: "ok", Names: names[i:j], Created: created[i:j], More: j < len(names), PID: os.Getpid()}
		if err := fdpass.Send(c, m, files[i:j]...); err != nil {
			return err
		}
		if j == len(names) {
			return nil
		}
	}
}

// keeperClient is the agent's side of the keeper.
type keeperClient struct {
	path   string
	trials string // the state directory, where the keeper sees which Trials are gone
	spawn  bool   // start a keeper when none answers
	log    *slog.Logger
	mu     sync.Mutex // one exchange at a time
}

// dial connects to the keeper, starting one if none answers and spawning
// is on.
func (k *keeperClient) dial() (*net.UnixConn, error) {
	c, err := fdpass.Dial(k.path)
	if err == nil || !k.spawn || !(errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED)) {
		return c, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "keeper", "--socket", k.path, "--trials", k.trials)
	// Its stdio is not the agent's: a keeper outlives the agent, and must
	// not hold a pipe open that someone waits on for the agent's end. It
	// has little to say, and the agent logs its start.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start a keeper: %w", err)
	}
	go func() { _ = cmd.Wait() }()
	k.log.Info("started a keeper for the listeners", "pid", cmd.Process.Pid, "socket", k.path)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err = fdpass.Dial(k.path); err == nil || time.Now().After(deadline) {
			return c, err
		}
	}
}

// ensure starts a keeper now if none answers (and spawning is on), so
// that the first Trial's listeners are kept.
func (k *keeperClient) ensure() {
	k.mu.Lock()
	defer k.mu.Unlock()
	c, err := k.dial()
	if err != nil {
		k.log.Warn("no keeper: if this agent dies, connections to the Trials' endpoints are refused until it is back", "keeper", k.path, "error", err)
		return
	}
	_ = c.Close()
}

// exchange sends one request and reads its answers: the files they
// carry by name, with the creation time of each one's Trial where the
// keeper knows it.
func (k *keeperClient) exchange(m keeperMsg, files []*os.File) (map[string]*os.File, map[string]string, error) {
	got, created, _, err := k.exchangeMsg(m, files)
	return got, created, err
}

// held asks the keeper how many listeners it holds (starting one if none
// answers and spawning is on).
func (k *keeperClient) held() (int, error) {
	_, _, r, err := k.exchangeMsg(keeperMsg{Op: "ping"}, nil)
	return r.N, err
}

func (k *keeperClient) exchangeMsg(m keeperMsg, files []*os.File) (map[string]*os.File, map[string]string, keeperMsg, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	c, err := k.dial()
	if err != nil {
		return nil, nil, keeperMsg{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if err := fdpass.Send(c, m, files...); err != nil {
		return nil, nil, keeperMsg{}, err
	}
	got, created := make(map[string]*os.File), make(map[string]string)
	for {
		var r keeperMsg
		fs, err := fdpass.Recv(c, &r)
		if err == nil && r.Op != "ok" {
			err = fmt.Errorf("keeper: %s", r.Error)
		}
		if err == nil && len(fs) != len(r.Names) {
			err = fmt.Errorf("keeper: %d files for %d names", len(fs), len(r.Names))
		}
		if err != nil {
			closeFiles(fs)
			for _, f := range got {
				_ = f.Close()
			}
			return nil, nil, keeperMsg{}, err
		}
		for i, n := range r.Names {
			got[n] = fs[i]
			if c := at(r.Created, i); c != "" {
				created[n] = c
			}
		}
		if !r.More {
			return got, created, r, nil
		}
	}
}

// put gives the keeper its copies of the named listeners; created are
// their Trials' creation times (trialCreated; nil, or "" for a listener
// of no Trial).
func (k *keeperClient) put(names, created []string, lns []net.Listener) {
	var files []*os.File
	defer func() { closeFiles(files) }()
	for i, ln := range lns {
		f, err := listenerFile(ln)
		if err != nil {
			k.log.Warn("keeper: a listener cannot be kept", "name", names[i], "error", err)
			return
		}
		files = append(files, f)
	}
	for i := 0; i < len(files); i += fdpass.MaxFiles {
		j := min(i+fdpass.MaxFiles, len(files))
		m := keeperMsg{Op: "put", Names: names[i:j]}
		if created != nil {
			m.Created = created[i:j]
		}
		if _, _, err := k.exchange(m, files[i:j]); err != nil {
			k.log.Warn("keeper: listeners not kept; if this agent dies, connections to them are refused until it is back", "error", err)
			return
		}
	}
}

// del drops the named listeners, and those whose names start with prefix.
func (k *keeperClient) del(prefix string, names ...string) {
	if _, _, err := k.exchange(keeperMsg{Op: "del", Prefix: prefix, Names: names}, nil); err != nil {
		k.log.Warn("keeper: listeners not dropped", "error", err)
	}
}

// fetch takes copies of every listener the keeper holds, and the
// creation times of their Trials where it knows them; none answering is
// no error (nothing was kept).
func (k *keeperClient) fetch() (map[string]*os.File, map[string]string, error) {
	c, err := fdpass.Dial(k.path)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	_ = c.Close()
	return k.exchange(keeperMsg{Op: "get"}, nil)
}

// StopKeeper asks the keeper at path to close everything it holds and
// exit; none answering is no error.
func StopKeeper(path string) error {
	k := &keeperClient{path: path, log: slog.New(slog.DiscardHandler)}
	c, err := fdpass.Dial(path)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
		return nil
	}
	if err != nil {
		return err
	}
	_ = c.Close()
	_, _, err = k.exchange(keeperMsg{Op: "quit"}, nil)
	return err
}

// keep gives the keeper the endpoint listeners of Trial id, created at
// created.
func (a *Agent) keep(id string, created time.Time, lns []net.Listener) {
	if a.keeper == nil || len(lns) == 0 {
		return
	}
	names, at := make([]string, len(lns)), make([]string, len(lns))
	for i := range lns {
		names[i], at[i] = trialListenerName(id, i), trialCreated(created)
	}
	a.keeper.put(names, at, lns)
}

// unkeep drops Trial id's listeners from the keeper (a destroy).
func (a *Agent) unkeep(id string) {
	if a.keeper != nil {
		a.keeper.del("trial:" + id + ":")
	}
}

// createdAt is when Trial id was created (zero: no such Trial here).
func (a *Agent) createdAt(id string) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	if lt := a.trials[id]; lt != nil {
		return lt.info.Created
	}
	return time.Time{}
}
