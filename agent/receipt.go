//go:build linux

package agent

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/rootdir"
	"github.com/trialnet/trialnet/sandbox"
)

// DefaultReceiptKey is the host's receipt signing key (ed25519, PKCS#8
// free: the 64 bytes of the private key, hex). Only root reads it; its
// public half is beside it, ReceiptPublicKey(path), for anyone.
const DefaultReceiptKey = "/var/lib/trialnet/receipt.key"

// signReceipt encodes r once and signs those bytes.
func signReceipt(r client.Receipt, key ed25519.PrivateKey) (client.SignedReceipt, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return client.SignedReceipt{}, err
	}
	return client.SignedReceipt{Receipt: b, Signature: ed25519.Sign(key, b), PublicKey: key.Public().(ed25519.PublicKey)}, nil
}

// warmSigner has the tables the first ed25519 key derivation and
// signature of a process build (~1.5 ms of CPU) made in the background,
// while the Trial's command runs: a one-shot run otherwise builds them
// at its end, on the way to its exit. It touches no key.
var warmSigner = sync.OnceFunc(func() {
	go ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))
})

// warmEncoders has encoding/json build its encoders of a Trial's state
// record and of the receipt in the background (by reflection, ~1 ms of
// CPU together, at their first use in a process): an embedded agent's one
// Trial would otherwise build them on its way to its command and to its
// exit. It encodes zero values, of no Trial.
func warmEncoders() {
	go func() {
		_, _ = json.Marshal(sandbox.Record{})
		_, _ = json.Marshal(client.Receipt{})
	}()
}

// ReceiptPublicKey is where the public half of the key at path is kept.
func ReceiptPublicKey(path string) string { return path + ".pub" }

// receiptKey reads the host's signing key at path, making it the first
// time, and keeps its public half beside it true to it (written, or
// repaired, from the key on disk: two makers racing never leave one that
// does not match).
func receiptKey(path string) (ed25519.PrivateKey, error) {
	if err := keyDirOurs(filepath.Dir(path)); err != nil {
		return nil, err
	}
	key, err := readKey(path)
	if errors.Is(err, os.ErrNotExist) {
		if err = makeKey(path); err == nil {
			// What was missing of the directory is checked now that it
			// is there: another user may have made it first.
			err = keyDirOurs(filepath.Dir(path))
		}
		if err == nil {
			key, err = readKey(path) // the winner's, if another maker won
		}
	}
	if err != nil {
		return nil, err
	}
	pub := hex.EncodeToString(key.Public().(ed25519.PublicKey))
	if b, err := os.ReadFile(ReceiptPublicKey(path)); err != nil || string(bytes.TrimSpace(b)) != pub {
		if err := rootdir.WriteFileAtomic(ReceiptPublicKey(path), []byte(pub+"\n"), 0o644); err != nil {
			return nil, fmt.Errorf("write the receipt public key: %w", err)
		}
	}
	return key, nil
}

// keyDirOurs refuses a key directory that another user may write, or
// may swap: a key planted there, or one of theirs made in its place,
// would sign receipts and reports that verify. Every directory the
// kernel crosses to reach it is checked (keyPathOurs), those a symlink
// on the way leads through among them. A missing one is made by us.
func keyDirOurs(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("the receipt key's directory %s: %w", dir, err)
	}
	return keyPathOurs(dir, abs, 0)
}

// maxKeyLinks bounds the symlinks keyPathOurs follows, as the kernel's
// own limit (40) bounds a lookup.
const maxKeyLinks = 40

// keyPathOurs checks path (absolute, clean) from the root down: each
// directory on it is ours (uid 0 or this process's) and writable by no
// one else, but that an ancestor may be sticky (/tmp), where no one else
// may move or remove the entry of ours below it; the last, the key's
// own, must not be writable by anyone else at all. A symlink is followed
// as the kernel would (links counts those followed); one whose target
// climbs with ".." is refused rather than resolved by hand. dir is the
// directory as configured, for messages.
func keyPathOurs(dir, path string, links int) error {
	refuse := func(format string, a ...any) error {
		return fmt.Errorf("the receipt key's directory %s: %s: another user could plant or replace the key there and forge receipts; keep the key in a directory whose every ancestor is root's and writable by root alone (or sticky, as /tmp)", dir, fmt.Sprintf(format, a...))
	}
	var parent unix.Stat_t
	if err := unix.Lstat("/", &parent); err != nil {
		return fmt.Errorf("the receipt key's directory %s: %w", dir, err)
	}
	if why := notOurs(&parent, path == "/"); why != "" {
		return refuse("/ %s", why)
	}
	cur := "/"
	parts := strings.Split(strings.TrimPrefix(path, "/"), "/")
	for i, name := range parts {
		if name == "" {
			continue
		}
		next := filepath.Join(cur, name)
		var st unix.Stat_t
		err := unix.Lstat(next, &st)
		switch {
		case errors.Is(err, unix.ENOENT):
			return nil // made by us, beneath directories checked
		case err != nil:
			return fmt.Errorf("the receipt key's directory %s: %w", dir, err)
		case st.Mode&unix.S_IFMT == unix.S_IFLNK:
			if links++; links > maxKeyLinks {
				return refuse("more than %d symlinks on the way", maxKeyLinks)
			}
			target, err := os.Readlink(next)
			if err != nil {
				return fmt.Errorf("the receipt key's directory %s: %w", dir, err)
			}
			if slices.Contains(strings.Split(target, "/"), "..") {
				return refuse("the symlink %s leads to %s, climbing with ..", next, target)
			}
			if !filepath.IsAbs(target) {
				target = filepath.Join(cur, target)
			}
			return keyPathOurs(dir, filepath.Join(append([]string{target}, parts[i+1:]...)...), links)
		case st.Mode&unix.S_IFMT != unix.S_IFDIR:
			return refuse("%s is not a directory", next)
		}
		if why := notOurs(&st, i == len(parts)-1); why != "" {
			return refuse("%s %s", next, why)
		}
		cur = next
	}
	return nil
}

// notOurs says why a directory with st is not ours alone ("": it is);
// last: it is the key's own, where sticky is no excuse.
func notOurs(st *unix.Stat_t, last bool) string {
	switch {
	case st.Uid != 0 && int(st.Uid) != os.Geteuid():
		return fmt.Sprintf("is uid %d's", st.Uid)
	case st.Mode&0o022 != 0 && (last || st.Mode&unix.S_ISVTX == 0):
		return fmt.Sprintf("has mode %04o (group or others may write it)", st.Mode&0o7777)
	}
	return ""
}

// readKey reads the key at path, which must be ours and no one else's
// to read: a regular file, not a symlink, with no group or other access.
func readKey(path string) (ed25519.PrivateKey, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return nil, &os.PathError{Op: "lstat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() || st.Mode&0o077 != 0 {
		return nil, fmt.Errorf("the receipt key %s is not a file of uid %d's with mode 0600 (it is uid %d's, mode %o): someone else may have read or planted it; remove it, and the next Trial's end makes a new one", path, os.Geteuid(), st.Uid, st.Mode)
	}
	k, err := readHex(path, ed25519.PrivateKeySize)
	if errors.Is(err, errNotKey) {
		return nil, fmt.Errorf("the receipt key %s is not an ed25519 key in hex: remove it, and the next Trial's end makes a new one", path)
	}
	return ed25519.PrivateKey(k), err
}

var errNotKey = errors.New("not a key")

// maxKeyFile bounds what readHex reads: a key in hex is 129 bytes.
const maxKeyFile = 4096

// readHex reads a key of size bytes, in hex, from path.
func readHex(path string, size int) ([]byte, error) {
	// A regular file only: verify --key reads a path it is given.
	f, err := rootdir.OpenRegular(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxKeyFile))
	if err != nil {
		return nil, err
	}
	k, err := hex.DecodeString(string(bytes.TrimSpace(b)))
	if err != nil || len(k) != size {
		return nil, errNotKey
	}
	return k, nil
}

// makeKey writes a new key whole to a temporary file and links it into
// place, which fails if another maker's is there first: a key is never
// seen half written, and never replaced.
func makeKey(path string) error {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("make the receipt key: %w", err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".receipt-key-*")
	if err != nil {
		return fmt.Errorf("make the receipt key: %w", err)
	}
	defer os.Remove(f.Name())
	_, err = io.WriteString(f, hex.EncodeToString(priv)+"\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		if err = os.Link(f.Name(), path); errors.Is(err, os.ErrExist) {
			err = nil
		}
	}
	if err == nil {
		// The link is the directory's: a key lost to a crash after it
		// signed receipts would leave them unverifiable.
		err = rootdir.SyncDir(filepath.Dir(path))
	}
	if err != nil {
		return fmt.Errorf("make the receipt key: %w", err)
	}
	return nil
}

// DigestLog is the digest of the decision log at path, nil if there is
// none. It reads a regular file only: verify, as root, may be pointed at
// a FIFO or a device, which would hang it or never end.
func DigestLog(path string) (*client.LogDigest, error) {
	f, err := rootdir.OpenRegular(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("the decision log: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return nil, err
	}
	return &client.LogDigest{SHA256: hex.EncodeToString(h.Sum(nil)), Bytes: n}, nil
}

// ReportSignature signs a whole run report: every field beside the
// receipt a report carries (its exit code, verdict, counters, summary) is
// the CLI's copy, and so is signed too, with the same host key.
type ReportSignature struct {
	Signature []byte `json:"signature"`
	PublicKey []byte `json:"public_key"`
}

// reportDomain starts what a report's signature covers. The host key
// signs receipts too, and a receipt is JSON, so it never starts so: a
// report's canonical bytes, set out as a receipt, never verify as one
// (nor a receipt's as a report).
const reportDomain = "trialnet run report v1\n"

// SignReport signs b, a report's canonical bytes, with the host key at
// keyPath (made the first time).
func SignReport(keyPath string, b []byte) (ReportSignature, error) {
	key, err := receiptKey(keyPath)
	if err != nil {
		return ReportSignature{}, fmt.Errorf("sign the report: %w", err)
	}
	return ReportSignature{Signature: ed25519.Sign(key, append([]byte(reportDomain), b...)), PublicKey: key.Public().(ed25519.PublicKey)}, nil
}

// Verify checks s over b against the host key pub.
func (s ReportSignature) Verify(pub ed25519.PublicKey, b []byte) error {
	if !bytes.Equal(s.PublicKey, pub) || !ed25519.Verify(pub, append([]byte(reportDomain), b...), s.Signature) {
		return fmt.Errorf("%w: the report's own fields (exit code, verdict, counters, summary) are not what trialnet wrote, or another host's key signed them", client.ErrReceiptForged)
	}
	return nil
}

// ReadPublicKey reads a receipt public key (hex) from path.
func ReadPublicKey(path string) (ed25519.PublicKey, error) {
	k, err := readHex(path, ed25519.PublicKeySize)
	if errors.Is(err, errNotKey) {
		return nil, fmt.Errorf("%s is not an ed25519 public key in hex", path)
	}
	return ed25519.PublicKey(k), err
}

// sign makes the receipt of a Trial just torn down, signs it, keeps it in
// the Trial's data directory and gives it to st. An agent without a key
// (made by hand, as in tests) signs nothing.
func (a *Agent) sign(lt *trial, st *client.Stats, exit *int) error {
	if a.cfg.ReceiptKey == "" {
		return nil
	}
	key, err := receiptKey(a.cfg.ReceiptKey)
	if err != nil {
		return fmt.Errorf("sign the Trial's receipt: %w", err)
	}
	host, _ := os.Hostname()
	r := client.Receipt{Schema: client.ReceiptSchema, Trial: st.Trial, Nonce: lt.info.Nonce, Host: host, Start: lt.info.Created, End: time.Now().UTC(), ExitCode: exit,
		Learning: st.Learning, Verdict: st.Verdict, Kernel: st.Kernel, Proxy: st.Proxy, DNS: st.DNS, Pools: st.Pools, Layers: st.Layers,
		Programs: a.host.BPF.ProgramTags()}
	if a.cfg.DataDir != "" {
		if r.DecisionLog, err = DigestLog(a.decisionLog(st.Trial)); err != nil {
			return fmt.Errorf("digest the decision log for the receipt: %w", err)
		}
		if r.DecisionLog != nil {
			r.DecisionLog.Unwritten = lt.log.lost()
		}
	}
	signed, err := signReceipt(r, key)
	if err != nil {
		return err
	}
	st.Receipt = &signed
	if a.cfg.DataDir == "" {
		return nil
	}
	b, err := json.MarshalIndent(signed, "", "  ")
	if err != nil {
		return err
	}
	return a.keepReceipt(st.Trial, append(b, '\n'), lt.dataMade)
}

// endedLogSigned refuses the decision log of an ended Trial that is not
// the one its kept receipt was signed with: truncated, rotated or edited
// after the Trial ended, it would read as a whole and clean account. A
// Trial still in the registry (live, or ending) is still being written;
// one that ended without a receipt (no key, or removed at an agent's
// start) has nothing to hold its log to.
func (a *Agent) endedLogSigned(id string) error {
	a.mu.Lock()
	_, present := a.trials[id]
	a.mu.Unlock()
	if present || a.cfg.ReceiptKey == "" {
		return nil
	}
	path := filepath.Join(a.cfg.DataDir, id, "receipt.json")
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var s client.SignedReceipt
	if err == nil {
		err = json.Unmarshal(b, &s)
	}
	pub, kerr := ReadPublicKey(ReceiptPublicKey(a.cfg.ReceiptKey))
	var r client.Receipt
	if err = errors.Join(err, kerr); err == nil {
		r, err = s.Verify(pub)
	}
	if err != nil {
		return errf(client.CodeInternal, "Trial %q's receipt %s cannot be checked (%v), so neither can its decision log: read the log as it is with 'trialnet audit --from %s'", id, path, err, a.decisionLog(id))
	}
	// Another Trial's receipt verifies as well, and holds its own log.
	if r.Trial != id {
		return errf(client.CodeInternal, "the receipt %s is Trial %q's, not %q's: files were moved between Trials' directories after they ended, so the decision log there is no account of %q; read it as it is with 'trialnet audit --from %s'",
			path, r.Trial, id, id, a.decisionLog(id))
	}
	d, err := DigestLog(a.decisionLog(id))
	switch {
	case err != nil:
		return errf(client.CodeInternal, "digest Trial %q's decision log: %v", id, err)
	case r.DecisionLog == nil && d != nil:
		return errf(client.CodeInternal, "Trial %q's receipt was signed when it had no decision log, so the one there now (%d bytes) was put there after the Trial ended and is no account of it; read it as it is with 'trialnet audit --from %s'",
			id, d.Bytes, a.decisionLog(id))
	case r.DecisionLog == nil:
		return nil
	case d != nil && d.Bytes > r.DecisionLog.Bytes && signedPrefix(a.decisionLog(id), r.DecisionLog):
		// Not only an edit: a predecessor that did not confirm it ended
		// the Trial's connections at the destroy appends their records
		// after the receipt (DestroyExit warns of it).
		return errf(client.CodeInternal, "Trial %q's decision log is not the one its receipt was signed with: its first %d bytes are, and %d more were added after the Trial ended, by an edit or by a draining predecessor agent (the agent warned at the destroy if it did not confirm ending the Trial's connections), so its records are no account of the Trial; 'trialnet verify %s' says the same; read it as it is with 'trialnet audit --from %s' (the signed records are the first %d bytes)",
			id, r.DecisionLog.Bytes, d.Bytes-r.DecisionLog.Bytes, path, a.decisionLog(id), r.DecisionLog.Bytes)
	case d == nil || d.SHA256 != r.DecisionLog.SHA256 || d.Bytes != r.DecisionLog.Bytes:
		var now int64
		if d != nil {
			now = d.Bytes
		}
		return errf(client.CodeInternal, "Trial %q's decision log is not the one its receipt was signed with (%d bytes signed, %d now): it was changed after the Trial ended (truncated, rotated or edited), so its records are no account of the Trial; 'trialnet verify %s' says the same; read it as it is with 'trialnet audit --from %s'",
			id, r.DecisionLog.Bytes, now, path, a.decisionLog(id))
	}
	return nil
}

// signedPrefix reports whether the first want.Bytes bytes of the log at
// path have want's digest.
func signedPrefix(path string, want *client.LogDigest) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyN(h, f, want.Bytes); err != nil {
		return false
	}
	return hex.EncodeToString(h.Sum(nil)) == want.SHA256
}

// keepReceipt writes Trial id's receipt into the Trial's data directory,
// durably as a whole: WriteFileAtomic syncs the directory that names the
// receipt, and the directory's own name in DataDir, made at create, is
// synced by a sync of DataDir begun after it was made: after the ticket
// made-1 (the Trial's dataMade), or, made 0, after the receipt's write.
// One begun after a create answered (syncDataAhead) is usually done.
func (a *Agent) keepReceipt(id string, b []byte, made uint64) error {
	if err := rootdir.WriteFileAtomic(filepath.Join(a.cfg.DataDir, id, "receipt.json"), b, 0o644); err != nil {
		return err
	}
	t := a.dataSync.ticket()
	if made != 0 {
		t = made - 1
	}
	if err := a.dataSync.after(a.cfg.DataDir, t); err != nil {
		return fmt.Errorf("sync %s, which names Trial %s's data directory: %w (its receipt may not survive a crash: keep the one this destroy returns)", a.cfg.DataDir, id, err)
	}
	return nil
}

// syncDataAhead begins, in the background, a sync of DataDir, which
// makes the names of the Trials' directories made so far durable: their
// destroys then need none of their own (keepReceipt). Called once a
// create has answered, so that it runs while the Trial does. Its error
// is the destroy's to meet: it syncs again, and says.
func (a *Agent) syncDataAhead() {
	if a.cfg.DataDir == "" {
		return
	}
	t := a.dataSync.ticket()
	go func() { _ = a.dataSync.after(a.cfg.DataDir, t) }()
}

// dirSync syncs a directory for callers that each need a sync of it begun
// after a moment of theirs (a ticket): those that wait while one runs
// share the next, so that destroys ending together pay for one.
type dirSync struct {
	begun  atomic.Uint64 // syncs begun
	mu     sync.Mutex    // held while one runs
	synced uint64        // under mu: the number of the last one done
	// sync syncs a directory; nil: rootdir.SyncDir (a test watches).
	sync func(dir string) error
}

// ticket is the moment from which a sync counts: the syncs begun so far
// do not.
func (s *dirSync) ticket() uint64 { return s.begun.Load() }

// after returns once a sync of dir begun after ticket t is done.
func (s *dirSync) after(dir string, t uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.synced > t {
		return nil
	}
	n := s.begun.Add(1)
	do := s.sync
	if do == nil {
		do = rootdir.SyncDir
	}
	if err := do(dir); err != nil {
		return err
	}
	s.synced = n
	return nil
}
