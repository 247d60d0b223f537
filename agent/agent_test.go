//go:build linux

package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testhost"
	"github.com/trialnet/trialnet/sandbox"
	trialspec "github.com/trialnet/trialnet/trial"
)

func TestMain(m *testing.M) {
	sandbox.Init()
	// The test binary doubles as an owner: a process of its own that asks
	// for owned Trials (ownerProcess).
	if sock := os.Getenv(ownerSocketEnv); sock != "" {
		os.Exit(ownerMain(sock, strings.Split(os.Getenv(ownerIDsEnv), ",")))
	}
	if sock := os.Getenv(preparerEnv); sock != "" {
		os.Exit(preparerMain(sock))
	}
	if os.Getenv(probeEnv) != "" {
		os.Exit(probeMain())
	}
	if sock := os.Getenv(lostPredecessorEnv); sock != "" {
		os.Exit(lostPredecessorMain(sock))
	}
	os.Exit(m.Run())
}

const upstreamPort = 8081

// world is a test host serving HTTP on upstreamPort and an in-process DNS
// server that names it.
type world struct {
	host     *testhost.Host
	dnsAddr  string
	requests atomic.Int64
	holding  atomic.Int64 // /hold requests open now
}

// waitHolding waits until n /hold requests have reached the upstream: their
// tunnels are answered, not only accepted by the proxy.
func (w *world) waitHolding(t *testing.T, n int64) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); w.holding.Load() != n; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests held at the upstream, want %d", w.holding.Load(), n)
		}
	}
}

func newWorld(t testing.TB, subnet uint8, names ...string) *world {
	t.Helper()
	w := &world{host: testhost.NewT(t, subnet)}
	ln, err := w.host.NS.Listen(context.Background(), "tcp", netip.AddrPortFrom(w.host.Addr4, upstreamPort).String())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		w.requests.Add(1)
		if w.hold(rw, r) {
			return
		}
		fmt.Fprintf(rw, "hello from %s", r.Host)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	addr, stop, err := testhost.ServeDNS(w.host.Addr4, names...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	w.dnsAddr = addr
	return w
}

func (w *world) config(t testing.TB) AgentConfig {
	return AgentConfig{
		Host:       isolatedHost(t),
		DataDir:    t.TempDir(),
		ReceiptKey: filepath.Join(t.TempDir(), "receipt.key"),
		Resolvers:  []string{w.dnsAddr},
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")},
	}
}

func startAgent(t testing.TB, cfg AgentConfig) *Agent {
	t.Helper()
	a, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(true) })
	if !cfg.Ephemeral {
		// Its first creates take shells, as a running agent's do.
		readyShells(t, a, a.file.Load().PreparedShells())
	}
	return a
}

// startAgentToClose starts an agent that the test closes itself, with
// closeAgent (Close's teardown), which closes it once; the cleanup
// closes it (tearing down) where the test did not get that far.
func startAgentToClose(t testing.TB, cfg AgentConfig) (a *Agent, closeAgent func(teardown bool)) {
	t.Helper()
	a, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	closeAgent = func(teardown bool) { once.Do(func() { a.Close(teardown) }) }
	t.Cleanup(func() { closeAgent(true) })
	return a, closeAgent
}

// namesWithPrefix are the names in dir that begin with prefix.
func namesWithPrefix(t *testing.T, dir, prefix string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// curl runs curl in the Trial as nobody and returns its exit code and output.
func curl(t *testing.T, a *Agent, id string, args ...string) (int, string) {
	t.Helper()
	info, err := a.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return curlIn(t, info, args...)
}

// curlIn runs curl in a Trial as nobody, from this process, the way
// `trialnet exec` does: attached by the paths the agent reports.
func curlIn(t *testing.T, info client.TrialInfo, args ...string) (int, string) {
	t.Helper()
	tr, err := Attach(info)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out bytes.Buffer
	code, err := tr.Exec(ctx, sandbox.Command{
		Args: append([]string{"curl", "-sS", "--max-time", "5"}, args...), Env: []string{"PATH=/usr/bin:/bin"},
		UID: 65534, GID: 65534, ProxyURL: info.ProxyURL, Stdout: &out, Stderr: &out,
	}, nil)
	if err != nil && code < 0 {
		t.Fatalf("exec curl: %v", err)
	}
	return code, out.String()
}

// through curls url through the Trial's proxy (CONNECT even for http).
func through(t *testing.T, a *Agent, id, url string) (int, string) {
	return curl(t, a, id, "--proxytunnel", "-x", ProxyURL, url)
}

func TestPrivilegedTrialReachesOnlyItsAllowlist(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 221, "upstream.example.test", "other.example.test")
	cfg := w.config(t)
	var journal lockedBuffer // the agent's log: decision records go there too
	cfg.Logger = slog.New(slog.NewTextHandler(&journal, nil))
	a := startAgent(t, cfg)
	info, err := a.Create(context.Background(), trialspec.Request{ID: "agt-allow", Allow: []string{fmt.Sprintf("upstream.example.test:%d", upstreamPort)}})
	if err != nil {
		t.Fatal(err)
	}
	if info.ProxyURL != "http://127.0.0.1:3128" || !strings.HasSuffix(info.Netns, "/agt-allow") || !strings.HasSuffix(info.Cgroup, "/agt-allow") {
		t.Fatalf("info %+v", info)
	}
	ip := w.host.Addr4.String()
	if code, out := through(t, a, info.ID, fmt.Sprintf("http://upstream.example.test:%d/", upstreamPort)); code != 0 || !strings.Contains(out, "hello from upstream.example.test") {
		t.Fatalf("allowed name: curl exit %d: %s", code, out)
	}
	// The proxy variables every Trial process gets lead to the proxy.
	if code, out := curl(t, a, info.ID, "--proxytunnel", fmt.Sprintf("http://upstream.example.test:%d/", upstreamPort)); code != 0 {
		t.Fatalf("through http_proxy from the environment: curl exit %d: %s", code, out)
	}
	// Plain http:// as clients send it through http_proxy: forwarded in
	// absolute form under the same policy, not tunnelled.
	if code, out := curl(t, a, info.ID, fmt.Sprintf("http://upstream.example.test:%d/", upstreamPort)); code != 0 || !strings.Contains(out, "hello from upstream.example.test") {
		t.Fatalf("plain http through the Trial's proxy: curl exit %d: %s", code, out)
	}
	if _, out := curl(t, a, info.ID, "-i", fmt.Sprintf("http://other.example.test:%d/", upstreamPort)); !strings.Contains(out, "403") || !strings.Contains(out, "policy_denied") {
		t.Fatalf("plain http to a name off the allowlist: %s", out)
	}
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(journal.String(), "reason=policy_denied"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the refusal is not in the agent's log:\n%s", journal.String())
		}
	}
	for _, c := range []struct{ what, url string }{
		{"other name", fmt.Sprintf("http://other.example.test:%d/", upstreamPort)},
		{"IP literal", fmt.Sprintf("http://%s:%d/", ip, upstreamPort)},
	} {
		if code, out := through(t, a, info.ID, c.url); code == 0 || !strings.Contains(out, "403") {
			t.Fatalf("%s: curl exit %d: %s", c.what, code, out)
		}
	}
	if code, out := curl(t, a, info.ID, "--noproxy", "*", fmt.Sprintf("http://%s:%d/", ip, upstreamPort)); code == 0 {
		t.Fatalf("direct connection succeeded: %s", out)
	}
	if n := w.requests.Load(); n != 3 {
		t.Fatalf("the test host saw %d requests, want exactly the three allowed ones", n)
	}
	// Each decision is counted as its record is written, after the answer.
	st := waitStats(t, a, info.ID, func(st client.Stats) bool {
		return st.Proxy.ByReason["allowed"] == 3 && st.Proxy.ByReason["policy_denied"] == 2 && st.Proxy.ByReason["ip_literal"] == 1
	})
	if st.Kernel["connect4_denied"] < 1 || st.Egress != 0 || !strings.HasPrefix(st.Verdict, "verdict: 0 direct egress packets") {
		t.Fatalf("kernel %v, egress %d, verdict %q", st.Kernel, st.Egress, st.Verdict)
	}
	final, err := a.Destroy(context.Background(), info.ID)
	if err != nil {
		t.Fatal(err)
	}
	if final.Proxy.Allowed != 3 || final.Proxy.BytesDown == 0 {
		t.Fatalf("final stats %+v", final.Proxy)
	}
	recs, err := a.Audit(context.Background(), info.ID)
	if err != nil || len(recs) != 6 {
		t.Fatalf("audit after destroy: %d records, %v", len(recs), err)
	}
	if _, err := os.Stat(filepath.Join(a.cfg.DataDir, info.ID, "stats.json")); err != nil {
		t.Fatalf("final stats not kept: %v", err)
	}
	// A destroyed Trial's stats are its final ones, read where they are
	// kept, with its receipt: signed by the host key, naming the log.
	kept, err := a.Stats(context.Background(), info.ID)
	if err != nil || kept.Proxy.Allowed != 3 || kept.Receipt == nil {
		t.Fatalf("stats of the destroyed Trial: %+v, %v", kept, err)
	}
	b, err := os.ReadFile(filepath.Join(a.cfg.DataDir, info.ID, "receipt.json"))
	if err != nil {
		t.Fatal(err)
	}
	var signed client.SignedReceipt
	if err := json.Unmarshal(b, &signed); err != nil {
		t.Fatal(err)
	}
	pub, err := ReadPublicKey(ReceiptPublicKey(a.cfg.ReceiptKey))
	if err != nil {
		t.Fatal(err)
	}
	r, err := signed.Verify(pub)
	if err != nil {
		t.Fatal(err)
	}
	digest, err := DigestLog(a.decisionLog(info.ID))
	if err != nil || r.DecisionLog == nil || *r.DecisionLog != *digest || r.Proxy.Allowed != 3 || r.Trial != info.ID || len(r.Programs) == 0 {
		t.Fatalf("receipt %+v (log %+v, %v)", r, digest, err)
	}
	if _, err := a.Get(context.Background(), info.ID); err == nil {
		t.Fatal("a destroyed Trial is still listed")
	}
}

func TestPrivilegedTwoTrialsSeparateAllowlists(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 222, "a.example.test", "b.example.test")
	a := startAgent(t, w.config(t))
	for _, id := range []string{"agt-a", "agt-b"} {
		name := id[len(id)-1:] + ".example.test"
		if _, err := a.Create(context.Background(), trialspec.Request{ID: id, Allow: []string{fmt.Sprintf("%s:%d", name, upstreamPort)}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Create(context.Background(), trialspec.Request{ID: "agt-a"}); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("duplicate id: %v", err)
	}
	for _, c := range []struct {
		trial, name string
		ok          bool
	}{{"agt-a", "a", true}, {"agt-a", "b", false}, {"agt-b", "b", true}, {"agt-b", "a", false}} {
		code, out := through(t, a, c.trial, fmt.Sprintf("http://%s.example.test:%d/", c.name, upstreamPort))
		if (code == 0) != c.ok {
			t.Fatalf("%s -> %s: curl exit %d: %s", c.trial, c.name, code, out)
		}
	}
	// The metrics carry each Trial's decisions under its own label. A
	// refusal is counted as its record is written, which may come a
	// moment after the client read the 403: wait for it, bounded.
	wants := []string{
		"trialnet_trials_live{}",
		"trialnet_proxy_decisions_total{decision=allow,reason=allowed,trial=agt-a,}",
		"trialnet_proxy_decisions_total{decision=deny,reason=policy_denied,trial=agt-b,}",
		"trialnet_direct_egress_packets_total{trial=agt-a,}",
		"trialnet_kernel_connect4_allowed_total{trial=agt-b,}",
	}
	var seen map[string]float64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		seen = map[string]float64{}
		for _, mf := range scrape(t, a.MetricsHandler(), false) {
			for _, m := range mf.GetMetric() {
				labels := ""
				for _, l := range m.GetLabel() {
					labels += l.GetName() + "=" + l.GetValue() + ","
				}
				seen[mf.GetName()+"{"+labels+"}"] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
		if !slices.ContainsFunc(wants, func(w string) bool { _, ok := seen[w]; return !ok }) || time.Now().After(deadline) {
			break
		}
	}
	for _, want := range wants {
		if _, ok := seen[want]; !ok {
			t.Errorf("metric %s missing", want)
		}
	}
	if seen["trialnet_trials_live{}"] != 2 || seen["trialnet_proxy_decisions_total{decision=allow,reason=allowed,trial=agt-a,}"] != 1 {
		t.Errorf("metric values: %v", seen)
	}
	for _, id := range []string{"agt-a", "agt-b"} {
		recs, err := a.Audit(context.Background(), id)
		if err != nil || len(recs) != 2 {
			t.Fatalf("%s: %d records, %v", id, len(recs), err)
		}
		for _, r := range recs {
			if r.Trial != id {
				t.Fatalf("%s's log has a record of another Trial: %+v", id, r)
			}
		}
	}
}

func TestPrivilegedCreateRefusals(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 223)
	a := startAgent(t, w.config(t))
	for _, c := range []struct {
		req  trialspec.Request
		code string
	}{
		{trialspec.Request{ID: "Bad/ID"}, client.CodeBadID},
		{trialspec.Request{ID: "agt-p", Profiles: []string{"nosuch"}}, client.CodeUnknownProfile},
		{trialspec.Request{ID: "agt-q", Allow: []string{"*.com:443"}}, client.CodeBadAllowlist},
		{trialspec.Request{ID: "agt-r", Allow: []string{"127.0.0.1:443"}}, client.CodeBadAllowlist},
	} {
		_, err := a.Create(context.Background(), c.req)
		var e *client.Error
		if !errors.As(err, &e) || e.Code != c.code {
			t.Errorf("%+v: %v, want code %s", c.req, err, c.code)
		}
	}
	if len(a.list()) != 0 {
		t.Fatalf("refused creates left Trials: %v", a.list())
	}
	// The Trials' files kept ready beside the shells are the pool's.
	entries, _ := os.ReadDir(a.cfg.Host.StateDir)
	if len(entries) != len(shellEntries(t, a.cfg.Host.StateDir)) {
		t.Fatalf("refused creates left state files: %v", entries)
	}
}

// An id used again starts a fresh decision log; the earlier Trial's log
// and final stats stay on disk beside it.
func TestPrivilegedReusedIDStartsAFreshLog(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 233)
	a := startAgent(t, w.config(t))
	if _, err := a.Create(context.Background(), trialspec.Request{ID: "agt-reuse"}); err != nil {
		t.Fatal(err)
	}
	if code, _ := through(t, a, "agt-reuse", "http://denied.example.test:443/"); code == 0 {
		t.Fatal("a CONNECT with an empty allowlist succeeded")
	}
	if _, err := a.Destroy(context.Background(), "agt-reuse"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Create(context.Background(), trialspec.Request{ID: "agt-reuse"}); err != nil {
		t.Fatal(err)
	}
	if recs, err := a.Audit(context.Background(), "agt-reuse"); err != nil || len(recs) != 0 {
		t.Fatalf("the new Trial's log has %d records (%v): the old Trial's leaked in", len(recs), err)
	}
	old, _ := filepath.Glob(filepath.Join(a.cfg.DataDir, "agt-reuse.*", "decisions.jsonl"))
	if len(old) != 1 {
		t.Fatalf("the earlier Trial's log was not kept: %v", old)
	}
}

// An ended Trial's decision log is audited only as its receipt signed
// it: one with a record taken out, or one put in, was read as the whole
// and clean account of the Trial.
func TestPrivilegedAuditRefusesAnEndedLogChanged(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 233)
	a := startAgent(t, w.config(t))
	if _, err := a.Create(context.Background(), trialspec.Request{ID: "agt-tamper"}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if code, _ := through(t, a, "agt-tamper", "http://denied.example.test:443/"); code == 0 {
			t.Fatal("a CONNECT with an empty allowlist succeeded")
		}
	}
	if _, err := a.Destroy(context.Background(), "agt-tamper"); err != nil {
		t.Fatal(err)
	}
	path := a.decisionLog("agt-tamper")
	signed, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if recs, err := a.Audit(context.Background(), "agt-tamper"); err != nil || len(recs) != 2 {
		t.Fatalf("the log as signed: %d records, %v", len(recs), err)
	}
	first, rest, _ := bytes.Cut(signed, []byte("\n"))
	for name, b := range map[string][]byte{
		"a refusal taken out": rest,
		"a record put in":     append(slices.Clone(signed), first...),
	} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if recs, err := a.Audit(context.Background(), "agt-tamper"); err == nil || !strings.Contains(err.Error(), "not the one its receipt was signed with") {
			t.Errorf("%s: audited as %d records (%v)", name, len(recs), err)
		} else if appended := strings.Contains(err.Error(), "were added after the Trial ended"); appended != (name == "a record put in") {
			// A draining predecessor's late records are appended too.
			t.Errorf("%s: %v; want it to say whether records were only added", name, err)
		}
	}
}

// An ended Trial's log is audited only as its own receipt signed it: not
// as another Trial's receipt and log, moved into its directory, sign
// them (each signature and digest holds, for the other Trial), nor when
// its receipt was signed with no log and one was put there after.
func TestPrivilegedAuditRefusesAnotherTrialsLog(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 233)
	a := startAgent(t, w.config(t))
	for _, id := range []string{"agt-denied", "agt-clean", "agt-nolog"} {
		if _, err := a.Create(context.Background(), trialspec.Request{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	if code, _ := through(t, a, "agt-denied", "http://denied.example.test:443/"); code == 0 {
		t.Fatal("a CONNECT with an empty allowlist succeeded")
	}
	if err := os.Remove(a.decisionLog("agt-nolog")); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"agt-denied", "agt-clean", "agt-nolog"} {
		if _, err := a.Destroy(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	denied, err := os.ReadFile(a.decisionLog("agt-denied"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"receipt.json", "decisions.jsonl"} {
		b, err := os.ReadFile(filepath.Join(a.cfg.DataDir, "agt-clean", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(a.cfg.DataDir, "agt-denied", f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if recs, err := a.Audit(context.Background(), "agt-denied"); err == nil || !strings.Contains(err.Error(), `is Trial "agt-clean"'s`) {
		t.Errorf("another Trial's receipt and log: audited as %d records (%v)", len(recs), err)
	}
	if err := os.WriteFile(a.decisionLog("agt-nolog"), denied, 0o600); err != nil {
		t.Fatal(err)
	}
	if recs, err := a.Audit(context.Background(), "agt-nolog"); err == nil || !strings.Contains(err.Error(), "signed when it had no decision log") {
		t.Errorf("a log put where the receipt signed none: audited as %d records (%v)", len(recs), err)
	}
}

// hold serves /hold, a request held open as a long tunnel (counted in
// holding until its client goes), and says whether r was it.
func (w *world) hold(rw http.ResponseWriter, r *http.Request) bool {
	if r.URL.Path != "/hold" {
		return false
	}
	w.holding.Add(1)
	defer w.holding.Add(-1)
	rw.WriteHeader(http.StatusOK)
	rw.(http.Flusher).Flush()
	<-r.Context().Done()
	return true
}

// An ephemeral agent's Trial has no tunnel ledger, names file or DNS
// counts file, which only a later agent serving the Trial reads: its
// Trials end with it, and a run finding one that a killed run left
// removes them unread. A daemon's Trial has them, the control. Seen red
// with each made whatever the agent (the ephemeral Trial's file there).
func TestPrivilegedEphemeralTrialKeepsNoFilesForASuccessor(t *testing.T) {
	privtest.Require(t)
	ctx := context.Background()
	for _, c := range []struct {
		name      string
		ephemeral bool
	}{{"daemon", false}, {"ephemeral", true}} {
		t.Run(c.name, func(t *testing.T) {
			host := isolatedHost(t)
			a := startAgent(t, AgentConfig{Host: host, DataDir: t.TempDir(), Ephemeral: c.ephemeral, File: &config.File{}})
			info, err := a.Create(ctx, trialspec.Request{})
			if err != nil {
				t.Fatal(err)
			}
			if !info.Transparent {
				t.Fatal("the Trial is not transparent: its names and DNS counts files are not made either way")
			}
			for _, suffix := range []string{".ledgers", namesSuffix, dnsCountsSuffix} {
				p := filepath.Join(host.StateDir, info.ID+suffix)
				_, err := os.Lstat(p)
				if c.ephemeral && !errors.Is(err, os.ErrNotExist) {
					t.Errorf("the ephemeral agent's Trial has %s (%v), which no agent reads", p, err)
				}
				if !c.ephemeral && err != nil {
					t.Errorf("the daemon's Trial has no %s: %v", suffix, err)
				}
			}
			if _, err := a.Destroy(ctx, info.ID); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// An agent with NoReceipt (an embedded one whose run writes no report)
// signs no receipt and never reads, nor makes, the receipt key; the
// control, without it, signs with the key it makes. Seen red with
// NoReceipt ignored (a receipt, and the key made).
func TestPrivilegedNoReceiptSignsNothing(t *testing.T) {
	privtest.Require(t)
	ctx := context.Background()
	for _, unsigned := range []bool{false, true} {
		t.Run(fmt.Sprint("no-receipt=", unsigned), func(t *testing.T) {
			key := filepath.Join(t.TempDir(), "receipt.key")
			a := startAgent(t, AgentConfig{Host: isolatedHost(t), ReceiptKey: key, Ephemeral: true, NoReceipt: unsigned, File: &config.File{}})
			info, err := a.Create(ctx, trialspec.Request{})
			if err != nil {
				t.Fatal(err)
			}
			st, err := a.Destroy(ctx, info.ID)
			if err != nil {
				t.Fatal(err)
			}
			_, kerr := os.Lstat(key)
			if unsigned && (st.Receipt != nil || !errors.Is(kerr, os.ErrNotExist)) {
				t.Errorf("with NoReceipt: receipt %v, key %s: %v; want neither", st.Receipt != nil, key, kerr)
			}
			if !unsigned && (st.Receipt == nil || kerr != nil) {
				t.Errorf("without NoReceipt: receipt %v, key %s: %v; want both", st.Receipt != nil, key, kerr)
			}
		})
	}
}

// The proxy starts beside the host's opening: a start whose host cannot
// open (pins outside bpffs) stops the proxy it started, its netlink
// watches and counts region among it. Start is a library call, and a
// caller that goes on after the failure would hold them until it exits.
func TestPrivilegedStartFailureStopsTheProxy(t *testing.T) {
	privtest.Require(t)
	open := func() []string {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		var held []string
		for _, e := range ents {
			if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && (strings.HasPrefix(l, "socket:") || strings.HasPrefix(l, "/memfd:")) {
				held = append(held, l)
			}
		}
		return held
	}
	host := isolatedHost(t)
	host.PinDir = t.TempDir() // not on bpffs: the host does not open
	cfg := AgentConfig{Host: host, DataDir: t.TempDir(), ReceiptKey: filepath.Join(t.TempDir(), "receipt.key"), Ephemeral: true, File: &config.File{}}
	if a, err := Start(cfg); err == nil { // the runtime's own descriptors (netpoll) are made by the first start
		a.Close(true)
		t.Fatal("an agent started with its pins outside bpffs")
	}
	before := open()
	if a, err := Start(cfg); err == nil {
		a.Close(true)
		t.Fatal("an agent started with its pins outside bpffs")
	} else if !strings.Contains(err.Error(), "bpf") {
		t.Fatalf("the start failed, but not at the host's opening: %v", err)
	}
	if after := open(); len(after) != len(before) {
		t.Fatalf("%d sockets and memfds held after a failed start (%v), %d before (%v)", len(after), after, len(before), before)
	}
}
