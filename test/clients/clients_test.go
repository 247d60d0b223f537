//go:build linux

// Package clients runs real clients — curl, git, pip, npm, the go
// command, Python, Node, cargo and ssh — inside Trials against TLS
// upstreams on a test host, served under a test CA that each client
// trusts through the variable it reads. For every client it shows that
// the allowed name works through the proxy, that an off-list name is
// refused with its reason, and that the client skipping the proxy fails
// closed; each Trial's decision log is printed with the case.
package clients

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	agentclient "github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/record"
	trialspec "github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/agent"
	"github.com/trialnet/trialnet/internal/testenv"
	"github.com/trialnet/trialnet/internal/testhost"
	"github.com/trialnet/trialnet/sandbox"
	"github.com/trialnet/trialnet/test/ctr"
)

func TestMain(m *testing.M) {
	sandbox.Init()
	os.Exit(m.Run())
}

const (
	domain     = "clients.test"
	deniedHost = "denied." + domain // resolvable, never on an allowlist
	subnet     = 190
	nobody     = 65534
	// runTimeout bounds one client run; clients are told to give up sooner.
	runTimeout = 3 * time.Minute
	// trialPath is the PATH of commands in the Trials (and the go command's
	// directory): Debian's tools, not the operator's.
	trialPath = "/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// world is a test host with the upstreams on port 443 (TLS) and 80
// (plain HTTP), sshd on 22 when the ssh case starts it, a DNS server on
// the test host naming it for every name (the agent's resolver, which logs
// what it is asked), and an agent whose Trials may reach the test host's
// range.
type world struct {
	host    *testhost.Host
	dns     *testhost.DNSLog
	agent   *agent.Agent
	dir     string // world-readable: the CA, the Trials' homes
	caFile  string
	cert    tls.Certificate // *.clients.test, under the CA in caFile
	gitRoot string
	commit  func() string // pushes a commit to demo.git, returns its hash

	// ctr, when set, runs the Trials' commands in containers of its
	// runtime instead of through trialnet's launch path (container_test.go).
	ctr  ctr.Runner
	sock string // the agent's control socket

	accepts atomic.Int64 // TCP connections the upstreams accepted
	mu      sync.Mutex
	hits    map[string]int // requests by Host
}

// newAgentWorld starts a world: its test host, upstreams, DNS and agent.
func newAgentWorld(t *testing.T) *world {
	t.Helper()
	dir := privtest.SharedDir(t, "clients-")
	w := &world{host: testhost.NewT(t, subnet), dir: dir, caFile: filepath.Join(dir, "ca.pem"),
		gitRoot: filepath.Join(dir, "git"), hits: map[string]int{}}
	if err := os.Mkdir(w.gitRoot, 0o755); err != nil {
		t.Fatal(err)
	}
	w.commit = gitRepo(t, w.gitRoot)
	w.commit()
	w.cert = testCA(t, w.caFile)

	h := upstreams(t, w.gitRoot)
	for _, port := range []uint16{443, 80} {
		ln, err := w.host.NS.Listen(context.Background(), "tcp", netip.AddrPortFrom(w.host.Addr4, port).String())
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{
			Handler: http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
				w.mu.Lock()
				w.hits[r.Host]++
				w.mu.Unlock()
				h.ServeHTTP(rw, r)
			}),
			TLSConfig: &tls.Config{Certificates: []tls.Certificate{w.cert}},
			// It bounds the TLS handshake too, which a JVM under TCG
			// can take past 10 s in.
			ReadHeaderTimeout: time.Minute,
		}
		if port == 443 {
			go func() { _ = srv.ServeTLS(countingListener{ln, &w.accepts}, "", "") }()
		} else {
			go func() { _ = srv.Serve(countingListener{ln, &w.accepts}) }()
		}
		t.Cleanup(func() { _ = srv.Close() })
	}

	var err error
	if w.dns, err = w.host.ServeDNS(w.host.Addr4); err != nil {
		t.Fatal(err)
	}
	// Served on its control socket: trialnet oci-hook asks it about the
	// containers of container_test.go.
	w.agent, _, w.sock = testenv.ServedAgent(t, "clients", agent.AgentConfig{
		Resolvers: []string{netip.AddrPortFrom(w.host.Addr4, 53).String()}, AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")},
	})
	return w
}

type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

func (w *world) hitsFor(host string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hits[host]
}

// caEnv is how each client is told to trust the test CA: the variable it
// reads, all set at once, as an operator would for every Trial.
func (w *world) caEnv() []string {
	var env []string
	for _, v := range []string{"SSL_CERT_FILE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT", "REQUESTS_CA_BUNDLE",
		"NODE_EXTRA_CA_CERTS", "CARGO_HTTP_CAINFO"} {
		env = append(env, v+"="+w.caFile)
	}
	return env
}

// trial is one client's Trial: its own allowlist, home and decision log.
type trial struct {
	t    *testing.T
	w    *world
	info agentclient.TrialInfo
	tr   *sandbox.Launcher
	home string
	uid  uint32
	path string // PATH inside the Trial
	seq  int    // numbers each run's working directory
	ctr  ctr.Runner
}

func (w *world) newTrial(t *testing.T, name string, uid uint32, allow ...string) *trial {
	t.Helper()
	tc, err := w.tryTrial(t, name, uid, trialspec.Request{Allow: allow})
	if err != nil {
		t.Fatal(err)
	}
	return tc
}

// tryTrial makes the Trial req asks for, named after name, or says why
// the agent would not.
func (w *world) tryTrial(t *testing.T, name string, uid uint32, req trialspec.Request) (*trial, error) {
	t.Helper()
	req.ID = "cl-" + name
	info, err := w.agent.Create(context.Background(), req)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _, _ = w.agent.Destroy(context.Background(), info.ID) })
	tr, err := agent.Attach(info)
	if err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(w.dir, "home-"+name)
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, int(uid), int(uid)); err != nil {
		t.Fatal(err)
	}
	path := trialPath
	if goBin, err := exec.LookPath("go"); err == nil {
		path += ":" + filepath.Dir(goBin)
	}
	return &trial{t: t, w: w, info: info, tr: tr, home: home, uid: uid, path: path, ctr: w.ctr}, nil
}

// workdir is a fresh directory in the Trial's home, owned by its user.
func (tc *trial) workdir(what string) string {
	tc.t.Helper()
	tc.seq++
	d := filepath.Join(tc.home, fmt.Sprintf("%s-%d", what, tc.seq))
	if err := os.Mkdir(d, 0o755); err != nil {
		tc.t.Fatal(err)
	}
	if err := os.Chown(d, int(tc.uid), int(tc.uid)); err != nil {
		tc.t.Fatal(err)
	}
	return d
}

// write puts a file into the Trial's home, owned by its user.
func (tc *trial) write(path, body string) {
	tc.t.Helper()
	err := os.WriteFile(path, []byte(body), 0o644)
	if err == nil {
		err = os.Chown(path, int(tc.uid), int(tc.uid))
	}
	if err != nil {
		tc.t.Fatal(err)
	}
}

// run runs argv in the Trial with the CA variables and env, and, when
// proxied, the proxy variables every Trial process gets.
func (tc *trial) run(proxied bool, env []string, argv ...string) (int, string) {
	tc.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	var out bytes.Buffer
	c := sandbox.Command{
		Args: argv, Env: append(append([]string{"PATH=" + tc.path, "HOME=" + tc.home, "LANG=C.UTF-8"}, tc.w.caEnv()...), env...),
		Dir: tc.home, UID: tc.uid, GID: tc.uid, Stdout: &out, Stderr: &out,
	}
	if proxied {
		c.ProxyURL = tc.info.ProxyURL
	}
	if tc.ctr != nil {
		return tc.runInContainer(ctx, c, &out)
	}
	code, err := tc.tr.Exec(ctx, c, nil)
	var se *sandbox.StartError
	if errors.As(err, &se) {
		tc.t.Fatalf("%s did not start: %v", argv[0], err)
	}
	if err != nil {
		tc.t.Fatalf("%s: %v\n%s", argv[0], err, out.String())
	}
	return code, out.String()
}

// decisions is the Trial's decision log, read back as the proxy wrote it.
func (tc *trial) decisions() []record.Event {
	tc.t.Helper()
	recs, err := tc.w.agent.Audit(context.Background(), tc.info.ID)
	if err != nil {
		tc.t.Fatal(err)
	}
	return recs
}

// waitDecision waits (bounded) for a decision on host:port matching
// decision and reason (any reason if empty): an allowed tunnel is logged
// when it closes, just after the client exits.
func (tc *trial) waitDecision(host string, port uint16, decision record.Decision, reason record.Reason) (record.Event, bool) {
	tc.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, e := range tc.decisions() {
			if e.Host == host && e.Port == port && e.Decision == decision && (reason == "" || e.Reason == reason) {
				return e, true
			}
		}
		if time.Now().After(deadline) {
			return record.Event{}, false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kernel is the Trial's count of refusals by the eBPF layer and its
// direct egress packets.
func (tc *trial) kernel() (refused, egress uint64) {
	tc.t.Helper()
	st, err := tc.w.agent.Stats(context.Background(), tc.info.ID)
	if err != nil {
		tc.t.Fatal(err)
	}
	for k, v := range st.Kernel {
		if strings.HasSuffix(k, "_denied") {
			refused += v
		}
	}
	return refused, st.Egress
}

// failedClosed fails the test unless what ran between before and now
// reached nothing: no connection at the upstreams, at least one refusal
// counted by the kernel, no direct egress packet.
func (tc *trial) failedClosed(what string, code int, out string, accepts int64, refused uint64) {
	tc.t.Helper()
	r, egress := tc.kernel()
	switch {
	case code == 0:
		tc.t.Errorf("%s: exit 0, want a failure:\n%s", what, out)
	case tc.w.accepts.Load() != accepts:
		tc.t.Errorf("%s: the upstreams accepted %d connections", what, tc.w.accepts.Load()-accepts)
	case r <= refused:
		tc.t.Errorf("%s: the kernel counted no refusal (%d before, %d after):\n%s", what, refused, r, out)
	case egress != 0:
		tc.t.Errorf("%s: %d direct egress packets", what, egress)
	default:
		tc.t.Logf("%s: failed closed (exit %d, %d kernel refusals, 0 direct egress packets): %s", what, code, r-refused, errorLine(out))
	}
}

// errorLine is the line of a client's output that says why it failed:
// the first naming an error, else the last.
func errorLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for _, l := range lines {
		lower := strings.ToLower(l)
		if (strings.Contains(lower, "error") || strings.Contains(lower, "fail") || strings.Contains(lower, "403")) &&
			!strings.Contains(lower, "complete log") {
			return strings.TrimSpace(l)
		}
	}
	return strings.TrimSpace(lines[len(lines)-1])
}

// logDecisions prints the Trial's decision log with the case.
func (tc *trial) logDecisions() {
	tc.t.Helper()
	for _, e := range tc.decisions() {
		dialed := ""
		if e.Dialed.IsValid() {
			dialed = e.Dialed.String()
		}
		tc.t.Logf("decision: %s %s %s %s rule=%q dialed=%q sni=%q up=%d down=%d detail=%q",
			e.Method, e.Target, e.Decision, e.Reason, e.Rule, dialed, e.SNI, e.BytesUp, e.BytesDown, e.Detail)
	}
}
