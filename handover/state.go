//go:build linux

package handover

import (
	"fmt"
	"sync"
)

// State is where one hand-over is, as either agent sees it. Both move
// through the same states, each when it sends or reads the message that
// makes the step.
type State uint8

const (
	// StateHello: connected; the new agent's hello is sent, or awaited.
	StateHello State = iota
	// StateOffered: the old agent sent (part of) its offer: the new agent may
	// hold copies of its listeners from now on, and adopts its Trials.
	StateOffered
	// StateServing: the new agent serves every listener it was offered.
	StateServing
	// StateStopped: the old agent stopped accepting; it drains, and the new
	// agent follows the drain. The hand-over has happened.
	StateStopped
	// StateDrained: the old agent drained and exits (an end).
	StateDrained
	// StateRefused: the old agent refused the hello; it serves on (an end).
	StateRefused
	// StateFailed: the hand-over ended before the old agent stopped accepting;
	// it serves on, and the new agent must not (an end).
	StateFailed
	// StateLost: the connection ended after the old agent stopped accepting and
	// before it drained: one of the two is gone (an end).
	StateLost
	nStates
)

var stateNames = [nStates]string{"hello", "offered", "serving", "stopped", "drained", "refused", "failed", "lost"}

func (s State) String() string {
	if s < nStates {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", s)
}

// transitions are the only steps a hand-over takes: everything else is a
// protocol error (a second "stopped", a "serving" before the offer, a
// drain that ends before it began). A state with none is an end.
var transitions = map[State][]State{
	StateHello:   {StateOffered, StateRefused, StateFailed},
	StateOffered: {StateServing, StateFailed},
	StateServing: {StateStopped, StateFailed},
	StateStopped: {StateDrained, StateLost},
}

// allowed reports whether a hand-over in from may go to to.
func allowed(from, to State) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// Ended reports whether s is an end: no step leaves it.
func (s State) Ended() bool { return len(transitions[s]) == 0 }

// machine holds one hand-over's State; watchers wait on changed, which
// each step closes and replaces.
type machine struct {
	mu      sync.Mutex
	s       State
	changed chan struct{}
}

func newMachine() *machine { return &machine{changed: make(chan struct{})} }

// to takes the step to next, or says why it may not.
func (m *machine) to(next State) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !allowed(m.s, next) {
		return fmt.Errorf("hand-over protocol: %s cannot follow %s", next, m.s)
	}
	m.s = next
	close(m.changed)
	m.changed = make(chan struct{})
	return nil
}

// end takes the step to whichever end the state allows: StateFailed before
// the old agent stopped accepting, StateLost after. It reports the state the
// hand-over is in, which was an end already if it was ended before.
func (m *machine) end() State { return m.endAs(StateFailed, StateLost) }

// fail ends a hand-over that has not happened (StateFailed), and reports
// the state it is in: one that had happened goes on.
func (m *machine) fail() State { return m.endAs(StateFailed) }

func (m *machine) endAs(ends ...State) State {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, e := range ends {
		if allowed(m.s, e) {
			m.s = e
			close(m.changed)
			m.changed = make(chan struct{})
		}
	}
	return m.s
}

// now is the state, and a channel closed at the next step.
func (m *machine) now() (State, <-chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.s, m.changed
}

func (m *machine) state() State { s, _ := m.now(); return s }
