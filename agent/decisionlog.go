package agent

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"sync"

	"github.com/trialnet/trialnet/record"
)

// Bounds of a Trial's refusals shown, and of a watcher's backlog.
const (
	topRefused   = 5
	watchBacklog = 256
)

// decisionLog is one Trial's decision records as the agent keeps them:
// the file they are appended to and the watchers following them live.
// Its zero value keeps no file.
type decisionLog struct {
	mu       sync.Mutex
	file     *os.File       // decisions.jsonl; nil without a DataDir
	w        *record.Writer // writes to file
	watchers map[chan record.Event]struct{}
	ended    bool // no more records: watchers are closed and none are added
	// unwritten are the records writes to file failed for, by this
	// process, as of its close.
	unwritten uint64
	// fwd, if set, gets each record's line once written: a draining
	// agent's successor counts them (see forward).
	fwd func(line []byte)
	// own are the keys (idKey) of the records written since forwarding
	// began at size from, until the hand-over ends (nil: none kept; at
	// most its 10 minutes of records at the Trial's rates): the others
	// the file holds past from are the successor's (strangers).
	own  map[uint64]struct{}
	from int64
}

// forward sends each record written from now on to fn as well (nil:
// no more), and returns the file's size at that moment: every record
// before it is in the file, every one after goes to fn too.
func (l *decisionLog) forward(fn func(line []byte)) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fwd, l.own, l.from = fn, nil, 0
	if l.file == nil {
		return 0
	}
	st, err := l.file.Stat()
	if err != nil {
		return 0
	}
	if fn != nil {
		l.own, l.from = make(map[uint64]struct{}), st.Size()
	}
	return st.Size()
}

// handedOver stops keeping the ids of the records written: the
// successor serves, and strangers is not asked for.
func (l *decisionLog) handedOver() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.own = nil
}

// strangers are the records in the file since forwarding began that
// this process did not write: a successor's, which served the Trial
// beside this process until its hand-over failed. A line it left torn
// is ended, so that this process's next record starts its own.
func (l *decisionLog) strangers() ([]record.Event, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.file == nil || l.own == nil {
		return nil, nil
	}
	st, err := l.file.Stat()
	if err != nil {
		return nil, err
	}
	// Read counts lines from the section's start: the name says where.
	name := fmt.Sprintf("%s past byte %d", l.file.Name(), l.from)
	evs, err := record.Read(io.NewSectionReader(l.file, l.from, st.Size()-l.from), name)
	// A successor killed mid-write left its last line torn: this
	// process's next record would be glued to it, unreadable.
	if endTornLine(l.file, st.Size()) == lineTorn {
		l.unwritten += l.w.Unwritten()
		l.w = record.NewTornWriter(l.file)
	}
	out := evs[:0]
	for _, ev := range evs {
		if _, mine := l.own[idKey(ev.ID)]; !mine {
			out = append(out, ev)
		}
	}
	return out, err
}

// observe hands a record that another process wrote to the watchers.
func (l *decisionLog) observe(ev *record.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.notify(ev)
}

func (l *decisionLog) notify(ev *record.Event) {
	for ch := range l.watchers {
		select {
		case ch <- *ev:
		default: // a watcher that does not keep up loses events, never the proxy its pace
		}
	}
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
	return l.openFile(f)
}

// openFile is open with the file opened (read, write and append), which
// the log owns from here.
func (l *decisionLog) openFile(f *os.File) (int64, error) {
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return 0, err
	}
	size := st.Size()
	w := record.NewWriter(f)
	switch endTornLine(f, size) {
	case lineEnded:
		size++
	case lineTorn:
		w = record.NewTornWriter(f)
	}
	l.mu.Lock()
	l.file, l.w = f, w
	l.mu.Unlock()
	return size, nil
}

// What endTornLine found at a file's end.
const (
	lineWhole = iota // nothing, or a whole line
	lineEnded        // a torn line, now ended with a newline
	lineTorn         // a torn line, whose newline could not be written
)

// endTornLine ends with a newline the last line of f (size bytes) if a
// process killed mid-write left it torn.
func endTornLine(f *os.File, size int64) int {
	var last [1]byte
	if size == 0 {
		return lineWhole
	}
	if _, err := f.ReadAt(last[:], size-1); err != nil || last[0] == '\n' {
		return lineWhole
	}
	if _, err := f.Write([]byte{'\n'}); err != nil {
		// The disk full: the first record that fits ends the line
		// first; the Trial is not lost for it.
		return lineTorn
	}
	return lineEnded
}

// close stops writing the file.
func (l *decisionLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.file != nil {
		l.unwritten += l.w.Unwritten()
		_ = l.file.Close()
		l.file, l.w = nil, nil
	}
}

// lost is how many records could not be written to the file.
func (l *decisionLog) lost() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.unwritten
	if l.w != nil {
		n += l.w.Unwritten()
	}
	return n
}

// add hands a record to the watchers and appends its line (see
// record.Sink) to the file.
func (l *decisionLog) add(ev *record.Event, line []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.notify(ev)
	if l.fwd != nil && line == nil {
		line, _ = ev.AppendJSON(nil)
	}
	var err error
	if l.w != nil {
		err = l.w.Write(ev, line)
	}
	if l.own != nil {
		l.own[idKey(ev.ID)] = struct{}{}
	}
	if l.fwd != nil && line != nil {
		l.fwd(line)
	}
	return err
}

// replay rebuilds a re-adopted Trial's proxy counters from its file at
// path (its first upTo bytes; < 0: all), so that they continue across an agent restart as the kernel's
// do. Unreadable records are left out, and returned as the error beside
// the counters.
func replay(path string, upTo int64) (*record.TrialStats, error) {
	st := &record.TrialStats{}
	err := record.ScanFilePrefix(path, upTo, func(ev *record.Event) {
		st.Add(ev)
		st.CountWritten(ev)
	})
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	return st, err
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

// endWatchers ends every watcher of every Trial: after a hand-over they
// follow the Trial to the new agent (client.Client.Watch).
func (a *Agent) endWatchers() {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, lt := range a.trials {
		lt.log.end()
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

// idKey is what the own set keeps of a record's id: 8 bytes of its hash
// rather than the string, as a Trial refused at its record rate through
// a long hand-over adds one a refusal. The ids are the agent's random
// ones, so two that share a key are as likely as guessing 64 bits.
func idKey(id string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(id))
	return h.Sum64()
}
