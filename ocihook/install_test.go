//go:build linux

package ocihook

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
)

func TestEntry(t *testing.T) {
	if _, err := Entry("trialnet", nil); err == nil {
		t.Error("a relative binary path was accepted")
	}
	b, err := Entry("/usr/bin/trialnet", []string{"trialnet", "oci-hook"})
	if err != nil {
		t.Fatal(err)
	}
	var e struct {
		Version string `json:"version"`
		Hook    struct {
			Path    string   `json:"path"`
			Args    []string `json:"args"`
			Timeout int      `json:"timeout"`
		} `json:"hook"`
		When struct {
			Annotations map[string]string `json:"annotations"`
			Always      *bool             `json:"always"`
		} `json:"when"`
		Stages []string `json:"stages"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatal(err)
	}
	if e.Version != "1.0.0" || e.Hook.Path != "/usr/bin/trialnet" || !slices.Equal(e.Stages, []string{"createRuntime", "poststop"}) || e.When.Always != nil || e.Hook.Timeout <= 0 {
		t.Fatalf("entry %s", b)
	}
	// The runtime matches each key and value pattern against each
	// annotation (unanchored, as Go's regexp MatchString).
	for key, want := range map[string]bool{AnnotationTrial: true, AnnotationProfile: true, "io.trialnet.io/x": false, "x.trialnet.io/trial": false, "io.podman.annotations.autoremove": false} {
		got := false
		for k, v := range e.When.Annotations {
			if regexp.MustCompile(k).MatchString(key) && regexp.MustCompile(v).MatchString("eval-1") {
				got = true
			}
		}
		if got != want {
			t.Errorf("annotation %s runs the hook: %v, want %v", key, got, want)
		}
	}
}

func TestInstall(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "hooks.d")
	one, _ := Entry("/usr/bin/trialnet", []string{"trialnet", "oci-hook"})
	two, _ := Entry("/opt/trialnet", []string{"trialnet", "oci-hook"})
	path, changed, err := Install(dir, one, false)
	if err != nil || !changed || path != filepath.Join(dir, HookFile) {
		t.Fatalf("first install: %s %v %v", path, changed, err)
	}
	if _, changed, err := Install(dir, one, false); err != nil || changed {
		t.Errorf("the same entry again: changed %v, %v", changed, err)
	}
	if _, _, err := Install(dir, two, false); !errors.Is(err, ErrDifferentEntry) {
		t.Errorf("a different entry without force: %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != string(one) {
		t.Errorf("a refused install changed the file: %s", b)
	}
	if _, changed, err := Install(dir, two, true); err != nil || !changed {
		t.Errorf("with force: %v %v", changed, err)
	}
	if b, _ := os.ReadFile(path); string(b) != string(two) {
		t.Errorf("force did not replace the file: %s", b)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("the hooks directory holds %d files, want only %s", len(entries), HookFile)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644 (runtimes read it as root, anyone may)", fi.Mode())
	}
}
