//go:build linux

package ledger

import (
	"encoding/binary"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/trialnet/trialnet/internal/testkit"
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
	l, err := Create(dir, "lt1", 4)
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
	if evs, err := Lost(dir, "lt1"); err != nil || len(evs) != 0 {
		t.Fatalf("a live process's ledger read as lost: %v %v", evs, err)
	}
	asDead(t, dir, "lt1", 1<<22-1) // above pid_max's default: no process
	evs, err := Lost(dir, "lt1")
	if err != nil || len(evs) != 1 {
		t.Fatalf("lost tunnels: %+v %v; want b.example.com's alone", evs, err)
	}
	got := evs[0]
	if got.Target != "b.example.com:443" || got.Decision != record.DecisionAllow || !strings.Contains(got.Detail, "ended without closing it") ||
		!got.Time.Equal(start) || got.Duration < time.Minute {
		t.Errorf("the lost tunnel's record: %+v", got)
	}
	if evs, _ := Lost(dir, "lt1"); len(evs) != 0 {
		t.Errorf("read twice: %+v", evs)
	}
	l.Remove()
}

// A ledger left under this process's own pid by a process that had it
// before (another start time) is that process's, and lost.
func TestLedgerOfAReusedPid(t *testing.T) {
	dir := t.TempDir()
	l, err := Create(dir, "lt2", 2)
	if err != nil {
		t.Fatal(err)
	}
	l.Open(&record.Event{Schema: record.EventSchema, ID: "x", Time: time.Now(), Trial: "lt2", Method: "CONNECT", Target: "c.example.com:443"})
	asDead(t, dir, "lt2", os.Getpid())
	if evs, err := Lost(dir, "lt2"); err != nil || len(evs) != 1 {
		t.Errorf("a dead process's ledger under this pid: %+v %v", evs, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "lt2.ledgers", strconv.Itoa(os.Getpid()))); !os.IsNotExist(err) {
		t.Errorf("it was not removed: %v", err)
	}
}

// A record the ledger's slot cannot hold whole, whatever its strings
// hold, is trimmed to fit and still read back: the plain-HTTP target full
// of '<' (six bytes of JSON each) was once not kept at all. What
// identifies the request (its decision, start, a prefix of its target and
// rule) comes back, and the record says it was trimmed.
func TestLedgerTrimsWhatDoesNotFit(t *testing.T) {
	many := make([]netip.Addr, 300)
	for i := range many {
		many[i] = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(i)})
	}
	long := func(s string, n int) string { return strings.Repeat(s, n/len(s)) }
	cases := []struct {
		name string
		ev   func(*record.Event)
	}{
		{"target of '<'", func(e *record.Event) { e.Target = "http://echo.test:9001/" + long("<", 1000) }},
		{"target of '&' and '>'", func(e *record.Event) { e.Target = "http://echo.test:9001/" + long("&>", 1000) }},
		{"control characters", func(e *record.Event) { e.Target = "/" + long("\x01\x1f\x7f", 1000) }},
		{"invalid UTF-8", func(e *record.Event) { e.Target = "/" + long("\xff\xc3", 1000) }},
		{"four-byte characters", func(e *record.Event) { e.Target = "/" + long("𝄞é\u2028", 1900) }},
		{"every string long", func(e *record.Event) {
			e.Target, e.Method, e.SNI = "/"+long("<", 1000), long("\"", 500), long("\\", 300)
			e.Host, e.Rule, e.Profile, e.Client = long("a.", 253), "*."+long("b<", 250)+":80", long("p&", 300), long("c>", 100)
			e.Detail, e.Resolved = long("d<", 6000), many
		}},
		{"many addresses", func(e *record.Event) { e.Resolved = many }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l, err := Create(dir, "tr1", 2)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Remove()
			start := time.Now().Add(-time.Minute).UTC()
			ev := record.Event{Schema: record.EventSchema, ID: "id-1", Time: start, Trial: "tr1", Method: "GET",
				Target: "http://echo.test:9001/", Host: "echo.test", Port: 9001, Decision: record.DecisionAllow,
				Reason: record.ReasonAllowed, Rule: "echo.test:9001", Client: "127.0.0.1:3128"}
			tc.ev(&ev)
			if whole, _ := ev.AppendJSON(nil); len(whole) <= ledgerSlot-8 {
				t.Fatalf("the case fits its slot whole (%d bytes): it tests nothing", len(whole))
			}
			l.Open(&ev)
			asDead(t, dir, "tr1", 1<<22-2)
			evs, err := Lost(dir, "tr1")
			if err != nil || len(evs) != 1 {
				t.Fatalf("lost tunnels: %d %v; want the one kept", len(evs), err)
			}
			got := evs[0]
			if got.Decision != record.DecisionAllow || !got.Time.Equal(start) || got.Port != ev.Port || got.Trial != "tr1" ||
				!strings.Contains(got.Detail, "trimmed to fit the ledger") {
				t.Errorf("the trimmed record: %+v", got)
			}
			if !keptPrefix(t, got.Target, ev.Target, 64) || !keptPrefix(t, got.Rule, ev.Rule, 64) {
				t.Errorf("target %q, rule %q: not a prefix of the request's (%.40q…, %.40q…)", got.Target, got.Rule, ev.Target, ev.Rule)
			}
		})
	}
}

// keptPrefix says whether got is want, as JSON reads it back, or a
// prefix of at least n bytes of it marked with want's length.
func keptPrefix(t *testing.T, got, want string, n int) bool {
	mark := "…[" + strconv.Itoa(len(want)) + " bytes]"
	want = testkit.JSONRoundTrip(t, want)
	if got == want {
		return true
	}
	p, ok := strings.CutSuffix(got, mark)
	return ok && strings.HasPrefix(want, p) && len(p) >= min(n, len(want))
}

// FuzzLedgerSlot: whatever a Trial puts in a record's strings, its slot
// line fits, is valid JSON, reads back with its decision and start, and
// each string is whole or a marked prefix, short enough that the log's
// own clip leaves it alone.
func FuzzLedgerSlot(f *testing.F) {
	f.Add("http://echo.test/"+strings.Repeat("<", 1000), "echo.test", "echo.test:80", "GET", "", 3)
	f.Add(strings.Repeat("\xff", 1500), strings.Repeat("\u2028", 300), strings.Repeat("\"\\", 400), "\x00\b\f", "𝄞", 0)
	f.Add(strings.Repeat("é<", 700), "", strings.Repeat("&", 2000), strings.Repeat("\x7f", 900), strings.Repeat("\t", 700), 40)
	f.Fuzz(func(t *testing.T, target, host, rule, method, sni string, addrs int) {
		for _, s := range []string{target, host, rule, method, sni} {
			for i := 0; i < len(s); {
				_, n := utf8.DecodeRuneInString(s[i:])
				if b, _ := json.Marshal(s[i : i+n]); escapedLen(s[i:i+n]) != len(b)-2 {
					t.Fatalf("escapedLen(%q) = %d, encoding/json writes %s", s[i:i+n], escapedLen(s[i:i+n]), b)
				}
				i += n
			}
		}
		start := time.Unix(1_700_000_000, 123456789).UTC()
		ev := record.Event{Schema: record.EventSchema, ID: "id", Time: start, Trial: "fz", Method: method, Target: target,
			Host: host, Rule: rule, SNI: sni, Detail: target + rule, Port: 80, Decision: record.DecisionAllow, Reason: record.ReasonAllowed}
		for i := range addrs % 200 {
			ev.Resolved = append(ev.Resolved, netip.AddrFrom16([16]byte{0x20, 0x01, 15: byte(i)}))
		}
		line, err := slotLine(&ev, ledgerSlot-8)
		if err != nil || len(line) > ledgerSlot-8 || !json.Valid(line) {
			t.Fatalf("slot line of %d bytes, valid %v: %v\n%s", len(line), json.Valid(line), err, line)
		}
		var got record.Event
		if err := got.UnmarshalJSON(line); err != nil {
			t.Fatalf("read back: %v\n%s", err, line)
		}
		if got.Decision != ev.Decision || !got.Time.Equal(start) || got.Port != ev.Port {
			t.Fatalf("what identifies the request is gone: %+v", got)
		}
		trimmed := got.Detail == ledgerTrimmed
		for _, f := range []struct{ got, want string }{{got.Target, target}, {got.Host, host}, {got.Rule, rule}, {got.Method, method}, {got.SNI, sni}} {
			whole := f.got == testkit.JSONRoundTrip(t, f.want)
			if !whole && (!trimmed || !(f.got == "" || keptPrefix(t, f.got, f.want, 0)) || len(f.got) > record.MaxRecordField) {
				t.Fatalf("%q is neither %.60q whole nor a marked prefix of it (trimmed %v)", f.got, f.want, trimmed)
			}
		}
	})
}

// An earlier agent's ledger, named <id>.open.<pid> beside every other
// Trial's files, is found once moved into the Trial's directory.
func TestLedgerMovesLegacy(t *testing.T) {
	dir := t.TempDir()
	l, err := Create(dir, "lt3", 2)
	if err != nil {
		t.Fatal(err)
	}
	l.Open(&record.Event{Schema: record.EventSchema, ID: "x", Time: time.Now(), Trial: "lt3", Method: "CONNECT", Target: "d.example.com:443"})
	dead := 1<<22 - 2
	asDead(t, dir, "lt3", dead)
	legacy := filepath.Join(dir, "lt3.open."+strconv.Itoa(dead))
	if err := os.Rename(ledgerPath(dir, "lt3", dead), legacy); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "lt3.json"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := MoveLegacy(dir); err != nil {
		t.Fatal(err)
	}
	if evs, err := Lost(dir, "lt3"); err != nil || len(evs) != 1 || evs[0].Target != "d.example.com:443" {
		t.Errorf("the moved ledger's tunnels: %+v %v", evs, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "lt3.json")); err != nil {
		t.Errorf("another file was moved: %v", err)
	}
}

// A Trial's ledger directory that is a symlink (planted where the state
// directory is one a uid-0 Trial can write, which it is when configured
// outside the hidden /run/trialnet) is not followed: the agent, root
// outside the Trial, would otherwise create and truncate a file wherever
// it leads, read and remove every file there, or move a legacy ledger
// into it. Nor is a ledger that is a symlink read.
func TestLedgerFollowsNoSymlink(t *testing.T) {
	dir, victim := t.TempDir(), t.TempDir()
	keep := filepath.Join(victim, "precious")
	if err := os.WriteFile(keep, []byte("not a ledger"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Planted again before each step: one that removes it must not hide
	// what the next does.
	plant := func() {
		_ = os.Remove(trialDir(dir, "t1"))
		if err := os.Symlink(victim, trialDir(dir, "t1")); err != nil {
			t.Fatal(err)
		}
	}
	plant()
	if l, err := Create(dir, "t1", 1); err == nil {
		l.Remove()
		t.Errorf("a ledger was created through the symlinked directory")
	}
	plant()
	if _, err := Lost(dir, "t1"); err == nil {
		t.Errorf("Lost read the symlinked directory without an error")
	}
	// A legacy ledger is moved into no symlinked directory.
	plant()
	legacy := filepath.Join(dir, "t1.open.42")
	if err := os.WriteFile(legacy, []byte(ledgerMagic), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := MoveLegacy(dir); err == nil {
		t.Errorf("MoveLegacy moved into the symlinked directory without an error")
	}
	plant()
	// A ledger that is a symlink, in a real directory.
	if err := os.Mkdir(trialDir(dir, "t2"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(keep, filepath.Join(trialDir(dir, "t2"), "43")); err != nil {
		t.Fatal(err)
	}
	if _, err := Lost(dir, "t2"); err == nil {
		t.Errorf("Lost read a symlinked ledger without an error")
	}
	ents, _ := os.ReadDir(victim)
	if b, err := os.ReadFile(keep); err != nil || string(b) != "not a ledger" || len(ents) != 1 {
		t.Errorf("the directory the symlinks lead to was changed: %q, %v, %d entries", b, err, len(ents))
	}
	RemoveAll(dir, "t1")
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("RemoveAll reached through the symlink: %v", err)
	}
}

// A file already at this process's ledger's name (a hard link a uid-0
// Trial planted to a file of the same file system, a stale ledger) is
// replaced, never truncated and written through.
func TestLedgerWritesThroughNoPlantedFile(t *testing.T) {
	dir := t.TempDir()
	keep := filepath.Join(dir, "precious")
	if err := os.WriteFile(keep, []byte("not a ledger"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(trialDir(dir, "t1"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(keep, ledgerPath(dir, "t1", os.Getpid())); err != nil {
		t.Fatal(err)
	}
	l, err := Create(dir, "t1", 1)
	if err != nil {
		t.Fatal(err)
	}
	l.Remove()
	if b, err := os.ReadFile(keep); err != nil || string(b) != "not a ledger" {
		t.Errorf("the file linked at the ledger's name was written: %d bytes, %v", len(b), err)
	}
}

// A tunnel's record lists the first 16 of its name's addresses and says
// how many there were (record.Clip). Kept in a ledger, the record lost
// the count: the tunnel's record kept only the 16 (Event.SetResolved),
// and its cut, read back, listed them as if they were all. The note
// comes back with it; a detail of any other kind is not kept, as before.
func TestLedgerKeepsHowManyAddresses(t *testing.T) {
	dir := t.TempDir()
	l, err := Create(dir, "lt6", 2)
	if err != nil {
		t.Fatal(err)
	}
	many := make([]netip.Addr, 40)
	for i := range many {
		many[i] = netip.AddrFrom4([4]byte{93, 184, 0, byte(i)})
	}
	ev := &record.Event{Schema: record.EventSchema, ID: "x", Time: time.Now(), Trial: "lt6", Method: "CONNECT", Target: "many.example.com:443",
		Decision: record.DecisionAllow}
	ev.SetResolved(many)
	l.Open(ev)
	up := &record.Event{Schema: record.EventSchema, ID: "y", Time: time.Now(), Trial: "lt6", Method: "CONNECT", Target: "up.example.com:443",
		Decision: record.DecisionAllow, Detail: "through the upstream proxy 192.0.2.1:3128, which resolved the name"}
	l.Open(up)
	asDead(t, dir, "lt6", 1<<22-1)
	evs, err := Lost(dir, "lt6")
	if err != nil || len(evs) != 2 {
		t.Fatalf("lost tunnels: %+v %v", evs, err)
	}
	for _, got := range evs {
		record.Clip(&got) // as the proxy records it
		switch got.Target {
		case ev.Target:
			if len(got.Resolved) != 16 || !strings.HasSuffix(got.Detail, "ended without closing it (killed or crashed); its byte counts are unknown; resolved to 40 addresses, the first 16 recorded") {
				t.Errorf("the cut of a tunnel to a name of 40 addresses: %d listed, detail %q", len(got.Resolved), got.Detail)
			}
		default:
			if strings.Contains(got.Detail, "upstream proxy") {
				t.Errorf("another detail kept: %q", got.Detail)
			}
		}
	}
}
