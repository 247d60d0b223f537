//go:build linux

package ocihook

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// DefaultHooksDir is where podman and CRI-O read hooks.d entries.
const DefaultHooksDir = "/etc/containers/oci/hooks.d"

// HookFile is the name of trialnet's entry in a hooks directory.
const HookFile = "trialnet.json"

// hookTimeout bounds the hook's run as the runtime counts it, in
// seconds: above the hook's own bound on the agent's answers, so that
// the hook says why it gives up rather than being killed mid-sentence.
const hookTimeout = 30

// Entry is the hooks.d entry (containers/common pkg/hooks, version
// 1.0.0) that runs trialnet oci-hook at createRuntime and poststop for
// every container with a trialnet.io/ annotation; the rest never start
// it. The hook tells the stages apart by the state's status.
func Entry(binary string, args []string) ([]byte, error) {
	if !filepath.IsAbs(binary) {
		return nil, fmt.Errorf("the hook's binary %q is not an absolute path", binary)
	}
	e := map[string]any{
		"version": "1.0.0",
		"hook":    map[string]any{"path": binary, "args": args, "timeout": hookTimeout},
		"when":    map[string]any{"annotations": map[string]string{`^trialnet\.io/`: ".*"}},
		"stages":  []string{"createRuntime", "poststop"},
	}
	b, err := json.MarshalIndent(e, "", "  ")
	return append(b, '\n'), err
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

// Install writes entry as dir/HookFile, atomically (a runtime reading
// the directory at that moment sees the old file or the new one). An
// existing file of the same content is left as it is (changed false);
// one of another content is replaced only with force.
func Install(dir string, entry []byte, force bool) (path string, changed bool, err error) {
	path = filepath.Join(dir, HookFile)
	changed, err = install(path, entry, force, "hook entry", "--print")
	return path, changed, err
}

// DefaultSeccompProfile is where 'trialnet oci-hook install' writes the
// seccomp profile that containers in a Trial are run with (podman
// --security-opt seccomp=FILE).
const DefaultSeccompProfile = "/etc/trialnet/seccomp.json"

// DefaultSeccompBase is podman's default profile (containers-common),
// which the written profile starts from where it is installed.
const DefaultSeccompBase = "/usr/share/containers/seccomp.json"

// SeccompProfile is the profile for containers in a Trial: base (a
// podman or Docker profile file) with the key calls refused, or, with no
// base, the least profile that refuses them (KeyCallsProfile).
func SeccompProfile(base []byte, goarch string) ([]byte, error) {
	profile := KeyCallsProfile(goarch)
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

// install writes data at path atomically, unless a file of the same
// content is there; one of another content only with force.
func install(path string, data []byte, force bool, what, printFlag string) (bool, error) {
	old, err := os.ReadFile(path)
	switch {
	case err == nil && bytes.Equal(old, data):
		return false, nil
	case err == nil && !force:
		return false, fmt.Errorf("%w: %s holds another %s; compare it with 'trialnet oci-hook install %s' and pass --force to replace it", ErrDifferentEntry, path, what, printFlag)
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return false, err
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
