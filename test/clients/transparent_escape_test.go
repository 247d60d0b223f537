//go:build linux

package clients

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testhost"
	"github.com/trialnet/trialnet/record"
)

// echoPort is a port the allowlists below name only sometimes: the test
// host echoes on it, counting connections.
const echoPort = 8443

// TestPrivilegedTransparentRefusals is a Trial attacking transparent
// mode from inside: hiding data in DNS names, fronting another name
// through an allowed name's pool address, connecting to a pool address
// never handed out, to an allowed name on a port not allowed, exhausting
// the pool, binding the stub's or a pool address itself to intercept, and
// datagrams (QUIC) to an allowed name's address.
// Each asserts the refusal and that nothing reached the test host.
func TestPrivilegedTransparentRefusals(t *testing.T) {
	privtest.Require(t)
	w := newAgentWorld(t)
	ln, err := w.host.NS.Listen(context.Background(), "tcp", netip.AddrPortFrom(w.host.Addr4, echoPort).String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	var echoes atomic.Int64
	go testhost.Echo(countingListener{ln, &echoes})

	t.Run("dns-exfil", func(t *testing.T) { dnsExfil(t, w) })
	t.Run("sni-fronting", func(t *testing.T) { sniFronting(t, w) })
	t.Run("unassigned-pool-address", func(t *testing.T) { unassignedPoolAddress(t, w) })
	t.Run("bind-stub-and-pool-address", func(t *testing.T) { bindToIntercept(t, w, &echoes) })
	t.Run("port-not-allowed", func(t *testing.T) { portNotAllowed(t, w, &echoes) })
	t.Run("pool-exhaustion", func(t *testing.T) { poolExhaustion(t, w) })
	t.Run("udp-to-pool", func(t *testing.T) { udpToPool(t, w) })
}

// probe runs transprobe in the Trial and decodes its JSON report.
func (tc *trial) probe(report any, args ...string) {
	tc.t.Helper()
	code, out := tc.run(false, nil, append([]string{tc.w.transprobe(tc.t)}, args...)...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	last := lines[len(lines)-1]
	if code != 0 || json.Unmarshal([]byte(last), report) != nil {
		tc.t.Fatalf("transprobe %s: exit %d\n%s", args[0], code, out)
	}
	tc.t.Logf("transprobe %s: %s", args[0], last)
}

// dnsExfil: names carrying a marker, every record type, UDP and TCP, to
// the stub; then the test host's DNS server directly (UDP and TCP 53, DoT
// 853), the host's own nameservers and resolver daemons; then glibc's
// path. The stub answers every query (it exists and has no upstream),
// gives no record to a name the allowlist does not admit, and the test
// host's DNS server, which the agent resolves with, is asked nothing.
func dnsExfil(t *testing.T, w *world) {
	tc := w.newTrial(t, "tp-exfil", nobody, "exfil-ok."+domain+":443", "*.wild."+domain+":443")
	t.Cleanup(tc.logDecisions)
	marker := randomLabel("tnx")

	// The detector works: a question asked from outside a Trial is logged.
	control := randomLabel("ctl")
	m := new(dns.Msg)
	m.SetQuestion(control+".exfil.example.", dns.TypeTXT)
	if _, err := dns.Exchange(m, netip.AddrPortFrom(w.host.Addr4, 53).String()); err != nil || len(w.dns.Asked(control)) != 1 {
		t.Fatalf("the test host's DNS server did not log a question asked from the host (%v): the check below would be blind", err)
	}

	direct := append([]string{w.host.Addr4.String(), w.host.Local4.String()}, hostNameservers()...)
	before := tc.received()
	var rep struct {
		Asked       int               `json:"asked"`
		Unanswered  int               `json:"unanswered"`
		Rcodes      map[string]int    `json:"rcodes"`
		WithRecords []string          `json:"with_records"`
		Direct      map[string]string `json:"direct"`
	}
	tc.probe(&rep, "exfil", "-marker", marker, "-under", strings.Join([]string{"exfil-ok." + domain, "wild." + domain, deniedHost}, ","),
		"-direct", strings.Join(direct, ","))
	if rep.Asked == 0 || rep.Unanswered != 0 {
		t.Errorf("the stub answered %d of %d queries: every query must get an answer (NXDOMAIN, REFUSED, NODATA), none may wait for an upstream; is the stub on %s?",
			rep.Asked-rep.Unanswered, rep.Asked, "127.0.0.53:53")
	}
	for _, r := range rep.WithRecords {
		// Only a name under the allowed wildcard is admitted (its A gets a
		// pool address); the exact name admits nothing below it.
		if !strings.Contains(strings.ToLower(r), ".wild."+domain+". ") {
			t.Errorf("a name the allowlist does not admit got records: %s", r)
		}
	}
	for what, err := range rep.Direct {
		if err == "" {
			t.Errorf("%s: reached from the Trial", what)
		}
	}
	// glibc's resolver, through nsswitch and resolv.conf, for a marked name.
	tc.nameNotFound(marker + ".exfil.example")
	if code, out := tc.run(false, nil, "getent", "hosts", "127.100.0.1"); code == 0 {
		t.Errorf("a reverse lookup of a pool address answered: %s", out)
	}
	if q := w.dns.Asked(marker); len(q) != 0 {
		t.Errorf("the test host's DNS server was asked %d questions carrying the marker, e.g. %v", len(q), q[0])
	}
	if got := tc.received() - before; got != 0 {
		t.Errorf("the test host received %d connections or datagrams", got)
	}
}

// randomLabel is prefix and 8 random hex digits: a marker no other test
// asks about.
func randomLabel(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// hostNameservers are the nameservers of the host's own resolv.conf.
func hostNameservers() []string {
	b, err := os.ReadFile("/etc/resolv.conf")
	if err != nil {
		return nil
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "nameserver" {
			out = append(out, f[1])
		}
	}
	return out
}

// sniFronting: a TLS ClientHello naming another host, or none, and a
// plain HTTP request whose Host names another host, each sent to an
// allowed name's pool address: refused, as CONNECT refuses them, and the
// other host is never asked for.
func sniFronting(t *testing.T, w *world) {
	front := "front." + domain
	tc := w.newTrial(t, "tp-front", nobody, front+":443", front+":80")
	t.Cleanup(tc.logDecisions)
	addr, ok := tc.lookup(front)
	if !ok {
		return
	}
	if code, out := tc.run(false, nil, "curl", "-sS", "--fail", "--max-time", "20", url(front, "/hello")); code != 0 {
		t.Errorf("the allowed name itself: exit %d\n%s", code, out)
	}
	for _, c := range []struct {
		what string
		port uint16
		argv []string
	}{
		{"SNI naming another host", 443, []string{"--resolve", fmt.Sprintf("%s:443:%s", deniedHost, addr), url(deniedHost, "/hello")}},
		{"no SNI (the pool address as the URL)", 443, []string{"-k", url(addr.String(), "/hello")}},
		{"plain HTTP, Host naming another host", 80, []string{"-H", "Host: " + deniedHost, "http://" + front + "/hello"}},
	} {
		accepts, denies := w.accepts.Load(), len(tc.denials(front, c.port))
		code, out := tc.run(false, nil, append([]string{"curl", "-sS", "--fail", "--max-time", "20"}, c.argv...)...)
		switch {
		case code == 0:
			t.Errorf("%s: exit 0:\n%s", c.what, out)
		case w.hitsFor(deniedHost) != 0 || w.hitsFor(addr.String()) != 0:
			t.Errorf("%s: the upstream served it", c.what)
		}
		var e []record.Event
		for deadline := time.Now().Add(5 * time.Second); len(e) <= denies && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			e = tc.denials(front, c.port)
		}
		if len(e) <= denies {
			t.Errorf("%s: no new deny decision for %s:%d", c.what, front, c.port)
			continue
		}
		t.Logf("%s: refused (%s; %d upstream connections); curl said: %s", c.what, e[len(e)-1].Reason, w.accepts.Load()-accepts, errorLine(out))
	}
}

// denials are the Trial's deny decisions for host:port so far.
func (tc *trial) denials(host string, port uint16) []record.Event {
	tc.t.Helper()
	var out []record.Event
	for _, e := range tc.decisions() {
		if e.Host == host && e.Port == port && e.Decision == record.DecisionDeny {
			out = append(out, e)
		}
	}
	return out
}

// lastPoolAddr is the pool's highest address, which a Trial that looks
// up a few names is never handed.
func lastPoolAddr() netip.Addr {
	a := pool.Masked().Addr().As4()
	hostBits := 32 - pool.Bits()
	n := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	n |= 1<<hostBits - 2
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
}

type interceptReport struct {
	Listen   map[string]string `json:"listen"`
	Accepted int               `json:"accepted"`
	Dial     dialReport        `json:"dial"`
}

type dialReport struct {
	Resolved string `json:"resolved"`
	Resolve  string `json:"resolve_err"`
	Connect  string `json:"connect_err"`
	Read     string `json:"read"`
	ReadErr  string `json:"read_err"`
}

// unassignedPoolAddress: a connection to a pool address no name was
// given lands in the agent, which refuses it, even when a Trial process
// listens on that very address (with steering off it would get it).
func unassignedPoolAddress(t *testing.T, w *world) {
	tc := w.newTrial(t, "tp-unassigned", nobody, "assigned."+domain+":"+fmt.Sprint(echoPort))
	t.Cleanup(tc.logDecisions)
	target := netip.AddrPortFrom(lastPoolAddr(), echoPort).String()
	before := tc.received()
	var rep interceptReport
	tc.probe(&rep, "intercept", "-listen", target, "-connect", target)
	if rep.Listen["tcp "+target] != "" {
		t.Logf("the Trial could not listen on %s: %s", target, rep.Listen["tcp "+target])
	}
	if rep.Accepted != 0 || rep.Dial.Read != "" {
		t.Errorf("a connection to %s, never handed out, was served (by the Trial's own listener: %d; read %q): it must land in the agent and be refused",
			target, rep.Accepted, rep.Dial.Read)
	}
	if got := tc.received() - before; got != 0 {
		t.Errorf("the test host received %d connections or datagrams", got)
	}
}

// bindToIntercept: a Trial binds the stub's address (UDP and TCP, with
// and without SO_REUSEPORT) and the pool address its allowed name was
// given, then looks the name up and connects: the lookup is answered by
// the stub and the connection reaches the test host through the agent,
// never the Trial's own sockets.
func bindToIntercept(t *testing.T, w *world, echoes *atomic.Int64) {
	name := "bound." + domain
	tc := w.newTrial(t, "tp-bound", nobody, fmt.Sprintf("%s:%d", name, echoPort))
	t.Cleanup(tc.logDecisions)
	addr, ok := tc.lookup(name)
	if !ok {
		return
	}
	own := netip.AddrPortFrom(addr, echoPort).String()
	was := echoes.Load()
	var rep interceptReport
	tc.probe(&rep, "intercept", "-listen", own, "-connect", fmt.Sprintf("%s:%d", name, echoPort))
	for what, err := range rep.Listen {
		t.Logf("bind %s: %s", what, cmp.Or(err, "bound"))
	}
	switch {
	case rep.Accepted != 0:
		t.Errorf("the Trial's own sockets got %d connections or queries meant for the stub or the agent", rep.Accepted)
	case rep.Dial.Resolved != addr.String():
		t.Errorf("%s resolved to %q (%s), want %s from the stub", name, rep.Dial.Resolved, rep.Dial.Resolve, addr)
	case rep.Dial.Read != "x\n" || echoes.Load() != was+1:
		t.Errorf("the connection to %s did not reach the test host through the agent: read %q (%s %s), %d echo connections",
			name, rep.Dial.Read, rep.Dial.Connect, rep.Dial.ReadErr, echoes.Load()-was)
	default:
		tc.transparentAllowed(name, echoPort)
	}
	if again, ok := tc.lookup(name); ok && again != addr {
		t.Errorf("%s is now %s, was %s", name, again, addr)
	}
}

// portNotAllowed: an allowed name on a port its entry does not name:
// the connection lands in the agent and is refused and recorded, and the
// test host, listening on that port, sees nothing.
func portNotAllowed(t *testing.T, w *world, echoes *atomic.Int64) {
	name := "port." + domain
	tc := w.newTrial(t, "tp-port", nobody, name+":443")
	t.Cleanup(tc.logDecisions)
	was, before := echoes.Load(), tc.received()
	var rep dialReport
	tc.probe(&rep, "dial", fmt.Sprintf("%s:%d", name, echoPort))
	if a, err := netip.ParseAddr(rep.Resolved); err != nil || !pool.Contains(a) {
		t.Errorf("%s resolved to %q (%s), want a pool address: the name is allowed, on another port", name, rep.Resolved, rep.Resolve)
	}
	if rep.Read != "" || echoes.Load() != was {
		t.Errorf("%s:%d was served (read %q, %d echo connections): the port is not allowed", name, echoPort, rep.Read, echoes.Load()-was)
	}
	if got := tc.received() - before; got != 0 {
		t.Errorf("the test host received %d connections or datagrams", got)
	}
	e, ok := tc.waitDecision(name, echoPort, record.DecisionDeny, "")
	switch {
	case !ok:
		t.Errorf("no deny decision for %s:%d", name, echoPort)
	case !markedTransparent(e):
		t.Errorf("the deny decision for %s:%d is not marked transparent", name, echoPort)
	default:
		t.Logf("%s:%d refused: %s", name, echoPort, e.Reason)
	}
}

// poolExhaustion: a Trial asks for distinct names under an allowed
// wildcard until the stub refuses; the names after are refused too, the
// first keeps its address and still works, and none of them was asked
// upstream (only the one connected to is resolved, by the agent).
func poolExhaustion(t *testing.T, w *world) {
	suffix := "wild." + domain
	tc := w.newTrial(t, "tp-exhaust", nobody, "*."+suffix+":443")
	t.Cleanup(tc.logDecisions)
	var rep struct {
		FirstRefused int    `json:"first_refused"`
		LaterRefused int    `json:"later_refused"`
		FirstAddr    string `json:"first_addr"`
		FirstAgain   string `json:"first_again"`
		Err          string `json:"err"`
	}
	const most = 5000
	start := time.Now()
	tc.probe(&rep, "exhaust", "-suffix", suffix, "-max", fmt.Sprint(most))
	t.Logf("%v asking", time.Since(start).Round(time.Second))
	if rep.Err != "" {
		t.Fatalf("before any bound: %s (is the stub wired?)", rep.Err)
	}
	switch {
	case rep.FirstRefused < 0:
		t.Errorf("%d names under *.%s, every one given an address: no bound", most, suffix)
	case rep.FirstRefused == 0:
		t.Errorf("the first name was refused")
	case rep.LaterRefused != 20:
		t.Errorf("after the bound (%d names), %d of the next 20 were refused, want all", rep.FirstRefused, rep.LaterRefused)
	case rep.FirstAgain != rep.FirstAddr:
		t.Errorf("the first name was %q, is now %q", rep.FirstAddr, rep.FirstAgain)
	}
	first := "n0." + suffix
	if code, out := tc.run(false, nil, "curl", "-sS", "--fail", "--max-time", "20", url(first, "/hello")); code != 0 || w.hitsFor(first) != 1 {
		t.Errorf("the first name after exhaustion: exit %d, %d upstream requests\n%s", code, w.hitsFor(first), out)
	}
	var upstream []string
	for _, q := range w.dns.Asked(suffix) {
		if !strings.EqualFold(q.Name, dns.Fqdn(first)) {
			upstream = append(upstream, q.Name)
		}
	}
	if len(upstream) != 0 {
		slices.Sort(upstream)
		t.Errorf("%d names the Trial only looked up were asked upstream, e.g. %s", len(upstream), upstream[0])
	}
}

// udpToPool: datagrams to an allowed name's pool address and port (a
// QUIC client's first flight among them), unconnected from IPv4 and from
// IPv6 by the mapped form, and on a connected socket: nothing steers UDP,
// so none leaves the Trial's loopback, none is relayed or recorded, and
// the connected socket hears ICMP port unreachable, as QUIC clients
// expect before they fall back to TCP.
func udpToPool(t *testing.T, w *world) {
	name := "quic." + domain
	tc := w.newTrial(t, "tp-udp", nobody, fmt.Sprintf("%s:%d", name, echoPort))
	t.Cleanup(tc.logDecisions)
	before := tc.received()
	var rep struct {
		Resolved string            `json:"resolved"`
		Resolve  string            `json:"resolve_err"`
		Sent     map[string]string `json:"sent"`
		ReadErr  string            `json:"read_err"`
	}
	tc.probe(&rep, "udp", fmt.Sprintf("%s:%d", name, echoPort))
	if a, err := netip.ParseAddr(rep.Resolved); err != nil || !pool.Contains(a) {
		t.Errorf("%s resolved to %q (%s), want a pool address", name, rep.Resolved, rep.Resolve)
	}
	for _, how := range []string{"sendto4", "sendto6-mapped", "connected-quic"} {
		if err, ok := rep.Sent[how]; !ok || err != "" {
			t.Errorf("%s: %q, want sent (to the Trial's own loopback, where it finds no socket)", how, err)
		}
	}
	if !strings.Contains(rep.ReadErr, "connection refused") {
		t.Errorf("the connected socket's read after its datagram: %q, want connection refused (ICMP port unreachable)", rep.ReadErr)
	}
	if got := tc.received() - before; got != 0 {
		t.Errorf("the test host received %d connections or datagrams", got)
	}
	for _, e := range tc.decisions() {
		if e.Host == name {
			t.Errorf("a decision for %s: %+v; datagrams are never relayed", name, e)
		}
	}
}
