package record

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/trialnet/trialnet/internal/rootdir"
)

// Writer writes decision records as JSON lines, each in one write call
// under a lock, so that records from concurrent writers never interleave
// mid-line. A record a failed write left in part (the disk full) is
// ended with a newline before the next one, so that only its own line is
// unreadable; the records not written are counted (Unwritten).
type Writer struct {
	mu        sync.Mutex
	w         io.Writer
	buf       []byte
	torn      bool   // the last write left part of a record, with no newline
	unwritten uint64 // records a write failed for
}

// NewWriter returns a Writer to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// NewTornWriter returns a Writer to w, which ends in part of a record
// whose newline could not be written yet: its first record starts with
// one.
func NewTornWriter(w io.Writer) *Writer { return &Writer{w: w, torn: true} }

// Write writes ev's line (as a Sink gets it), or ev encoded when line is
// nil, and a newline.
func (w *Writer) Write(ev *Event, line []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var err error
	if line == nil {
		if line, err = ev.AppendJSON(nil); err != nil {
			return fmt.Errorf("decision record %s not written: %w", ev.ID, err)
		}
	}
	w.buf = w.buf[:0]
	if w.torn {
		w.buf = append(w.buf, '\n')
	}
	lead := len(w.buf)
	w.buf = append(append(w.buf, line...), '\n')
	n, err := w.w.Write(w.buf)
	switch {
	case err == nil:
		w.torn = false
		return nil
	case n > lead:
		w.torn = true
	case n == lead:
		w.torn = false // the newline went out, nothing of the record
	}
	w.unwritten++
	return err
}

// Unwritten is how many records a write failed for.
func (w *Writer) Unwritten() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.unwritten
}

// ReadFile reads a decision log: every record it can, and an error for
// the lines it cannot (a torn write, a record of a newer schema) naming
// the first of them. A record is never half-read.
func ReadFile(path string) ([]Event, error) { return ReadFilePrefix(path, -1) }

// ReadFilePrefix is ReadFile of the first n bytes of the file (n < 0: all
// of it): the records another process had written by a moment it knows
// the file's size at.
func ReadFilePrefix(path string, n int64) ([]Event, error) {
	var out []Event
	err := ScanFilePrefix(path, n, func(ev *Event) { out = append(out, *ev) })
	return out, err
}

// ScanFilePrefix is ReadFilePrefix with each record handed to fn as it
// is read (Scan), none of them kept.
func ScanFilePrefix(path string, n int64, fn func(*Event)) error {
	// audit --from reads a path it is given.
	f, err := rootdir.OpenRegular(path)
	if errors.Is(err, rootdir.ErrNotRegular) {
		return fmt.Errorf("decision log: %w: give the decisions.jsonl file itself", err)
	}
	if err != nil {
		return fmt.Errorf("decision log: %w", err)
	}
	defer f.Close()
	var r io.Reader = f
	if n >= 0 {
		r = io.LimitReader(f, n)
	}
	return Scan(r, path, fn)
}

// Read is ReadFile of what r reads, a part of the file at path that
// starts at a record (path names it in errors, with lines counted from
// r's start).
func Read(r io.Reader, path string) ([]Event, error) {
	var out []Event
	err := Scan(r, path, func(ev *Event) { out = append(out, *ev) })
	return out, err
}

// Scan is Read with each record handed to fn as it is read, valid only
// during the call, and none kept: a Trial's whole log (64 MiB, 117,120
// records here) held 121 MiB of the agent's heap while a restart rebuilt
// its counters from it.
func Scan(r io.Reader, path string, fn func(*Event)) error {
	var (
		first error
		bad   int
	)
	br := bufio.NewReader(r)
	for n := 1; ; n++ {
		line, rerr := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			var ev Event
			if err := json.Unmarshal(line, &ev); err != nil {
				if bad++; first == nil {
					first = fmt.Errorf("%s line %d: %w", path, n, err)
				}
			} else {
				fn(&ev)
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			return fmt.Errorf("read %s: %w", path, rerr)
		}
	}
	if bad > 1 {
		first = fmt.Errorf("%w (and %d more unreadable lines)", first, bad-1)
	}
	return first
}
