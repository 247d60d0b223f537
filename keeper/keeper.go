//go:build linux

// Package keeper holds copies of the agent's listening sockets (the
// control socket, the metrics port, every Trial's proxy endpoint) in a
// process of its own, so that they outlive the agent: when the agent is
// killed outright, connections to them wait in the kernel's accept queue
// instead of being refused, and the next agent takes the sockets back and
// serves them. It never accepts, reads or writes on them; it only holds
// them, and gives them to root of this PID namespace.
//
// Under systemd it is the agent's child in the unit's cgroup, which
// KillMode=process leaves alive when the agent dies; on Kubernetes it is
// a container of its own in the agent's pod, which outlives the agent
// container's restarts. Without either, the agent starts it (setsid) the
// first time it needs it.
//
// Run is the keeper process, Client the agent's side of it.
package keeper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/trialnet/trialnet/internal/fdpass"
	"github.com/trialnet/trialnet/internal/lname"
	"golang.org/x/sys/unix"
)

// DefaultSocket is the keeper's socket beside the agent's control socket
// sock.
func DefaultSocket(sock string) string {
	return strings.TrimSuffix(sock, ".sock") + ".keeper"
}

// trialOf is the Trial whose endpoint a listener's name (lname) names,
// if any: the keeper drops a Trial's listeners once the Trial is gone.
func trialOf(name string) (string, bool) {
	n, err := lname.Parse(name)
	return n.Trial, err == nil && n.OfTrial()
}

// msg is one request to the keeper, or its answer.
type msg struct {
	Op     string   `json:"op"` // put, del, get, quit; the answer: ok, error
	Names  []string `json:"names,omitempty"`
	Prefix string   `json:"prefix,omitempty"` // del: every name starting with it
	More   bool     `json:"more,omitempty"`   // get's answer: more messages follow
	PID    int      `json:"pid,omitempty"`
	N      int      `json:"n,omitempty"` // ping's answer: how many it holds
	Error  string   `json:"error,omitempty"`
	// Created is, for each of Names that is a Trial's listener, when its
	// Trial was created (TrialCreated): with its id, it names one Trial,
	// where an id alone may be a later Trial's that reused it. "": not
	// known (an agent or keeper of an earlier build).
	Created []string `json:"created,omitempty"`
}

// TrialCreated is a Trial's identity beside its id, as the keeper and
// the agent compare it: its creation time t, which its record keeps.
func TrialCreated(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// RecordedCreated is the creation time (TrialCreated) that Trial id's
// record in the state directory trials names (ok false: no record), ""
// if it names none or cannot be read.
func RecordedCreated(trials, id string) (created string, ok bool) {
	b, err := os.ReadFile(filepath.Join(trials, id+".json"))
	if errors.Is(err, os.ErrNotExist) {
		return "", false
	}
	// The sandbox's record (sandbox.Record): the Trial's description is
	// under "trial", or "meta" in a record of a build before it.
	type desc struct {
		Created time.Time `json:"created"`
	}
	var rec struct {
		Trial, Meta *desc
	}
	if err != nil || json.Unmarshal(b, &rec) != nil {
		return "", true
	}
	switch {
	case rec.Trial != nil:
		return TrialCreated(rec.Trial.Created), true
	case rec.Meta != nil:
		return TrialCreated(rec.Meta.Created), true
	}
	return "", true
}

// OtherTrial reports whether a listener kept for the Trial created at
// kept (TrialCreated) belongs to another Trial than the one created at
// now, under the same id; an unknown time ("") matches any.
func OtherTrial(kept, now string) bool { return kept != "" && now != "" && kept != now }

// Run holds listeners for agents at the socket path until ctx ends,
// an agent asks it to quit (a teardown), or it holds nothing. A Trial's
// listeners are dropped once its record is gone from trials (the agent's
// state directory; empty: never): a Trial removed by other means than an
// agent's destroy must not have its namespace kept alive by a socket.
func Run(ctx context.Context, path, trials string, log *slog.Logger) error {
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
	k := newKeeper(trials)
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
	// byTrial is, for each Trial id, the names held that carry it: keep
	// and prune visit one Trial's, not every Trial's.
	byTrial map[string]map[string]struct{}
	trials  string
	// recs is, for each Trial whose record a pass read, what it found
	// and the record file's identity then; only pruneGone uses it.
	recs map[string]record
}

// record is what a pass read in a Trial's record: created (ok false: no
// record), and the file's inode, size and change time when it was read.
type record struct {
	ino, size int64
	ctime     unix.Timespec
	created   string
}

func newKeeper(trials string) *keeper {
	return &keeper{files: make(map[string]*os.File), created: make(map[string]string),
		byTrial: make(map[string]map[string]struct{}), trials: trials, recs: make(map[string]record)}
}

// pruneGone drops the listeners of Trials whose record is gone or names
// another Trial. The records are read once a Trial and without k.mu, so
// that an agent's put or del (a create or destroy) does not wait for a
// pass over every live Trial's record; a listener put meanwhile under a
// name (another file) is not the one judged, and stays.
func (k *keeper) pruneGone(log *slog.Logger) {
	if k.trials == "" {
		return
	}
	type held struct {
		name, created string
		f             *os.File
	}
	k.mu.Lock()
	byTrial := make(map[string][]held, len(k.byTrial))
	for id, names := range k.byTrial {
		for n := range names {
			if _, ok := trialOf(n); ok {
				byTrial[id] = append(byTrial[id], held{n, k.created[n], k.files[n]})
			}
		}
	}
	k.mu.Unlock()
	for id := range k.recs {
		if _, ok := byTrial[id]; !ok {
			delete(k.recs, id)
		}
	}
	for id, hs := range byTrial {
		created, ok := k.recorded(id)
		k.mu.Lock()
		for _, h := range hs {
			if k.files[h.name] == h.f && (!ok || OtherTrial(h.created, created)) {
				k.drop(h.name)
				log.Info("keeper: dropped the listener of a Trial that is gone", "name", h.name, "created", h.created)
			}
		}
		k.mu.Unlock()
	}
}

// recorded is RecordedCreated, read again only when the record file
// changed since the last pass (another inode, size or change time): at
// 1,000 live Trials a pass otherwise reads and parses 1,000 records
// every 2 s that have not changed. The stat comes before the read, so a
// record replaced between them is read again at the next pass.
func (k *keeper) recorded(id string) (string, bool) {
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(k.trials, id+".json"), &st); err != nil {
		delete(k.recs, id)
		return RecordedCreated(k.trials, id)
	}
	now := record{ino: int64(st.Ino), size: st.Size, ctime: st.Ctim}
	if was, ok := k.recs[id]; ok && was.ino == now.ino && was.size == now.size && was.ctime == now.ctime {
		return was.created, true
	}
	created, ok := RecordedCreated(k.trials, id)
	if ok {
		now.created = created
		k.recs[id] = now
	}
	return created, ok
}

// idle is how long a keeper holding nothing waits for an agent.
const idle = time.Minute

// prune drops the listeners of Trials whose record is gone or names
// another Trial under the same id (it was destroyed and its id reused,
// and this keeper missed the agent's word of it), and ends the keeper
// (cancel) once it has held nothing for idle.
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
		k.pruneGone(log)
		k.mu.Lock()
		n := len(k.files)
		k.mu.Unlock()
		switch {
		case n > 0:
			empty = time.Now()
		case time.Since(empty) > idle:
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
	if id, _ := trialOf(n); id != "" {
		delete(k.byTrial[id], n)
		if len(k.byTrial[id]) == 0 {
			delete(k.byTrial, id)
		}
	}
}

// keep holds f as the listener named n of the Trial created at created
// (""; unknown, or not a Trial's), in place of what it held under that
// name, and of every listener it held for another Trial of the same id;
// k.mu is held.
func (k *keeper) keep(n string, f *os.File, created string) {
	id, ofTrial := trialOf(n)
	if ofTrial && created != "" {
		for m := range k.byTrial[id] {
			if OtherTrial(k.created[m], created) {
				k.drop(m)
			}
		}
	}
	k.drop(n)
	k.files[n] = f
	if created != "" {
		k.created[n] = created
	}
	if id != "" {
		if k.byTrial[id] == nil {
			k.byTrial[id] = make(map[string]struct{})
		}
		k.byTrial[id][n] = struct{}{}
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
		var m msg
		files, err := fdpass.Recv(c, &m)
		if err != nil {
			return false
		}
		reply := msg{Op: "ok", PID: os.Getpid()}
		switch m.Op {
		case "put":
			if len(files) != len(m.Names) {
				closeFiles(files)
				reply = msg{Op: "error", Error: fmt.Sprintf("%d files for %d names", len(files), len(m.Names))}
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
			reply = msg{Op: "error", Error: fmt.Sprintf("unknown op %q", m.Op)}
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
		m := msg{Op: "ok", Names: names[i:j], Created: created[i:j], More: j < len(names), PID: os.Getpid()}
		if err := fdpass.Send(c, m, files[i:j]...); err != nil {
			return err
		}
		if j == len(names) {
			return nil
		}
	}
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}
