package record

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// fullDisk writes to f, but from the failAt-th write on only the first
// part bytes of each, with ENOSPC, until it is given room again.
type fullDisk struct {
	f      *os.File
	writes int
	failAt int
	part   int
	room   bool
}

func (d *fullDisk) Write(b []byte) (int, error) {
	d.writes++
	if d.writes < d.failAt || d.room {
		return d.f.Write(b)
	}
	n, _ := d.f.Write(b[:min(d.part, len(b))])
	return n, errors.New("no space left on device")
}

// A record the disk had no room for is counted as unwritten, and a part
// of it the disk did take leaves no more than its own line unreadable:
// the next record, written once there is room again, is read whole. A
// Trial that fills the disk the decision log is on (its uid's files share
// it) had a refusal's record torn, and the next one glued to it and lost
// too, behind a receipt that signed the log as it was.
func TestWriterTornRecordLosesOnlyItself(t *testing.T) {
	path := filepath.Join(t.TempDir(), "decisions.jsonl")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	disk := &fullDisk{f: f, failAt: 2, part: 10}
	w := NewWriter(disk)
	ev := func(target string) *Event {
		return &Event{Schema: EventSchema, Trial: "t", Target: target, Decision: DecisionDeny, Reason: ReasonPolicyDenied}
	}
	if err := w.Write(ev("first.test:443"), nil); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(ev("torn.test:443"), nil); err == nil {
		t.Fatal("a write the disk refused reported no error")
	}
	disk.part = 0
	if err := w.Write(ev("lost.test:443"), nil); err == nil {
		t.Fatal("a write the disk refused reported no error")
	}
	disk.room = true
	if err := w.Write(ev("after.test:443"), nil); err != nil {
		t.Fatal(err)
	}
	recs, err := ReadFile(path)
	if len(recs) != 2 || recs[0].Target != "first.test:443" || recs[1].Target != "after.test:443" {
		t.Fatalf("records read %+v (%v): want first.test and after.test", recs, err)
	}
	if err == nil {
		t.Fatal("the torn record's line read without an error")
	}
	if got := w.Unwritten(); got != 2 {
		t.Fatalf("%d records counted unwritten, want 2", got)
	}
}

// ReadFile (audit --from) reads regular files only: a FIFO at the path it
// is given would hang it, and /dev/zero fill its memory. Seen red with
// the mode check taken out: the FIFO's read blocked the test.
func TestReadFileRegularOnly(t *testing.T) {
	dir := t.TempDir()
	fifo, zero := filepath.Join(dir, "fifo"), filepath.Join(dir, "zero")
	if err := errors.Join(syscall.Mkfifo(fifo, 0o600), os.Symlink("/dev/zero", zero)); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{fifo, zero} {
		if recs, err := ReadFile(p); err == nil || !strings.Contains(err.Error(), "not a regular file") || !strings.Contains(err.Error(), "give the decisions.jsonl file itself") {
			t.Errorf("ReadFile(%s) = %d records, %v: want it refused as not a regular file, the file to give named", p, len(recs), err)
		}
	}
	// A missing log is one: the advice to give the file itself is not for it.
	if _, err := ReadFile(filepath.Join(dir, "none")); !errors.Is(err, os.ErrNotExist) || strings.Contains(err.Error(), "give the") {
		t.Errorf("ReadFile of a missing file: %v, want it said missing and no more", err)
	}
}
