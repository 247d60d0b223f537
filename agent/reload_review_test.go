//go:build linux

package agent

import (
	"fmt"
	"testing"

	"github.com/trialnet/trialnet/internal/privtest"
	"github.com/trialnet/trialnet/proxy"
)

// Found by an attacker's read of reload, learning and live changes.

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
	if _, err := a.Reload(ReloadRequest{}); err != nil {
		t.Fatal(err)
	}
	info, err := a.Create(CreateRequest{ID: "rv-learn", Profiles: []string{"dev"}})
	if err != nil {
		t.Fatal(err)
	}
	code, out := through(t, a, info.ID, "http://"+other+"/")
	t.Logf("after reload with learn off: Learning=%v; curl %s (not on the list): exit %d %q", info.Learning, other, code, out)
	if info.Learning || code == 0 {
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
	if _, err := a.Create(CreateRequest{ID: "rv-rp", Profiles: []string{"p1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ChangeAllow("rv-rp", AllowChange{Remove: []string{other}, Cut: true}, 0); err != nil {
		t.Fatal(err)
	}
	if code, _ := through(t, a, "rv-rp", "http://"+other+"/"); code == 0 {
		t.Fatal("deny did not apply")
	}
	if _, err := a.Reload(ReloadRequest{Reprofile: true}); err != nil { // same file
		t.Fatal(err)
	}
	code, out := through(t, a, "rv-rp", "http://"+other+"/")
	t.Logf("after reload --reprofile of an unchanged file: curl %s exit %d %q", other, code, out)
	if code == 0 {
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
	if _, err := a.Create(CreateRequest{ID: "rv-old", Profiles: []string{"p1"}}); err != nil {
		t.Fatal(err)
	}
	writeConfig(t, path, "profiles:\n  p1: ["+target+"]\nallow_cidrs: [198.18.0.0/15]\n")
	if _, err := a.Reload(ReloadRequest{}); err != nil {
		t.Fatal(err)
	}
	code, out := through(t, a, "rv-old", url)
	t.Logf("live Trial after reload: exit %d %q", code, out)
	a.Close(false)
	cfg.File, err = proxy.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b := startAgent(t, cfg)
	code, out = through(t, b, "rv-old", url)
	t.Logf("same Trial after restart: exit %d %q", code, out)
	if code == 0 {
		t.Errorf("the restart gave a live Trial the CIDRs a reload meant for new Trials")
	}
}
