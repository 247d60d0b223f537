//go:build linux

package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/internal/rootdir"
	"github.com/trialnet/trialnet/internal/termsafe"
)

// reportSink is where run writes its report: a file it makes after the
// Trial ended, or a descriptor the Trial never had (trialnet-exec marks
// every descriptor above stderr close-on-exec). Neither is the Trial's to
// write, as its stdout and stderr are.
type reportSink struct {
	path  string
	dir   *os.File // path's directory, opened before the Trial runs
	fd    *os.File // a copy of descriptor fdNum
	fdNum int
}

// openReport checks the report flags before anything runs.
func openReport(path string, fd int) (*reportSink, error) {
	switch {
	case path != "" && fd >= 0:
		return nil, usageError{"run: give --report or --report-fd, not both"}
	case path != "":
		dir, err := filepath.Abs(filepath.Dir(path))
		if err != nil {
			return nil, err
		}
		// Opened now, as the operator names it: a Trial that swaps a
		// directory on the way for a symlink afterwards redirects nothing.
		d, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, usageError{fmt.Sprintf("run: --report %s: its directory %s: %v", path, dir, err)}
		}
		return &reportSink{path: filepath.Join(dir, filepath.Base(path)), dir: d}, nil
	case fd >= 0 && fd <= 2:
		return nil, usageError{fmt.Sprintf("run: --report-fd %d is the Trial's own stdio; give 3 or more, opened by the caller (3>report.json)", fd)}
	case fd > 2:
		// A copy of its own: the caller's descriptor stays the caller's
		// (an os.File on it would close it when collected). The caller's
		// is marked close-on-exec, so that no process of the Trial (its
		// init among them) ever holds it.
		dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3)
		if err != nil {
			return nil, usageError{fmt.Sprintf("run: --report-fd %d is not open: open it for the command (for example 3>report.json)", fd)}
		}
		unix.CloseOnExec(fd)
		return &reportSink{fd: os.NewFile(uintptr(dup), "report"), fdNum: fd}, nil
	}
	return nil, nil
}

func (r *reportSink) write(v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if r.fd != nil {
		_, err := r.fd.Write(b)
		if cerr := r.fd.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write the report to descriptor %d: %w", r.fdNum, err)
		}
		return nil
	}
	// Made new and renamed into place in the directory opened before the
	// Trial ran: whatever sits at the name (a file, or a symlink a Trial
	// planted there) is replaced, never written through.
	defer r.dir.Close()
	if err := rootdir.WriteAt(r.dir, filepath.Base(r.path), b, 0o644); err != nil {
		return fmt.Errorf("write the report %s: %w", r.path, err)
	}
	return nil
}

// terminalReset undoes what a Trial may leave a terminal in: autowrap
// off, the cursor hidden or moved, colours and attributes, the alternate
// screen, a scroll region; then starts a fresh line.
const terminalReset = "\x1b[?1049l\x1b[r\x1b[0m\x1b[?7h\x1b[?25h\r\n"

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

// cmdVerify checks a receipt (receipt.json, or a run report holding one)
// against this host's receipt key, and the decision log beside it.
func cmdVerify(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("verify", "verify [--key PUBLIC_KEY] [--log DECISIONS] [-j] RECEIPT",
		"trialnet verify /var/lib/trialnet/trials/run-x/receipt.json", stderr)
	key := fs.String("key", agent.ReceiptPublicKey(agent.DefaultReceiptKey), "the host's receipt public key")
	logPath := fs.String("log", "", "the Trial's decisions.jsonl (default: beside RECEIPT, if there)")
	asJSON := jsonFlag(fs)
	if err := parseInterspersed(fs, args); err != nil {
		return exitUsage
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return fail(stdout, stderr, *asJSON, exitUsage, usageError{"verify: give exactly one receipt file"})
	}
	path := fs.Arg(0)
	b, err := os.ReadFile(path)
	if err != nil {
		return fail(stdout, stderr, *asJSON, exitUsage, fmt.Errorf("verify: %w", err))
	}
	var outer struct {
		Receipt json.RawMessage `json:"receipt"`
	}
	var signed agent.SignedReceipt
	if err := json.Unmarshal(b, &signed); err != nil || signed.Signature == nil {
		// A run report: the receipt is one of its keys.
		if json.Unmarshal(b, &outer) != nil || json.Unmarshal(outer.Receipt, &signed) != nil || signed.Signature == nil {
			return fail(stdout, stderr, *asJSON, exitUsage, fmt.Errorf("verify: %s holds no signed receipt", path))
		}
	}
	pub, err := agent.ReadPublicKey(*key)
	if err != nil {
		return fail(stdout, stderr, *asJSON, exitUsage, fmt.Errorf("verify: the host's receipt key: %w (give --key)", err))
	}
	r, err := signed.Verify(pub)
	if err != nil {
		return fail(stdout, stderr, *asJSON, exitFailure, fmt.Errorf("verify %s: %w", path, err))
	}
	lp := *logPath
	if lp == "" {
		if p := filepath.Join(filepath.Dir(path), "decisions.jsonl"); fileExists(p) {
			lp = p
		}
	}
	logState := "no decision log checked"
	if lp != "" {
		d, err := agent.DigestLog(lp)
		switch {
		case err != nil:
			return fail(stdout, stderr, *asJSON, exitFailure, fmt.Errorf("verify: %w", err))
		case d == nil || r.DecisionLog == nil || *d != *r.DecisionLog:
			return fail(stdout, stderr, *asJSON, exitFailure, fmt.Errorf("verify %s: %w: the decision log %s is not the one it was signed with", path, agent.ErrReceiptForged, lp))
		}
		logState = "decision log " + lp + " matches"
	}
	if *asJSON {
		printJSON(stdout, r)
		return exitOK
	}
	exit := "none reported"
	if r.ExitCode != nil {
		exit = fmt.Sprint(*r.ExitCode)
	}
	fmt.Fprintf(stdout, "receipt ok: Trial %s on %s, %s to %s, exit %s\n%s\n%s\n", termsafe.String(r.Trial), termsafe.String(r.Host),
		r.Start.Format("2006-01-02T15:04:05Z07:00"), r.End.Format("2006-01-02T15:04:05Z07:00"), exit, termsafe.String(r.Verdict), logState)
	return exitOK
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return !errors.Is(err, os.ErrNotExist)
}
