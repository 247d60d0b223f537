//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/client"
	trialspec "github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/bpf"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/sandbox"
)

func TestNoAgentSaysHowToStartOne(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	for _, args := range [][]string{{"list", "--socket", sock}, {"stats", "--socket", sock}, {"destroy", "--socket", sock, "x"}, {"create", "--socket", sock, "-j"}} {
		code, out, errOut := trialnet(args...)
		if code != exitFailure || !strings.Contains(out+errOut, "no trialnet agent is running") || !strings.Contains(out+errOut, "trialnet agent") {
			t.Errorf("%v: exit %d, %q %q", args, code, out, errOut)
		}
	}
}

// The CLI against a running agent: create -j, list, exec, stats, audit,
// destroy; refusals exit 3 with the agent's message; run uses the running
// agent instead of embedding one.
func TestPrivilegedCLIWithAgent(t *testing.T) {
	privtest.Require(t)
	dir, sock := servedAgent(t, "cli")

	code, out, errOut := trialnet("create", "--socket", sock, "--id", "cli-1", "--allow", "api.example.test:443", "-j")
	var info client.TrialInfo
	if code != 0 || json.Unmarshal([]byte(out), &info) != nil || info.ID != "cli-1" || info.ProxyURL == "" || info.Netns == "" || info.Cgroup == "" {
		t.Fatalf("create -j: exit %d, %q %q", code, out, errOut)
	}
	if info.Owner != nil { // a long-lived Trial ends with destroy alone
		t.Fatalf("create made a Trial owned by %+v", info.Owner)
	}
	if code, _, errOut := trialnet("create", "--socket", sock, "--id", "cli-1"); code != exitRefused || !strings.Contains(errOut, "already exists") {
		t.Fatalf("duplicate: exit %d, %q", code, errOut)
	}
	if code, out, _ := trialnet("list", "--socket", sock); code != 0 || !strings.Contains(out, "cli-1") || !strings.Contains(out, "api.example.test:443") {
		t.Fatalf("list: exit %d, %q", code, out)
	}
	if code, _, errOut := trialnet("exec", "--socket", sock, "--trial", "cli-1", "--uid", "65534", "--", "sh", "-c", `test "$HTTPS_PROXY" = http://127.0.0.1:3128 && exit 9`); code != 9 {
		t.Fatalf("exec: exit %d, want CMD's 9; %q", code, errOut)
	}
	if code, _, _ := trialnet("exec", "--socket", sock, "--trial", "cli-1", "--uid", "65534", "--", "no-such-command-trialnet"); code != 127 {
		t.Fatalf("exec of a missing command: exit %d, want 127", code)
	}
	if code, _, _ := trialnet("exec", "--socket", sock, "--trial", "nosuch", "--uid", "65534", "--", "true"); code != exitRefused {
		t.Fatalf("exec in an unknown Trial: exit %d, want %d", code, exitRefused)
	}
	// The process limit: the Trial's from create, unless exec or run
	// gives one.
	// A uid of these commands' own: RLIMIT_NPROC counts every process of
	// the uid, and packages testing alongside run many as 65534.
	lone := strconv.FormatUint(uint64(3_100_000_000+rand.Uint32N(1_000_000)), 10)
	limitIs := func(n string) []string {
		return []string{"--", "sh", "-c", `grep -q "^Max processes *` + n + ` *` + n + ` " /proc/self/limits && exit 9`}
	}
	if code, _, errOut := trialnet("create", "--socket", sock, "--id", "cli-2", "--max-procs", "77"); code != 0 {
		t.Fatalf("create --max-procs: exit %d, %q", code, errOut)
	}
	for _, c := range [][]string{
		append([]string{"exec", "--socket", sock, "--trial", "cli-2", "--uid", lone}, limitIs("77")...),
		append([]string{"exec", "--socket", sock, "--trial", "cli-2", "--uid", lone, "--max-procs", "33"}, limitIs("33")...),
		append([]string{"exec", "--socket", sock, "--trial", "cli-1", "--uid", lone}, limitIs("4096")...),
	} {
		if code, _, errOut := trialnet(c...); code != 9 {
			t.Errorf("%q: exit %d, want 9 (the limit as asked); %q", c, code, errOut)
		}
	}
	if code, out, _ := trialnet("stats", "--socket", sock, "--trial", "cli-1"); code != 0 || !strings.Contains(out, "connect4_denied") || !strings.Contains(out, "0 direct egress packets") {
		t.Fatalf("stats: exit %d, %q", code, out)
	}
	if code, out, _ := trialnet("audit", "--socket", sock, "--trial", "cli-1", "-j"); code != 0 || strings.TrimSpace(out) != "[]" {
		t.Fatalf("audit -j: exit %d, %q", code, out)
	}
	// run goes through the running agent: the Trial appears there while
	// CMD runs. Before Linux 6.5 (no SO_PEERPIDFD) the agent refuses to
	// own it, saying so; the embedded agent is the way there.
	peerPidfd := agent.HavePeerPidfd()
	if peerPidfd != nil {
		code, _, errOut = trialnet("run", "--socket", sock, "--uid", "65534", "--", "true")
		if code != 125 || !strings.Contains(errOut, "SO_PEERPIDFD") {
			t.Fatalf("run through the agent without SO_PEERPIDFD: exit %d, %q", code, errOut)
		}
	} else {
		code, _, errOut = trialnet("run", "--socket", sock, "--show-refusals", "--uid", "65534", "--",
			"sh", "-c", "curl -sS --max-time 5 https://refused.example.test/; exit 0")
		if code != 0 {
			t.Fatalf("run through the agent: exit %d, %q", code, errOut)
		}
		// The refusal comes over the agent's decision stream, as it happens.
		if !strings.Contains(errOut, "trialnet: refused CONNECT refused.example.test:443: policy_denied") ||
			!strings.Contains(errOut, "1 refused (refused.example.test:443 ×1)") {
			t.Fatalf("run --show-refusals through the agent:\n%s", errOut)
		}
		if m, _ := filepath.Glob(filepath.Join(dir, "data", "run-*", "stats.json")); len(m) != 1 {
			t.Fatalf("run did not go through the agent: final stats %v", m)
		}
		if code, _, errOut := trialnet(append([]string{"run", "--socket", sock, "--uid", lone, "--max-procs", "44"}, limitIs("44")...)...); code != 9 {
			t.Errorf("run --max-procs 44: exit %d, want 9 (the limit as asked); %q", code, errOut)
		}
	}
	if code, _, errOut := trialnet("run", "--socket", sock, "--config", "x.yaml", "--uid", "65534", "--", "true"); code != exitUsage || !strings.Contains(errOut, "own configuration") {
		t.Fatalf("run --config with an agent running: exit %d, %q", code, errOut)
	}
	// Flags end at CMD: one after it is CMD's argument, never trialnet's
	// (this one would make CMD root).
	flagCmds := [][]string{{"exec", "--trial", "cli-1"}, {"run"}}
	if peerPidfd != nil {
		flagCmds = flagCmds[:1]
	}
	for _, cmd := range flagCmds {
		args := append(cmd, "--socket", sock, "--uid", "65534", "sh", "-c", `test "$1 $2 $(id -u)" = "--uid 0 65534" && exit 9`, "sh", "--uid", "0")
		if code, _, errOut := trialnet(args...); code != 9 {
			t.Fatalf("%s with a flag after CMD: exit %d, want CMD's 9 (the flag is CMD's); %q", cmd[0], code, errOut)
		}
	}
	if code, out, _ := trialnet("destroy", "--socket", sock, "cli-1"); code != 0 || !strings.Contains(out, "verdict") {
		t.Fatalf("destroy: exit %d, %q", code, out)
	}
	if code, _, errOut := trialnet("destroy", "--socket", sock, "cli-2"); code != 0 {
		t.Fatalf("destroy cli-2: exit %d, %q", code, errOut)
	}
	if code, _, errOut := trialnet("destroy", "--socket", sock, "cli-1"); code != exitRefused || !strings.Contains(errOut, "no live Trial") {
		t.Fatalf("destroy twice: exit %d, %q", code, errOut)
	}
}

// trialnet agent with its metrics port in use exits 125 with the reason,
// and leaves neither its control socket nor its pins.
func TestPrivilegedAgentMetricsPortInUse(t *testing.T) {
	privtest.Require(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	hc := testenv.IsolatedHost(t, "metrics")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "trialnet.yaml")
	yaml := fmt.Sprintf("paths:\n  pin_dir: %s\n  netns_dir: %s\n  cgroup_parent: %s\n  state_dir: %s\n  data_dir: %s\n", hc.PinDir, hc.NetnsDir, hc.Parent, hc.StateDir, dir)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "agent.sock")
	code, _, errOut := trialnet("agent", "--config", cfg, "--socket", sock, "--metrics-addr", busy.Addr().String())
	if code != exitFailure || !strings.Contains(errOut, busy.Addr().String()) || !strings.Contains(errOut, "address already in use") {
		t.Fatalf("agent with its metrics port in use: exit %d, %q", code, errOut)
	}
	for _, p := range []string{sock, hc.PinDir} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left by an agent that did not start", p)
		}
	}
}

// uninstall --config removes what lives at the config's paths: its
// Trials (through the one teardown), records, pins, cgroup parent, and
// the files a stopped agent prepared for Trials.
func TestPrivilegedUninstallHonoursConfigPaths(t *testing.T) {
	privtest.Require(t)
	hc := testenv.IsolatedHost(t, "uninst")
	h, err := agent.OpenHost(hc)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := h.Create(trialspec.Spec{ID: "u1", UnixOpen: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = h.Close()
	data := t.TempDir()
	// A stopped agent's (a pid no process has) Trial files made ahead.
	shell := fmt.Sprintf("%s%d-7", sandbox.ShellPrefix, 1<<22-1)
	prepared := []string{filepath.Join(data, shell, "decisions.jsonl"), filepath.Join(hc.StateDir, shell+".ledgers", "1")}
	for _, p := range prepared {
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(t.TempDir(), "trialnet.yaml")
	yaml := fmt.Sprintf("paths:\n  pin_dir: %s\n  netns_dir: %s\n  cgroup_parent: %s\n  state_dir: %s\n  data_dir: %s\n", hc.PinDir, hc.NetnsDir, hc.Parent, hc.StateDir, data)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := trialnet("uninstall", "--config", cfg); code != exitFailure || !strings.Contains(errOut, "u1") {
		t.Fatalf("uninstall with a live Trial: exit %d %q; want a refusal naming it", code, errOut)
	}
	if code, out, errOut := trialnet("uninstall", "--config", cfg, "--force"); code != exitOK || !strings.Contains(out, hc.PinDir) {
		t.Fatalf("uninstall --force: exit %d %q %q", code, out, errOut)
	}
	for _, p := range append([]string{hc.PinDir, hc.Parent, tr.Cgroup, tr.Netns.Path, filepath.Join(hc.StateDir, "u1.json")}, filepath.Dir(prepared[0]), filepath.Dir(prepared[1])) {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left after uninstall --force --config", p)
		}
	}
}

// uninstall --config refuses a file someone but root could have written:
// its paths are what uninstall removes as root. The attack: a netns_dir
// naming root's directory and a cgroup_parent of the writer's holding a
// directory named like a file there; uninstall --force "destroyed" that
// Trial and removed the file. Seen red with rootsConfig returning nil:
// the victim file was removed, exit 0. The agent refuses it too (seen
// red without its call of rootsConfig: it went on, exit 125).
func TestPrivilegedUninstallRefusesAConfigNotRoots(t *testing.T) {
	privtest.Require(t)
	shared := privtest.SharedDir(t, "uninstall-")
	victims, theirs := filepath.Join(shared, "victims"), filepath.Join(shared, "theirs")
	for _, d := range []string{victims, filepath.Join(theirs, "cg", "shadow")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	victim := filepath.Join(victims, "shadow")
	if err := os.WriteFile(victim, []byte("root:secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	yaml := fmt.Sprintf("paths:\n  pin_dir: %s-none-%d\n  netns_dir: %s\n  cgroup_parent: %s\n  state_dir: %s\n  data_dir: %s\n",
		bpf.DefaultPinDir, os.Getpid(), victims, filepath.Join(theirs, "cg"), t.TempDir(), t.TempDir())
	for _, c := range []struct {
		name  string
		mode  os.FileMode
		owner int
		why   string
	}{
		{"own.yaml", 0o644, 65534, "uid 65534's"},
		{"world.yaml", 0o666, 0, "mode 0666"},
	} {
		cfg := filepath.Join(theirs, c.name)
		if err := errors.Join(os.WriteFile(cfg, []byte(yaml), c.mode), os.Chmod(cfg, c.mode), os.Chown(cfg, c.owner, c.owner)); err != nil {
			t.Fatal(err)
		}
		code, _, errOut := trialnet("uninstall", "--config", cfg, "--force")
		if code != exitUsage || !strings.Contains(errOut, c.why) {
			t.Errorf("uninstall --config %s: exit %d, want %d and %q: %s", c.name, code, exitUsage, c.why, errOut)
		}
		if _, err := os.Stat(victim); err != nil {
			t.Fatalf("uninstall --config %s removed %s: %v", c.name, victim, err)
		}
		agentRefuses(t, cfg, c.why)
	}
	// In a directory of another user's, a root file is refused too.
	if err := os.Chown(theirs, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(theirs, "roots.yaml")
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := trialnet("uninstall", "--config", cfg, "--force"); code != exitUsage || !strings.Contains(errOut, "owned by uid 65534") {
		t.Errorf("uninstall --config in uid 65534's directory: exit %d, want %d: %s", code, exitUsage, errOut)
	}
	agentRefuses(t, cfg, "owned by uid 65534")
	if _, err := os.Stat(victim); err != nil {
		t.Fatalf("uninstall removed %s: %v", victim, err)
	}
}

// agentRefuses runs an agent on config cfg, which it must refuse (exit
// 2, saying why) before it serves: it makes, writes and removes what the
// file's paths name, as root, and enforces its policy.
func agentRefuses(t *testing.T, cfg, why string) {
	t.Helper()
	cmd := trialnetProcess(t, "agent", "--config", cfg, "--socket", filepath.Join(t.TempDir(), "agent.sock"), "--keeper", "off")
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop := time.AfterFunc(20*time.Second, func() { _ = cmd.Process.Kill() }) // one that serves never ends
	defer stop.Stop()
	_ = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != exitUsage || !strings.Contains(errOut.String(), why) {
		t.Errorf("agent --config %s: exit %d, want %d and %q: %s", cfg, code, exitUsage, why, errOut.String())
	}
}

// audit prints the agent's records: -j parses back into proxy.Event
// unchanged, and the table shows each record's rule and profile.
func TestAuditPrintsTypedRecords(t *testing.T) {
	recs := []record.Event{
		{Schema: record.EventSchema, ID: "e1", Time: time.Date(2025, 1, 2, 3, 4, 5, 6000, time.UTC), Trial: "aud-1",
			Method: "CONNECT", Target: "api.example.test:443", Host: "api.example.test", Port: 443,
			Decision: record.DecisionAllow, Reason: record.ReasonAllowed, Resolved: []netip.Addr{netip.MustParseAddr("93.184.216.34")},
			Dialed: netip.MustParseAddrPort("93.184.216.34:443"), Rule: "api.example.test:443", Profile: "claude",
			BytesUp: 10, BytesDown: 20, Duration: 5 * time.Millisecond, DNS: time.Millisecond, Dial: time.Millisecond, FirstByte: 2 * time.Millisecond},
		{Schema: record.EventSchema, ID: "e2", Time: time.Date(2025, 1, 2, 3, 4, 6, 0, time.UTC), Trial: "aud-1",
			Method: "CONNECT", Target: "evil.example.test:443", Decision: record.DecisionDeny, Reason: record.ReasonPolicyDenied,
			Detail: "not on the allowlist"},
	}
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/trials/aud-1/audit" {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(recs)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	code, out, errOut := trialnet("audit", "--socket", sock, "--trial", "aud-1", "-j")
	var got []record.Event
	if code != exitOK || json.Unmarshal([]byte(out), &got) != nil {
		t.Fatalf("audit -j: exit %d, %q %q", code, out, errOut)
	}
	if !reflect.DeepEqual(got, recs) {
		t.Fatalf("audit -j read back as\n%+v\nwant\n%+v", got, recs)
	}
	code, out, errOut = trialnet("audit", "--socket", sock, "--trial", "aud-1")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != exitOK || len(lines) != 3 || !strings.Contains(lines[0], "RULE") || !strings.Contains(lines[0], "PROFILE") ||
		strings.Join(strings.Fields(lines[1])[2:8], " ") != "allow allowed api.example.test:443 claude 93.184.216.34:443 10" ||
		strings.Join(strings.Fields(lines[2])[2:4], " ") != "deny policy_denied" {
		t.Fatalf("audit: exit %d, %q %q", code, out, errOut)
	}
}

// fakeAgent serves h on a unix socket of its own and returns the socket.
func fakeAgent(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return sock
}

// servedAgent starts an in-process agent keeping its data in dir/data,
// serving its control API on sock in dir; both end with the test.
func servedAgent(t *testing.T, name string) (dir, sock string) {
	t.Helper()
	_, dir, sock = testenv.ServedAgent(t, name, agent.AgentConfig{})
	return dir, sock
}

// A receipt is bound to its run: the nonce create took, the Trial, and
// the decision log it was signed with, which verify finds beside it or
// is told of; without one, a distinct exit unless --no-log. A run
// through the agent shows its report's path in list while it runs.
func TestPrivilegedReceiptBoundToRun(t *testing.T) {
	privtest.Require(t)
	dir, sock := servedAgent(t, "receipt")
	if code, _, errOut := trialnet("create", "--socket", sock, "--id", "bound-1", "--nonce", "h-7f3a"); code != 0 {
		t.Fatalf("create --nonce: exit %d\n%s", code, errOut)
	}
	if code, _, errOut := trialnet("destroy", "--socket", sock, "bound-1"); code != 0 {
		t.Fatalf("destroy: exit %d\n%s", code, errOut)
	}
	kept := filepath.Join(dir, "data", "bound-1")
	copied := filepath.Join(t.TempDir(), "receipt.json")
	b, err := os.ReadFile(filepath.Join(kept, "receipt.json"))
	if err == nil {
		err = os.WriteFile(copied, b, 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(kept, "decisions.jsonl")
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{filepath.Join(kept, "receipt.json")}, exitOK, "decision log " + log + " matches"},
		{[]string{"--nonce", "h-7f3a", "--trial", "bound-1", copied}, exitNoLog, "decision log was not found"},
		{[]string{"--nonce", "h-7f3a", "--no-log", copied}, exitOK, "no decision log checked (--no-log)"},
		{[]string{"--nonce", "h-7f3a", "--log", log, copied}, exitOK, "matches"},
		{[]string{"--nonce", "h-0000", "--log", log, copied}, exitFailure, "is of another run"},
		{[]string{"--log", copied, copied}, exitFailure, "is not the one it was signed with"},
	} {
		code, out, errOut := trialnet(append([]string{"verify"}, c.args...)...)
		if code != c.code || !strings.Contains(out+errOut, c.want) {
			t.Errorf("verify %q: exit %d, want %d and %q\n%s%s", c.args, code, c.code, c.want, out, errOut)
		}
	}

	t.Run("list shows the report's path", func(t *testing.T) {
		// run through an agent needs SO_PEERPIDFD (TestPrivilegedCLIWithAgent)
		privtest.RequireKernel(t, agent.HavePeerPidfd())
		reports := filepath.Join(t.TempDir(), "reports")
		token := "trialnet-list-" + filepath.Base(dir)
		marker := filepath.Join(t.TempDir(), token)
		listed := make(chan string, 1)
		go func() {
			deadline := time.Now().Add(20 * time.Second)
			for !processWith(token) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			_, out, _ := trialnet("list", "--socket", sock)
			listed <- out
			_ = os.WriteFile(marker, nil, 0o644)
		}()
		code, _, errOut := trialnet("run", "--socket", sock, "--uid", "65534", "--id", "listed-1", "--report-dir", reports, "--",
			"sh", "-c", `i=0; while [ ! -e "$1" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done`, token, marker)
		if out := <-listed; code != 0 || !strings.Contains(out, "listed-1") || !strings.Contains(out, filepath.Join(reports, "listed-1.json")) {
			t.Fatalf("run: exit %d\n%s\nlist while it ran:\n%s", code, errOut, out)
		}
	})
}

func healthAnswer(status int, h client.Health) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(h)
	}
}

// health exits 0 only for a ready agent; an agent that answers unready
// exits 125 saying why (0 with --live); with no answer it says what stands
// in the way: no socket, a socket a killed agent left, an agent that
// accepts but does not answer.
func TestHealth(t *testing.T) {
	ready := fakeAgent(t, healthAnswer(http.StatusOK, client.Health{OK: true, EBPF: "attached", Agent: "serving", Trials: 2}))
	unready := fakeAgent(t, healthAnswer(http.StatusServiceUnavailable,
		client.Health{EBPF: "link trialnet_bind4: load pinned link: no such file or directory", Agent: "serving"}))
	notFound := fakeAgent(t, func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) })

	// What a SIGKILLed agent leaves: the socket file, nobody listening.
	stale := filepath.Join(t.TempDir(), "stale.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	_ = ln.Close()

	// An agent between taking its socket and serving it: connections
	// wait in the backlog, unanswered.
	hung := filepath.Join(t.TempDir(), "hung.sock")
	hl, err := net.Listen("unix", hung)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hl.Close() })

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--socket", ready}, exitOK, "is ready"},
		{[]string{"--socket", ready, "-j"}, exitOK, `"ok":true`},
		{[]string{"--socket", unready}, exitFailure, "is not ready: its eBPF links are not all pinned (link trialnet_bind4"},
		{[]string{"--socket", unready, "-j"}, exitFailure, `"ok":false`},
		{[]string{"--socket", unready, "--live"}, exitOK, "is not ready"},
		{[]string{"--socket", notFound}, exitFailure, "answered /healthz with 404"},
		{[]string{"--socket", filepath.Join(t.TempDir(), "none.sock")}, exitFailure, "no trialnet agent is running on"},
		{[]string{"--socket", filepath.Join(t.TempDir(), "none.sock"), "-j"}, exitFailure, `{"error":"no trialnet agent is running on`},
		{[]string{"--socket", stale, "--live"}, exitFailure, "left over from an agent that is gone"},
		{[]string{"--socket", hung, "--live", "--timeout", "300ms"}, exitFailure, "did not answer in time"},
		{[]string{"--socket", ready, "extra"}, exitUsage, "it takes flags only"},
		{[]string{"--socket", ready, "--timeout", "0s"}, exitUsage, "--timeout must be positive"},
	} {
		start := time.Now()
		code, out, errOut := trialnet(append([]string{"health"}, tc.args...)...)
		if code != tc.code || !strings.Contains(out+errOut, tc.want) {
			t.Errorf("health %v: exit %d, %q %q; want exit %d and %q", tc.args, code, out, errOut, tc.code, tc.want)
		}
		if took := time.Since(start); took > 3*time.Second {
			t.Errorf("health %v took %v", tc.args, took)
		}
	}
}

// rootsConfig follows a link at the config's own name only as far as
// root's word goes: a link someone else owns (in a sticky directory such
// as /tmp) can be pointed at their file once checked, before the load or
// a SIGHUP's reload, and a root link may lead into their directory. A
// root link to a root file is followed, and the file's real path is what
// gets read. Seen red with rootsConfig's Lstat made a Stat (the last
// name followed unchecked, as before): both links were accepted, and the
// root link returned as itself.
func TestPrivilegedRootsConfigFollowsOnlyRootsLinks(t *testing.T) {
	privtest.Require(t)
	dir := t.TempDir()
	roots, theirs, sticky := filepath.Join(dir, "roots"), filepath.Join(dir, "theirs"), filepath.Join(dir, "tmp")
	for _, d := range []string{roots, theirs, sticky} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := errors.Join(os.Chmod(sticky, 0o777|os.ModeSticky), os.Chown(theirs, 65534, 65534)); err != nil {
		t.Fatal(err)
	}
	good, inTheirs := filepath.Join(roots, "trialnet.yaml"), filepath.Join(theirs, "trialnet.yaml")
	for _, f := range []string{good, inTheirs} {
		if err := os.WriteFile(f, []byte("profiles: {}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(name, target string, owner int) string {
		p := filepath.Join(sticky, name)
		if err := errors.Join(os.Symlink(target, p), os.Lchown(p, owner, owner)); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct{ path, why string }{
		{link("theirs-link", good, 65534), "owned by uid 65534"},
		{link("into-theirs", inTheirs, 0), "owned by uid 65534"},
	} {
		if real, err := rootsConfig(c.path); err == nil || !strings.Contains(err.Error(), c.why) {
			t.Errorf("rootsConfig(%s) = %q, %v; want it refused, saying %q", c.path, real, err, c.why)
		}
	}
	p := link("roots-link", "../roots/trialnet.yaml", 0)
	if real, err := rootsConfig(p); err != nil || real != good {
		t.Errorf("rootsConfig(%s) = %q, %v; want %s, root's link and file", p, real, err, good)
	}
}
