//go:build linux

package ociruntime

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/trialnet/trialnet/ocihook"
)

// DefaultDaemonJSON is dockerd's configuration file.
const DefaultDaemonJSON = "/etc/docker/daemon.json"

// DefaultName is the runtime's name in daemon.json: docker run
// --runtime trialnet.
const DefaultName = "trialnet"

// Runtime is a daemon.json runtimes entry. Docker 20.10 runs a runtime
// with arguments through a script it writes ("path args $@"), so no
// argument may hold a space.
type Runtime struct {
	Path        string   `json:"path"`
	RuntimeArgs []string `json:"runtimeArgs,omitempty"`
}

// Entry is the runtime entry that runs binary as trialnet oci-runtime in
// front of runc, with the hook told of the agent's socket, and extra
// flags of oci-runtime's (the agent's places) before runc's arguments.
func Entry(binary, runc, socket string, extra ...string) (Runtime, error) {
	if !filepath.IsAbs(binary) || !filepath.IsAbs(runc) {
		return Runtime{}, fmt.Errorf("the runtime %q and runc %q must be absolute paths", binary, runc)
	}
	args := []string{"oci-runtime", "--runc", runc}
	if len(HookArgs(socket)) > 2 {
		args = append(args, "--socket", socket)
	}
	args = append(append(args, extra...), "--")
	for _, a := range append([]string{binary}, args...) {
		if strings.ContainsAny(a, " \t\n'\"\\$`") {
			return Runtime{}, fmt.Errorf("%q holds a character Docker's runtime script would split or expand", a)
		}
	}
	return Runtime{Path: binary, RuntimeArgs: args}, nil
}

// Fragment is the daemon.json that holds only this entry, for --print.
func Fragment(name string, rt Runtime) ([]byte, error) {
	b, err := json.MarshalIndent(map[string]any{"runtimes": map[string]Runtime{name: rt}}, "", "  ")
	return append(b, '\n'), err
}

// ErrDifferentRuntime is a runtime of the same name and other content
// in daemon.json.
var ErrDifferentRuntime = errors.New("daemon.json has another runtime of this name")

// Install merges rt into the daemon.json at path as runtimes[name],
// keeping every other key as it was, and writes it atomically (dockerd
// reading it at that moment sees the old file or the new one). A file
// that is not one JSON object, or holds a key twice, is left alone; an
// entry of the same name and another content is replaced only with
// force; the same entry changes nothing.
func Install(path, name string, rt Runtime, force bool) (changed bool, err error) {
	doc := map[string]json.RawMessage{}
	mode := os.FileMode(0o644)
	old, err := os.ReadFile(path)
	switch {
	case err == nil:
		if err := ocihook.DecodeStrict(old, &doc); err != nil || doc == nil {
			return false, fmt.Errorf("%s is not a JSON object dockerd reads one way (%v): mend it first", path, err)
		}
		if fi, err := os.Stat(path); err == nil {
			mode = fi.Mode().Perm()
		}
	case !errors.Is(err, os.ErrNotExist):
		return false, err
	}
	runtimes := map[string]json.RawMessage{}
	if raw, ok := doc["runtimes"]; ok {
		if err := json.Unmarshal(raw, &runtimes); err != nil || runtimes == nil {
			return false, fmt.Errorf("%s: runtimes is not an object (%v)", path, err)
		}
	}
	want, err := json.Marshal(rt)
	if err != nil {
		return false, err
	}
	if have, ok := runtimes[name]; ok {
		var cur Runtime
		if json.Unmarshal(have, &cur) == nil && cur.Path == rt.Path && slices.Equal(cur.RuntimeArgs, rt.RuntimeArgs) {
			return false, nil
		}
		if !force {
			return false, fmt.Errorf("%w: %s has runtimes.%s = %s; compare it with 'trialnet oci-runtime install --print' and pass --force to replace it", ErrDifferentRuntime, path, name, have)
		}
	}
	runtimes[name] = want
	if doc["runtimes"], err = json.Marshal(runtimes); err != nil {
		return false, err
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return false, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return false, err
	}
	return true, writeAtomic(path, append(out, '\n'), mode)
}
