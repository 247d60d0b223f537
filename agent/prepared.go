//go:build linux

package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/dnsstub"
	"github.com/trialnet/trialnet/sandbox"
	trialspec "github.com/trialnet/trialnet/trial"
	"golang.org/x/sys/unix"
)

// shells keeps Trial shells ready (sandbox.Shell: the part of a Trial
// that does not depend on its description), so that a create takes one
// instead of making a network namespace, its listeners and pool groups.
// One goroutine refills it, one shell at a time, and only while no call
// that changes Trials runs (enter): it does not compete with the
// creates it is there to speed up, nor with destroys. Shells are this process's alone: never recorded, never
// handed over, removed by Close. Beside them it keeps as many Trials'
// files (trialFiles), which a create takes with a shell and a container's
// adoption, which brings its own namespace and cgroup, without one.
type shells struct {
	a  *Agent
	mu sync.Mutex
	// ready are the shells made, of the transparent mode in mode.
	ready []*prepShell
	// files are the Trials' files made.
	files []*trialFiles
	// mode is the transparent mode of the last create: shells are made
	// for that one (a shell of the other is not taken).
	mode atomic.Bool
	// prepare makes a shell (the host's Prepare), prepareFiles a
	// Trial's files; under mu.
	prepare      func(transparent bool) (*prepShell, error)
	prepareFiles func(transparent bool) (*trialFiles, error)
	kickc        chan struct{}
	stopc        chan struct{}
	done         chan struct{}
}

// startShells sweeps what shells of stopped agents left and starts the
// refill. An ephemeral agent (trialnet run) keeps none, as it makes one
// Trial, and leaves the sweep to the daemon's start (a listing of every
// Trial's group) off its path.
func (a *Agent) startShells() {
	s := &shells{a: a, prepare: a.prepareShell, prepareFiles: a.prepareFiles, kickc: make(chan struct{}, 1), stopc: make(chan struct{}), done: make(chan struct{})}
	s.mode.Store(true) // a Trial's default (config.File.Spec)
	a.shells = s
	if a.cfg.Ephemeral {
		close(s.done)
		return
	}
	a.host.SweepShells(pidAlive)
	a.sweepFiles(pidAlive)
	go s.refill()
	s.kick()
}

// pidAlive reports whether process pid exists: a shell it made may be in
// use. Its own shells are never swept (a pid reused by a live process
// only leaves a crashed agent's groups until that process ends).
func pidAlive(pid int) bool {
	return pid == unix.Getpid() || !errors.Is(unix.Kill(pid, 0), unix.ESRCH)
}

// kick wakes the refill; nil (an agent still starting) has none.
func (s *shells) kick() {
	if s == nil {
		return
	}
	select {
	case s.kickc <- struct{}{}:
	default:
	}
}

// take takes a ready shell for a Trial of the given transparent mode,
// or returns nil: the create makes everything itself.
func (s *shells) take(transparent bool) *prepShell {
	defer s.kick()
	s.mode.Store(transparent)
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, sh := range s.ready {
		if sh.sh.Transparent() == transparent {
			s.ready = append(s.ready[:i], s.ready[i+1:]...)
			return sh
		}
	}
	return nil
}

// takeFiles takes a Trial's files made ahead, or returns nil: the
// Trial's are made afresh.
func (s *shells) takeFiles() *trialFiles {
	defer s.kick()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.files) == 0 {
		return nil
	}
	f := s.files[len(s.files)-1]
	s.files = s.files[:len(s.files)-1]
	return f
}

// refill makes shells up to the configured number whenever kicked (a
// create took one, a call ended), and removes those over it or of the
// other mode.
func (s *shells) refill() {
	defer close(s.done)
	for {
		select {
		case <-s.stopc:
			return
		case <-s.kickc:
		}
		if !s.quiet() {
			return
		}
		// One at a time; a call that came meanwhile kicked, and the
		// next shell waits for quiet again.
		for len(s.kickc) == 0 && s.a.calls.Load() == 0 && s.fillOne() {
		}
	}
}

// refillQuiet is how long the agent has had no call that changes Trials
// before the refill makes a shell: a Trial's create is usually followed
// at once by its launch (the caller's work, on the same cores) and, for
// a short command, its destroy; making a shell there would slow both.
const refillQuiet = 20 * time.Millisecond

// quiet waits until nothing kicked for refillQuiet; false once stopped.
func (s *shells) quiet() bool {
	t := time.NewTimer(refillQuiet)
	defer t.Stop()
	for {
		select {
		case <-s.stopc:
			return false
		case <-s.kickc:
			t.Reset(refillQuiet)
		case <-t.C:
			return true
		}
	}
}

// fillOne makes one missing Trial's files or, with none missing, one
// missing shell (dropping the unwanted first); false when there is
// nothing to do or making one failed. The files come first: they are
// cheaper, and an adoption uses them alone.
func (s *shells) fillOne() bool {
	want, mode := s.a.file.Load().PreparedShells(), s.mode.Load()
	s.mu.Lock()
	var dropFiles []*trialFiles
	if len(s.files) > want {
		s.files, dropFiles = s.files[:want], s.files[want:]
	}
	missingFiles, prepareFiles := len(s.files) < want, s.prepareFiles
	s.mu.Unlock()
	for _, f := range dropFiles {
		f.close()
	}
	if missingFiles {
		f, err := prepareFiles(mode)
		if err != nil {
			s.a.log.Warn("a Trial's files could not be prepared; creates make them themselves until they can", "error", err)
			return false
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		select {
		case <-s.stopc:
			f.close() // closed meanwhile
			return false
		default:
		}
		s.files = append(s.files, f)
		return true
	}
	s.mu.Lock()
	var keep, drop []*prepShell
	for _, sh := range s.ready {
		if sh.sh.Transparent() == mode && len(keep) < want {
			keep = append(keep, sh)
		} else {
			drop = append(drop, sh)
		}
	}
	s.ready = keep
	missing, prepare := len(keep) < want, s.prepare
	s.mu.Unlock()
	for _, sh := range drop {
		sh.close()
	}
	if !missing {
		return false
	}
	sh, err := prepare(mode)
	if err != nil {
		s.a.log.Warn("a Trial shell could not be prepared; creates make everything themselves until one can", "error", err)
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.stopc:
		sh.close() // closed meanwhile
		return false
	default:
	}
	s.ready = append(s.ready, sh)
	return true
}

// close stops the refill and removes every ready shell.
func (s *shells) close() {
	s.mu.Lock()
	select {
	case <-s.stopc:
	default:
		close(s.stopc)
	}
	s.mu.Unlock()
	<-s.done
	s.mu.Lock()
	ready, files := s.ready, s.files
	s.ready, s.files = nil, nil
	s.mu.Unlock()
	for _, sh := range ready {
		sh.close()
	}
	for _, f := range files {
		f.close()
	}
}

// shellPool is the address pool a prepared shell's steering is for: the
// stub's default, which every Trial's stub has.
var shellPool = netip.MustParsePrefix(dnsstub.DefaultPoolCIDR)

// prepShell is a ready shell with what the agent adds to it for a
// transparent Trial: the stub's sockets and the steered listener in its
// namespace, and the steering attached there (pinned when taken).
type prepShell struct {
	sh *sandbox.Shell
	tp transparentSockets
}

func (p *prepShell) close() {
	p.tp.close()
	p.sh.Close()
}

// prepareShell makes a shell for Trials of the given transparent mode.
func (a *Agent) prepareShell(transparent bool) (_ *prepShell, err error) {
	sh, err := a.host.Prepare(transparent)
	if err != nil {
		return nil, err
	}
	p := &prepShell{sh: sh}
	if !transparent {
		return p, nil
	}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	if p.tp, err = listenTransparent(sh.NetnsPath()); err != nil {
		return nil, fmt.Errorf("prepare shell %s: %w", sh.Name, err)
	}
	if p.tp.steer, err = bpf.AttachSteer(sh.NetnsPath(), shellPool, p.tp.steered); err != nil {
		return nil, fmt.Errorf("prepare shell %s: %w", sh.Name, err)
	}
	return p, nil
}

// untouched refuses transparent sockets of a shell on which something
// waits: a connection or a datagram, which only a process in its
// namespace can have sent.
func (s transparentSockets) untouched() error {
	type sock struct {
		c    syscall.Conn
		addr net.Addr
	}
	var socks []sock
	if s.udp != nil {
		socks = append(socks, sock{s.udp, s.udp.LocalAddr()})
	}
	for _, l := range []*net.TCPListener{s.tcp, s.steered} {
		if l != nil {
			socks = append(socks, sock{l, l.Addr()})
		}
	}
	for _, x := range socks {
		if n, err := sandbox.Waiting(x.c); err != nil || n > 0 {
			return fmt.Errorf("%d waiting on its transparent socket %s before a create took it (%v)", n, x.addr, err)
		}
	}
	return nil
}

// makeTrial makes lt's sandbox from a ready shell, or, with none or one
// that cannot be used, as Create does: a shell's failure never fails a
// create. A shell's transparent sockets are left in lt.opened.
func (a *Agent) makeTrial(lt *trial) func(trialspec.Spec, sandbox.Endpoint) (*sandbox.Trial, error) {
	return func(spec trialspec.Spec, ep sandbox.Endpoint) (*sandbox.Trial, error) {
		p := a.shells.take(spec.Transparent)
		if p == nil {
			return a.host.Create(spec, ep)
		}
		refused := func(err error) (*sandbox.Trial, error) {
			a.log.Error("a prepared Trial shell was refused; making the Trial afresh", "trial", spec.ID, "shell", p.sh.Name, "error", err)
			p.close()
			return a.host.Create(spec, ep)
		}
		if err := p.tp.untouched(); err != nil {
			return refused(err)
		}
		tr, err := a.host.CreateFrom(p.sh, spec, ep)
		if errors.Is(err, sandbox.ErrShell) {
			return refused(err)
		}
		if err != nil {
			p.tp.close()
			return nil, err
		}
		lt.opened = p.tp
		return tr, nil
	}
}
