//go:build linux

package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/sandbox"
)

// defaultRetentionEvery is how often the retention rule runs on a timer,
// besides at start, after a reload and after each destroy.
const defaultRetentionEvery = time.Hour

// trashPrefix marks data being removed: an entry is renamed to it under
// a.mu (so no Trial can take its id in between), then removed. A crash in
// between leaves it for the next sweep.
const trashPrefix = ".retention-"

// retainer runs the retention sweeps of one agent on one goroutine.
type retainer struct {
	kick   chan struct{}
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// dataEntry is what one destroyed (or live) Trial left in the data
// directory: <id>, or <id>.<unixnano> for the data of an earlier Trial
// with the same id.
type dataEntry struct {
	name string    // the directory's name
	id   string    // the Trial's id
	at   time.Time // when the Trial's data was last written
}

// startRetention applies the rule once and starts the sweeper.
func (a *Agent) startRetention() {
	if a.cfg.DataDir == "" {
		return
	}
	a.sweep()
	every := a.cfg.RetentionEvery
	if every <= 0 {
		every = defaultRetentionEvery
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.ret.kick, a.ret.cancel = make(chan struct{}, 1), cancel
	a.ret.wg.Add(1)
	go func() {
		defer a.ret.wg.Done()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			case <-a.ret.kick:
			}
			a.sweep()
		}
	}()
}

// soon asks for a sweep; requests made while one is pending are one.
func (r *retainer) soon() {
	if r.kick == nil {
		return
	}
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

func (r *retainer) stop() {
	if r.cancel != nil {
		r.cancel()
		r.wg.Wait()
	}
}

// sweep applies the configured retention rule to the data directory.
func (a *Agent) sweep() {
	var rule config.Retention
	if f := a.file.Load(); f != nil {
		rule = f.Retention
	}
	if rule == (config.Retention{}) {
		return // no rule: keep everything, without listing the directory
	}
	removed, err := a.applyRetention(rule, time.Now())
	if len(removed) > 0 {
		a.log.Info("retention: removed the data of destroyed Trials", "entries", removed, "keep_days", rule.KeepDays, "keep_trials", rule.KeepTrials)
	}
	if err != nil {
		a.log.Error("retention", "error", err)
	}
}

// applyRetention removes the data of destroyed Trials that rule does not
// keep: entries older than KeepDays days, and entries beyond the
// KeepTrials newest. A live Trial's directory is neither counted nor
// removed, and nothing but Trial data directories is touched.
func (a *Agent) applyRetention(rule config.Retention, now time.Time) ([]string, error) {
	dir := a.cfg.DataDir
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", dir, err)
	}
	var errs []error
	var data []dataEntry
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), trashPrefix) && e.IsDir() {
			errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
			continue
		}
		id, ok := trialDataName(e.Name())
		if !ok || !e.IsDir() || a.registered(id) && id == e.Name() {
			continue
		}
		at, err := dataTime(filepath.Join(dir, e.Name()))
		if err != nil {
			continue // removed meanwhile
		}
		data = append(data, dataEntry{e.Name(), id, at})
	}
	var removed []string
	for _, d := range expired(data, rule, now) {
		ok, err := a.removeData(d)
		if ok {
			removed = append(removed, d.name)
		}
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

// expired returns the entries rule removes, given every destroyed
// Trial's entry.
func expired(data []dataEntry, rule config.Retention, now time.Time) []dataEntry {
	// Newest first; equal times by name, so the choice is stable.
	slices.SortFunc(data, func(x, y dataEntry) int {
		if c := y.at.Compare(x.at); c != 0 {
			return c
		}
		return cmp.Compare(x.name, y.name)
	})
	var out []dataEntry
	for i, d := range data {
		tooOld := rule.KeepDays > 0 && now.Sub(d.at) > time.Duration(rule.KeepDays)*24*time.Hour
		tooMany := rule.KeepTrials > 0 && i >= rule.KeepTrials
		if tooOld || tooMany {
			out = append(out, d)
		}
	}
	return out
}

// trialDataName parses a data directory entry's name: <id> or
// <id>.<unixnano>.
func trialDataName(name string) (string, bool) {
	id := name
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		if _, err := strconv.ParseUint(name[i+1:], 10, 64); err != nil {
			return "", false
		}
		id = name[:i]
	}
	return id, sandbox.ValidID(id) == nil
}

// dataTime is when a Trial's data was last written: its stats.json (the
// moment it was destroyed), else (an agent died before writing it) the
// newer of its directory and its decision log.
func dataTime(dir string) (time.Time, error) {
	if st, err := os.Stat(filepath.Join(dir, "stats.json")); err == nil {
		return st.ModTime(), nil
	}
	st, err := os.Stat(dir)
	if err != nil {
		return time.Time{}, err
	}
	at := st.ModTime()
	if lst, err := os.Stat(filepath.Join(dir, "decisions.jsonl")); err == nil && lst.ModTime().After(at) {
		at = lst.ModTime()
	}
	return at, nil
}

func (a *Agent) registered(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.trials[id]
	return ok
}

// removeData removes one entry, unless it has become a live Trial's
// directory: the check and the rename out of the way happen under a.mu,
// which Create holds to take an id.
func (a *Agent) removeData(d dataEntry) (bool, error) {
	dir := a.cfg.DataDir
	trash := filepath.Join(dir, trashPrefix+d.name)
	a.mu.Lock()
	if _, live := a.trials[d.id]; live && d.name == d.id {
		a.mu.Unlock()
		return false, nil
	}
	err := os.Rename(filepath.Join(dir, d.name), trash)
	a.mu.Unlock()
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return true, os.RemoveAll(trash)
}
