//go:build linux

package handover

import (
	"encoding/json"
	"sync"
)

// forwarder queues the records a draining old agent sends on.
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

// recordsBatch keeps a Records message well under a packet socket's send
// buffer (~208 KiB).
const recordsBatch = 64 << 10

func newForwarder() *forwarder {
	return &forwarder{q: make(map[string][]json.RawMessage), wake: make(chan struct{}, 1)}
}

// add queues one line of Trial id's log; the caller may reuse line.
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

// run sends the queued records to s until stop is closed; it returns the
// connection's error, or nil after a last flush once stop is closed.
func (f *forwarder) run(s *Successor, stop <-chan struct{}) error {
	for {
		var last bool
		select {
		case <-f.wake:
		case <-stop:
			last = true
		}
		if err := f.flush(s); err != nil || last {
			return err
		}
	}
}

// flush sends every queued record, in batches.
func (f *forwarder) flush(s *Successor) error {
	f.sendMu.Lock()
	defer f.sendMu.Unlock()
	q, dropped := f.take()
	if dropped > 0 {
		s.log.Warn("records not sent to the successor (it did not keep up); they are in the log, and its counters miss them until its next restart", "records", dropped)
	}
	for id, lines := range q {
		for len(lines) > 0 {
			n, size := 0, 0
			for n < len(lines) && size < recordsBatch {
				size += len(lines[n])
				n++
			}
			if err := s.send(Records{Trial: id, Lines: lines[:n]}); err != nil {
				return err
			}
			lines = lines[n:]
		}
	}
	return nil
}
