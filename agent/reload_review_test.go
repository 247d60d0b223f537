//go:build linux

package agent

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/record"
	trialspec "github.com/trialnet/trialnet/trial"
)

// Found by an attacker's read of reload, learning and live changes.

// refusedFor runs a CONNECT through the Trial's proxy to url and returns
// curl's exit code and the proxy's Trialnet-Reason ("" when none), so
// that a refusal is told apart from a target that is simply down.
func refusedFor(t *testing.T, a *Agent, id, url string) (int, string) {
	t.Helper()
	code, out := curl(t, a, id, "-v", "--proxytunnel", "-x", ProxyURL, url)
	for _, line := range strings.Split(out, "\n") {
		if _, v, ok := strings.Cut(line, "< Trialnet-Reason: "); ok {
			return code, strings.TrimSpace(v)
		}
	}
	return code, ""
}

// A reload that switches a profile's learning off: Trials created from it
// afterwards enforce their allowlist.
func TestPrivilegedReloadLearnOffStopsLearning(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 236, "upstream.example.test", "other.example.test")
	up := fmt.Sprintf("upstream.example.test:%d", upstreamPort)
	other := fmt.Sprintf("other.example.test:%d", upstreamPort)
	cfg, path := reloadable(t, w, "profiles:\n  dev:\n    learn: true\n    allow: ["+up+"]\n")
	a := startAgent(t, cfg)
	writeConfig(t, path, "profiles:\n  dev:\n    allow: ["+up+"]\n")
	if _, err := a.Reload(context.Background(), client.ReloadRequest{}); err != nil {
		t.Fatal(err)
	}
	info, err := a.Create(context.Background(), trialspec.Request{ID: "rv-learn", Profiles: []string{"dev"}})
	if err != nil {
		t.Fatal(err)
	}
	if code, out := through(t, a, info.ID, "http://"+up+"/"); code != 0 {
		t.Fatalf("the allowed name is not reached (the test cannot tell a refusal): exit %d %q", code, out)
	}
	code, reason := refusedFor(t, a, info.ID, "http://"+other+"/")
	t.Logf("after reload with learn off: Learning=%v; curl %s (not on the list): exit %d, reason %q", info.Learning, other, code, reason)
	if info.Learning || code == 0 || reason != string(record.ReasonPolicyDenied) {
		t.Errorf("a Trial created after learning was switched off still learns")
	}
}

// reload --reprofile does not bring back a profile entry the operator
// removed from the live Trial with deny.
func TestPrivilegedReprofileKeepsDenied(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 237, "upstream.example.test", "other.example.test")
	up := fmt.Sprintf("upstream.example.test:%d", upstreamPort)
	other := fmt.Sprintf("other.example.test:%d", upstreamPort)
	cfg, _ := reloadable(t, w, "profiles:\n  p1: ["+up+", "+other+"]\n")
	a := startAgent(t, cfg)
	if _, err := a.Create(context.Background(), trialspec.Request{ID: "rv-rp", Profiles: []string{"p1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ChangeAllow(WithCallerUID(context.Background(), 0), "rv-rp", client.AllowChange{Remove: []string{other}, Cut: true}); err != nil {
		t.Fatal(err)
	}
	if code, out := through(t, a, "rv-rp", "http://"+up+"/"); code != 0 {
		t.Fatalf("the entry left is not reached (the test cannot tell a refusal): exit %d %q", code, out)
	}
	if code, reason := refusedFor(t, a, "rv-rp", "http://"+other+"/"); code == 0 || reason != string(record.ReasonPolicyDenied) {
		t.Fatalf("deny did not apply: exit %d, reason %q", code, reason)
	}
	if _, err := a.Reload(context.Background(), client.ReloadRequest{Reprofile: true}); err != nil { // same file
		t.Fatal(err)
	}
	code, reason := refusedFor(t, a, "rv-rp", "http://"+other+"/")
	t.Logf("after reload --reprofile of an unchanged file: curl %s exit %d, reason %q", other, code, reason)
	if code == 0 || reason != string(record.ReasonPolicyDenied) {
		t.Errorf("reprofile re-allowed an entry the operator denied on the live Trial")
	}
}

// Allowed CIDRs a reload adds for new Trials do not reach a live Trial
// when the agent restarts and re-adopts it.
func TestPrivilegedRestartKeepsCreatedCIDRs(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 238, "upstream.example.test")
	target := fmt.Sprintf("upstream.example.test:%d", upstreamPort)
	url := "http://" + target + "/"
	cfg, path := reloadable(t, w, "profiles:\n  p1: ["+target+"]\n")
	cfg.AllowCIDRs = nil
	a, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Create(context.Background(), trialspec.Request{ID: "rv-old", Profiles: []string{"p1"}}); err != nil {
		t.Fatal(err)
	}
	writeConfig(t, path, "profiles:\n  p1: ["+target+"]\nallow_cidrs: [198.18.0.0/15]\n")
	if _, err := a.Reload(context.Background(), client.ReloadRequest{}); err != nil {
		t.Fatal(err)
	}
	// A Trial created after the reload reaches the target: it is up, and
	// the reload did apply to new Trials.
	if _, err := a.Create(context.Background(), trialspec.Request{ID: "rv-new", Profiles: []string{"p1"}}); err != nil {
		t.Fatal(err)
	}
	if code, out := through(t, a, "rv-new", url); code != 0 {
		t.Fatalf("a Trial created after the reload does not reach the target: exit %d %q", code, out)
	}
	if code, reason := refusedFor(t, a, "rv-old", url); code == 0 || reason != string(record.ReasonAddressDenied) {
		t.Fatalf("the live Trial after the reload: exit %d, reason %q; want address_denied", code, reason)
	}
	a.Close(false)
	cfg.File, err = config.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b := startAgent(t, cfg)
	code, reason := refusedFor(t, b, "rv-old", url)
	t.Logf("same Trial after restart: exit %d, reason %q", code, reason)
	if code == 0 || reason != string(record.ReasonAddressDenied) {
		t.Errorf("the restart gave a live Trial the CIDRs a reload meant for new Trials")
	}
}
