//go:build linux

package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/cli"
	"github.com/trialnet/trialnet/internal/rootdir"
	"github.com/trialnet/trialnet/internal/termsafe"
	"github.com/trialnet/trialnet/sandbox"
)

// reportSink is where run writes its report: a file it makes after the
// Trial ended, or a descriptor the Trial never had (trialnet-exec marks
// every descriptor above stderr close-on-exec). Neither is the Trial's to
// write, as its stdout and stderr are; check makes sure that the name a
// harness reads it by is not the Trial's to change either.
type reportSink struct {
	path  string   // where the harness reads it, absolute, as given
	name  string   // path's last element
	dir   *os.File // path's directory, opened before the Trial runs
	fd    *os.File // a copy of descriptor fdNum
	fdNum int
	// fdPath is the file or FIFO fdNum is open on, and fdID that file's
	// identity; "" for a pipe or socket, which no name leads to.
	fdPath string
	fdID   rootdir.FileID
}

// suggestedReportDir is where the error text points harnesses for a
// report directory the Trial cannot touch: root's, beside the agent's data.
const suggestedReportDir = "/var/lib/trialnet/reports"

// reportSafely is what a refusal of a report's place suggests instead.
const reportSafely = "use --report-dir " + suggestedReportDir + " (root's; the report is DIR/ID.json, its path printed when the run starts), " +
	"--report FILE in a directory only root or you can write, or --report-fd 3 on a pipe the harness reads (trialnet run --report-fd 3 ... 3>&1 1>&2 | harness)"

// openReport checks the report flags before anything runs, and where
// the report goes against the Trial's uid and gid before it makes or
// opens anything there: --report FILE, --report-dir DIR (DIR/id.json),
// or --report-fd N.
func openReport(path, dir string, fd int, id string, uid, gid uint32) (*reportSink, error) {
	given := 0
	for _, g := range []bool{path != "", dir != "", fd >= 0} {
		if g {
			given++
		}
	}
	switch {
	case given > 1:
		return nil, usageError{"run: give one of --report, --report-dir and --report-fd"}
	case dir != "":
		if !filepath.IsAbs(dir) {
			return nil, usageError{fmt.Sprintf("run: --report-dir %s: give an absolute path", dir)}
		}
		// Not cleaned, as for --report: the kernel (and a harness
		// reading DIR/ID.json) takes "link/.." as link's target's parent.
		path = strings.TrimSuffix(dir, "/") + "/" + id + ".json"
		// Checked before it is made: what is missing of DIR is made by
		// root beneath directories the Trial cannot change.
		if err := checkReportPath(path, uid, gid); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, usageError{fmt.Sprintf("run: --report-dir %s: %v", dir, err)}
		}
		return openReportFile(path, "--report-dir "+dir, uid, gid)
	case path != "":
		if err := checkReportPath(path, uid, gid); err != nil {
			return nil, err
		}
		return openReportFile(path, "--report "+path, uid, gid)
	case fd >= 0:
		return openReportFd(fd, uid, gid)
	}
	return nil, nil
}

// checkReportPath refuses a report path the Trial (uid, gid) could make
// lead elsewhere before the harness reads it.
func checkReportPath(path string, uid, gid uint32) error {
	if err := rootdir.OutOfReach(path, uid, gid); err != nil {
		return usageError{fmt.Sprintf("run: the report %s could be swapped by the Trial, and a harness would read another run's: %v; %s", path, err, reportSafely)}
	}
	cu, cg := sudoCaller()
	if err := rootdir.OthersOutOfReach(path, cu, cg); err != nil {
		return usageError{fmt.Sprintf("run: the report %s could be swapped by another user of this host once verify has read it, and a harness would read theirs: %v; %s", path, err, reportSafely)}
	}
	return nil
}

func openReportFile(path, flag string, uid, gid uint32) (*reportSink, error) {
	// As the kernel resolves it, and a harness reading it will: not
	// cleaned, so "link/.." is the symlink's parent, not ".".
	abs, err := rootdir.Unclean(path)
	if err != nil {
		return nil, err
	}
	i := strings.LastIndex(abs, "/")
	dir, name := abs[:i+1], abs[i+1:]
	if name == "" || name == "." || name == ".." {
		return nil, usageError{fmt.Sprintf("run: %s names no file", flag)}
	}
	// Opened now, as the operator names it: a Trial that swaps a
	// directory on the way for a symlink afterwards redirects nothing.
	d, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, usageError{fmt.Sprintf("run: %s: its directory %s: %v", flag, strings.TrimSuffix(dir, "/"), err)}
	}
	if err := recheckReportDir(d, abs, dir, uid, gid); err != nil {
		d.Close()
		return nil, err
	}
	// Tried now, as the report is made when the Trial ends: a place no
	// file can be made in is said before the Trial runs, not after it.
	if err := rootdir.CanWriteAt(d, name); err != nil {
		d.Close()
		return nil, usageError{fmt.Sprintf("run: %s: trialnet cannot make a file in %s (%v), where the report is written when the Trial ends: give a directory on a filesystem root can write, such as %s", flag, strings.TrimSuffix(dir, "/"), err, suggestedReportDir)}
	}
	return &reportSink{path: abs, name: name, dir: d}, nil
}

// recheckReportDir checks path again once its directory d is open: a
// part missing at the first check, beneath a sticky directory the
// Trial's uid can write, may since have been made by a process of that
// uid (another Trial's), and MkdirAll or the open took it as it found
// it. Checked out of reach now, the path cannot change; d must be what
// it names.
func recheckReportDir(d *os.File, path, dir string, uid, gid uint32) error {
	if err := checkReportPath(path, uid, gid); err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(d.Fd()), &st); err != nil {
		return err
	}
	if id, err := rootdir.IDOf(dir); err != nil || id != (rootdir.FileID{Dev: st.Dev, Ino: st.Ino}) {
		return usageError{fmt.Sprintf("run: the report's directory %s changed while trialnet opened it (another process made or moved it): %s", dir, reportSafely)}
	}
	return nil
}

// openReportFd takes descriptor fd for the report, refusing one the
// Trial writes to as well (a terminal, the pipe or file of its stdio)
// or one on a file or FIFO it could write or replace.
func openReportFd(fd int, uid, gid uint32) (*reportSink, error) {
	if fd <= 2 {
		return nil, usageError{fmt.Sprintf("run: --report-fd %d is the Trial's own stdio; give 3 or more, on a pipe the harness reads (trialnet run --report-fd 3 ... 3>&1 1>&2 | harness)", fd)}
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, usageError{fmt.Sprintf("run: --report-fd %d is not open: open it for the command, on a pipe the harness reads (trialnet run --report-fd 3 ... 3>&1 1>&2 | harness)", fd)}
	}
	if _, err := unix.IoctlGetTermios(fd, unix.TCGETS); err == nil {
		return nil, usageError{fmt.Sprintf("run: --report-fd %d is a terminal, which the Trial writes to as well: a report there could be forged; %s", fd, reportSafely)}
	}
	for std := range 3 {
		var o unix.Stat_t
		if unix.Fstat(std, &o) == nil && o.Dev == st.Dev && o.Ino == st.Ino {
			return nil, usageError{fmt.Sprintf("run: --report-fd %d is the same pipe or file as descriptor %d, which the Trial writes to: a report there could be forged (3>&1 alone does this; add 1>&2); %s", fd, std, reportSafely)}
		}
	}
	if err := namedPeer(fd, st.Mode); err != nil {
		return nil, err
	}
	r := &reportSink{fdNum: fd}
	p, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if t := st.Mode & unix.S_IFMT; err == nil && (t == unix.S_IFREG || t == unix.S_IFIFO) && (t == unix.S_IFREG || filepath.IsAbs(p)) {
		// A file, or a named FIFO (an anonymous pipe, "pipe:[N]", has no
		// name to swap; a file always has, "(deleted)" or not).
		err = rootdir.FileOutOfReach(p, uid, gid)
		if id, serr := rootdir.IDOf(p); err == nil && (serr != nil || id != (rootdir.FileID{Dev: st.Dev, Ino: st.Ino})) {
			err = fmt.Errorf("%w: it is no longer at %s", rootdir.ErrInReach, p)
		}
		if err != nil {
			return nil, usageError{fmt.Sprintf("run: --report-fd %d is open on %s, which the Trial could replace: %v; %s", fd, p, err, reportSafely)}
		}
		cu, cg := sudoCaller()
		if err := rootdir.FileOthersOutOfReach(p, cu, cg); err != nil {
			return nil, usageError{fmt.Sprintf("run: --report-fd %d is open on %s, which another user of this host could change once verify has read it: %v; %s", fd, p, err, reportSafely)}
		}
		r.fdPath, r.fdID = p, rootdir.FileID{Dev: st.Dev, Ino: st.Ino}
	}
	// A copy of its own: the caller's descriptor stays the caller's (an
	// os.File on it would close it when collected). The caller's is
	// marked close-on-exec, so that no process of the Trial (its init
	// among them) ever holds it.
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3)
	if err != nil {
		return nil, err
	}
	unix.CloseOnExec(fd)
	r.fd = os.NewFile(uintptr(dup), "report")
	return r, nil
}

// namedPeer refuses a socket fd connected to a listener at a path: the
// Trial may connect to that path as well and send its own report first,
// as it may write a named FIFO. (An abstract name is its network
// namespace's, and the Trial has its own.)
func namedPeer(fd int, mode uint32) error {
	if mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil
	}
	peer, err := unix.Getpeername(fd)
	if u, ok := peer.(*unix.SockaddrUnix); err == nil && ok && u.Name != "" && u.Name[0] != '@' {
		return usageError{fmt.Sprintf("run: --report-fd %d is a socket connected to %s, which the Trial may connect to as well and send its own report: use a pipe or a socket pair; %s", fd, termsafe.String(u.Name), reportSafely)}
	}
	return nil
}

// signedReport is v as the report's JSON, signed whole with the host's
// key (reportSignatureKey) over its canonical bytes (canonicalReport).
func signedReport(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return nil, err
	}
	c, err := canonicalReport(fields)
	if err != nil {
		return nil, err
	}
	sig, err := agent.SignReport(agent.DefaultReceiptKey, c)
	if err != nil {
		return nil, err
	}
	if fields[reportSignatureKey], err = json.Marshal(sig); err != nil {
		return nil, err
	}
	if b, err = json.MarshalIndent(fields, "", "  "); err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// reportSignatureKey is the report's key that holds its signature.
const reportSignatureKey = "report_signature"

// canonicalReport is what a report's signature covers: its fields but the
// signature, keys sorted, compact (json.Marshal of the map), so that an
// indented copy verifies too.
func canonicalReport(fields map[string]json.RawMessage) ([]byte, error) {
	rest := maps.Clone(fields)
	delete(rest, reportSignatureKey)
	return json.Marshal(rest)
}

// errReportMoved is the report written, but no longer where the harness
// looks for it.
var errReportMoved = errors.New("REPORT NOT WHERE IT WAS ASKED FOR")

func (r *reportSink) write(v any) error {
	b, err := signedReport(v)
	if err != nil {
		return err
	}
	if r.fd != nil {
		_, err := r.fd.Write(b)
		if cerr := r.fd.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write the report to descriptor %d: %w", r.fdNum, err)
		}
		if r.fdPath != "" {
			if id, err := rootdir.IDOf(r.fdPath); err != nil || id != r.fdID {
				return fmt.Errorf("%w: the report went to descriptor %d, but %s is no longer that file (it was moved or replaced while the Trial ran): do not read it", errReportMoved, r.fdNum, r.fdPath)
			}
		}
		return nil
	}
	// Made new and renamed into place in the directory opened before the
	// Trial ran: whatever sits at the name (a file, or a symlink a Trial
	// planted there) is replaced, never written through. The caller's
	// alone: it names the hosts the Trial reached or tried.
	defer r.dir.Close()
	wrote, err := rootdir.WriteAt(r.dir, r.name, b, 0o600)
	if err != nil {
		return fmt.Errorf("write the report %s: %w", r.path, err)
	}
	// The name a harness reads must lead to what was just written.
	if id, err := rootdir.IDOf(r.path); err != nil || id != wrote {
		where, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", r.dir.Fd()))
		return fmt.Errorf("%w: %s is not the report trialnet wrote (a directory on the way was moved or replaced while the Trial ran; trialnet wrote it in %s): do not read it", errReportMoved, r.path, where)
	}
	return nil
}

// terminalReset undoes what a Trial may leave a terminal in: autowrap
// off, the cursor hidden or moved, attributes, the alternate screen, a
// scroll region; the line-drawing character set (G0 and G1, and shifted
// to G1), insert, reverse-screen and origin modes, the keypad's
// application mode, xterm's modifyOtherKeys and kitty's keyboard flags;
// the default colours and the palette (OSC 10, 11, 4: text drawn in the
// background's colour, or in line-drawing glyphs, hid trialnet's summary
// after a fake one, in an attacker's review); then starts a fresh line.
const terminalReset = "\x1b[?1049l\x1b[r\x1b[0m\x1b[?7h\x1b[?25h" +
	"\x0f\x1b(B\x1b)B\x1b[4l\x1b[?5l\x1b[?6l\x1b[?1l\x1b>\x1b[>4m\x1b[=0;1u" +
	"\x1b]104\x1b\\\x1b]110\x1b\\\x1b]111\x1b\\\x1b]112\x1b\\\r\n"

// resetTerminal writes terminalReset to w if it is a terminal.
func resetTerminal(w io.Writer) {
	f, ok := w.(*os.File)
	if !ok {
		return
	}
	if _, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS); err != nil {
		return
	}
	_, _ = io.WriteString(f, terminalReset)
}

// heldNotices keeps what the terminal relay says to the operator
// (sandbox.Command.Notices) until the Trial is over and the terminal
// reset: on a screen the Trial left (the alternate one) it would vanish.
type heldNotices struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (h *heldNotices) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.b.Write(p)
}

// say writes what was held to stderr; reset says to reset the terminal
// before, when there is anything.
func (h *heldNotices) say(stderr io.Writer, reset bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.b.Len() == 0 {
		return
	}
	if reset {
		resetTerminal(stderr)
	}
	_, _ = h.b.WriteTo(stderr)
}

// verify's own exit codes, besides exitOK, exitUsage and exitFailure
// (forged, or another run's).
const (
	// exitNoLog: a receipt that verifies, of a Trial that kept a decision
	// log, where no log was found to check.
	exitNoLog = 3
	// exitNoVerdict: a genuine report of a run that ended before its
	// Trial's verdict (refused, or failed around CMD): no receipt.
	exitNoVerdict = 4
)

// cmdVerify checks a receipt (receipt.json, or a run report holding one)
// against this host's receipt key, the run it is expected to be of
// (--nonce, --trial), and the decision log it was signed with.
func cmdVerify(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlags("verify", "verify [--nonce STR] [--trial ID] [--key PUBLIC_KEY] [--log DECISIONS | --no-log] [-j] RECEIPT",
		"trialnet verify --nonce 3f1c9e0a --trial eval-42 /var/lib/trialnet/reports/eval-42.json\n\n"+
			"Exit: 0 verified; 125 forged, or another run's (nonce, Trial) or log; 3 the Trial kept a decision log and none was found (give --log, or --no-log); 4 a genuine report of a run that ended without a verdict; 2 usage.", stderr)
	key := fs.String("key", agent.ReceiptPublicKey(agent.DefaultReceiptKey), "the host's receipt public key")
	logPath := fs.String("log", "", "the Trial's decisions.jsonl (default: beside RECEIPT, else in "+agent.DefaultDataDir+"/ID)")
	noLog := fs.Bool("no-log", false, "check no decision log: exit 0 without one")
	nonce := nonceFlag(fs, "the nonce the harness gave run or create: a receipt with any other, or none, is refused")
	trial := new(string)
	fs.Func("trial", "the Trial id the receipt must be of", func(v string) error {
		*trial = v
		return sandbox.ValidID(v)
	})
	asJSON := jsonFlag(fs)
	if err := cli.ParseInterspersed(fs, args); err != nil {
		return exitUsage
	}
	if fs.NArg() != 1 || (*noLog && *logPath != "") {
		fs.Usage()
		return cli.Fail(stdout, stderr, *asJSON, exitUsage, usageError{"verify: give exactly one receipt file, and --log or --no-log, not both"})
	}
	path := fs.Arg(0)
	r, code, err := verifyReceipt(path, *key, *nonce, *trial)
	if err == nil {
		code, err = verifyRun(r, *nonce, *trial)
	}
	logState := ""
	if err == nil {
		logState, code, err = verifyLog(r, path, *logPath, *noLog)
	}
	if err != nil {
		return cli.Fail(stdout, stderr, *asJSON, code, fmt.Errorf("verify %s: %w", path, err))
	}
	if *asJSON {
		cli.PrintJSON(stdout, r)
		return exitOK
	}
	exit := "none reported"
	if r.ExitCode != nil {
		exit = fmt.Sprint(*r.ExitCode)
	}
	nonceState := "no nonce"
	if r.Nonce != "" {
		nonceState = "nonce " + termsafe.String(r.Nonce)
	}
	fmt.Fprintf(stdout, "receipt ok: Trial %s on %s, %s to %s, exit %s, %s\n%s\n%s\n", termsafe.String(r.Trial), termsafe.String(r.Host),
		r.Start.Format("2006-01-02T15:04:05Z07:00"), r.End.Format("2006-01-02T15:04:05Z07:00"), exit, nonceState, termsafe.String(r.Verdict), logState)
	return exitOK
}

// verifyReceipt reads the signed receipt at path (alone, or in a run
// report, which must then verify whole) and checks it against the public
// key at key. The JSON is read strictly: a key twice in one object (in
// any case) is refused, since readers differ on which one they take. A
// report without a receipt is checked against nonce and trial here.
func verifyReceipt(path, key, nonce, trial string) (client.Receipt, int, error) {
	b, err := readReceiptFile(path)
	if err != nil {
		return client.Receipt{}, exitUsage, err
	}
	if err := uniqueKeys(b); err != nil {
		return client.Receipt{}, exitFailure, fmt.Errorf("%w: it is truncated, not JSON, or ambiguous: %v", client.ErrReceiptForged, err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return client.Receipt{}, exitUsage, errors.New("it is not a JSON object, and holds no signed receipt")
	}
	pub, err := agent.ReadPublicKey(key)
	if err != nil {
		return client.Receipt{}, exitUsage, fmt.Errorf("the host's receipt key: %w (give --key)", err)
	}
	signed := fields
	if err := bareReceiptOnly(fields); err != nil {
		return client.Receipt{}, exitFailure, err
	}
	// No receipt, or none given (null: run's destroy failed through a
	// running agent that answered its error alone, an older one).
	if _, ok := fields[reportSignatureKey]; ok && (fields["receipt"] == nil || string(fields["receipt"]) == "null") {
		code, err := failedRun(fields, pub, nonce, trial)
		return client.Receipt{}, code, err
	}
	if inner, ok := fields["receipt"]; ok && fields["signature"] == nil {
		// A run report: its own fields are signed whole, and the receipt
		// is one of them.
		var sig agent.ReportSignature
		if json.Unmarshal(fields[reportSignatureKey], &sig) != nil || sig.Signature == nil {
			return client.Receipt{}, exitFailure, fmt.Errorf("%w: the report has no %s, so its own fields (exit code, verdict, counters) cannot be trusted", client.ErrReceiptForged, reportSignatureKey)
		}
		c, err := canonicalReport(fields)
		if err == nil {
			err = sig.Verify(pub, c)
		}
		if err != nil {
			return client.Receipt{}, exitFailure, err
		}
		if json.Unmarshal(inner, &signed) != nil {
			signed = nil
		}
	}
	var s client.SignedReceipt
	if json.Unmarshal(signed["signature"], &s.Signature) != nil || json.Unmarshal(signed["public_key"], &s.PublicKey) != nil || s.Signature == nil {
		return client.Receipt{}, exitUsage, errors.New("it holds no signed receipt")
	}
	s.Receipt = signed["receipt"]
	r, err := s.Verify(pub)
	if err != nil {
		return client.Receipt{}, exitFailure, err
	}
	return r, exitOK, nil
}

// bareReceiptKeys are all a bare receipt (receipt.json) holds.
var bareReceiptKeys = []string{"receipt", "signature", "public_key"}

// bareReceiptOnly refuses a file shaped as a bare receipt (a signature
// at the top) that holds anything else: a report's fields there (its
// exit code, verdict, summary) would pass unsigned beside a genuine
// receipt, and a harness reading them would take them as trialnet's.
func bareReceiptOnly(fields map[string]json.RawMessage) error {
	if fields["signature"] == nil {
		return nil
	}
	for k := range fields {
		if !slices.Contains(bareReceiptKeys, k) {
			return fmt.Errorf("%w: it is a bare receipt (a signature at the top) that holds %q too, which no signature covers: a bare receipt holds only %s", client.ErrReceiptForged, termsafe.String(k), strings.Join(bareReceiptKeys, ", "))
		}
	}
	return nil
}

// maxReceiptFile bounds what verify reads of a receipt or report: a
// report is a few kilobytes.
const maxReceiptFile = 4 << 20

// readReceiptFile reads the receipt or report at path, a regular file
// of at most maxReceiptFile bytes: a FIFO would hang verify, and
// /dev/zero fill its memory.
func readReceiptFile(path string) ([]byte, error) {
	f, err := rootdir.OpenRegular(path)
	if errors.Is(err, rootdir.ErrNotRegular) {
		return nil, fmt.Errorf("%w: a receipt or report is one", err)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxReceiptFile+1))
	if err == nil && len(b) > maxReceiptFile {
		err = fmt.Errorf("it is larger than %d bytes, which no receipt or report is", maxReceiptFile)
	}
	return b, err
}

// failedRun is verify's answer to a report without a receipt: a run
// refused, or failed before its Trial's end. Genuine (its signature
// holds) and of the run expected (nonce, trial), it is exitNoVerdict
// with the run's error; another run's is exitFailure, as its receipt
// would be; else forged.
func failedRun(fields map[string]json.RawMessage, pub ed25519.PublicKey, nonce, trial string) (int, error) {
	var sig agent.ReportSignature
	c, err := canonicalReport(fields)
	if err == nil {
		err = json.Unmarshal(fields[reportSignatureKey], &sig)
	}
	if err == nil {
		err = sig.Verify(pub, c)
	}
	if err != nil {
		return exitFailure, err
	}
	var failed struct {
		Trial string `json:"trial"`
		Nonce string `json:"nonce"`
		Exit  int    `json:"exit_code"`
		Error string `json:"error"`
	}
	_ = json.Unmarshal(c, &failed) // the signed fields
	if code, err := verifyRun(client.Receipt{Trial: failed.Trial, Nonce: failed.Nonce}, nonce, trial); err != nil {
		return code, fmt.Errorf("a run that ended without a verdict, and %w", err)
	}
	return exitNoVerdict, fmt.Errorf("no verdict: run of Trial %s (nonce %q) ended with exit %d before its Trial's end: %s",
		termsafe.String(failed.Trial), termsafe.String(failed.Nonce), failed.Exit, termsafe.String(failed.Error))
}

// maxJSONDepth bounds how deep uniqueKeys reads; a report is 4 deep.
const maxJSONDepth = 32

// uniqueKeys refuses JSON with a key twice in one object, compared
// without case, nested deeper than maxJSONDepth, or with anything after
// its one value.
func uniqueKeys(b []byte) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var walk func(depth int) error
	walk = func(depth int) error {
		if depth > maxJSONDepth {
			return fmt.Errorf("nested deeper than %d", maxJSONDepth)
		}
		t, err := d.Token()
		if err != nil {
			return err
		}
		switch t {
		case json.Delim('{'):
			seen := map[string]bool{}
			for d.More() {
				k, err := d.Token()
				if err != nil {
					return err
				}
				key := strings.ToLower(k.(string))
				if seen[key] {
					return fmt.Errorf("the key %q is there twice in one object", termsafe.String(k.(string)))
				}
				seen[key] = true
				if err := walk(depth + 1); err != nil {
					return err
				}
			}
		case json.Delim('['):
			for d.More() {
				if err := walk(depth + 1); err != nil {
					return err
				}
			}
		default:
			return nil
		}
		_, err = d.Token() // the closing delimiter
		return err
	}
	if err := walk(0); err != nil {
		return fmt.Errorf("not one well-formed JSON value: %w", err)
	}
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return errors.New("more than one JSON value")
	}
	return nil
}

// verifyRun checks that r is of the run the harness started.
func verifyRun(r client.Receipt, nonce, trial string) (int, error) {
	switch {
	case nonce != "" && r.Nonce == "":
		return exitFailure, fmt.Errorf("%w: it carries no nonce, and %q was expected: it is of a run started without --nonce, not this one", client.ErrReceiptOtherRun, nonce)
	case nonce != "" && r.Nonce != nonce:
		return exitFailure, fmt.Errorf("%w: it carries nonce %q, not %q", client.ErrReceiptOtherRun, termsafe.String(r.Nonce), nonce)
	case trial != "" && r.Trial != trial:
		return exitFailure, fmt.Errorf("%w: it is of Trial %q, not %q", client.ErrReceiptOtherRun, termsafe.String(r.Trial), trial)
	}
	return exitOK, nil
}

// verifyLog checks the decision log r was signed with: at logPath,
// beside the receipt at path, or in the agent's data directory. A Trial
// whose log was signed but is not found is exitNoLog, unless noLog.
func verifyLog(r client.Receipt, path, logPath string, noLog bool) (string, int, error) {
	switch {
	case noLog:
		return "no decision log checked (--no-log)", exitOK, nil
	case r.DecisionLog == nil && logPath == "":
		return "no decision log: the Trial kept none (its receipt says so; a run without an agent keeps none)", exitOK, nil
	}
	lp := logPath
	if lp == "" {
		places := []string{filepath.Join(filepath.Dir(path), "decisions.jsonl")}
		if sandbox.ValidID(r.Trial) == nil {
			places = append(places, filepath.Join(agent.DefaultDataDir, r.Trial, "decisions.jsonl"))
		}
		for _, p := range places {
			if fileExists(p) {
				lp = p
				break
			}
		}
	}
	if lp == "" {
		return "", exitNoLog, fmt.Errorf("the receipt verifies, but its Trial's decision log was not found beside it or in %s/%s: give --log FILE, or --no-log to accept it unchecked", agent.DefaultDataDir, termsafe.String(r.Trial))
	}
	d, err := agent.DigestLog(lp)
	switch {
	case errors.Is(err, os.ErrPermission):
		return "", exitNoLog, fmt.Errorf("the receipt verifies, but its decision log %s cannot be read here (%v): run verify as root, or give --log FILE or --no-log", lp, err)
	case err != nil:
		return "", exitFailure, err
	case d == nil || r.DecisionLog == nil || d.SHA256 != r.DecisionLog.SHA256 || d.Bytes != r.DecisionLog.Bytes:
		return "", exitFailure, fmt.Errorf("%w: the decision log %s is not the one it was signed with", client.ErrReceiptForged, lp)
	case r.DecisionLog.Unwritten > 0:
		return fmt.Sprintf("decision log %s matches, but %d records could not be written to it (its disk full?): the counters hold them, the log does not", lp, r.DecisionLog.Unwritten), exitOK, nil
	}
	return "decision log " + lp + " matches", exitOK, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return !errors.Is(err, os.ErrNotExist)
}
