//go:build linux

package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/record"
)

// A learning Trial tunnels a name off its allowlist and says so in the
// record; the address guard, the IP-literal check and the enforcing
// Trial beside it still refuse.
func TestLearningWidensNamesOnly(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{learn: true, allow: []string{"listed.example.com:443"}, cidrs: []string{"198.18.0.0/15"}})
	enforcing := tp.addTrial(t, "t2", "listed.example.com:443")
	tp.dns.set("listed.example.com", 60, "198.18.0.10")
	tp.dns.set("off.example.com", 60, "198.18.0.11")
	tp.dns.set("meta.example.com", 60, "169.254.169.254")
	tp.dns.set("lo.example.com", 60, "127.0.0.1")

	for _, c := range []struct {
		target    string
		status    int
		reason    record.Reason
		wouldDeny record.Reason
	}{
		{"listed.example.com:443", 200, record.ReasonAllowed, ""},
		{"off.example.com:443", 200, record.ReasonAllowed, record.ReasonPolicyDenied},
		{"meta.example.com:80", 403, record.ReasonAddressDenied, record.ReasonPolicyDenied},
		{"lo.example.com:443", 403, record.ReasonAddressDenied, record.ReasonPolicyDenied},
		{"198.18.0.11:443", 403, record.ReasonIPLiteral, ""},
	} {
		resp, c2, _ := tp.connect(t, connectHead(c.target))
		if resp.StatusCode != c.status {
			t.Fatalf("%s: status %d, want %d", c.target, resp.StatusCode, c.status)
		}
		_ = c2.Close()
		ev := tp.event(t)
		if ev.Reason != c.reason || ev.WouldDeny != c.wouldDeny || !ev.Learning {
			t.Fatalf("%s: record reason %q would_deny %q learning %v; want %q %q true", c.target, ev.Reason, ev.WouldDeny, ev.Learning, c.reason, c.wouldDeny)
		}
		if c.wouldDeny != "" && ev.Rule != "" {
			t.Fatalf("%s: a name let through by learning has rule %q", c.target, ev.Rule)
		}
	}
	resp, _, _ := enforcing.connect(t, connectHead("off.example.com:443"))
	if ev := tp.event(t); resp.StatusCode != 403 || ev.Reason != record.ReasonPolicyDenied || ev.Learning || ev.WouldDeny != "" {
		t.Fatalf("enforcing Trial: status %d, record %+v", resp.StatusCode, ev)
	}
	if st, _ := tp.Stats("t1"); st.WouldDeny != 1 || st.Allowed != 2 {
		t.Fatalf("learning stats %+v: want 2 allowed, 1 of them would_deny", st)
	}
}

// openEcho opens a tunnel through tp and checks that it echoes.
func openEcho(t *testing.T, tp *testProxy, target string) (net.Conn, *bufio.Reader) {
	t.Helper()
	resp, c, br := tp.connect(t, connectHead(target))
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT %s: %s", target, resp.Status)
	}
	if !echoes(c, br) {
		t.Fatalf("tunnel to %s does not echo", target)
	}
	return c, br
}

// echoes reports whether a tunnel to the echo upstream still carries data.
func echoes(c net.Conn, br *bufio.Reader) bool {
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		return false
	}
	line, err := br.ReadString('\n')
	return err == nil && line == "ping\n"
}

// A changed allowlist applies to the next CONNECT; cut ends exactly the
// open tunnels that a removed entry allowed.
func TestSetAllowAppliesAndCutsOnlyRemovedEntries(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{allow: []string{"a.example.com:443", "*.w.example.com:443"}, cidrs: []string{"198.18.0.0/15"}})
	for _, n := range []string{"a", "b", "x.w"} {
		tp.dns.set(n+".example.com", 60, "198.18.0.10")
	}
	refused := func(target string) bool {
		resp, c, _ := tp.connect(t, connectHead(target))
		_ = c.Close()
		ev := tp.event(t)
		return resp.StatusCode == 403 && ev.Reason == record.ReasonPolicyDenied
	}
	if !refused("b.example.com:443") {
		t.Fatal("b before allow: not refused")
	}
	cur, _ := tp.Allow("t1")
	bEntry, _ := allow.ParseEntry("b.example.com:443")
	next, err := cur.Change([]allow.Entry{bEntry}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tp.SetAllow("t1", next, nil); err != nil {
		t.Fatal(err)
	}
	ca, bra := openEcho(t, tp, "a.example.com:443")
	cb, brb := openEcho(t, tp, "b.example.com:443")
	cw, brw := openEcho(t, tp, "x.w.example.com:443")

	// Remove a without cut: its tunnel stays, new CONNECTs are refused.
	aEntry, _ := allow.ParseEntry("a.example.com:443")
	cur, _ = tp.Allow("t1")
	next, _ = cur.Change(nil, []allow.Entry{aEntry})
	if n, err := tp.SetAllow("t1", next, nil); err != nil || n != 0 {
		t.Fatalf("remove a without cut: %d cut, %v", n, err)
	}
	if !refused("a.example.com:443") || !echoes(ca, bra) {
		t.Fatal("after removing a without cut: want new CONNECTs refused and the open tunnel kept")
	}
	// Remove b and the wildcard with cut, naming only them: a's tunnel
	// (its entry already gone, not cut now) stays.
	wEntry, _ := allow.ParseEntry("*.w.example.com:443")
	cur, _ = tp.Allow("t1")
	next, _ = cur.Change(nil, []allow.Entry{bEntry, wEntry})
	n, err := tp.SetAllow("t1", next, []allow.Entry{bEntry, wEntry})
	if err != nil || n != 2 {
		t.Fatalf("cut b and *.w: %d cut, %v", n, err)
	}
	if echoes(cb, brb) || echoes(cw, brw) {
		t.Fatal("a tunnel of a removed entry survived the cut")
	}
	if !echoes(ca, bra) {
		t.Fatal("the cut ended a tunnel of an entry it did not name")
	}
	for range 2 {
		if ev := tp.event(t); !strings.Contains(ev.Detail, "tunnel cut by a policy change") || ev.Decision != record.DecisionAllow {
			t.Fatalf("cut tunnel's record: %+v", ev)
		}
	}
}

// Changes and CONNECTs race (run with -race): every CONNECT is answered
// under some version of the list, and after a final removal with cut no
// tunnel of the removed entry is left open, however the two interleaved.
func TestSetAllowConcurrentWithConnects(t *testing.T) {
	tp := newTestProxy(t, proxyOpts{allow: []string{"a.example.com:443"}, cidrs: []string{"198.18.0.0/15"}})
	tp.dns.set("a.example.com", 60, "198.18.0.10")
	// Records by client address: a connection closed without an answer
	// is judged by what the proxy recorded for it.
	var recMu sync.Mutex
	records := map[string]record.Event{}
	go func() {
		for e := range tp.events {
			recMu.Lock()
			records[e.Client] = e
			recMu.Unlock()
		}
	}()
	recordOf := func(addr string) (record.Event, bool) {
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			recMu.Lock()
			e, ok := records[addr]
			recMu.Unlock()
			if ok {
				return e, true
			}
		}
		return record.Event{}, false
	}
	a, _ := allow.ParseEntry("a.example.com:443")
	with, without := allow.New(a), allow.New()
	const rounds, clients = 50, 4
	var wg sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				c, err := net.Dial("tcp", tp.addr)
				if err != nil {
					t.Error(err)
					return
				}
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				_, _ = io.WriteString(c, connectHead("a.example.com:443"))
				line, _ := bufio.NewReader(c).ReadString('\n')
				switch {
				case strings.HasPrefix(line, "HTTP/1.1 200"):
					mu.Lock()
					open = append(open, c)
					mu.Unlock()
				case strings.HasPrefix(line, "HTTP/1.1 403"):
					_ = c.Close()
				case line == "":
					// No answer at all: the proxy's record of the
					// connection says which path lost it.
					_ = c.Close()
					e, ok := recordOf(c.LocalAddr().String())
					t.Errorf("a CONNECT got no answer; the proxy's record of it: %+v (found %v)", e, ok)
				default:
					t.Errorf("answer %q", line)
					_ = c.Close()
				}
			}
		}()
	}
	clientsDone := make(chan struct{})
	toggled := make(chan int)
	go func() { // toggles for as long as the clients run, at most 100000 times
		i := 0
		defer func() { toggled <- i }()
		for ; i < 100000; i++ {
			select {
			case <-clientsDone:
				return
			default:
			}
			l := with
			if i%2 == 0 {
				l = without
			}
			if _, err := tp.SetAllow("t1", l, []allow.Entry{a}); err != nil {
				t.Error(err)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}()
	wg.Wait()
	close(clientsDone)
	t.Logf("%d allowlist changes", <-toggled)
	if _, err := tp.SetAllow("t1", without, []allow.Entry{a}); err != nil {
		t.Fatal(err)
	}
	if len(open) == 0 {
		t.Fatal("no tunnel was opened while the allowlist changed: nothing to cut")
	}
	deadline := time.Now().Add(3 * time.Second) // one wait for all of them
	for i, c := range open {
		_ = c.SetDeadline(deadline)
		// A cut tunnel ends (EOF or reset); one left open times out, as
		// the echo upstream says nothing unless written to.
		if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("tunnel %d of %d is open after its entry was removed with cut (%v)", i, len(open), err)
		}
		_ = c.Close()
	}
	t.Logf("%d tunnels were opened and cut", len(open))
}

// A cut that lands after a CONNECT is registered but before its 200 is
// written must leave the client a refusal, not a bare close: the race
// TestSetAllowConcurrentWithConnects hits now and then, made certain.
func TestCutBeforeAnswerRefuses(t *testing.T) {
	e, _ := allow.ParseEntry("a.example.com:443")
	client, peer := net.Pipe()
	defer peer.Close()
	ot := &openTunnel{entry: e, ruled: true, client: client, up: nil}
	ot.cut(record.ReasonPolicyDenied, "its allowlist entry a.example.com:443 was removed")
	err := ot.establish(connectAnswer)
	var d *record.Denial
	if !errors.As(err, &d) || d.Reason != record.ReasonPolicyDenied || !strings.Contains(d.Detail, "while the tunnel was being opened") {
		t.Fatalf("establish after a cut: %v, want a policy denial", err)
	}
	// A second cut (the entry removed again, before the refusal is
	// written) leaves it open too: closing it would lose the refusal.
	ot.cut(record.ReasonPolicyDenied, "its allowlist entry a.example.com:443 was removed")
	// The client connection was left open for the refusal.
	go func() { _, _ = io.WriteString(client, "x") }()
	_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := peer.Read(make([]byte, 1)); err != nil {
		t.Fatalf("the cut closed the unanswered client connection: %v", err)
	}

	// Answered first: the 200 goes out, and a cut then closes.
	client2, peer2 := net.Pipe()
	defer peer2.Close()
	ot2 := &openTunnel{entry: e, ruled: true, client: client2}
	got := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(peer2).ReadString('\n')
		got <- line
	}()
	if err := ot2.establish(connectAnswer); err != nil {
		t.Fatal(err)
	}
	if line := <-got; !strings.HasPrefix(line, "HTTP/1.1 200") {
		t.Fatalf("answer %q", line)
	}
	ot2.cut(record.ReasonPolicyDenied, "its allowlist entry a.example.com:443 was removed")
	if _, err := client2.Write([]byte("x")); !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("a cut after the answer left the client open: %v", err)
	}
}

func TestAllowlistChangeRefusals(t *testing.T) {
	l, err := allow.Parse([]string{"a.example.com:443", "*.w.example.com:443"}, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ remove, want string }{
		{"b.example.com:443", "not an entry"},
		{"x.w.example.com:443", "allowed by *.w.example.com:443"},
		{"a.example.com:80", "not an entry"},
	} {
		e, _ := allow.ParseEntry(c.remove)
		if _, err := l.Change(nil, []allow.Entry{e}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("remove %s: %v, want %q", c.remove, err, c.want)
		}
	}
	a, _ := allow.ParseEntry("a.example.com:443")
	next, err := l.Change(nil, []allow.Entry{a})
	if err != nil || next.Has(a) || !l.Has(a) || len(next.Entries()) != 1 {
		t.Fatalf("remove a: %v %v", next.Entries(), err)
	}
}

// Learn lists exactly what was let through and offers a wildcard only
// for enough hosts under one registrable domain, never over a public
// suffix; its profile loads as configuration.
func TestLearnProfile(t *testing.T) {
	var recs []record.Event
	add := func(host string, port uint16, d record.Decision, wouldDeny record.Reason) {
		recs = append(recs, record.Event{Trial: "l1", Host: host, Port: port, Decision: d, WouldDeny: wouldDeny})
	}
	for _, h := range []string{"a.cdn.example.com", "b.cdn.example.com", "c.x.cdn.example.com"} {
		add(h, 443, record.DecisionAllow, record.ReasonPolicyDenied)
	}
	add("a.cdn.example.com", 443, record.DecisionAllow, "") // counted twice
	for _, h := range []string{"p.two.example.org", "q.two.example.org"} {
		add(h, 443, record.DecisionAllow, record.ReasonPolicyDenied) // two hosts: no wildcard
	}
	for _, h := range []string{"u1.github.io", "u2.github.io", "u3.github.io"} {
		add(h, 443, record.DecisionAllow, record.ReasonPolicyDenied) // three owners: no wildcard
	}
	add("metadata.example.com", 80, record.DecisionDeny, record.ReasonPolicyDenied) // refused: left out
	recs = append(recs, record.Event{Trial: "l1", Decision: record.DecisionPolicyChange, PolicyChange: &record.PolicyChange{UID: 0}})
	l := config.Learn(recs, 0)
	var got []string
	for _, e := range l.Entries {
		got = append(got, fmt.Sprintf("%s=%d/%d", e.Entry, e.Allowed, e.WouldDeny))
	}
	want := "a.cdn.example.com:443=1/1 b.cdn.example.com:443=0/1 c.x.cdn.example.com:443=0/1 p.two.example.org:443=0/1 q.two.example.org:443=0/1 u1.github.io:443=0/1 u2.github.io:443=0/1 u3.github.io:443=0/1"
	if strings.Join(got, " ") != want {
		t.Fatalf("entries\n%s\nwant\n%s", strings.Join(got, " "), want)
	}
	if len(l.Wildcards) != 1 || l.Wildcards[0].Entry.String() != "*.cdn.example.com:443" || len(l.Wildcards[0].Hosts) != 3 || l.Changes != 1 {
		t.Fatalf("wildcards %+v, changes %d", l.Wildcards, l.Changes)
	}
	y, err := l.Profile("learned")
	if err != nil {
		t.Fatal(err)
	}
	f, err := config.ParseFile(y)
	if err != nil {
		t.Fatalf("profile does not load: %v\n%s", err, y)
	}
	al, _ := f.Allowlist([]string{"learned"}, nil, false)
	if len(al.Entries()) != 8 || !strings.Contains(string(y), `# offered: - "*.cdn.example.com:443"`) || strings.Contains(string(y), "metadata") {
		t.Fatalf("profile:\n%s", y)
	}
	if _, err := config.Learn(recs[len(recs)-2:], 0).Profile("x"); err == nil {
		t.Fatal("a profile of nothing let through")
	}
}
