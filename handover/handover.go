//go:build linux

// Package handover is the protocol by which a running agent (the old
// agent, the predecessor) hands its listeners to a new agent process (the
// successor) without closing them, over a root-only packet socket
// (internal/fdpass, SCM_RIGHTS). The successor says Hello; the old agent
// Offers its listeners and counts pages, the successor serves them and
// says Serving, and only then does the old agent stop accepting and say
// Stopped. A connection arriving at any moment waits in the kernel's
// accept queue of a socket that stays open throughout, so none is refused.
// The old agent then drains: it serves what it has open until that ends
// or its drain timeout passes, and cuts the rest. From the offer on it
// sends its Records to the successor, which counts them; while it drains
// it tells the successor what it has Open, and applies the successor's
// Allow and Remove, answering each with Done.
//
// Each side keeps the hand-over's State, whose steps are written down
// (transitions); a message out of turn ends it. The old agent's side
// (Give, then (*Successor).Drain) works against a Giver, the new agent's
// (Take, then (*Predecessor).Serve) against a Taker: the agent implements
// both. Checking that the peer is root of this PID namespace is the
// caller's (fdpass.Dial, fdpass.CheckPeer), before either is called.
package handover

import (
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Config is what either side needs besides its peer.
type Config struct {
	// Paths are what the agent holds by path (state, data, pins,
	// namespaces, cgroup parent, socket); an old agent hands over only to
	// a new one with the same.
	Paths map[string]string
	// Log gets what happens; nil: nothing.
	Log *slog.Logger
}

func (c Config) log() *slog.Logger {
	if c.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Log
}

// Timeouts: each step of the offer; the new agent's start (it adopts
// every Trial, which takes well under a second each), which it says it is
// still at every StepTimeout/6; each message sent, so that a peer that
// stops reading holds neither side; an Allow or Remove's answer.
const (
	StepTimeout  = 30 * time.Second
	ServeTimeout = 10 * time.Minute
	sendTimeout  = 10 * time.Second
	askTimeout   = 10 * time.Second
	// cutWait bounds the wait for what a cut ended to write its records.
	cutWait = 10 * time.Second
)

func closeFiles(files []*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}

// awaitExit waits until the process of pidfd has exited (-1: it had when
// its pidfd was asked for).
func awaitExit(pidfd int) {
	if pidfd >= 0 {
		pollEnd(pidfd, -1)
	}
}

// endGrace is how long, in ms, endProcess waits before it kills (-1:
// until the process ends by itself).
var endGrace = 2000

// endProcess waits a moment for the process of pidfd to end (a successor
// that failed closes its copies of the listeners, says why and exits),
// then kills it, and waits (bounded) for its end. It reports whether the
// process has ended: only then are its ledgers and records complete.
func endProcess(pidfd int) bool {
	if pollEnd(pidfd, endGrace) {
		return true
	}
	_ = unix.PidfdSendSignal(pidfd, unix.SIGKILL, nil, 0)
	return pollEnd(pidfd, 5000)
}

// pollEnd waits up to ms milliseconds (-1: no bound) for the process of
// pidfd to end, through the signals this process gets (poll returns
// EINTR on each, whatever SA_RESTART says).
func pollEnd(pidfd, ms int) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	end := time.Now().Add(time.Duration(ms) * time.Millisecond)
	for {
		left := -1
		if ms >= 0 {
			if left = int(time.Until(end).Milliseconds()); left <= 0 {
				return false
			}
		}
		n, err := unix.Poll(fds, left)
		if n > 0 {
			return true
		}
		if err != unix.EINTR {
			return false
		}
	}
}
