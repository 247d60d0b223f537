//go:build linux

package ocihook

import (
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// hooksdEntry is what a runtime reads of a hooks.d entry.
type hooksdEntry struct {
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

// matches is containers/common's When.Match (pkg/hooks/1.0.0) for an
// entry with always or annotations only: always matches every container;
// otherwise every key pattern must match some annotation whose value
// matches its value pattern, both unanchored (regexp.MatchString).
func (e hooksdEntry) matches(t *testing.T, annotations map[string]string) bool {
	t.Helper()
	if e.When.Always != nil && *e.When.Always {
		return true
	}
	for kp, vp := range e.When.Annotations {
		found := false
		for k, v := range annotations {
			km, err := regexp.MatchString(kp, k)
			if err != nil {
				t.Fatal(err)
			}
			if vm, err := regexp.MatchString(vp, v); km && err == nil && vm {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return len(e.When.Annotations) > 0
}

// stagesFor are the stages at which a runtime runs the hook for a
// container with annotations, as podman and CRI-O read the entries.
func stagesFor(t *testing.T, entries map[string][]byte, annotations map[string]string) []string {
	t.Helper()
	var stages []string
	for _, b := range entries {
		var e hooksdEntry
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatal(err)
		}
		if e.matches(t, annotations) {
			stages = append(stages, e.Stages...)
		}
	}
	slices.Sort(stages)
	return stages
}

func TestEntries(t *testing.T) {
	if _, err := Entries("trialnet", nil); err == nil {
		t.Error("a relative binary path was accepted")
	}
	entries, err := Entries("/usr/bin/trialnet", []string{"trialnet", "oci-hook"})
	if err != nil {
		t.Fatal(err)
	}
	if got := slices.Sorted(maps.Keys(entries)); !slices.Equal(got, []string{PoststopFile, HookFile}) {
		t.Fatalf("entries %v", got)
	}
	for name, b := range entries {
		var e hooksdEntry
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatal(err)
		}
		// createRuntime for every container (one that claims no Trial
		// is refused if it shares a Trial's namespace), poststop for
		// the claims.
		always := name == HookFile
		if e.Version != "1.0.0" || e.Hook.Path != "/usr/bin/trialnet" || len(e.Stages) != 1 || (e.When.Always != nil) != always || e.Hook.Timeout <= 0 || len(e.When.Annotations) != map[bool]int{true: 0, false: 1}[always] {
			t.Errorf("%s: %s", name, b)
		}
	}
	both, create := []string{"createRuntime", "poststop"}, []string{"createRuntime"}
	for _, c := range []struct {
		ann  map[string]string
		want []string
	}{
		{map[string]string{AnnotationTrial: "eval-1"}, both},
		{map[string]string{AnnotationProfile: "claude"}, create},
		{map[string]string{AnnotationProfile: ""}, create},
		// Both keys: refused at createRuntime; poststop still runs (the
		// trial key), and finds no container to end.
		{map[string]string{AnnotationTrial: "eval-1", AnnotationProfile: "claude"}, both},
		// A key this build does not know reaches the hook, which refuses it.
		{map[string]string{"trialnet.io/trials": "x"}, both},
		{map[string]string{"trialnet.io/profiles": "x"}, both},
		{map[string]string{"trialnet.io/profile\n": "x"}, both},
		{map[string]string{"trialnet.io/profil": "x"}, both},
		{map[string]string{"trialnet.io/Profile": "x"}, both},
		{map[string]string{"trialnet.io/": "x"}, both},
		{map[string]string{"trialnet.io/x": "a\nb"}, both},
		{map[string]string{AnnotationProfile: "claude", "trialnet.io/x": "y"}, both},
		{map[string]string{AnnotationProfile: "claude", "io.podman.annotations.autoremove": "TRUE"}, create},
		// The prefix in another case: the hook reads it as a claim.
		{map[string]string{"Trialnet.io/trial": "eval-1"}, both},
		{map[string]string{"TRIALNET.IO/PROFILE": "claude"}, both},
		{map[string]string{"trialnet.IO/profile": "claude"}, create},
		// Not trialnet's: the hook runs at createRuntime only, where it
		// looks for a Trial's namespaces.
		{map[string]string{"io.trialnet.io/x": "y"}, create},
		{map[string]string{"x.trialnet.io/trial": "y"}, create},
		{map[string]string{"trialnetxio/trial": "y"}, create},
		{map[string]string{"io.podman.annotations.autoremove": "TRUE"}, create},
		{nil, create},
	} {
		if got := stagesFor(t, entries, c.ann); !slices.Equal(got, c.want) {
			t.Errorf("annotations %q: the hook runs at %v, want %v", c.ann, got, c.want)
		}
	}
}

// The poststop key pattern is the complement of the profile key among
// trialnet.io/ keys, for every key near it.
func TestPoststopKeyPattern(t *testing.T) {
	re := regexp.MustCompile(poststopKeyPattern())
	keys := []string{"", "x", "trialnet.io", AnnotationTrial, AnnotationProfile}
	word := strings.TrimPrefix(AnnotationProfile, annotationPrefix)
	for i := range len(word) + 1 {
		for _, tail := range []string{"", "x", "\n", "p", "e", "é", word} {
			keys = append(keys, annotationPrefix+word[:i]+tail, annotationPrefix+word[:i]+tail+word[i:],
				annotationPrefix+strings.ToUpper(word[:i])+word[i:]+tail)
		}
	}
	for _, k := range slices.Clone(keys) {
		keys = append(keys, strings.ToUpper(k), "Trialnet.IO/"+strings.TrimPrefix(k, annotationPrefix))
	}
	for _, k := range keys {
		want := strings.HasPrefix(strings.ToLower(k), annotationPrefix) && k[len(annotationPrefix):] != "profile"
		if got := re.MatchString(k); got != want {
			t.Errorf("key %q: poststop %v, want %v", k, got, want)
		}
	}
}

// Every annotation key that the hook reads as a claim (one it takes, or
// one it refuses) but the profile key (in any case of the prefix: refused
// or made a Trial at createRuntime, nothing to end) makes the runtime run
// it at poststop too: each case of the prefix, with the keys the hook knows
// and others, and characters before and after. (createRuntime runs for
// every container.) A joined container the hook is not shown at its end
// stays among its Trial's live ones.
func TestEveryClaimRunsTheHook(t *testing.T) {
	entries, err := Entries("/usr/bin/trialnet", []string{"trialnet", "oci-hook"})
	if err != nil {
		t.Fatal(err)
	}
	const prefix = annotationPrefix
	var prefixes []string
	for mask := range 1 << len(prefix) {
		p := []byte(prefix)
		for i := range p {
			if mask&(1<<i) != 0 {
				p[i] = byte(unicode.ToUpper(rune(p[i])))
			}
		}
		prefixes = append(prefixes, string(p))
	}
	prefixes = slices.Compact(slices.Sorted(slices.Values(prefixes)))
	claims := 0
	for _, p := range prefixes {
		for _, lead := range []string{"", " ", "\t", "\n", "x", "\u212a"} {
			for _, word := range []string{"trial", "profile", "Trial", "PROFILE", "trial ", " profile", "x", "", "\n"} {
				k := lead + p + word
				cl, err := claimOf(map[string]string{k: "v"}, nil)
				if err == nil && !cl.any() {
					continue
				}
				claims++
				if got := stagesFor(t, entries, map[string]string{k: "v"}); (lead != "" || word != "profile") && !slices.Contains(got, "poststop") {
					t.Errorf("key %q: the hook reads a claim (%+v, %v), and the runtime runs it at %v", k, cl, err, got)
				}
			}
		}
	}
	if claims < len(prefixes)*9 {
		t.Errorf("%d keys read as claims, want every one with a bare prefix (%d)", claims, len(prefixes)*9)
	}
	// strings.ToLower, which the readers use, maps a few runes outside
	// ASCII to a letter of the prefix (U+0130 to i) that Go's (?i), which
	// containers/common matches with, does not fold to it.
	folded := 0
	for r := rune(0x80); r <= unicode.MaxRune; r++ {
		l := strings.ToLower(string(r))
		for i := range len(prefix) {
			if l != prefix[i:i+1] {
				continue
			}
			k := prefix[:i] + string(r) + prefix[i+1:] + "trial"
			if cl, err := claimOf(map[string]string{k: "v"}, nil); err == nil && !cl.any() {
				continue // not a claim to the hook
			}
			folded++
			if got := stagesFor(t, entries, map[string]string{k: "v"}); !slices.Contains(got, "poststop") {
				t.Errorf("key %q: the hook reads a claim, and the runtime runs it at %v", k, got)
			}
		}
	}
	if folded == 0 {
		t.Error("no rune outside ASCII lowers to a letter of the prefix: the loop above tests nothing")
	}
}

func TestInstall(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "hooks.d")
	one, _ := Entries("/usr/bin/trialnet", []string{"trialnet", "oci-hook"})
	two, _ := Entries("/opt/trialnet", []string{"trialnet", "oci-hook"})
	paths, changed, err := Install(dir, one, false)
	if err != nil || !changed || !slices.Equal(paths, []string{filepath.Join(dir, PoststopFile), filepath.Join(dir, HookFile)}) {
		t.Fatalf("first install: %s %v %v", paths, changed, err)
	}
	if _, changed, err := Install(dir, one, false); err != nil || changed {
		t.Errorf("the same entry again: changed %v, %v", changed, err)
	}
	// An earlier trialnet's single entry in the way: nothing is written.
	old := filepath.Join(t.TempDir(), "hooks.d")
	if err := os.MkdirAll(old, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(old, HookFile), []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Install(old, one, false); !errors.Is(err, ErrDifferentEntry) {
		t.Errorf("over an earlier entry without force: %v", err)
	}
	if _, err := os.Stat(filepath.Join(old, PoststopFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused install wrote %s: %v", PoststopFile, err)
	}
	if _, _, err := Install(dir, two, false); !errors.Is(err, ErrDifferentEntry) {
		t.Errorf("a different entry without force: %v", err)
	}
	check := func(what string, want map[string][]byte) {
		t.Helper()
		for i, p := range paths {
			if b, _ := os.ReadFile(p); string(b) != string(want[filepath.Base(p)]) {
				t.Errorf("%s: %s holds %s", what, paths[i], b)
			}
		}
	}
	check("a refused install", one)
	if _, changed, err := Install(dir, two, true); err != nil || !changed {
		t.Errorf("with force: %v %v", changed, err)
	}
	check("with force", two)
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("the hooks directory holds %d files, want only %s and %s", len(entries), HookFile, PoststopFile)
	}
	for _, p := range paths {
		if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o644 {
			t.Errorf("%s: mode %v, want 0644 (runtimes read it as root, anyone may)", p, fi.Mode())
		}
	}
}
