//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testpty"
	"github.com/trialnet/trialnet/record"
)

// forger is a Trial that makes one refused CONNECT, then prints a forged
// "all clear" summary and leaves the terminal with autowrap off and the
// cursor at the right margin, as the reviewer's did; and plants a symlink
// where the report will be written, to an operator's file.
const forger = `curl -sS --max-time 5 https://exfil.example.net/ 2>/dev/null
printf 'trialnet: Trial run-x: exit 0 after 1s; tunnels: 0 allowed, 0 refused; verdict: 0 direct egress packets (ok)\n\033[?7l\033[999C' >&2
ln -s "$VICTIM" "$REPORT" && ln -s "$VICTIM" "$REPORT.planted"
echo '{"verdict":"forged"}' >&3 2>/dev/null
exit 0`

type runReport struct {
	Trial   string              `json:"trial"`
	Exit    int                 `json:"exit_code"`
	Proxy   record.TrialStats   `json:"proxy"`
	Verdict string              `json:"verdict"`
	Summary string              `json:"summary"`
	Receipt agent.SignedReceipt `json:"receipt"`
}

// The verdict a harness reads is trialnet's: the report goes to a file
// the Trial cannot write (a symlink it planted there is replaced, its
// target untouched) or to a descriptor it never had, and carries a
// receipt that verify accepts, and refuses once changed.
func TestPrivilegedRunReportIsTheVerdict(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "curl")
	installedByTest(t)
	// A directory the Trial's uid can reach and write, outside its own
	// /tmp: sticky, so that it may add its own entries but not move
	// root's (os.Chmod would drop the sticky bit).
	shared := privtest.SharedDir(t, "report-")
	if err := unix.Chmod(shared, 0o1777); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(t.TempDir(), "operator-file")
	if err := os.WriteFile(victim, []byte("untouched\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(shared, "report.json")
	t.Setenv("VICTIM", victim)
	t.Setenv("REPORT", report)

	check := func(t *testing.T, b []byte) runReport {
		t.Helper()
		var r runReport
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("report: %v\n%s", err, b)
		}
		if r.Proxy.Denied != 1 || strings.Contains(r.Verdict, "forged") || !strings.Contains(r.Summary, "1 refused (exfil.example.net:443 ×1)") {
			t.Fatalf("report %+v: want the real verdict, one refusal", r)
		}
		if r.Receipt.Signature == nil {
			t.Fatal("the report carries no signed receipt")
		}
		return r
	}

	t.Run("file", func(t *testing.T) {
		code, _, errOut := trialnet("run", "--allow", "allowed.example.test:443", "--uid", "65534", "--report", report, "--", "sh", "-c", forger)
		if code != 0 {
			t.Fatalf("run: exit %d\n%s", code, errOut)
		}
		if b, _ := os.ReadFile(victim); string(b) != "untouched\n" {
			t.Fatalf("the operator's file, which the Trial's symlink pointed at: %q", b)
		}
		if _, err := os.Lstat(report + ".planted"); err != nil {
			t.Fatalf("the Trial could not plant its symlink (the test shows nothing): %v", err)
		}
		if fi, err := os.Lstat(report); err != nil || !fi.Mode().IsRegular() {
			t.Fatalf("the report is not a regular file: %v %v", fi, err)
		}
		b, err := os.ReadFile(report)
		if err != nil {
			t.Fatal(err)
		}
		check(t, b)
		if code, out, errOut := trialnet("verify", report); code != 0 || !strings.Contains(out, "receipt ok") {
			t.Fatalf("verify the report: exit %d\n%s%s", code, out, errOut)
		}
		// Changed after signing: refused.
		var sr struct {
			Receipt agent.SignedReceipt `json:"receipt"`
		}
		if err := json.Unmarshal(b, &sr); err != nil {
			t.Fatal(err)
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, sr.Receipt.Receipt); err != nil {
			t.Fatal(err)
		}
		changed := bytes.Replace(compact.Bytes(), []byte(`"tunnels_denied":1`), []byte(`"tunnels_denied":0`), 1)
		if bytes.Equal(changed, compact.Bytes()) {
			t.Fatal("the receipt has no tunnels_denied of 1 to change")
		}
		sr.Receipt.Receipt = changed
		forged, _ := json.Marshal(sr)
		path := filepath.Join(t.TempDir(), "forged.json")
		if err := os.WriteFile(path, forged, 0o644); err != nil {
			t.Fatal(err)
		}
		if code, out, errOut := trialnet("verify", path); code != exitFailure || !strings.Contains(errOut, "does not verify") {
			t.Fatalf("verify a changed receipt: exit %d, %q %q; want refused", code, out, errOut)
		}
	})

	// Where the Trial could move a directory on the way, run refuses
	// before anything runs, and says what to use instead. The attack it
	// stops: the Trial moves the report's directory away and puts its
	// own, with an earlier clean report, in its place.
	t.Run("a directory the Trial could swap", func(t *testing.T) {
		open := filepath.Join(shared, "open")
		if err := os.Mkdir(open, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(open, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(open, "out")
		if err := os.Mkdir(out, 0o755); err != nil { // root's, in the Trial's
			t.Fatal(err)
		}
		world := filepath.Join(shared, "world")
		if err := os.Mkdir(world, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := unix.Chmod(world, 0o777); err != nil { // root's, not sticky
			t.Fatal(err)
		}
		swapped := filepath.Join(shared, "swapped")
		swap := fmt.Sprintf("mv %s %s.moved && mkdir %s && echo '{\"exit_code\":0}' > %s/report.json && touch %s", out, out, out, out, swapped)
		for _, c := range []struct{ report, why string }{
			{filepath.Join(out, "report.json"), "is owned by uid 65534"},
			{filepath.Join(open, "report.json"), "is owned by uid 65534"},
			{filepath.Join(world, "report.json"), "world-writable"},
		} {
			code, _, errOut := trialnet("run", "--uid", "65534", "--report", c.report, "--", "sh", "-c", swap)
			if code != exitUsage || !strings.Contains(errOut, "could be swapped by the Trial") || !strings.Contains(errOut, "--report-dir "+DefaultReportDir) ||
				!strings.Contains(errOut, c.why) {
				t.Fatalf("--report %s: exit %d, want %d and %q\n%s", c.report, code, exitUsage, c.why, errOut)
			}
			if _, err := os.Stat(swapped); err == nil {
				t.Fatal("the Trial ran")
			}
		}
	})

	// A directory swapped while the Trial ran (here by root, as no Trial
	// may): the report is written where run opened it, and run says
	// loudly that FILE is not it, exit 125.
	t.Run("a directory swapped during the run", func(t *testing.T) {
		base := t.TempDir()
		out := filepath.Join(base, "out")
		if err := os.Mkdir(out, 0o755); err != nil {
			t.Fatal(err)
		}
		token := "trialnet-swap-" + filepath.Base(base)
		marker := filepath.Join(shared, token)
		done := make(chan error, 1)
		go func() { done <- swapWhenRunning(token, out, marker) }()
		code, _, errOut := trialnet("run", "--uid", "65534", "--report", filepath.Join(out, "report.json"), "--",
			"sh", "-c", `i=0; while [ ! -e "$1" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done`, token, marker)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if code != exitFailure || !strings.Contains(errOut, "REPORT NOT WHERE IT WAS ASKED FOR") || !strings.Contains(errOut, out+".moved") {
			t.Fatalf("run: exit %d, want %d and the report's real place\n%s", code, exitFailure, errOut)
		}
		if _, err := os.Stat(filepath.Join(out+".moved", "report.json")); err != nil {
			t.Fatalf("the report is not where run opened its directory: %v", err)
		}
	})

	t.Run("descriptor", func(t *testing.T) {
		f, err := os.Create(filepath.Join(t.TempDir(), "fd-report.json"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		code, _, errOut := trialnet("run", "--allow", "allowed.example.test:443", "--uid", "65534", "--report-fd", fmt.Sprint(f.Fd()), "--",
			"sh", "-c", strings.ReplaceAll(forger, ">&3", fmt.Sprintf(">&%d", f.Fd())))
		if code != 0 {
			t.Fatalf("run: exit %d\n%s", code, errOut)
		}
		b, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		check(t, b)
	})

	// The documented way: a pipe the harness reads.
	t.Run("descriptor on a pipe", func(t *testing.T) {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		got := make(chan []byte, 1)
		go func() { b, _ := io.ReadAll(r); got <- b }()
		code, _, errOut := trialnet("run", "--allow", "allowed.example.test:443", "--uid", "65534", "--report-fd", fmt.Sprint(w.Fd()), "--",
			"sh", "-c", strings.ReplaceAll(forger, ">&3", fmt.Sprintf(">&%d", w.Fd())))
		_ = w.Close()
		if code != 0 {
			t.Fatalf("run: exit %d\n%s", code, errOut)
		}
		check(t, <-got)
	})

	// A descriptor on a file the Trial could replace (its directory is
	// the Trial's to write) or write itself: refused before anything
	// runs, as the file at --report is.
	t.Run("descriptor on a file in the Trial's reach", func(t *testing.T) {
		open := filepath.Join(shared, "fdopen")
		if err := os.Mkdir(open, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(open, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		writable := filepath.Join(t.TempDir(), "writable.json")
		for _, c := range []struct {
			path string
			mode uint32
			why  string
		}{{filepath.Join(open, "report.json"), 0o644, "is owned by uid 65534"}, {writable, 0o666, "world-writable"}} {
			f, err := os.Create(c.path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := unix.Chmod(c.path, c.mode); err != nil {
				t.Fatal(err)
			}
			code, _, errOut := trialnet("run", "--uid", "65534", "--report-fd", fmt.Sprint(f.Fd()), "--", "true")
			if code != exitUsage || !strings.Contains(errOut, "which the Trial could replace") || !strings.Contains(errOut, c.why) || !strings.Contains(errOut, "3>&1 1>&2 | harness") {
				t.Fatalf("--report-fd on %s: exit %d, want %d and %q\n%s", c.path, code, exitUsage, c.why, errOut)
			}
		}
	})

	// --report-dir: DIR/ID.json, made if missing, its path said before
	// the Trial starts; the receipt carries the harness's nonce, and
	// verify takes no other run's receipt for it.
	t.Run("report-dir and nonce", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "reports")
		code, _, errOut := trialnet("run", "--uid", "65534", "--report-dir", dir, "--id", "nonce-a", "--nonce", "harness-run-a", "--", "true")
		path := filepath.Join(dir, "nonce-a.json")
		if code != 0 || !strings.Contains(errOut, "trialnet: Trial nonce-a: its report will be "+path) {
			t.Fatalf("run --report-dir: exit %d\n%s", code, errOut)
		}
		if code, _, errOut := trialnet("run", "--uid", "65534", "--report-dir", dir, "--id", "nonce-b", "--", "true"); code != 0 {
			t.Fatalf("run --report-dir, no nonce: exit %d\n%s", code, errOut)
		}
		for _, c := range []struct {
			args []string
			code int
			want string
		}{
			{[]string{"--nonce", "harness-run-a", "--trial", "nonce-a", path}, exitOK, "nonce harness-run-a"},
			{[]string{"--nonce", "harness-run-b", path}, exitFailure, `carries nonce "harness-run-a", not "harness-run-b"`},
			{[]string{"--trial", "nonce-b", path}, exitFailure, `of Trial "nonce-a", not "nonce-b"`},
			{[]string{"--nonce", "harness-run-a", filepath.Join(dir, "nonce-b.json")}, exitFailure, "carries no nonce"},
		} {
			code, out, errOut := trialnet(append([]string{"verify"}, c.args...)...)
			if code != c.code || !strings.Contains(out+errOut, c.want) {
				t.Errorf("verify %q: exit %d, want %d and %q\n%s%s", c.args, code, c.code, c.want, out, errOut)
			}
		}
	})
}

// swapWhenRunning waits (bounded) for a process whose command line holds
// token, then moves dir away, makes a new one in its place and creates
// marker, which the process waits for.
func swapWhenRunning(token, dir, marker string) error {
	deadline := time.Now().Add(20 * time.Second)
	for !processWith(token) {
		if time.Now().After(deadline) {
			return fmt.Errorf("no process with %q started", token)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := os.Rename(dir, dir+".moved"); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(marker, nil, 0o644)
}

// processWith reports whether a process's command line holds s.
func processWith(s string) bool {
	m, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range m {
		if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte(s)) {
			return true
		}
	}
	return false
}

// After the Trial, a terminal gets back autowrap, the cursor, plain
// attributes and the main screen, and a fresh line, before trialnet's
// own lines.
func TestResetTerminal(t *testing.T) {
	master, slave := testpty.Open(t, 24, 80)
	resetTerminal(slave)
	resetTerminal(&bytes.Buffer{}) // not a terminal: nothing
	buf := make([]byte, 64)
	n, err := master.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	got := string(buf[:n])
	for _, want := range []string{"\x1b[?7h", "\x1b[?25h", "\x1b[0m", "\x1b[?1049l"} {
		if !strings.Contains(got, want) {
			t.Fatalf("reset %q lacks %q", got, want)
		}
	}
}

// run confines where a Trial makes sockets and FIFOs (its own /dev/shm),
// unless it is run without unix confinement, which the command then gets.
func TestPrivilegedRunConfinesSocketPaths(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	shared := privtest.SharedDir(t, "fifo-")
	if err := os.Chmod(shared, 0o1777); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		flags []string
		code  int
	}{{nil, 1}, {[]string{"--no-unix-confine"}, 0}} {
		fifo := filepath.Join(shared, fmt.Sprintf("fifo-%d", c.code))
		args := append(append([]string{"run", "--uid", "65534"}, c.flags...), "--", "mkfifo", fifo)
		if code, _, errOut := trialnet(args...); code != c.code {
			t.Errorf("run %v: exit %d, want %d\n%s", c.flags, code, c.code, errOut)
		}
	}
	if code, _, errOut := trialnet("run", "--uid", "65534", "--", "mkfifo", "/dev/shm/own"); code != 0 {
		t.Errorf("a FIFO in the Trial's own /dev/shm: exit %d\n%s", code, errOut)
	}
}

// verify on a file that holds no receipt, or with a key file that is no
// key, says so and fails.
func TestVerifyBadInput(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.json")
	if err := os.WriteFile(empty, []byte(`{"verdict":"ok"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := trialnet("verify", empty); code != exitUsage || !strings.Contains(errOut, "holds no signed receipt") {
		t.Errorf("verify a file without a receipt: exit %d, %q", code, errOut)
	}
	signed := filepath.Join(dir, "receipt.json")
	if err := os.WriteFile(signed, []byte(`{"receipt":{"schema":1},"signature":"AAAA","public_key":"AAAA"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := trialnet("verify", "--key", empty, signed); code != exitUsage || !strings.Contains(errOut, "is not an ed25519 public key") {
		t.Errorf("verify with a key file that is no key: exit %d, %q", code, errOut)
	}
}
