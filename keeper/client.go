//go:build linux

package keeper

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/trialnet/trialnet/internal/fdpass"
)

// Client is the agent's side of the keeper.
type Client struct {
	path   string
	trials string // the state directory, where the keeper sees which Trials are gone
	spawn  bool   // start a keeper when none answers
	log    *slog.Logger
	mu     sync.Mutex // one exchange at a time
}

// NewClient is an agent's client of the keeper at path; trials is the
// agent's state directory, which a keeper it starts reads to drop the
// listeners of Trials that are gone; spawn starts a keeper when none
// answers.
func NewClient(path, trials string, spawn bool, log *slog.Logger) *Client {
	return &Client{path: path, trials: trials, spawn: spawn, log: log}
}

// Path is the keeper's socket.
func (k *Client) Path() string { return k.path }

// dial connects to the keeper, starting one if none answers and spawning
// is on.
func (k *Client) dial() (*net.UnixConn, error) {
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

// Ensure starts a keeper now if none answers (and spawning is on), so
// that the first Trial's listeners are kept.
func (k *Client) Ensure() {
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
func (k *Client) exchange(m msg, files []*os.File) (map[string]*os.File, map[string]string, error) {
	got, created, _, err := k.exchangeMsg(m, files)
	return got, created, err
}

// Held asks the keeper how many listeners it holds (starting one if none
// answers and spawning is on).
func (k *Client) Held() (int, error) {
	_, _, r, err := k.exchangeMsg(msg{Op: "ping"}, nil)
	return r.N, err
}

func (k *Client) exchangeMsg(m msg, files []*os.File) (map[string]*os.File, map[string]string, msg, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	c, err := k.dial()
	if err != nil {
		return nil, nil, msg{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if err := fdpass.Send(c, m, files...); err != nil {
		return nil, nil, msg{}, err
	}
	got, created := make(map[string]*os.File), make(map[string]string)
	for {
		var r msg
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
			return nil, nil, msg{}, err
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

// Put gives the keeper its copies of the named listeners; created are
// their Trials' creation times (TrialCreated; nil, or "" for a listener
// of no Trial).
func (k *Client) Put(names, created []string, lns []net.Listener) {
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
	k.PutFiles(names, created, files)
}

// PutFiles is Put for sockets given as files (a UDP socket is no
// listener); the caller closes them.
func (k *Client) PutFiles(names, created []string, files []*os.File) {
	for i := 0; i < len(files); i += fdpass.MaxFiles {
		j := min(i+fdpass.MaxFiles, len(files))
		m := msg{Op: "put", Names: names[i:j]}
		if created != nil {
			m.Created = created[i:j]
		}
		if _, _, err := k.exchange(m, files[i:j]); err != nil {
			k.log.Warn("keeper: listeners not kept; if this agent dies, connections to them are refused until it is back", "error", err)
			return
		}
	}
}

// Del drops the named listeners, and those whose names start with prefix.
func (k *Client) Del(prefix string, names ...string) {
	if _, _, err := k.exchange(msg{Op: "del", Prefix: prefix, Names: names}, nil); err != nil {
		k.log.Warn("keeper: listeners not dropped", "error", err)
	}
}

// Fetch takes copies of every listener the keeper holds, and the
// creation times of their Trials where it knows them; none answering is
// no error (nothing was kept).
func (k *Client) Fetch() (map[string]*os.File, map[string]string, error) {
	c, err := fdpass.Dial(k.path)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	_ = c.Close()
	return k.exchange(msg{Op: "get"}, nil)
}

// Stop asks the keeper at path to close everything it holds and
// exit; none answering is no error.
func Stop(path string) error {
	k := &Client{path: path, log: slog.New(slog.DiscardHandler)}
	c, err := fdpass.Dial(path)
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
		return nil
	}
	if err != nil {
		return err
	}
	_ = c.Close()
	_, _, err = k.exchange(msg{Op: "quit"}, nil)
	return err
}

func listenerFile(ln net.Listener) (*os.File, error) {
	f, ok := ln.(interface{ File() (*os.File, error) })
	if !ok {
		return nil, fmt.Errorf("a %T cannot be handed over", ln)
	}
	return f.File()
}
