//go:build linux

package agent

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/rootdir"
)

// Makers racing for a fresh key all get the one key on disk, and its
// public half matches it; a changed receipt, one signed by another key,
// and a key file that is not one are refused; an indented copy verifies.
func TestReceiptKeyAndVerify(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys", "receipt.key")
	keys := make([]ed25519.PrivateKey, 8)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			k, err := receiptKey(path)
			if err != nil {
				t.Error(err)
			}
			keys[i] = k
		})
	}
	wg.Wait()
	for _, k := range keys[1:] {
		if !k.Equal(keys[0]) {
			t.Fatal("racing makers got different keys")
		}
	}
	pub, err := ReadPublicKey(ReceiptPublicKey(path))
	if err != nil || !pub.Equal(keys[0].Public()) {
		t.Fatalf("the public half does not match the key: %v", err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the key file: %v %v, want mode 0600", fi, err)
	}

	exit := 3
	signed, err := signReceipt(client.Receipt{Schema: client.ReceiptSchema, Trial: "t1", ExitCode: &exit, Verdict: "verdict: 0 direct egress packets (ok)"}, keys[0])
	if err != nil {
		t.Fatal(err)
	}
	if r, err := signed.Verify(pub); err != nil || r.Trial != "t1" || *r.ExitCode != 3 {
		t.Fatalf("verify: %+v, %v", r, err)
	}
	var indented bytes.Buffer
	if err := json.Indent(&indented, signed.Receipt, "", "  "); err != nil {
		t.Fatal(err)
	}
	if _, err := (client.SignedReceipt{Receipt: indented.Bytes(), Signature: signed.Signature, PublicKey: signed.PublicKey}).Verify(pub); err != nil {
		t.Fatalf("an indented copy: %v", err)
	}
	changed := signed
	changed.Receipt = bytes.Replace(signed.Receipt, []byte(`"exit_code":3`), []byte(`"exit_code":0`), 1)
	if _, err := changed.Verify(pub); !errors.Is(err, client.ErrReceiptForged) {
		t.Fatalf("a changed receipt: %v", err)
	}
	_, other, _ := ed25519.GenerateKey(nil)
	forged, _ := signReceipt(client.Receipt{Schema: client.ReceiptSchema, Trial: "t1"}, other)
	if _, err := forged.Verify(pub); !errors.Is(err, client.ErrReceiptForged) {
		t.Fatalf("a receipt signed by another key: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.key")
	if err := os.WriteFile(bad, []byte("not hex\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := receiptKey(bad); err == nil {
		t.Fatal("a key file that is not a key was taken")
	}
}

// The signing key is taken only where no one else could have read or
// planted it: a key file others may read, a symlink, or one in a
// directory others may write is refused (whoever holds or chose the key
// forges every receipt and report). Nothing is made or changed there.
func TestReceiptKeyOnlyOurs(t *testing.T) {
	good := filepath.Join(t.TempDir(), "receipt.key")
	if _, err := receiptKey(good); err != nil {
		t.Fatal(err)
	}
	key, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	readable := filepath.Join(t.TempDir(), "receipt.key")
	if err := os.WriteFile(readable, key, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(readable, 0o644); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	planted := filepath.Join(open, "receipt.key")
	if err := os.WriteFile(planted, key, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "receipt.key")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	for name, path := range map[string]string{"readable by others": readable, "in a world-writable directory": planted, "a symlink": link} {
		if _, err := receiptKey(path); err == nil {
			t.Errorf("a key %s was taken", name)
		}
	}
	if _, err := receiptKey(filepath.Join(open, "new.key")); err == nil {
		t.Error("a key was made in a world-writable directory")
	}
}

// A key directory that is ours is not enough: a directory above it that
// another user may write (or owns) lets them move it aside and put one
// of theirs, with their key, in its place; so does one a symlink on the
// way leads through. A sticky one (/tmp, where the good key above is)
// lets no one else move our entry, and passes.
func TestReceiptKeyDirAncestorsOurs(t *testing.T) {
	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	keys := filepath.Join(open, "keys")
	if err := os.Mkdir(keys, 0o755); err != nil {
		t.Fatal(err)
	}
	sticky := filepath.Join(t.TempDir(), "sticky")
	if err := os.Mkdir(sticky, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sticky, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	underSticky := filepath.Join(sticky, "keys")
	if err := os.Mkdir(underSticky, 0o755); err != nil {
		t.Fatal(err)
	}
	// ours/link -> open/keys: the link's own directory is ours, the
	// directory it leads through is not.
	ours := t.TempDir()
	if err := os.Symlink(keys, filepath.Join(ours, "link")); err != nil {
		t.Fatal(err)
	}
	// open/link -> ours: a link another user may replace.
	if err := os.Symlink(ours, filepath.Join(open, "link")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, path, want string }{
		{"a parent others may write", filepath.Join(keys, "receipt.key"), open + " has mode 0777"},
		{"a missing one beneath such a parent", filepath.Join(keys, "new", "receipt.key"), open + " has mode 0777"},
		{"through a symlink to such a directory", filepath.Join(ours, "link", "receipt.key"), open + " has mode 0777"},
		{"through a symlink in such a directory", filepath.Join(open, "link", "receipt.key"), open + " has mode 0777"},
	} {
		if _, err := receiptKey(tc.path); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s (%s): %v; want refused, saying %q", tc.name, tc.path, err, tc.want)
		}
	}
	if _, err := receiptKey(filepath.Join(underSticky, "receipt.key")); err != nil {
		t.Errorf("a key in a directory of ours beneath a sticky one: %v", err)
	}
	if _, err := receiptKey(filepath.Join(sticky, "receipt.key")); err == nil {
		t.Error("a key directory that is itself sticky and world-writable was taken")
	}
}

// A receipt kept at destroy survives a crash as a whole: WriteFileAtomic
// syncs the receipt and the Trial's directory that names it, and the
// directory's own name in DataDir (made at create) is synced by a sync of
// DataDir begun once the receipt is in place, before keepReceipt returns.
func TestKeepReceiptSyncsTheDataDir(t *testing.T) {
	data := t.TempDir()
	if err := os.Mkdir(filepath.Join(data, "t1"), 0o700); err != nil {
		t.Fatal(err)
	}
	a := &Agent{cfg: AgentConfig{DataDir: data}}
	var synced []string
	a.dataSync.sync = func(dir string) error {
		b, _ := os.ReadFile(filepath.Join(data, "t1", "receipt.json"))
		synced = append(synced, fmt.Sprintf("%s, the receipt %q", dir, b))
		return rootdir.SyncDir(dir)
	}
	if err := a.keepReceipt("t1", []byte("signed"), 0); err != nil {
		t.Fatal(err)
	}
	if want := []string{data + `, the receipt "signed"`}; !slices.Equal(synced, want) {
		t.Errorf("syncs %q, want %q", synced, want)
	}
}

// A sync of DataDir begun after the Trial's directory was made (the
// ticket its dataMade keeps, as syncDataAhead's after a create) is
// enough for its receipt; one begun before it is not.
func TestKeepReceiptTakesASyncBegunAfterTheDirectory(t *testing.T) {
	data := t.TempDir()
	a := &Agent{cfg: AgentConfig{DataDir: data}}
	syncs := 0
	a.dataSync.sync = func(dir string) error {
		syncs++
		return rootdir.SyncDir(dir)
	}
	for _, before := range []bool{false, true} {
		id := fmt.Sprintf("t-%v", before)
		if before { // a sync done, then the directory made
			if err := a.dataSync.after(data, a.dataSync.ticket()); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Mkdir(filepath.Join(data, id), 0o700); err != nil {
			t.Fatal(err)
		}
		made := a.dataSync.ticket() + 1
		if !before { // the directory made, then a sync begun
			if err := a.dataSync.after(data, made-1); err != nil {
				t.Fatal(err)
			}
		}
		n := syncs
		if err := a.keepReceipt(id, []byte("signed"), made); err != nil {
			t.Fatal(err)
		}
		if want := map[bool]int{false: n, true: n + 1}[before]; syncs != want {
			t.Errorf("a sync of DataDir done before the directory was made: %v; keepReceipt synced %d times, want %d", before, syncs-n, want-n)
		}
	}
}

// Callers that wait while a sync runs share the next one: a sync begun
// after a caller's ticket is enough for it, one begun before is not.
func TestDirSyncShared(t *testing.T) {
	dir := t.TempDir()
	var s dirSync
	var n atomic.Int32
	var arm atomic.Bool // the next sync is held until hold is closed
	hold, holding := make(chan struct{}), make(chan struct{})
	s.sync = func(string) error {
		n.Add(1)
		if arm.CompareAndSwap(true, false) {
			holding <- struct{}{}
			<-hold
		}
		return nil
	}
	t0 := s.ticket()
	if err := s.after(dir, t0); err != nil || n.Load() != 1 {
		t.Fatalf("a first caller: %d syncs, %v; want 1", n.Load(), err)
	}
	if err := s.after(dir, t0); err != nil || n.Load() != 1 {
		t.Fatalf("a caller whose ticket is older than the sync done: %d syncs, %v; want that one", n.Load(), err)
	}
	t1 := s.ticket()
	errs := make(chan error, 3)
	arm.Store(true)
	go func() { errs <- s.after(dir, t1) }()
	<-holding // the second sync runs
	t2 := s.ticket()
	for range 2 {
		go func() { errs <- s.after(dir, t2) }()
	}
	close(hold)
	for range 3 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n.Load() != 3 {
		t.Errorf("two callers that came during a sync begun before their ticket: %d syncs in all, want 3 (that one, and one they share)", n.Load())
	}
}

// BenchmarkKeepReceipt: a receipt kept at destroy as the build before
// kept it (WriteFileAtomic into the Trial's directory) and as keepReceipt
// does (the same, then DataDir synced), each into a directory made just
// before, as at create, alternating in one loop under the same load.
func BenchmarkKeepReceipt(b *testing.B) {
	before, after := b.TempDir(), b.TempDir()
	a := &Agent{cfg: AgentConfig{DataDir: after}}
	data := bytes.Repeat([]byte("x"), 2500)
	var tb, ta []time.Duration
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprint(i)
		for _, d := range []string{before, after} {
			if err := os.Mkdir(filepath.Join(d, id), 0o700); err != nil {
				b.Fatal(err)
			}
		}
		old := func() {
			t0 := time.Now()
			if err := rootdir.WriteFileAtomic(filepath.Join(before, id, "receipt.json"), data, 0o644); err != nil {
				b.Fatal(err)
			}
			tb = append(tb, time.Since(t0))
		}
		kept := func() {
			t0 := time.Now()
			if err := a.keepReceipt(id, data, 0); err != nil {
				b.Fatal(err)
			}
			ta = append(ta, time.Since(t0))
		}
		if i%2 == 0 {
			old()
			kept()
		} else {
			kept()
			old()
		}
	}
	med := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds()) / 1000
	}
	mb, ma := med(tb), med(ta)
	b.ReportMetric(mb, "before-p50-ms")
	b.ReportMetric(ma, "after-p50-ms")
	b.ReportMetric(ma/mb, "after/before")
}
