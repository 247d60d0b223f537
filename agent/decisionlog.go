package agent

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/trialnet/trialnet/record"
)

// Bounds of a Trial's refusals by target, and of a watcher's backlog.
const (
	maxRefusedTargets = 256
	otherTargets      = record.OtherTargets
	topRefused        = 5
	watchBacklog      = 256
)

// decisionLog is one Trial's decision records as the agent keeps them:
// the file they are appended to, the watchers following them live, and
// the Trial's refusals counted by target. Its zero value keeps no file.
type decisionLog struct {
	mu   sync.Mutex
	file *os.File       // decisions.jsonl; nil without a DataDir
	w    *record.Writer // writes to file
	// refused counts refusals by target, at most maxRefusedTargets of
	// them; the rest under otherTargets.
	refused  map[string]uint64
	watchers map[chan record.Event]struct{}
	ended    bool // no more records: watchers are closed and none are added
}

// open starts appending to the file at path, and returns its size: what
// a restarted agent's Trial wrote already counts against its bound. A
// file whose last record an agent crash cut short is ended with a
// newline first, so that the next record starts a line of its own and
// only the torn one is unreadable.
func (l *decisionLog) open(path string) (int64, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return 0, err
	}
	size := st.Size()
	var last [1]byte
	if size > 0 {
		if _, err := f.ReadAt(last[:], size-1); err == nil && last[0] != '\n' {
			if _, err := f.Write([]byte{'\n'}); err != nil {
				_ = f.Close()
				return 0, err
			}
			size++
		}
	}
	l.mu.Lock()
	l.file, l.w = f, record.NewWriter(f)
	l.mu.Unlock()
	return size, nil
}

// close stops writing the file; records after it are still counted.
func (l *decisionLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.file != nil {
		_ = l.file.Close()
		l.file, l.w = nil, nil
	}
}

// add counts a record, hands it to the watchers and appends its line
// (see proxy.Sink) to the file.
func (l *decisionLog) add(ev *record.Event, line []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.count(ev)
	for ch := range l.watchers {
		select {
		case ch <- *ev:
		default: // a watcher that does not keep up loses events, never the proxy its pace
		}
	}
	if l.w == nil {
		return nil
	}
	return l.w.Write(ev, line)
}

// replay counts the records of a re-adopted Trial's file at path, so
// that its counters continue across an agent restart as the kernel's
// do, and returns the proxy's counters rebuilt from them. Unreadable
// records are left out, and returned as the error beside the counters.
func (l *decisionLog) replay(path string) (*record.TrialStats, error) {
	recs, err := record.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	st := &record.TrialStats{}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range recs {
		st.Add(&recs[i])
		l.count(&recs[i])
	}
	return st, err
}

// count adds a refusal, or the refusals a summary record stands for, to
// the refusals by target; l.mu is held.
func (l *decisionLog) count(ev *record.Event) {
	switch ev.Decision {
	case record.DecisionAllow, record.DecisionPolicyChange:
	case record.DecisionSuppressed:
		if ev.Suppressed != nil {
			for target, n := range ev.Suppressed.Refused {
				l.countRefused(target, n)
			}
		}
	default:
		l.countRefused(ev.Target, 1)
	}
}

func (l *decisionLog) countRefused(target string, n uint64) {
	if l.refused == nil {
		l.refused = make(map[string]uint64)
	}
	if _, ok := l.refused[target]; !ok && len(l.refused) >= maxRefusedTargets {
		target = otherTargets
	}
	l.refused[target] += n
}

// topRefused is the Trial's most refused targets, most first.
func (l *decisionLog) topRefused() []TargetCount {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]TargetCount, 0, len(l.refused))
	for t, n := range l.refused {
		out = append(out, TargetCount{t, n})
	}
	slices.SortFunc(out, func(x, y TargetCount) int {
		if x.Count != y.Count {
			return int(y.Count) - int(x.Count)
		}
		return strings.Compare(x.Target, y.Target)
	})
	return out[:min(len(out), topRefused)]
}

// watch calls fn with each record as it is added, until ctx ends or the
// log ends (after the Trial's last record). A watcher that falls more
// than watchBacklog records behind loses the excess.
func (l *decisionLog) watch(ctx context.Context, fn func(record.Event)) error {
	ch := make(chan record.Event, watchBacklog)
	l.mu.Lock()
	if l.ended {
		l.mu.Unlock()
		return nil
	}
	if l.watchers == nil {
		l.watchers = make(map[chan record.Event]struct{})
	}
	l.watchers[ch] = struct{}{}
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.watchers, ch)
		l.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev, ok := <-ch:
			if !ok {
				return nil
			}
			fn(ev)
		}
	}
}

// end closes every watcher once the Trial makes no more decisions.
func (l *decisionLog) end() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ended {
		return
	}
	l.ended = true
	for ch := range l.watchers {
		close(ch)
		delete(l.watchers, ch)
	}
}
