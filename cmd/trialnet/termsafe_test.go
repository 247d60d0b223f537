//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/internal/termsafe"
	"github.com/trialnet/trialnet/internal/testkit"
	"github.com/trialnet/trialnet/record"
)

// hostileRecords are a refusal and a summary record with h in every
// string a Trial can reach (directly, or through a log read with --from).
func hostileRecords(h string) []record.Event {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	return []record.Event{
		{Schema: record.EventSchema, ID: "e1", Time: at, Trial: "t1", Client: h, Method: "CONNECT" + h, Target: h + ":443", Host: h,
			Port: 443, Decision: record.DecisionDeny, Reason: record.Reason(h), Detail: "detail " + h, SNI: h, Rule: h, Profile: h, WouldDeny: record.Reason(h)},
		{Schema: record.SummarySchema, ID: "e2", Time: at, Trial: "t1", Decision: record.DecisionSuppressed, Detail: "3 similar " + h,
			Suppressed: &record.Suppressed{Records: 3, ByReason: map[record.Reason]uint64{record.Reason(h): 3}, Refused: map[string]uint64{h: 3}, Reached: []record.ReachedTarget{{Host: h, Port: 443, Requests: 2, WouldDeny: 1}}}},
	}
}

func hostileStats(h string) client.Stats {
	return client.Stats{Trial: h, Kernel: map[string]uint64{h: 1},
		Proxy:      record.TrialStats{Denied: 3, ByReason: map[record.Reason]uint64{record.Reason(h): 3}},
		TopRefused: []record.TargetCount{{Target: h + ":443", Count: 3}}, Verdict: "verdict: " + h}
}

// fakeStats serves a Trial's stats on a control socket, as the agent
// would, and returns the socket.
func fakeStats(t *testing.T, st client.Stats) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(st)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return sock
}

// Every command that prints what a Trial sent — --show-refusals, the run
// summary, stats and audit, as text and as JSON — prints each hostile
// string escaped, never raw; the JSON still decodes to the same values.
func TestPrintingCommandsEscapeTrialText(t *testing.T) {
	for _, hostile := range termsafe.Hostile {
		name, h := hostile.Name, hostile.Text
		t.Run(name, func(t *testing.T) {
			recs := hostileRecords(h)
			st := hostileStats(h)
			var log bytes.Buffer
			for _, r := range recs {
				b, err := json.Marshal(r)
				if err != nil {
					t.Fatal(err)
				}
				log.Write(append(b, '\n'))
			}
			path := filepath.Join(t.TempDir(), "decisions.jsonl")
			if err := os.WriteFile(path, log.Bytes(), 0o600); err != nil {
				t.Fatal(err)
			}
			sock := fakeStats(t, st)
			out := map[string]string{
				"--show-refusals": refusalLine(recs[0]) + "\n" + refusalLine(recs[1]) + "\n",
				"run summary":     summary(st, 0, time.Second) + "\n",
			}
			for cmd, args := range map[string][]string{
				"audit":    {"audit", "--from", path},
				"audit -j": {"audit", "--from", path, "-j"},
				"stats":    {"stats", "--socket", sock, "--trial", "t1"},
				"stats -j": {"stats", "--socket", sock, "--trial", "t1", "-j"},
			} {
				code, stdout, stderr := trialnet(args...)
				if code != exitOK {
					t.Fatalf("%s: exit %d: %s", cmd, code, stderr)
				}
				out[cmd] = stdout
			}
			// What went through JSON holds invalid UTF-8 as U+FFFD.
			hj := testkit.JSONRoundTrip(t, h)
			for cmd, o := range out {
				want := termsafe.String(h)
				if strings.HasPrefix(cmd, "audit") || strings.HasPrefix(cmd, "stats") {
					want = termsafe.String(hj)
				}
				for _, line := range strings.Split(strings.TrimSuffix(o, "\n"), "\n") {
					if !termsafe.Safe(line) {
						t.Errorf("%s printed %q raw:\n%q", cmd, h, line)
					}
				}
				if !strings.HasSuffix(cmd, "-j") && !strings.Contains(o, want) {
					t.Errorf("%s does not show %q as %q:\n%s", cmd, h, want, o)
				}
			}
			var got []record.Event
			if err := json.Unmarshal([]byte(out["audit -j"]), &got); err != nil || !reflect.DeepEqual(got, testkit.JSONRoundTrip(t, recs)) {
				t.Errorf("audit -j reads back as %+v (%v), want %+v", got, err, recs)
			}
			var gotSt client.Stats
			if err := json.Unmarshal([]byte(out["stats -j"]), &gotSt); err != nil || !reflect.DeepEqual(gotSt, testkit.JSONRoundTrip(t, st)) {
				t.Errorf("stats -j reads back as %+v (%v), want %+v", gotSt, err, st)
			}
		})
	}
}
