package agentwire

import (
	"encoding/json"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/trialnet/trialnet/trial"
)

// TrialInfo's JSON (create -j, list -j, the control API) is an interface:
// its keys are those of the build before trial.Spec, and "schema".
func TestTrialInfoKeys(t *testing.T) {
	info := TrialInfo{
		Spec: trial.Spec{Schema: trial.Schema, ID: "k", Strict: true, UnixOpen: true, Nested: true, UnixAllow: []string{"/a"},
			Learning: true, Allow: []trial.AllowEntry{{Entry: "a:1"}}, Profiles: []string{"p"}, AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
			Owner: &trial.Owner{PID: 1, Start: 2}, Denied: []string{"b:1"},
			Limits:  &trial.Limits{ProxyLimits: trial.ProxyLimits{MaxTunnels: 1}, PoolLimits: trial.PoolLimits{MaxProcesses: 1, MaxPids: 1, MaxMemory: 1}},
			Created: time.Now(), Nonce: "n", Report: "/r"},
		Netns: "/n", Cgroup: "/c", CgroupID: 1, ProxyURL: "http://127.0.0.1:3128",
	}
	b, err := json.Marshal(info)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]json.RawMessage
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := []string{"allow", "allow_cidrs", "cgroup", "cgroup_id", "created", "denied", "id", "learning", "limits", "nested", "netns",
		"nonce", "owner", "profiles", "proxy_url", "report", "schema", "strict", "transparent", "unix_allow", "unix_open"}
	if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, want) {
		t.Errorf("TrialInfo's keys are %v, want %v", keys, want)
	}
	var limits map[string]json.RawMessage
	if err := json.Unmarshal(got["limits"], &limits); err != nil {
		t.Fatal(err)
	}
	wantLimits := []string{"connect_burst", "connects_per_second", "max_client_connections", "max_log_bytes", "max_memory", "max_pending_heads",
		"max_pids", "max_processes", "max_tunnels", "record_burst", "records_per_second"}
	if keys := slices.Sorted(maps.Keys(limits)); !slices.Equal(keys, wantLimits) {
		t.Errorf("limits' keys are %v, want both halves in one mapping: %v", keys, wantLimits)
	}
	var back TrialInfo
	if err := json.Unmarshal(b, &back); err != nil || back.Owner == nil || *back.Limits != *info.Limits || back.CgroupID != 1 {
		t.Errorf("TrialInfo does not read back: %+v, %v", back, err)
	}
}

// A Trial with containers says whose their process boundary is; one
// without says nothing of containers.
func TestLayersSayWhoseForContainers(t *testing.T) {
	l := Layers{LandlockABI: 6, BPFLSM: true}
	if s := l.String(); strings.Contains(s, "container") {
		t.Errorf("a Trial without containers: %s", s)
	}
	l.Containers = 2
	if s := l.String(); !strings.HasSuffix(s, "; in its 2 container(s): "+ContainerLayers) {
		t.Errorf("a Trial with 2 containers: %s", s)
	}
	b, _ := json.Marshal(l)
	if !strings.Contains(string(b), `"containers":2`) {
		t.Errorf("JSON: %s", b)
	}
}
