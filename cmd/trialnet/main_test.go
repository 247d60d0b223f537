//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/internal/timerslack"
	"github.com/trialnet/trialnet/netns"
	"github.com/trialnet/trialnet/sandbox"
)

func TestMain(m *testing.M) {
	sandbox.Init()
	// The test binary doubles as the trialnet binary, for tests that need
	// it as a process of its own (signals, terminals).
	if os.Getenv("TRIALNET_CLI_MAIN") == "1" {
		if dir := os.Getenv(chrootEnv); dir != "" {
			enterChroot(dir)
			if os.Getenv(chrootExecEnv) == "1" {
				execInRoot()
			}
		}
		if os.Getenv(noChrootEnv) == "1" {
			execWithoutChroot()
		}
		if desc := os.Getenv("TRIALNET_CLI_SESSION_KEY"); desc != "" {
			execWithSessionKey(desc)
		}
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

func trialnet(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "Usage: trialnet COMMAND"},
		{[]string{"frobnicate"}, "unknown command"},
		{[]string{"run", "--bogus"}, "flag provided but not defined"},
		{[]string{"run"}, "no command given"},
		{[]string{"run", "--uid", "-5", "--", "true"}, "must not be negative"},
		{[]string{"run", "--uid", "1", "--gid", "-2", "--", "true"}, "must not be negative"},
		{[]string{"run", "--uid", "4294967295", "--", "true"}, "below 4294967295"},
		{[]string{"run", "--uid", "1", "--allow", "*.com:443", "--", "true"}, "too broad"},
		{[]string{"create", "--allow", "127.0.0.1:443"}, "IP address"},
		{[]string{"run", "--uid", "1", "--report", "/nonexistent-dir/r.json", "--", "true"}, "its directory /nonexistent-dir"},
		{[]string{"run", "--uid", "1", "--report-fd", "1", "--", "true"}, "the Trial's own stdio"},
		{[]string{"run", "--uid", "1", "--report-fd", "987", "--", "true"}, "--report-fd 987 is not open"},
		{[]string{"run", "--uid", "1", "--report", "r.json", "--report-fd", "3", "--", "true"}, "give one of --report, --report-dir and --report-fd"},
		{[]string{"run", "--uid", "1", "--report-dir", "reports", "--", "true"}, "give an absolute path"},
		{[]string{"run", "--uid", "1", "--nonce", "two words", "--", "true"}, "invalid nonce"},
		{[]string{"run", "--uid", "1", "--id", "../x", "--", "true"}, "invalid Trial id"},
		{[]string{"create", "--nonce", ""}, "invalid nonce"},
		{[]string{"verify", "--nonce", "", "r.json"}, "invalid nonce"},
		{[]string{"verify", "--trial", "", "r.json"}, "invalid Trial id"},
		{[]string{"verify", "--log", "x", "--no-log", "r.json"}, "not both"},
		{[]string{"verify"}, "give exactly one receipt file"},
		{[]string{"verify", "/nonexistent-receipt.json"}, "no such file"},
		{[]string{"create", "--allow", "api.anthropic.com"}, "host:port"},
	} {
		code, out, errOut := trialnet(tc.args...)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d", tc.args, code, exitUsage)
		}
		if !strings.Contains(out+errOut, tc.want) {
			t.Errorf("%v: output lacks %q:\n%s%s", tc.args, tc.want, out, errOut)
		}
	}
}

func TestRunNeedsAUser(t *testing.T) {
	for _, sudoUID := range []string{"", "0"} {
		t.Setenv("SUDO_UID", sudoUID)
		for _, cmd := range [][]string{{"run", "--", "true"}, {"exec", "--trial", "x", "--", "true"}} {
			code, _, errOut := trialnet(cmd...)
			if code != exitUsage || !strings.Contains(errOut, "--uid") {
				t.Errorf("SUDO_UID=%q %v: exit %d, %q: want a usage error naming --uid", sudoUID, cmd, code, errOut)
			}
		}
	}
}

// A uid whose number is another group's (disk is 6 on Debian, user 6 is
// man) is refused without --gid: the gid taken by default would be that
// group, and the Trial could open what it may (raw disks). The user's own
// group, or a --gid given, is not.
func TestRunRefusesAnotherGroupByDefault(t *testing.T) {
	t.Setenv("SUDO_UID", "")
	t.Setenv("SUDO_GID", "")
	other := anotherGroup(t)
	// Each fails just after the user is chosen, before any Trial is made:
	// a relative report directory, an agent socket that is not there.
	for cmd, after := range map[string][]string{"run": {"--report-dir", "relative"}, "exec": {"--trial", "x", "--socket", "/nonexistent/trialnet.sock"}} {
		args := append([]string{cmd, "--uid", other}, after...)
		code, _, errOut := trialnet(append(args, "--", "true")...)
		if code != exitUsage || !strings.Contains(errOut, "without --gid") {
			t.Errorf("%v (gid %s is another group): exit %d, %q: want a usage error asking for --gid", args, other, code, errOut)
		}
		code, _, errOut = trialnet(append(args, "--gid", "65534", "--", "true")...)
		if strings.Contains(errOut, "without --gid") {
			t.Errorf("%v --gid 65534: exit %d, %q: refused as if no --gid was given", args, code, errOut)
		}
	}
}

// The check of the gid taken by default runs beside the embedded agent's
// start, and its refusal still ends the run before a Trial is made: the
// command never runs, no report is written, and the error and exit code
// are those of a refusal before the start.
func TestPrivilegedRunRefusesAnotherGroupBesideTheStart(t *testing.T) {
	privtest.Require(t)
	t.Setenv("SUDO_UID", "")
	t.Setenv("SUDO_GID", "")
	other := anotherGroup(t)
	hc := testenv.IsolatedHost(t, "usercheck")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "trialnet.yaml")
	yaml := fmt.Sprintf("paths:\n  pin_dir: %s\n  netns_dir: %s\n  cgroup_parent: %s\n", hc.PinDir, hc.NetnsDir, hc.Parent)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(dir, "report.json")
	code, _, errOut := trialnet("run", "--socket", filepath.Join(dir, "no-agent.sock"), "--config", cfg, "--uid", other, "--report", report, "--", "true")
	if code != exitUsage || !strings.Contains(errOut, "without --gid") {
		t.Fatalf("run --uid %s (gid %s is another group) with an embedded agent: exit %d, %q: want a usage error asking for --gid", other, other, code, errOut)
	}
	if _, err := os.Stat(report); !os.IsNotExist(err) {
		t.Errorf("a refused run wrote its report (%v)", err)
	}
}

// anotherGroup is a gid, from /etc/group, that is not the own group of
// the user with that number.
func anotherGroup(t *testing.T) string {
	b, err := os.ReadFile("/etc/group")
	if err != nil {
		t.Skip("no /etc/group to find a group in:", err)
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Split(line, ":")
		if len(f) < 3 || f[2] == "0" {
			continue
		}
		if u, err := user.LookupId(f[2]); err != nil || (u.Username != f[0] && u.Gid != f[2]) {
			return f[2]
		}
	}
	t.Skip("every group in /etc/group is its same-numbered user's own")
	return ""
}

// Root is refused however it is asked for: a capability-less uid 0 still
// owns the host's root-owned files.
func TestRunRefusesRoot(t *testing.T) {
	for _, tc := range []struct {
		sudoUID, sudoGID string
		args             []string
	}{
		{"", "", []string{"--uid", "0"}},
		{"", "", []string{"--uid", "0", "--gid", "65534"}},
		{"", "", []string{"--uid", "65534", "--gid", "0"}},
		{"1000", "", []string{"--uid", "0"}},
		{"1000", "0", nil},
		{"1000", "", []string{"--gid", "0"}},
	} {
		t.Setenv("SUDO_UID", tc.sudoUID)
		t.Setenv("SUDO_GID", tc.sudoGID)
		for _, cmd := range []string{"run", "exec"} {
			args := append([]string{cmd}, tc.args...)
			if cmd == "exec" {
				args = append(args, "--trial", "x")
			}
			code, _, errOut := trialnet(append(args, "--", "true")...)
			if code != exitUsage || !strings.Contains(errOut, "never runs as uid 0 or gid 0") {
				t.Errorf("SUDO_UID=%q SUDO_GID=%q %v: exit %d, %q: want the root refusal", tc.sudoUID, tc.sudoGID, args, code, errOut)
			}
		}
	}
}

// installedByTest uninstalls trialnet (pins and parent cgroup) after the
// test when the test was the one that installed it.
func installedByTest(t *testing.T) {
	if _, err := os.Stat(bpf.DefaultPinDir); os.IsNotExist(err) {
		t.Cleanup(func() {
			if err := agent.Uninstall(agent.Config{}, "", false); err != nil {
				t.Error(err)
			}
		})
	}
}

// --workdir starts CMD there in the Trial (a FUSE or network file system
// holding it then stays in the Trial's view: sandbox's
// TestPrivilegedNoFUSELookupFromTheTrial); without it CMD starts at /,
// and a relative one is refused before any Trial is made.
func TestPrivilegedRunWorkdir(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	for _, c := range []struct {
		flags []string
		want  string
	}{{nil, "/"}, {[]string{"--workdir", "/usr/share"}, "/usr/share"}} {
		args := append(append([]string{"run", "--uid", "65534"}, c.flags...), "--", "sh", "-c", `test "$(pwd)" = "$0"`, c.want)
		if code, _, errOut := trialnet(args...); code != 0 {
			t.Errorf("run %q: exit %d, want CMD started in %s\n%s", c.flags, code, c.want, errOut)
		}
	}
	if code, _, errOut := trialnet("run", "--uid", "65534", "--workdir", "usr/share", "--", "true"); code != exitUsage || !strings.Contains(errOut, "absolute path") {
		t.Errorf("run --workdir usr/share: exit %d, want refused as not absolute\n%s", code, errOut)
	}
	// One not there in the Trial's view: the command is not started, and
	// the error names the directory and what it must be.
	if code, _, errOut := trialnet("run", "--uid", "65534", "--workdir", "/nonexistent-trialnet-dir", "--", "true"); code != 126 ||
		!strings.Contains(errOut, `working directory "/nonexistent-trialnet-dir"`) || !strings.Contains(errOut, "--workdir") {
		t.Errorf("run --workdir /nonexistent-trialnet-dir: exit %d, want 126 with the directory and --workdir named\n%s", code, errOut)
	}
}

// startSlack is the timer slack this test process started with, read
// before any test ran: tests before TestPrivilegedRunKeepsTheStartTimerSlack
// run agents in this process, which widen every thread's.
var startSlack, startSlackErr = os.ReadFile("/proc/self/timerslack_ns")

// A Trial's processes keep the timer slack trialnet started with,
// whichever thread launches them: run widens the runtime monitor's, and
// the threads the monitor makes inherit it (here every thread has a
// wider one, as such a thread would).
func TestPrivilegedRunKeepsTheStartTimerSlack(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	if startSlackErr != nil {
		t.Fatal(startSlackErr)
	}
	start := strings.TrimSpace(string(startSlack))
	ns, err := strconv.ParseInt(start, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/timerslack_ns", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	now, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	if err := timerslack.Set(time.Duration(ns) + time.Millisecond); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := timerslack.Set(time.Duration(now)); err != nil {
			t.Error(err)
		}
	})
	if code, _, errOut := trialnet("run", "--uid", "65534", "--", "sh", "-c", `test "$(cat /proc/self/timerslack_ns)" = "$0"`, start); code != 0 {
		t.Errorf("run: exit %d, want the command's timer slack the process's first, %s ns\n%s", code, start, errOut)
	}
}

func TestPrivilegedRunExitCodesAndCleanup(t *testing.T) {
	privtest.Require(t)
	installedByTest(t)
	before, err := netns.List(netns.DefaultDir)
	if err != nil {
		t.Fatal(err)
	}

	code, _, errOut := trialnet("run", "-v", "--uid", "65534", "--", "sh", "-c", "exit 7")
	if code != 7 {
		t.Fatalf("exit code %d, want CMD's 7; stderr:\n%s", code, errOut)
	}
	if !strings.Contains(errOut, "connect4_denied") || !strings.Contains(errOut, "0 direct egress packets") {
		t.Fatalf("-v: counters missing from stderr:\n%s", errOut)
	}
	// The pools the Trial drew on, with their peaks, as the host bounds them.
	for _, pool := range []string{"pids", "memory"} {
		if !regexp.MustCompile(`pool +` + pool + ` +(\d+ now, \d+ at peak, of \d+; \d+ |unbounded)`).MatchString(errOut) {
			t.Fatalf("-v: no %s pool line:\n%s", pool, errOut)
		}
	}

	// Without -v: one summary line; --show-refusals: one line per refusal
	// as it happens. The refused name is refused before any DNS.
	code, _, errOut = trialnet("run", "--show-refusals", "--allow", "allowed.example.test:443", "--uid", "65534", "--",
		"curl", "-sS", "--max-time", "5", "https://refused.example.test/")
	if code == 0 {
		t.Fatalf("curl to a refused name: exit 0\n%s", errOut)
	}
	var summary, refusals []string
	for _, l := range strings.Split(strings.TrimSpace(errOut), "\n") {
		switch {
		case strings.HasPrefix(l, "trialnet: Trial "):
			summary = append(summary, l)
		case strings.HasPrefix(l, "trialnet: refused "):
			refusals = append(refusals, l)
		}
	}
	// The line is short: the verdict in a few words; the layers and the
	// reasons are -v's.
	brief := "; 0 direct egress packets (ok)"
	if bpf.HaveLSM() != nil {
		brief = "; 0 direct egress packets (ok; foreign sockets unwatched)"
	}
	// Beside it, what the kernel refused (curl's own unix connects, such
	// as glibc's to nscd, may be among them): a list as long as the
	// reasons, so the length is judged without it.
	if len(summary) != 1 || !strings.Contains(summary[0], "tunnels: 0 allowed, 1 refused (refused.example.test:443 ×1)") ||
		!strings.HasSuffix(summary[0], brief) || len(regexp.MustCompile(`kernel: \d+ refused \([^)]*\); `).ReplaceAllString(summary[0], "")) > 180 {
		t.Errorf("summary line %q in:\n%s", summary, errOut)
	}
	// The verdict speaks of foreign sockets as the kernel allows: "ok"
	// where the LSM layer watched, "not observed" where it could not.
	lsm := bpf.HaveLSM()
	if os.Getenv("TRIALNET_REQUIRE_LSM") == "1" && lsm != nil {
		t.Errorf("TRIALNET_REQUIRE_LSM=1 and no BPF LSM: %v", lsm)
	}
	wantLSM := []string{"0 foreign-socket uses (ok)", "BPF LSM"}
	if lsm != nil {
		wantLSM = []string{"foreign-socket uses not observed", "inactive: BPF LSM ("}
	}
	_, _, verbose := trialnet("run", "-v", "--allow", "allowed.example.test:443", "--uid", "65534", "--", "true")
	for _, w := range append(wantLSM, "layers: network namespace", "exit_code 0") {
		if !strings.Contains(verbose, w) {
			t.Errorf("run -v lacks %q (BPF LSM: %v):\n%s", w, lsm, verbose)
		}
	}
	if len(refusals) != 1 || !strings.Contains(refusals[0], "CONNECT refused.example.test:443: policy_denied") {
		t.Errorf("refusal lines %q in:\n%s", refusals, errOut)
	}
	if strings.Contains(errOut, "connect4_denied") {
		t.Errorf("the counter table without -v:\n%s", errOut)
	}

	// A command that cannot start still gets its report, so that an
	// earlier run's report at the path is never read as this one's.
	stale := filepath.Join(t.TempDir(), "report.json")
	if err := os.WriteFile(stale, []byte(`{"exit_code":0,"verdict":"forged"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = trialnet("run", "--report", stale, "--uid", "65534", "--", "no-such-command-trialnet")
	if code != 127 || !strings.Contains(errOut, "not found") {
		t.Fatalf("missing command: exit %d, %q", code, errOut)
	}
	var failed struct {
		ExitCode int    `json:"exit_code"`
		Error    string `json:"error"`
	}
	if b, err := os.ReadFile(stale); err != nil || json.Unmarshal(b, &failed) != nil || failed.ExitCode != 127 || !strings.Contains(failed.Error, "not found") {
		t.Fatalf("the report of a command that could not start: %s (%v)", b, err)
	}

	// -j never writes on the Trial's stdout: it needs a report.
	if code, out, errOut := trialnet("run", "-j", "--uid", "65534", "--", "true"); code != exitUsage || !strings.Contains(out, "--report") {
		t.Fatalf("run -j without a report: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	reportPath := filepath.Join(t.TempDir(), "report.json")
	code, out, _ := trialnet("run", "-j", "--report", reportPath, "--uid", "65534", "--", "bash", "-c", ": </dev/tcp/127.0.0.1/1; true")
	if code != 0 || out != "" {
		t.Fatalf("-j run: exit %d, stdout %q", code, out)
	}
	if b, err := os.ReadFile(reportPath); err != nil {
		t.Fatal(err)
	} else {
		out = string(b)
	}
	var res struct {
		Trial    string            `json:"trial"`
		ExitCode int               `json:"exit_code"`
		Counters map[string]uint64 `json:"counters"`
		Direct   uint64            `json:"direct_egress_packets"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("-j output is not one JSON object: %v\n%s", err, out)
	}
	if !strings.HasPrefix(res.Trial, "run-") || res.Direct != 0 {
		t.Fatalf("bad -j result: %+v", res)
	}
	if _, ok := res.Counters["sock_create_denied"]; !ok {
		t.Fatalf("counters lack sock_create_denied: %v", res.Counters)
	}

	code, _, errOut = trialnet("run", "--timeout", "200ms", "--uid", "65534", "--", "sleep", "30")
	if code != exitTimeout || !strings.Contains(errOut, "timed out") {
		t.Fatalf("timeout: exit %d, %q", code, errOut)
	}

	// Nothing of those Trials is left: no namespace, no cgroup. (A run
	// may also have removed what an earlier, killed run left.)
	after, err := netns.List(netns.DefaultDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range after {
		if !slices.Contains(before, id) {
			t.Fatalf("namespaces before %v, after %v", before, after)
		}
	}
	parent, err := sandbox.EnsureParent()
	if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), "run-") {
			t.Fatalf("cgroup left behind: %s", filepath.Join(parent, e.Name()))
		}
	}
}

func TestPrivilegedDoctor(t *testing.T) {
	privtest.Require(t)
	code, out, _ := trialnet("doctor", "-j")
	type check struct {
		Check string `json:"check"`
		OK    bool   `json:"ok"`
	}
	var res struct {
		CanEnforce bool    `json:"can_enforce"`
		Checks     []check `json:"checks"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatal(err)
	}
	if code != 0 || !res.CanEnforce || len(res.Checks) < 10 {
		t.Fatalf("doctor: exit %d, %s", code, out)
	}
	// It names the bound on each pool that applies: the pids and memory
	// controllers, v1 on the machines this is developed on, v2 in the VM
	// matrix; both are there on each.
	for _, pool := range []string{"pids", "memory"} {
		if !slices.ContainsFunc(res.Checks, func(c check) bool {
			return strings.HasPrefix(c.Check, "per-Trial "+pool+" bound: cgroup v") && strings.Contains(c.Check, pool+" controller")
		}) {
			t.Errorf("doctor does not name the %s bound: %s", pool, out)
		}
	}
	for _, pool := range []string{"ptys", "/dev/shm", "/tmp and /var/tmp", "processes per command", "AIO contexts", "core dumps"} {
		if !slices.ContainsFunc(res.Checks, func(c check) bool { return strings.HasPrefix(c.Check, "per-Trial "+pool+": ") && c.OK }) {
			t.Errorf("doctor does not name the %s bound: %s", pool, out)
		}
	}
	// It did a real Load, and what it says of the BPF LSM layer is what
	// a host loading for Trials gets: never "ok" where run then fails.
	lsm := slices.IndexFunc(res.Checks, func(c check) bool { return strings.HasPrefix(c.Check, "BPF LSM layer (loaded") })
	load := slices.IndexFunc(res.Checks, func(c check) bool { return c.Check == agent.LoadCheck })
	if lsm < 0 || load < 0 || !res.Checks[load].OK {
		t.Fatalf("doctor made no real Load, or it failed: %s", out)
	}
	if !slices.ContainsFunc(res.Checks, func(c check) bool { return c.Check == agent.NetnsScanCheck && c.OK }) {
		t.Errorf("doctor does not say the adoption scan's task iterator loads: %s", out)
	}
	h, err := agent.OpenHost(testenv.IsolatedHost(t, "doctorcheck"))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if res.Checks[lsm].OK != h.BPF.LSM() {
		t.Errorf("doctor says BPF LSM ok=%v, a host's Load got LSM=%v (%v)", res.Checks[lsm].OK, h.BPF.LSM(), h.BPF.LSMError())
	}
	if leftover, _ := filepath.Glob(bpf.DefaultPinDir + "-doctor-*"); len(leftover) > 0 {
		t.Errorf("doctor left pins behind: %v", leftover)
	}
	mount, err := sandbox.Cgroup2Mount()
	if err != nil {
		t.Fatal(err)
	}
	if leftover, _ := filepath.Glob(filepath.Join(mount, "trialnet-doctor-*")); len(leftover) > 0 {
		t.Errorf("doctor left cgroups behind: %v", leftover)
	}
}
