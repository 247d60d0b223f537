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

// ErrDifferentEntry is a hooks.d entry of another content in the way.
var ErrDifferentEntry = errors.New("a different hooks.d entry exists")

// Install writes entry as dir/HookFile, atomically (a runtime reading
// the directory at that moment sees the old file or the new one). An
// existing file of the same content is left as it is (changed false);
// one of another content is replaced only with force.
func Install(dir string, entry []byte, force bool) (path string, changed bool, err error) {
	path = filepath.Join(dir, HookFile)
	old, err := os.ReadFile(path)
	switch {
	case err == nil && bytes.Equal(old, entry):
		return path, false, nil
	case err == nil && !force:
		return path, false, fmt.Errorf("%w: %s holds another hook entry; compare it with 'trialnet oci-hook install --print' and pass --force to replace it", ErrDifferentEntry, path)
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return path, false, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return path, false, err
	}
	tmp, err := os.CreateTemp(dir, ".trialnet-*.tmp")
	if err != nil {
		return path, false, err
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing to remove
	if _, err := tmp.Write(entry); err != nil {
		_ = tmp.Close()
		return path, false, err
	}
	if err := tmp.Chmod(0o644); err != nil {
		_ = tmp.Close()
		return path, false, err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return path, false, err
	}
	if err := tmp.Close(); err != nil {
		return path, false, err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return path, false, err
	}
	return path, true, nil
}
