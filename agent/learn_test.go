//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testhost"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/sandbox"
	trialspec "github.com/trialnet/trialnet/trial"
)

// A learning Trial reaches names off its (empty) allowlist through curl,
// each recorded as would_deny, while the address guard still refuses a
// metadata and a loopback answer. The profile audit makes of its log,
// loaded as configuration, gives an enforcing Trial exactly those names.
func TestPrivilegedLearnThenEnforce(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 234)
	names := []string{"a.svc.learn.test", "b.svc.learn.test", "c.svc.learn.test"}
	dnsAddr, stop, err := testhost.ServeDNSMap(map[string]netip.Addr{
		names[0]: w.host.Addr4, names[1]: w.host.Addr4, names[2]: w.host.Addr4, "other.learn.test": w.host.Addr4,
		"meta.learn.test": netip.MustParseAddr("169.254.169.254"), "lo.learn.test": netip.MustParseAddr("127.0.0.1"),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	w.dnsAddr = dnsAddr
	cfg := w.config(t)
	a, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	closeA := sync.OnceFunc(func() { a.Close(true) })
	t.Cleanup(closeA)

	info, err := a.Create(context.Background(), trialspec.Request{ID: "agt-learn", Learn: true})
	if err != nil {
		t.Fatal(err)
	}
	if !info.Learning || len(a.list()) != 1 || !a.list()[0].Learning {
		t.Fatalf("a learning Trial is not described as one: %+v", a.list())
	}
	// deny on a learning Trial says what it cannot do (another Trial: its
	// policy-change records would be this one's log's).
	add := fmt.Sprintf("%s:%d", names[0], upstreamPort)
	if _, err := a.Create(context.Background(), trialspec.Request{ID: "agt-learn-deny", Learn: true, Allow: []string{add}}); err != nil {
		t.Fatal(err)
	}
	if res, err := a.ChangeAllow(WithCallerUID(context.Background(), 0), "agt-learn-deny", client.AllowChange{Remove: []string{add}}); err != nil || !strings.Contains(res.Note, "learning") {
		t.Fatalf("deny on a learning Trial: note %q, %v; want it to say the name still gets through", res.Note, err)
	}
	if _, err := a.Destroy(context.Background(), "agt-learn-deny"); err != nil {
		t.Fatal(err)
	}
	url := func(name string) string { return fmt.Sprintf("http://%s:%d/", name, upstreamPort) }
	for _, n := range names {
		if code, out := through(t, a, info.ID, url(n)); code != 0 || !strings.Contains(out, "hello from "+n) {
			t.Fatalf("learning, %s: curl exit %d: %s", n, code, out)
		}
	}
	// Plain http:// is forwarded, and learned, the same way.
	if code, out := curl(t, a, info.ID, url(names[0])); code != 0 || !strings.Contains(out, "hello from") {
		t.Fatalf("learning, forwarded: curl exit %d: %s", code, out)
	}
	for _, n := range []string{"meta.learn.test", "lo.learn.test"} {
		if code, out := curl(t, a, info.ID, "-i", "--proxytunnel", "-x", ProxyURL, url(n)); code == 0 || !strings.Contains(out, "address_denied") {
			t.Fatalf("learning, %s: curl exit %d: %s; want the address guard's refusal", n, code, out)
		}
	}
	// A refusal is counted as its record is written, just after curl
	// has its answer.
	st := waitStats(t, a, info.ID, func(st client.Stats) bool { return st.Proxy.ByReason["address_denied"] == 2 })
	if !st.Learning || st.Proxy.WouldDeny != 4 || !strings.Contains(st.Verdict, "LEARNING") || st.Proxy.ByReason["address_denied"] != 2 {
		t.Fatalf("stats of a learning Trial: learning %v, would_deny %d, verdict %q, reasons %v", st.Learning, st.Proxy.WouldDeny, st.Verdict, st.Proxy.ByReason)
	}
	if _, err := a.Destroy(context.Background(), info.ID); err != nil {
		t.Fatal(err)
	}
	recs, err := a.Audit(context.Background(), info.ID)
	if err != nil || len(recs) != 6 {
		t.Fatalf("audit: %d records, %v", len(recs), err)
	}
	for _, r := range recs {
		if !r.Learning || r.WouldDeny != record.ReasonPolicyDenied || r.Rule != "" {
			t.Fatalf("record of a learning Trial: %+v", r)
		}
	}
	y, err := config.Learn(recs, 0).Profile("learned")
	if err != nil {
		t.Fatal(err)
	}
	file, err := config.ParseFile(y)
	if err != nil {
		t.Fatalf("learned profile:\n%s\n%v", y, err)
	}
	if strings.Contains(string(y), "meta.") || strings.Contains(string(y), "lo.") || !strings.Contains(string(y), `# offered: - "*.svc.learn.test:8081"`) {
		t.Fatalf("learned profile:\n%s", y)
	}
	t.Logf("learned profile:\n%s", y)

	closeA()
	cfg.File = file
	b := startAgent(t, cfg)
	info, err = b.Create(context.Background(), trialspec.Request{ID: "agt-enforce", Profiles: []string{"learned"}})
	if err != nil {
		t.Fatal(err)
	}
	if info.Learning {
		t.Fatal("a Trial of the learned profile is learning")
	}
	for _, n := range names {
		if code, out := through(t, b, info.ID, url(n)); code != 0 {
			t.Fatalf("enforced, %s: curl exit %d: %s", n, code, out)
		}
	}
	for _, n := range []string{"other.learn.test", "meta.learn.test"} {
		if code, out := curl(t, b, info.ID, "-i", "--proxytunnel", "-x", ProxyURL, url(n)); code == 0 || !strings.Contains(out, "policy_denied") {
			t.Fatalf("enforced, %s: curl exit %d: %s", n, code, out)
		}
	}
}

// holdIn starts curl in a Trial on a request the test host holds open,
// through a tunnel; its exit code arrives on the channel.
func holdIn(t *testing.T, info client.TrialInfo, name string) <-chan int {
	t.Helper()
	tr, err := Attach(info)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	done := make(chan int, 1)
	t.Cleanup(func() {
		cancel()
		select { // the Trial's teardown kills curl at the latest
		case <-done:
		case <-time.After(5 * time.Second):
		}
	})
	go func() {
		code, _ := tr.Exec(ctx, sandbox.Command{
			Args: []string{"curl", "-sS", "-N", "--max-time", "30", "--proxytunnel", "-x", info.ProxyURL, fmt.Sprintf("http://%s:%d/hold", name, upstreamPort)},
			Env:  []string{"PATH=/usr/bin:/bin"}, UID: 65534, GID: 65534, Stdout: io.Discard, Stderr: io.Discard,
		}, nil)
		done <- code
	}()
	return done
}

// waitActive waits until the Trial has n tunnels being served.
func waitActive(t *testing.T, a *Agent, id string, n int64) {
	t.Helper()
	waitStats(t, a, id, func(st client.Stats) bool { return st.Proxy.Active == n })
}

// waitStats waits (10 s at most) until the Trial's stats satisfy ok, and
// returns them.
func waitStats(t *testing.T, a *Agent, id string, ok func(client.Stats) bool) client.Stats {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err := a.Stats(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Trial's stats never came to what the test waits for: %+v", st.Proxy)
		}
	}
}

// allow and deny change a live Trial's allowlist: refused before allow,
// reached after; a deny refuses new CONNECTs, and with cut ends exactly
// the open tunnels of the removed entry. Each change is in the audit with
// its uid; bad entries are refused as at create.
func TestPrivilegedLiveAllowDeny(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 235, "a.live.test", "b.live.test")
	a := startAgent(t, w.config(t))
	entry := func(n string) string { return fmt.Sprintf("%s.live.test:%d", n, upstreamPort) }
	url := func(n string) string { return fmt.Sprintf("http://%s.live.test:%d/", n, upstreamPort) }
	info, err := a.Create(context.Background(), trialspec.Request{ID: "agt-live", Allow: []string{entry("a")}})
	if err != nil {
		t.Fatal(err)
	}
	if code, out := through(t, a, info.ID, url("b")); code == 0 {
		t.Fatalf("b before allow: %s", out)
	}
	const uid = 4242
	if _, err := a.ChangeAllow(WithCallerUID(context.Background(), uid), info.ID, client.AllowChange{Add: []string{entry("b")}}); err != nil {
		t.Fatal(err)
	}
	if code, out := through(t, a, info.ID, url("b")); code != 0 {
		recs, _ := a.Audit(context.Background(), info.ID)
		t.Fatalf("b after allow: curl exit %d: %s\n%+v", code, out, recs[len(recs)-1])
	}
	for _, c := range []struct {
		ch   client.AllowChange
		code string
	}{
		{client.AllowChange{Add: []string{"*.test:8081"}}, client.CodeBadAllowlist},
		{client.AllowChange{Add: []string{w.host.Addr4.String() + ":8081"}}, client.CodeBadAllowlist},
		{client.AllowChange{Remove: []string{entry("c")}}, client.CodeBadAllowlist},
		{client.AllowChange{}, client.CodeBadRequest},
	} {
		var e *client.Error
		if _, err := a.ChangeAllow(WithCallerUID(context.Background(), uid), info.ID, c.ch); !errors.As(err, &e) || e.Code != c.code {
			t.Errorf("%+v: %v, want %s", c.ch, err, c.code)
		}
	}
	if _, err := a.ChangeAllow(WithCallerUID(context.Background(), uid), "agt-none", client.AllowChange{Add: []string{entry("b")}}); err == nil {
		t.Error("a change of an unknown Trial was accepted")
	}

	holdA, holdB := holdIn(t, info, "a.live.test"), holdIn(t, info, "b.live.test")
	waitActive(t, a, info.ID, 2)
	// Accepted is not yet open: a CONNECT still in its DNS or dial when
	// the entry goes is refused as it re-decides, and is no tunnel cut
	// (seen under emulation, where that window is wide).
	w.waitHolding(t, 2)
	res, err := a.ChangeAllow(WithCallerUID(context.Background(), uid), info.ID, client.AllowChange{Remove: []string{entry("a")}, Cut: true})
	if err != nil || res.TunnelsCut != 1 {
		t.Fatalf("deny --cut a: %+v %v", res, err)
	}
	select {
	case code := <-holdA:
		if code == 0 {
			t.Fatal("the cut tunnel's curl exited 0")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the tunnel to the removed entry was not cut")
	}
	select {
	case <-holdB:
		t.Fatal("the tunnel to b, still allowed, ended with a's")
	case <-time.After(500 * time.Millisecond):
	}
	waitActive(t, a, info.ID, 1)
	if code, out := through(t, a, info.ID, url("a")); code == 0 {
		t.Fatalf("a after deny: %s", out)
	}
	// Without cut, b's open tunnel stays while new CONNECTs are refused.
	if _, err := a.ChangeAllow(WithCallerUID(context.Background(), uid), info.ID, client.AllowChange{Remove: []string{entry("b")}}); err != nil {
		t.Fatal(err)
	}
	if code, _ := through(t, a, info.ID, url("b")); code == 0 {
		t.Fatal("b after deny: reached")
	}
	waitActive(t, a, info.ID, 1)
	if got, _ := a.Get(context.Background(), info.ID); len(got.Allow) != 0 {
		t.Fatalf("allowlist after the changes: %+v", got.Allow)
	}

	recs, err := a.Audit(context.Background(), info.ID)
	if err != nil {
		t.Fatal(err)
	}
	var changes []string
	cutSeen := false
	for _, r := range recs {
		if r.Decision == record.DecisionPolicyChange {
			if r.PolicyChange == nil || r.PolicyChange.UID != uid || r.Schema != record.PolicyChangeSchema {
				t.Fatalf("policy change record %+v", r)
			}
			changes = append(changes, fmt.Sprintf("+%v-%v", r.PolicyChange.Added, r.PolicyChange.Removed))
		}
		cutSeen = cutSeen || strings.Contains(r.Detail, "tunnel cut by a policy change")
	}
	want := fmt.Sprintf("+[%s]-[] +[]-[%s] +[]-[%s]", entry("b"), entry("a"), entry("b"))
	if strings.Join(changes, " ") != want || !cutSeen {
		t.Fatalf("policy changes in the audit: %v (cut record seen: %v), want %s", changes, cutSeen, want)
	}
}

// A change made through the control socket is recorded with the
// caller's uid (SO_PEERCRED) and survives an agent restart.
func TestPrivilegedAllowSurvivesRestart(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 236, "upstream.example.test", "late.example.test")
	p := startAgentWithTrial(t, w, "agt-allow-restart")
	c, info := p.c, p.info
	late := fmt.Sprintf("late.example.test:%d", upstreamPort)
	up := fmt.Sprintf("upstream.example.test:%d", upstreamPort)
	if _, err := c.ChangeAllow(context.Background(), info.ID, client.AllowChange{Add: []string{late}, Remove: []string{up}}); err != nil {
		t.Fatal(err)
	}
	recs, err := c.Audit(context.Background(), info.ID)
	if err != nil || len(recs) != 1 || recs[0].PolicyChange == nil || recs[0].PolicyChange.UID != int64(os.Getuid()) {
		t.Fatalf("audit after the change: %+v %v; want one policy change by uid %d", recs, err, os.Getuid())
	}
	if err := p.first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = p.first.cmd.Wait()
	second := runAgent(t, p.bin, p.args...)
	waitReady(t, c, second)
	got, err := c.Get(context.Background(), info.ID)
	if err != nil || len(got.Allow) != 1 || got.Allow[0].Entry != late {
		t.Fatalf("after the restart: %+v %v\n%s", got.Allow, err, second.stderr.String())
	}
	if code, out := curlIn(t, info, "--proxytunnel", "http://"+late+"/"); code != 0 {
		t.Fatalf("the added entry after the restart: curl exit %d: %s", code, out)
	}
	if code, _ := curlIn(t, info, "--proxytunnel", "http://"+up+"/"); code == 0 {
		t.Fatal("the removed entry was reached after the restart")
	}
	if _, err := c.Destroy(context.Background(), info.ID); err != nil {
		t.Fatal(err)
	}
	_ = second.cmd.Process.Signal(syscall.SIGTERM)
	_ = second.cmd.Wait()
}
