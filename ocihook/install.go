//go:build linux

package ocihook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
)

// DefaultHooksDir is where podman and CRI-O read hooks.d entries.
const DefaultHooksDir = "/etc/containers/oci/hooks.d"

// HookFile is the name of trialnet's createRuntime entry in a hooks
// directory, PoststopFile that of its poststop entry.
const (
	HookFile     = "trialnet.json"
	PoststopFile = "trialnet-poststop.json"
)

// hookTimeout bounds the hook's run as the runtime counts it, in
// seconds: above the hook's own bound on the agent's answers, so that
// the hook says why it gives up rather than being killed mid-sentence.
const hookTimeout = 30

// Entries are the hooks.d entries (containers/common pkg/hooks, version
// 1.0.0), by file name. One runs trialnet oci-hook at createRuntime for
// every container: one with a trialnet.io/ annotation is judged (a key
// this build does not know refused), and one without is refused only if
// it shares a Trial's namespace or cgroup (Places.Unclaimed), which no
// annotation says (no condition of an entry's can match a namespace
// path), for the cost of one process start. The other
// runs it at poststop for the containers with such an annotation but those whose only such
// key is trialnet.io/profile: the agent ends a Trial made around a
// container by itself when the container's init exits (its owner), so a
// second process start there would only repeat it. A container that
// joined a Trial keeps poststop, which moves it to the Trial's ended
// containers. One entry cannot say this: a runtime runs all of an
// entry's stages when any annotation matches its key pattern
// (unanchored, Go's regexp, which has no lookahead), hence two files and
// the poststop key pattern written as the complement of the profile key.
func Entries(binary string, args []string) (map[string][]byte, error) {
	if !filepath.IsAbs(binary) {
		return nil, fmt.Errorf("the hook's binary %q is not an absolute path", binary)
	}
	out := map[string][]byte{}
	for file, e := range map[string]struct {
		when  map[string]any
		stage string
	}{
		HookFile:     {map[string]any{"always": true}, "createRuntime"},
		PoststopFile: {map[string]any{"annotations": map[string]string{poststopKeyPattern(): ".*"}}, "poststop"},
	} {
		b, err := json.MarshalIndent(map[string]any{
			"version": "1.0.0",
			"hook":    map[string]any{"path": binary, "args": args, "timeout": hookTimeout},
			"when":    e.when,
			"stages":  []string{e.stage},
		}, "", "  ")
		if err != nil {
			return nil, err
		}
		out[file] = append(b, '\n')
	}
	return out, nil
}

// keyPattern matches every trialnet.io/ annotation key, in any case: the
// hook, the Docker wrapper and the NRI plugin take any case of the prefix
// as a claim (and refuse what they do not know), so the poststop entry
// must reach every one that may have joined a Trial. They read the case with strings.ToLower, which lowers U+0130
// (İ) to i; (?i) does not fold it to i, so the pattern names it.
const keyPattern = `(?i:^tr[iİ]alnet\.[iİ]o/)`

// poststopKeyPattern matches the keys keyPattern matches but
// trialnet.io/profile exactly (made when asked for, not in every start of
// the binary).
func poststopKeyPattern() string { return "(?s)" + keyPattern + notExactly("profile") }

// notExactly is a pattern matching, at its start, any text but exactly
// word (anchored at the end): text that stops short of word, leaves it at
// some letter, or goes on past it. RE2 has no (?!word).
func notExactly(word string) string {
	if word == "" {
		return "."
	}
	c := regexp.QuoteMeta(word[:1])
	return "(?:$|[^" + c + "]|" + c + notExactly(word[1:]) + ")"
}

// WithPrecreate is entry (Entry's) with podman's precreate stage first:
// podman runs it before the runtime, with the config on standard input
// (the hook tells it from a state: IsConfig), so that the agent prepares
// a profile container's cgroup where the BPF LSM layer needs it. Only
// for a hooks directory podman alone reads: CRI-O's hooks library knows
// no precreate stage and refuses an entry that names one.
func WithPrecreate(entry []byte) ([]byte, error) {
	var e map[string]any
	if err := json.Unmarshal(entry, &e); err != nil {
		return nil, err
	}
	stages, _ := e["stages"].([]any)
	e["stages"] = append([]any{"precreate"}, stages...)
	b, err := json.MarshalIndent(e, "", "  ")
	return append(b, '\n'), err
}

// ErrDifferentEntry is a file of trialnet's (a hooks.d entry, a seccomp
// profile) of another content in the way.
var ErrDifferentEntry = errors.New("a different hooks.d entry exists")

// Install writes entries (file name → content, Entries) into dir, each
// atomically (a runtime reading the directory at that moment sees the
// old file or the new one). Files of the same content are left as they
// are; if one of another content is there, nothing is written unless
// force. changed: a file was written.
func Install(dir string, entries map[string][]byte, force bool) (paths []string, changed bool, err error) {
	names := slices.Sorted(maps.Keys(entries))
	for _, name := range names {
		paths = append(paths, filepath.Join(dir, name))
	}
	if !force {
		for i, name := range names {
			if err := differs(paths[i], entries[name], "hook entry", "--print"); err != nil {
				return paths, false, err
			}
		}
	}
	for i, name := range names {
		c, err := install(paths[i], entries[name], force, "hook entry", "--print")
		if err != nil {
			return paths, changed, err
		}
		changed = changed || c
	}
	return paths, changed, nil
}

// DefaultSeccompProfile is where 'trialnet oci-hook install' writes the
// seccomp profile that containers in a Trial are run with (podman
// --security-opt seccomp=FILE).
const DefaultSeccompProfile = "/etc/trialnet/seccomp.json"

// DefaultSeccompBase is podman's default profile (containers-common),
// which the written profile starts from where it is installed.
const DefaultSeccompBase = "/usr/share/containers/seccomp.json"

// SeccompProfile is the profile for containers in a Trial: base (a
// podman or Docker profile file) with the key calls and AF_VSOCK refused,
// or, with no base, the least profile that refuses them (ContainerProfile).
func SeccompProfile(base []byte, goarch string) ([]byte, error) {
	profile := ContainerProfile(goarch)
	if base != nil {
		if err := decodeStrict(base, new(any)); err != nil {
			return nil, err
		}
		d := json.NewDecoder(bytes.NewReader(base))
		d.UseNumber() // numbers stay as written
		profile = nil
		if err := d.Decode(&profile); err != nil || profile == nil {
			return nil, fmt.Errorf("not a JSON object: %v", err)
		}
		if err := RefuseVsock(profile); err != nil {
			return nil, err
		}
		if err := RefuseKeyCalls(profile); err != nil {
			return nil, err
		}
	}
	b, err := json.MarshalIndent(profile, "", "  ")
	return append(b, '\n'), err
}

// InstallSeccompProfile writes profile at path as Install writes the
// hook's entry.
func InstallSeccompProfile(path string, profile []byte, force bool) (changed bool, err error) {
	return install(path, profile, force, "seccomp profile", "--print-seccomp")
}

// differs refuses a file at path of another content than data.
func differs(path string, data []byte, what, printFlag string) error {
	old, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist), err == nil && bytes.Equal(old, data):
		return nil
	case err == nil:
		return fmt.Errorf("%w: %s holds another %s; compare it with 'trialnet oci-hook install %s' and pass --force to replace it", ErrDifferentEntry, path, what, printFlag)
	}
	return err
}

// install writes data at path atomically, unless a file of the same
// content is there; one of another content only with force.
func install(path string, data []byte, force bool, what, printFlag string) (bool, error) {
	old, err := os.ReadFile(path)
	if err == nil && bytes.Equal(old, data) {
		return false, nil
	}
	if !force {
		if err := differs(path, data, what, printFlag); err != nil {
			return false, err
		}
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	tmp, err := os.CreateTemp(dir, ".trialnet-*.tmp")
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing to remove
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return false, err
	}
	if err := tmp.Chmod(0o644); err != nil {
		_ = tmp.Close()
		return false, err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return false, err
	}
	if err := tmp.Close(); err != nil {
		return false, err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return false, err
	}
	return true, nil
}
