//go:build linux

package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/client"
	trialspec "github.com/trialnet/trialnet/trial"

	"github.com/trialnet/trialnet/allow"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/internal/testhost"
	"github.com/trialnet/trialnet/proxy"
	"github.com/trialnet/trialnet/record"
	"github.com/trialnet/trialnet/resolve"
	"golang.org/x/sys/unix"
)

// oneAddr resolves every name to one public address.
type oneAddr netip.Addr

func (a oneAddr) Resolve(context.Context, string) (resolve.Answer, error) {
	return resolve.Answer{Addrs: []netip.Addr{netip.Addr(a)}}, nil
}

// toUpstream connects every checked address to one local upstream.
type toUpstream string

func (u toUpstream) Dial(ctx context.Context, _ netip.AddrPort) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", string(u))
}

// noHostAddrs: this host has no addresses the guard must refuse.
type noHostAddrs struct{}

func (noHostAddrs) Contains(netip.Addr) (bool, error) { return false, nil }

// echoUpstream echoes every connection until its client half-closes.
func echoUpstream(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go testhost.Echo(ln)
	return ln.Addr().String()
}

// connectThrough sends one CONNECT to proxyAddr; an allowed tunnel
// carries "ping" and is half-closed. It returns the status.
func connectThrough(t *testing.T, proxyAddr, target string) int {
	t.Helper()
	c, err := net.Dial("tcp", proxyAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode == http.StatusOK {
		_, _ = io.WriteString(c, "ping")
		_ = c.(*net.TCPConn).CloseWrite()
		if got, err := io.ReadAll(br); err != nil || string(got) != "ping" {
			t.Fatalf("echo %q, %v", got, err)
		}
	}
	return resp.StatusCode
}

// The record the proxy emits is the record the agent reads back: two
// CONNECTs through a real proxy, written by the agent's onEvent, read
// by Audit, equal field for field to what the proxy handed out; and the
// counters replayed from the log are the proxy's own.
func TestDecisionRecordRoundTrip(t *testing.T) {
	const id = "rec-1"
	file, err := config.ParseFile([]byte("profiles:\n  claude: [\"api.example.com:443\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	allow, err := file.Allowlist([]string{"claude"}, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	sent := make(chan record.Event, 2)
	a, _, proxyAddr := recordingAgent(t, id, oneAddr(netip.MustParseAddr("93.184.216.34")), allow, nil, func(e record.Event) { sent <- e })

	var want []record.Event
	for target, status := range map[string]int{"other.example.com:443": http.StatusForbidden, "api.example.com:443": http.StatusOK} {
		if got := connectThrough(t, proxyAddr, target); got != status {
			t.Fatalf("CONNECT %s: %d, want %d", target, got, status)
		}
		want = append(want, <-sent) // in the order the log has them
	}
	final, _ := a.proxy.RemoveTrial(id)

	got, err := a.Audit(context.Background(), id)
	if err != nil || len(got) != len(want) {
		t.Fatalf("audit: %d records, %v; want %d", len(got), err, len(want))
	}
	for i := range want {
		w, g := want[i], got[i]
		if g.Schema != record.EventSchema || (w.Decision == record.DecisionAllow) != (g.Profile == "claude" && g.Rule == "api.example.com:443") {
			t.Errorf("record %d: schema %d, rule %q, profile %q", i, g.Schema, g.Rule, g.Profile)
		}
		// The log keeps whole microseconds and the wall clock.
		for _, d := range []*time.Duration{&w.Duration, &w.DNS, &w.Dial, &w.FirstByte} {
			*d = d.Truncate(time.Microsecond)
		}
		if !g.Time.Equal(w.Time) {
			t.Errorf("record %d: start %v, want %v", i, g.Time, w.Time)
		}
		g.Time = w.Time
		if !reflect.DeepEqual(g, w) {
			t.Errorf("record %d read back as\n%+v\nwant\n%+v", i, g, w)
		}
	}
	replayed := a.replayStats(&trial{info: client.TrialInfo{Spec: trialspec.Spec{ID: id}}})
	final.Active = 0
	if replayed == nil || !reflect.DeepEqual(*replayed, final) {
		t.Fatalf("replayed counters %+v, want the proxy's %+v", replayed, final)
	}
}

// A flood of malformed CONNECTs: the decision log keeps the record
// burst and a summary; the refusals by target and the counters rebuilt
// from it count every refusal, as the live ones do.
func TestDecisionLogFloodSummarised(t *testing.T) {
	const id, n = "rec-3", 40
	a, _, proxyAddr := recordingAgent(t, id, oneAddr(netip.MustParseAddr("93.184.216.34")), allow.New(),
		&trialspec.ProxyLimits{RecordRate: 1e-9, RecordBurst: 3}, nil)
	target := strings.Repeat("x", 1000) + "/"
	for range n {
		if got := connectThrough(t, proxyAddr, target); got != http.StatusBadRequest {
			t.Fatalf("CONNECT: %d", got)
		}
	}
	final, _ := a.proxy.RemoveTrial(id)
	recs, err := a.Audit(context.Background(), id)
	if err != nil || len(recs) != 4 || recs[3].Decision != record.DecisionSuppressed || recs[3].Suppressed.Records != n-3 {
		t.Fatalf("audit: %+v, %v; want 3 records and a summary of %d", recs, err, n-3)
	}
	if st, err := os.Stat(a.decisionLog(id)); err != nil || st.Size() > 6000 {
		t.Fatalf("decision log: %v, %v bytes", err, st.Size())
	}
	live := final.TopRefused(topRefused)
	if final.Denied != n || len(live) != 1 || live[0].Count != n || live[0].Target != recs[0].Target {
		t.Fatalf("live: stats %+v, refused %+v; want all %d", final, live, n)
	}
	replayed := a.replayStats(&trial{info: client.TrialInfo{Spec: trialspec.Spec{ID: id}}})
	final.Active = 0
	if replayed == nil || !reflect.DeepEqual(*replayed, final) {
		t.Fatalf("replayed counters %+v, want the proxy's %+v", replayed, final)
	}
	if got := replayed.TopRefused(topRefused); !reflect.DeepEqual(got, live) {
		t.Fatalf("replayed refusals by target %+v, want %+v", got, live)
	}
}

// A log with an old record (no schema), a current one and one of a newer
// schema: audit refuses it, naming the line and the schema; the replay
// counts what it can read and leaves the newer record out.
func TestDecisionLogSchemas(t *testing.T) {
	const id = "rec-2"
	a := &Agent{cfg: AgentConfig{DataDir: t.TempDir()}, log: slog.New(slog.DiscardHandler)}
	old := `{"decision":"allow","reason":"allowed","bytes_up":5,"bytes_down":7,"trial":"rec-2","event_id":"a"}`
	cur := `{"schema":1,"decision":"deny","reason":"policy_denied","trial":"rec-2","event_id":"b","profile":""}`
	newer := `{"schema":5,"decision":"allow","reason":"allowed","bytes_up":100,"trial":"rec-2","event_id":"c"}`
	if err := os.MkdirAll(filepath.Join(a.cfg.DataDir, id), 0o700); err != nil {
		t.Fatal(err)
	}
	write := func(lines ...string) {
		t.Helper()
		if err := os.WriteFile(a.decisionLog(id), []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(old, cur)
	recs, err := a.Audit(context.Background(), id)
	if err != nil || len(recs) != 2 || recs[0].Schema != 0 || recs[0].BytesDown != 7 || recs[1].Schema != 1 || recs[1].Reason != record.ReasonPolicyDenied {
		t.Fatalf("audit of old and current records: %+v, %v", recs, err)
	}

	write(old, cur, newer)
	recs, err = a.Audit(context.Background(), id)
	if err == nil || !strings.Contains(err.Error(), "line 3: decision record has schema 5, newer than the 4") || recs != nil {
		t.Fatalf("audit with a newer record: %d records, %v; want a schema error naming line 3", len(recs), err)
	}
	st := a.replayStats(&trial{info: client.TrialInfo{Spec: trialspec.Spec{ID: id}}})
	if st == nil || st.Allowed != 1 || st.Denied != 1 || st.BytesUp != 5 || st.BytesDown != 7 {
		t.Fatalf("replayed %+v; want the old and current records only", st)
	}
}

// A log whose last record a crash cut short gets a newline before the
// next record: only the torn line is lost, not the one appended after it.
func TestDecisionLogReopenedAfterTornWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "decisions.jsonl")
	if err := os.WriteFile(path, []byte(`{"schema":1,"trial":"x","decision":"al`), 0o600); err != nil {
		t.Fatal(err)
	}
	var l decisionLog
	if _, err := l.open(path); err != nil {
		t.Fatal(err)
	}
	if err := l.add(&record.Event{Trial: "x", Decision: record.DecisionDeny, Reason: record.ReasonPolicyDenied}, nil); err != nil {
		t.Fatal(err)
	}
	l.close()
	recs, err := record.ReadFile(path)
	if len(recs) != 1 || recs[0].Reason != record.ReasonPolicyDenied {
		t.Fatalf("records after a torn line: %+v (%v); want the one appended after it", recs, err)
	}
	if err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("the torn line is not reported: %v", err)
	}
}

// recordingAgent is an agent with a data directory and a proxy (resolving
// with r, dialing an echo upstream) serving Trial id alone, under allow
// and lim, on a loopback listener whose address it returns. tap, if set,
// sees each event after the agent has.
func recordingAgent(t *testing.T, id string, r resolve.Resolver, allow *allow.List, lim *trialspec.ProxyLimits, tap func(record.Event)) (*Agent, *trial, string) {
	t.Helper()
	a := &Agent{cfg: AgentConfig{DataDir: t.TempDir()}, log: slog.New(slog.DiscardHandler), trials: make(map[string]*trial)}
	onEvent := a.onEvent
	if tap != nil {
		onEvent = func(e *record.Event, line []byte) { a.onEvent(e, line); tap(*e) }
	}
	var err error
	a.proxy, err = proxy.New(proxy.Config{ProxySettings: config.ProxySettings{Resolver: r}, Dialer: toUpstream(echoUpstream(t)), HostAddrs: noHostAddrs{}, OnEvent: onEvent})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.proxy.Close() })
	lt := &trial{info: client.TrialInfo{Spec: trialspec.Spec{ID: id}}}
	if lim != nil {
		lt.info.Limits = &trialspec.Limits{ProxyLimits: *lim}
	}
	if err := a.register(id, lt); err != nil {
		t.Fatal(err)
	}
	if err := a.prepare(lt, allow, nil, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lt.log.close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = a.proxy.Serve(ln, id) }()
	return a, lt, ln.Addr().String()
}

// manyAddrs resolves every name to n private addresses: each request is
// refused (address_denied) after a charged CONNECT, and its record would
// list them all were it not clipped.
type manyAddrs int

func (n manyAddrs) Resolve(context.Context, string) (resolve.Answer, error) {
	addrs := make([]netip.Addr, n)
	for i := range addrs {
		addrs[i] = netip.AddrFrom4([4]byte{10, 9, byte(i >> 8), byte(i)})
	}
	return resolve.Answer{Addrs: addrs}, nil
}

// The finding: a Trial allowed a name with 4,000 private addresses wrote
// a 250 MB decisions.jsonl in 5 s against a max_log_bytes of 1 MB, in
// records of 64 KB, each charged to the CONNECT rate and so always
// written. Now max_log_bytes bounds every record: past it, only
// summaries are written (one when the log fills, one at the end here),
// and the counters rebuilt from the file are still exact.
func TestDecisionLogHardBound(t *testing.T) {
	const id, limit, n = "rec-4", 20000, 400
	allow, err := allow.Parse([]string{"many.test:443"}, false)
	if err != nil {
		t.Fatal(err)
	}
	a, _, proxyAddr := recordingAgent(t, id, manyAddrs(4000), allow, &trialspec.ProxyLimits{MaxLogBytes: limit, ConnectRate: 1e6, ConnectBurst: 1e6}, nil)
	start := time.Now()
	for range n {
		if got := connectThrough(t, proxyAddr, "many.test:443"); got != http.StatusForbidden {
			t.Fatalf("CONNECT: %d", got)
		}
	}
	final, _ := a.proxy.RemoveTrial(id)
	took := time.Since(start)
	b, err := os.ReadFile(a.decisionLog(id))
	if err != nil {
		t.Fatal(err)
	}
	var decisions, summaries int
	for line := range strings.Lines(string(b)) {
		var ev record.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Decision == record.DecisionSuppressed {
			summaries++
			if ev.Suppressed.Refused["many.test:443"] == 0 {
				t.Fatalf("a summary does not name the refused target: %s", line)
			}
			continue
		}
		if summaries > 0 {
			t.Fatalf("a record written in full after the log filled: %s", line)
		}
		if len(line) > 4096 {
			t.Fatalf("a record of %d bytes", len(line))
		}
		decisions += len(line)
	}
	// One summary when the log filled, one at the end, and one per
	// summary period between.
	bounds := record.Bounds{MaxLogBytes: limit}
	if whole := int64(limit) + bounds.SummaryReserve() + 80<<10; int64(len(b)) > whole {
		t.Fatalf("a decision log of %d bytes, over its bound of %d (max_log_bytes, the summaries' reserve, one last summary)", len(b), whole)
	}
	if most := 2 + int(took/(10*time.Second)); decisions > limit || summaries == 0 || summaries > most {
		t.Fatalf("%d bytes of records for a limit of %d, then %d summaries (at most %d) in a file of %d bytes", decisions, limit, summaries, most, len(b))
	}
	recs, err := a.Audit(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var replayed record.TrialStats
	for i := range recs {
		replayed.Add(&recs[i])
		replayed.CountWritten(&recs[i])
	}
	final.Active = 0
	if replayed.Denied != n || !reflect.DeepEqual(replayed, final) {
		t.Fatalf("replayed counters %+v, want the proxy's %+v (%d refusals)", replayed, final, n)
	}
	t.Logf("%d requests in %v: %d bytes of records, %d summaries, %d bytes in all", n, took.Round(time.Millisecond), decisions, summaries, len(b))
}

// More distinct refused targets than a summary names: the most refused
// targets a restarted agent rebuilds from the log are the live ones,
// both counted from what the log holds.
func TestTopRefusedSurvivesARestart(t *testing.T) {
	const id = "rec-5"
	a, _, proxyAddr := recordingAgent(t, id, oneAddr(netip.MustParseAddr("93.184.216.34")), allow.New(),
		&trialspec.ProxyLimits{RecordRate: 1e-9, RecordBurst: 3}, nil)
	for i := range 40 {
		target := fmt.Sprintf("t%02d%s/", i, strings.Repeat("x", 1000))
		for range 1 + i%3 {
			if got := connectThrough(t, proxyAddr, target); got != http.StatusBadRequest {
				t.Fatalf("CONNECT: %d", got)
			}
		}
	}
	final, _ := a.proxy.RemoveTrial(id)
	live := final.TopRefused(topRefused)
	replayed := a.replayStats(&trial{info: client.TrialInfo{Spec: trialspec.Spec{ID: id}}})
	if replayed == nil || !reflect.DeepEqual(replayed.TopRefused(topRefused), live) {
		t.Fatalf("most refused after a replay %+v, live %+v", replayed.TopRefused(topRefused), live)
	}
}

// A decision log whose disk fills (a Trial's uid shares it, and disk is
// not bounded) loses only the records there was no room for: the record
// a failed write left in part spoils no record after it, and the receipt
// says how many were not written. Before, a refusal's record torn by the
// full disk glued the next one, written once there was room again, to
// its line, and both were unreadable behind a receipt that said nothing
// of them.
func TestPrivilegedDecisionLogDiskFull(t *testing.T) {
	privtest.Require(t)
	const id = "rec-full"
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	al, err := allow.Parse([]string{"many.test:443"}, false)
	if err != nil {
		t.Fatal(err)
	}
	a, lt, proxyAddr := recordingAgent(t, id, manyAddrs(1), al, &trialspec.ProxyLimits{ConnectRate: 1e6, ConnectBurst: 1e6}, nil)
	lt.log.close()
	path := filepath.Join(dir, "decisions.jsonl")
	if _, err := lt.log.open(path); err != nil {
		t.Fatal(err)
	}
	refused := 0
	refuse := func(target string, n int) {
		for range n {
			if got := connectThrough(t, proxyAddr, target); got != http.StatusForbidden {
				t.Fatalf("CONNECT %s: %d", target, got)
			}
			refused++
		}
		// Records are written after the answer: wait for each.
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			recs, _ := record.ReadFile(path)
			if uint64(len(recs))+lt.log.lost() >= uint64(refused) {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	refuse("before.test:443", 3)
	fill := fillDisk(t, dir)
	refuse("during.test:443", 8)
	if err := os.Remove(fill); err != nil {
		t.Fatal(err)
	}
	refuse("after.test:443", 2)
	recs, rerr := record.ReadFile(path)
	lost := lt.log.lost()
	var after int
	for _, r := range recs {
		if r.Target == "after.test:443" {
			after++
		}
	}
	st, _ := a.proxy.Stats(id)
	if lost == 0 || after != 2 || uint64(len(recs))+lost != uint64(refused) || st.Denied != uint64(refused) {
		t.Fatalf("%d records read (%d after the disk had room again, want 2; error %v), %d counted unwritten, for %d refusals (the proxy counted %d)", len(recs), after, rerr, lost, refused, st.Denied)
	}
}

// A decision log whose last record an agent's crash cut short, opened
// again by the next agent while the disk is still full: the open does
// not fail (it would lose the Trial's re-adoption), and the first record
// written once there is room starts a line of its own.
func TestPrivilegedDecisionLogTornReopenedOnAFullDisk(t *testing.T) {
	privtest.Require(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	path := filepath.Join(dir, "decisions.jsonl")
	// Cut at a page's end: its newline needs a page the full disk lacks.
	if err := os.WriteFile(path, []byte(`{"id":"cut`+strings.Repeat("x", 4096-10)), 0o600); err != nil {
		t.Fatal(err)
	}
	fill := fillDisk(t, dir)
	var l decisionLog
	if _, err := l.open(path); err != nil {
		t.Fatalf("reopening a torn log on a full disk: %v", err)
	}
	defer l.close()
	if err := os.Remove(fill); err != nil {
		t.Fatal(err)
	}
	ev := record.Event{Schema: record.EventSchema, ID: "after", Time: time.Now(), Trial: "t", Method: "CONNECT", Decision: record.DecisionDeny, Reason: record.ReasonPolicyDenied, Target: "after.test:443"}
	if err := l.add(&ev, nil); err != nil {
		t.Fatal(err)
	}
	recs, _ := record.ReadFile(path)
	if len(recs) != 1 || recs[0].ID != "after" {
		t.Fatalf("records read after the disk had room: %+v; want the one written after", recs)
	}
}

// fillDisk writes a file in dir until its file system has no room left,
// a page and then a byte at a time, and returns its path.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	fill := filepath.Join(dir, "fill")
	f, err := os.Create(fill)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, size := range []int{4096, 1} {
		for b := make([]byte, size); ; {
			if _, err := f.Write(b); err != nil {
				break
			}
		}
	}
	return fill
}

// A successor killed mid-write during a failed hand-over leaves its last
// record torn: the old agent, serving on, counts its whole records as
// strangers (not its own), and ends the torn line, so that its own next
// record is not glued to it and lost to every later reader.
func TestDecisionLogStrangersEndTornLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "decisions.jsonl")
	var l decisionLog
	if _, err := l.open(path); err != nil {
		t.Fatal(err)
	}
	defer l.close()
	add := func(id string) {
		ev := record.Event{Schema: record.EventSchema, ID: id, Time: time.Now(), Trial: "t", Method: "CONNECT", Decision: record.DecisionDeny, Reason: record.ReasonPolicyDenied, Target: id + ".test:443"}
		if err := l.add(&ev, nil); err != nil {
			t.Fatal(err)
		}
	}
	add("before")
	l.forward(func([]byte) {})
	add("mine")
	theirs := record.Event{Schema: record.EventSchema, ID: "theirs", Time: time.Now(), Trial: "t", Method: "CONNECT", Decision: record.DecisionDeny, Reason: record.ReasonPolicyDenied, Target: "theirs.test:443"}
	line, err := theirs.AppendJSON(nil)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Write(append(append(line, '\n'), line[:len(line)/2]...))
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	evs, err := l.strangers()
	if len(evs) != 1 || evs[0].ID != "theirs" || err == nil || !strings.Contains(err.Error(), "past byte ") {
		t.Fatalf("strangers: %+v (%v); want the successor's whole record, and an error for its torn one", evs, err)
	}
	l.forward(nil)
	add("after")
	recs, _ := record.ReadFile(path)
	var ids []string
	for _, ev := range recs {
		ids = append(ids, ev.ID)
	}
	if strings.Join(ids, " ") != "before mine theirs after" {
		t.Fatalf("records read after the successor's torn line: %v; want before mine theirs after", ids)
	}
}
