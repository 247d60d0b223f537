//go:build linux

package keeper

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/trialnet/trialnet/internal/lname"
)

// writeRecord writes Trial id's record in dir, created at, in place (the
// same inode when it exists), as a record of this build names it.
func writeRecord(t testing.TB, dir, id string, at time.Time) {
	t.Helper()
	rec := fmt.Sprintf(`{"phase":"live","trial":{"id":%q,"created":%q,"schema":1}}`, id, at.UTC().Format(time.RFC3339Nano))
	if err := os.WriteFile(filepath.Join(dir, id+".json"), []byte(rec), 0o600); err != nil {
		t.Fatal(err)
	}
}

// holdFor makes k hold a listener (any file) of Trial id created at.
func holdFor(t testing.TB, k *keeper, id string, at time.Time) string {
	t.Helper()
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	n := lname.EndpointName(id, 0).String()
	k.mu.Lock()
	k.keep(n, f, TrialCreated(at))
	k.mu.Unlock()
	t.Cleanup(k.closeAll)
	return n
}

// A pass reads a record again once it changed, even rewritten in place
// to the same size (another Trial under the same id, created at another
// time of the same length), and drops the listener of the Trial gone;
// a record that did not change keeps its listener through every pass.
func TestPruneRereadsAChangedRecord(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	k := newKeeper(dir)
	first := time.Date(2026, 12, 6, 5, 0, 0, 111111111, time.UTC)
	writeRecord(t, dir, "a", first)
	writeRecord(t, dir, "b", first)
	na, nb := holdFor(t, k, "a", first), holdFor(t, k, "b", first)
	for range 2 {
		k.pruneGone(log)
		if k.files[na] == nil || k.files[nb] == nil {
			t.Fatal("a pass dropped the listener of a live Trial")
		}
	}
	// The change time moves with the kernel's clock tick (4 ms at most
	// on the kernels we run): the rewrite comes after one.
	time.Sleep(20 * time.Millisecond)
	writeRecord(t, dir, "a", first.Add(time.Second))
	k.pruneGone(log)
	if k.files[na] != nil {
		t.Error("a pass kept the listener of a Trial whose record, rewritten in place, names another Trial")
	}
	if err := os.Remove(filepath.Join(dir, "b.json")); err != nil {
		t.Fatal(err)
	}
	k.pruneGone(log)
	if k.files[nb] != nil {
		t.Error("a pass kept the listener of a Trial whose record is gone")
	}
	if len(k.recs) != 0 {
		t.Errorf("the pass still remembers the records of Trials it holds nothing for: %v", k.recs)
	}
}

// BenchmarkPrune times the keeper's pass over 1,000 live Trials' records
// that do not change, as the pass reads them (cached) and as it read
// them before it remembered them (every record read and parsed: the
// reference, side by side in one run).
func BenchmarkPrune(b *testing.B) {
	dir := b.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	k := newKeeper(dir)
	at := time.Now()
	for i := range 1000 {
		id := fmt.Sprintf("t%04d", i)
		writeRecord(b, dir, id, at)
		holdFor(b, k, id, at)
	}
	for _, mode := range []string{"reread", "cached"} {
		b.Run(mode, func(b *testing.B) {
			for range b.N {
				if mode == "reread" {
					clear(k.recs)
				}
				k.pruneGone(log)
			}
			if len(k.files) != 1000 {
				b.Fatalf("%d listeners held, want 1000", len(k.files))
			}
		})
	}
}
