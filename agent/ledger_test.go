//go:build linux

package agent

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/record"
)

// asDead rewrites this process's ledger of Trial id as if a process that
// has ended (pid, and a start time no process has) had written it.
func asDead(t *testing.T, dir, id string, pid int) {
	t.Helper()
	path := ledgerPath(dir, id, os.Getpid())
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint64(b[8:], uint64(pid))
	binary.LittleEndian.PutUint64(b[16:], 1) // started at boot's first tick: not this process
	if err := os.WriteFile(ledgerPath(dir, id, pid), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if pid != os.Getpid() {
		_ = os.Remove(path)
	}
}

// A ledger keeps the tunnels open now; those of a process that is gone
// come back as records of their cut, once, and a live process's ledger
// (this one's) is left alone.
func TestLedgerRecordsLostTunnels(t *testing.T) {
	dir := t.TempDir()
	l, err := openLedger(dir, "lt1", 4)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now().Add(-time.Minute).UTC()
	ev := func(target string) *record.Event {
		return &record.Event{Schema: record.EventSchema, ID: "id-" + target, Time: start, Trial: "lt1", Method: "CONNECT",
			Target: target, Host: strings.Split(target, ":")[0], Port: 443, Decision: record.DecisionAllow, Rule: target}
	}
	doneA := l.Open(ev("a.example.com:443"))
	l.Open(ev("b.example.com:443"))
	doneA()
	if evs, err := lostTunnels(dir, "lt1"); err != nil || len(evs) != 0 {
		t.Fatalf("a live process's ledger read as lost: %v %v", evs, err)
	}
	asDead(t, dir, "lt1", 1<<22-1) // above pid_max's default: no process
	evs, err := lostTunnels(dir, "lt1")
	if err != nil || len(evs) != 1 {
		t.Fatalf("lost tunnels: %+v %v; want b.example.com's alone", evs, err)
	}
	got := evs[0]
	if got.Target != "b.example.com:443" || got.Decision != record.DecisionAllow || !strings.Contains(got.Detail, "ended without closing it") ||
		!got.Time.Equal(start) || got.Duration < time.Minute {
		t.Errorf("the lost tunnel's record: %+v", got)
	}
	if evs, _ := lostTunnels(dir, "lt1"); len(evs) != 0 {
		t.Errorf("read twice: %+v", evs)
	}
	l.remove()
}

// A ledger left under this process's own pid by a process that had it
// before (another start time) is that process's, and lost.
func TestLedgerOfAReusedPid(t *testing.T) {
	dir := t.TempDir()
	l, err := openLedger(dir, "lt2", 2)
	if err != nil {
		t.Fatal(err)
	}
	l.Open(&record.Event{Schema: record.EventSchema, ID: "x", Time: time.Now(), Trial: "lt2", Method: "CONNECT", Target: "c.example.com:443"})
	asDead(t, dir, "lt2", os.Getpid())
	if evs, err := lostTunnels(dir, "lt2"); err != nil || len(evs) != 1 {
		t.Errorf("a dead process's ledger under this pid: %+v %v", evs, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "lt2.open."+strconv.Itoa(os.Getpid()))); !os.IsNotExist(err) {
		t.Errorf("it was not removed: %v", err)
	}
}
