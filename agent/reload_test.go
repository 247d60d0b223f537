//go:build linux

package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/trialnet/trialnet/client"
	"github.com/trialnet/trialnet/config"
	"github.com/trialnet/trialnet/internal/privtest"
	trialspec "github.com/trialnet/trialnet/trial"
)

// reloadable is an in-process agent started from a config file that the
// test rewrites.
func reloadable(t *testing.T, w *world, yaml string) (AgentConfig, string) {
	t.Helper()
	cfg := w.config(t)
	cfg.ConfigPath = filepath.Join(t.TempDir(), "trialnet.yaml")
	writeConfig(t, cfg.ConfigPath, yaml)
	f, err := config.LoadFile(cfg.ConfigPath)
	if err != nil {
		t.Fatal(err)
	}
	cfg.File = f
	return cfg, cfg.ConfigPath
}

func writeConfig(t *testing.T, path, yaml string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
}

func wantCode(t *testing.T, err error, code, contains string) {
	t.Helper()
	var e *client.Error
	if !errors.As(err, &e) || e.Code != code || !strings.Contains(e.Message, contains) {
		t.Fatalf("got %v, want a %s error saying %q", err, code, contains)
	}
}

// A good file applies to new Trials (a new profile, a new allowed CIDR)
// while a live Trial keeps its policy; a bad one, or one that moves
// paths, changes nothing and says why.
func TestPrivilegedReloadAppliesToNewTrials(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 234, "upstream.example.test")
	target := fmt.Sprintf("upstream.example.test:%d", upstreamPort)
	url := "http://" + target + "/"
	cfg, path := reloadable(t, w, "profiles:\n  p1: ["+target+"]\n")
	cfg.AllowCIDRs = nil // the test host (198.18.0.0/15) is reserved: refused until the file allows it
	a := startAgent(t, cfg)
	if _, err := a.Create(context.Background(), trialspec.Request{ID: "rl-old", Profiles: []string{"p1"}}); err != nil {
		t.Fatal(err)
	}
	if code, out := through(t, a, "rl-old", url); code == 0 || !strings.Contains(out, "403") {
		t.Fatalf("before the reload the reserved test host was reached: %d %s", code, out)
	}

	bad := map[string]struct{ yaml, says string }{
		"syntax":          {"profiles:\n  p2: [" + target + "\n", "yaml"},
		"loopback CIDR":   {"profiles:\n  p2: [" + target + "]\nallow_cidrs: [127.0.0.0/8]\n", "can never be allowed"},
		"unknown key":     {"profiles:\n  p2: [" + target + "]\nallow_cidr: [198.18.0.0/15]\n", "allow_cidr"},
		"paths changed":   {"profiles:\n  p2: [" + target + "]\npaths:\n  data_dir: /elsewhere\n", "paths cannot change on reload"},
		"retention < 0":   {"profiles:\n  p2: [" + target + "]\nretention:\n  keep_days: -1\n", "retention"},
		"missing profile": {"profiles: {p2: []}\n", "allows nothing"},
	}
	for name, b := range bad {
		t.Run(name, func(t *testing.T) {
			writeConfig(t, path, b.yaml)
			_, err := a.Reload(context.Background(), client.ReloadRequest{})
			wantCode(t, err, client.CodeBadConfig, b.says)
			if !strings.Contains(err.Error(), "nothing changed") {
				t.Fatalf("the error does not say nothing changed: %v", err)
			}
			_, err = a.Create(context.Background(), trialspec.Request{ID: "rl-p2", Profiles: []string{"p2"}})
			wantCode(t, err, client.CodeUnknownProfile, "p2")
		})
	}
	// The old profile still works after the refusals.
	if _, err := a.Create(context.Background(), trialspec.Request{ID: "rl-p1", Profiles: []string{"p1"}}); err != nil {
		t.Fatalf("the old profile after refused reloads: %v", err)
	}

	writeConfig(t, path, "profiles:\n  p1: ["+target+"]\n  p2: ["+target+"]\nallow_cidrs: [198.18.0.0/15]\n")
	res, err := a.Reload(context.Background(), client.ReloadRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Profiles, []string{"p1", "p2"}) || len(res.Reprofiled) != 0 {
		t.Fatalf("reload result %+v", res)
	}
	if _, err := a.Create(context.Background(), trialspec.Request{ID: "rl-new", Profiles: []string{"p2"}}); err != nil {
		t.Fatalf("the new profile: %v", err)
	}
	if code, out := through(t, a, "rl-new", url); code != 0 {
		t.Fatalf("a Trial created after the reload did not get the new allowed CIDR: %d %s", code, out)
	}
	for _, id := range []string{"rl-old", "rl-p1"} {
		if code, out := through(t, a, id, url); code == 0 || !strings.Contains(out, "403") {
			t.Fatalf("%s, created before the reload, got the new CIDR: %d %s", id, code, out)
		}
	}
}

// reload --reprofile gives a profile-made Trial its profile's new
// allowlist, in memory and in its record (a restarted agent keeps it),
// and leaves an --allow-made Trial alone. A live Trial's profile missing
// from the file refuses the reload.
func TestPrivilegedReloadReprofile(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 235, "upstream.example.test", "other.example.test")
	up := fmt.Sprintf("upstream.example.test:%d", upstreamPort)
	other := fmt.Sprintf("other.example.test:%d", upstreamPort)
	cfg, path := reloadable(t, w, "profiles:\n  p1: ["+up+"]\n")
	a, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Create(context.Background(), trialspec.Request{ID: "rp-prof", Profiles: []string{"p1"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Create(context.Background(), trialspec.Request{ID: "rp-allow", Allow: []string{up}}); err != nil {
		t.Fatal(err)
	}
	reach := func(a *Agent, id, target string) bool {
		code, _ := through(t, a, id, "http://"+target+"/")
		return code == 0
	}

	writeConfig(t, path, "profiles:\n  p9: ["+other+"]\n")
	_, err = a.Reload(context.Background(), client.ReloadRequest{Reprofile: true})
	wantCode(t, err, client.CodeBadConfig, "rp-prof")
	if !reach(a, "rp-prof", up) {
		t.Fatal("a refused reprofile changed the Trial's allowlist")
	}

	writeConfig(t, path, "profiles:\n  p1: ["+other+"]\n")
	if _, err := a.Reload(context.Background(), client.ReloadRequest{}); err != nil {
		t.Fatal(err)
	}
	if !reach(a, "rp-prof", up) || reach(a, "rp-prof", other) {
		t.Fatal("a reload without --reprofile changed a live Trial's allowlist")
	}
	res, err := a.Reload(context.Background(), client.ReloadRequest{Reprofile: true})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Reprofiled, []string{"rp-prof"}) {
		t.Fatalf("reprofiled %v, want [rp-prof]", res.Reprofiled)
	}
	check := func(a *Agent, when string) {
		t.Helper()
		if reach(a, "rp-prof", up) || !reach(a, "rp-prof", other) {
			t.Fatalf("%s: the profile-made Trial does not have the new profile's allowlist", when)
		}
		if !reach(a, "rp-allow", up) || reach(a, "rp-allow", other) {
			t.Fatalf("%s: the --allow-made Trial's allowlist changed", when)
		}
		info, err := a.Get(context.Background(), "rp-prof")
		if err != nil {
			t.Fatal(err)
		}
		if len(info.Allow) != 1 || info.Allow[0].Entry != other || info.Allow[0].Profile != "p1" {
			t.Fatalf("%s: description %+v", when, info.Allow)
		}
	}
	check(a, "after the reload")

	a.Close(false) // the Trials stay; a new agent re-adopts them from their records
	cfg.File, err = config.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b := startAgent(t, cfg)
	check(b, "after a restart")
}

// Each reload asks TrustConfig about the file's name and reads the path
// it returns: the CLI's check of root's word holds for a file changed
// or re-pointed after the start, not only at it. Seen red with Reload's
// call of TrustConfig taken out: the refused file's profile was loaded.
func TestPrivilegedReloadAsksTrustConfig(t *testing.T) {
	privtest.Require(t)
	w := newWorld(t, 235, "upstream.example.test")
	target := fmt.Sprintf("upstream.example.test:%d", upstreamPort)
	cfg, path := reloadable(t, w, "profiles:\n  p1: ["+target+"]\n")
	real := filepath.Join(t.TempDir(), "real.yaml")
	writeConfig(t, real, "profiles:\n  p1: ["+target+"]\n  p3: ["+target+"]\n")
	refuse := true
	cfg.TrustConfig = func(p string) (string, error) {
		if p != path {
			t.Errorf("TrustConfig(%s), want %s", p, path)
		}
		if refuse {
			return "", errors.New("it is uid 65534's")
		}
		return real, nil
	}
	a := startAgent(t, cfg)
	writeConfig(t, path, "profiles:\n  p1: ["+target+"]\n  p2: ["+target+"]\n")
	_, err := a.Reload(context.Background(), client.ReloadRequest{})
	wantCode(t, err, client.CodeBadConfig, "uid 65534's")
	_, err = a.Create(context.Background(), trialspec.Request{ID: "tc-p2", Profiles: []string{"p2"}})
	wantCode(t, err, client.CodeUnknownProfile, "p2")
	refuse = false
	res, err := a.Reload(context.Background(), client.ReloadRequest{})
	if err != nil || !slices.Equal(res.Profiles, []string{"p1", "p3"}) {
		t.Fatalf("reload with the path TrustConfig returned: %+v %v; want %s's profiles p1, p3", res, err, real)
	}
}
