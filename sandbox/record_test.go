//go:build linux

package sandbox

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/trial"
)

// recordedFrom reads the record in file (under testdata) as a host whose
// state directory holds it as Trial id's would.
func recordedFrom(t *testing.T, file, id string) Recorded {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	h := &Host{StateDir: t.TempDir()}
	if err := os.WriteFile(h.recordPath(id), b, 0o600); err != nil {
		t.Fatal(err)
	}
	recs := h.Recorded()
	if len(recs) != 1 || recs[0].ID != id {
		t.Fatalf("Recorded: %+v", recs)
	}
	return recs[0]
}

// Records written by the build before trial.Spec (captured from it:
// create with a profile, an explicit entry, --strict, --max-procs,
// --unix-allow and --nonce, then a deny and an allow; and an owned,
// learning run with --report) read as the Spec they describe, so that
// an agent re-adopts the Trials its predecessor left.
func TestRecordOfEarlierBuild(t *testing.T) {
	created, _ := time.Parse(time.RFC3339Nano, "2026-12-05T02:39:50.960600661Z")
	lim := func(procs int) *trial.Limits {
		return &trial.Limits{
			ProxyLimits: trial.ProxyLimits{MaxTunnels: 32, ConnectRate: 10, ConnectBurst: 200, MaxClientConns: 512, MaxPendingHeads: 64,
				RecordRate: 20, RecordBurst: 200, MaxLogBytes: 64 << 20},
			PoolLimits: trial.PoolLimits{MaxProcesses: procs, MaxPids: 512, MaxMemory: 1 << 30},
		}
	}
	cidrs := []netip.Prefix{netip.MustParsePrefix("198.18.0.0/15")}
	r := recordedFrom(t, "record-schema0-create.json", "old-format")
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	want := trial.Spec{Schema: trial.Schema, ID: "old-format", Strict: true, UnixAllow: []string{"/run/speccap.sock"},
		Allow: []trial.AllowEntry{
			{Entry: "api.example.com:443", RequireTLS: true, Profile: "api"},
			{Entry: "git.example.org:443"},
			{Entry: "pkg.example.org:443"},
		},
		Profiles: []string{"api"}, AllowCIDRs: cidrs, Denied: []string{"*.cdn.example.net:443"},
		Limits: lim(200), Created: created, Nonce: "run-7f3a"}
	if !reflect.DeepEqual(r.Record.Trial, want) {
		t.Errorf("the created Trial's record reads as\n%+v\nwant\n%+v", r.Record.Trial, want)
	}
	wantProxy := []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:3128"), netip.MustParseAddrPort("[::1]:3128")}
	if r.Record.Phase != PhaseLive || r.Record.CgroupID != 134051 || !strings.HasSuffix(r.Record.Cgroup, "/old-format") ||
		r.Record.Netns != "/tmp/spec-cap/netns/old-format" || !reflect.DeepEqual(r.Record.Proxy, wantProxy) {
		t.Errorf("the sandbox's part reads as %+v", r.Record)
	}

	r = recordedFrom(t, "record-schema0-run.json", "old-owned")
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	created, _ = time.Parse(time.RFC3339Nano, "2026-12-05T02:40:07.355847894Z")
	want = trial.Spec{Schema: trial.Schema, ID: "old-owned", UnixOpen: true, Learning: true, AllowCIDRs: cidrs,
		Owner: &trial.Owner{PID: 15158, Start: 1012717}, Limits: lim(300), Created: created, Report: "/tmp/spec-cap/report.json"}
	if !reflect.DeepEqual(r.Record.Trial, want) {
		t.Errorf("the run's record reads as\n%+v\nwant\n%+v", r.Record.Trial, want)
	}
}

// A record this build writes reads back whole; one of a newer schema, or
// naming another Trial, is refused rather than taken for what it may
// not mean.
func TestRecordRoundTrip(t *testing.T) {
	spec := trial.Spec{Schema: trial.Schema, ID: "rt", Strict: true, Nested: true, UnixAllow: []string{"/run/x.sock"},
		Learning: true, Allow: []trial.AllowEntry{{Entry: "a.example:443", RequireTLS: true, Profile: "p"}}, Profiles: []string{"p"},
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Owner: &trial.Owner{PID: 7, Start: 9}, Denied: []string{"b.example:443"},
		Limits:  &trial.Limits{ProxyLimits: trial.ProxyLimits{MaxTunnels: 3}, PoolLimits: trial.PoolLimits{MaxProcesses: 5, MaxPids: 6, MaxMemory: 7}},
		Created: time.Date(2026, 12, 5, 1, 2, 3, 4, time.UTC), Nonce: "n", Report: "/r"}
	h := &Host{StateDir: t.TempDir()}
	tr := &Trial{Launcher: Launcher{ID: spec.ID, Cgroup: "/cg/rt", CgroupID: 42, Spec: spec}, recorded: spec,
		proxy: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:3128")}, host: h}
	if err := tr.writeRecord(PhaseLive, true); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(h.recordPath("rt"))
	if err != nil {
		t.Fatal(err)
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(b, &keys); err != nil {
		t.Fatal(err)
	}
	if _, ok := keys["meta"]; ok {
		t.Errorf("the record still carries meta: %s", b)
	}
	rec, err := h.readRecord("rt")
	if err != nil {
		t.Fatal(err)
	}
	want := Record{Phase: PhaseLive, Trial: spec, Proxy: tr.proxy, Cgroup: "/cg/rt", CgroupID: 42}
	if !reflect.DeepEqual(rec, want) {
		t.Errorf("read back\n%+v\nwant\n%+v", rec, want)
	}

	newer := strings.Replace(string(b), `"schema":1`, `"schema":2`, 1)
	if newer == string(b) {
		t.Fatalf("no schema in %s", b)
	}
	if err := os.WriteFile(h.recordPath("rt"), []byte(newer), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := h.readRecord("rt"); err == nil || !strings.Contains(err.Error(), "newer trialnet") {
		t.Errorf("a record of a newer schema: %v, want a refusal that says a newer trialnet made it", err)
	}
	if err := os.WriteFile(h.recordPath("other"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := h.readRecord("other"); err == nil {
		t.Error("a record naming another Trial was read")
	}
}

// What the sandbox enforces was made with the Trial: a new description
// may change the proxy's part only.
func TestSetSpecKeepsTheSandboxPart(t *testing.T) {
	spec := trial.Spec{Schema: trial.Schema, ID: "fixed", UnixAllow: []string{"/run/a.sock"}}
	h := &Host{StateDir: t.TempDir()}
	tr := &Trial{Launcher: Launcher{ID: spec.ID, Spec: spec}, recorded: spec, host: h}
	for name, change := range map[string]func(*trial.Spec){
		"strict":     func(s *trial.Spec) { s.Strict = true },
		"unix_open":  func(s *trial.Spec) { s.UnixOpen = true },
		"nested":     func(s *trial.Spec) { s.Nested = true },
		"unix_allow": func(s *trial.Spec) { s.UnixAllow = append(s.UnixAllow, "/run/b.sock") },
		"max_pids":   func(s *trial.Spec) { s.Limits = &trial.Limits{PoolLimits: trial.PoolLimits{MaxPids: 1}} },
	} {
		s := spec
		s.UnixAllow = slices.Clone(spec.UnixAllow)
		change(&s)
		if err := tr.SetSpec(s); err == nil {
			t.Errorf("%s changed on a live Trial", name)
		}
	}
	s := spec
	s.Allow, s.Denied = []trial.AllowEntry{{Entry: "a.example:443"}}, []string{"b.example:443"}
	if err := tr.SetSpec(s); err != nil {
		t.Fatal(err)
	}
	if rec, err := h.readRecord("fixed"); err != nil || !reflect.DeepEqual(rec.Trial, s) {
		t.Errorf("the record after an allowlist change: %+v, %v", rec.Trial, err)
	}
}
